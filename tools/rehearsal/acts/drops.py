"""Images dropped into the input bucket: annotated at once (each event through EventBridge, the ingest queue and
Ingest), or gathered by the latency dial and started as one batch."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from unittest import mock

from tools.rehearsal.acts.common import SAMPLES, drain, queued_bodies, wait_for_executions
from tools.rehearsal.report import Report
from tools.rehearsal.stack import ACCOUNT, DeployedStack

if TYPE_CHECKING:
    from tools.rehearsal.services import InProcessServices


def dropped_images_are_annotated(services: InProcessServices, stack: DeployedStack, report: Report) -> int:
    """Upload under incoming/: the bucket's events, through the deployed rule, reach the ingest queue; Lambda
    polls it for the ingest function, which starts an execution. Returns how many images were dropped (0: failed)."""
    import boto3

    started = time.monotonic()
    dropped = {
        "incoming/cat.jpg": (SAMPLES / "chelsea-the-cat.jpg").read_bytes(),
        "incoming/coffee.webp": (SAMPLES / "coffee.webp").read_bytes(),
        "incoming/truncated.jpg": (SAMPLES / "chelsea-the-cat.jpg").read_bytes()[:4000],
    }
    for key, body in dropped.items():
        boto3.client("s3", region_name=stack.region).put_object(
            Bucket=stack.outputs["InputBucketName"], Key=key, Body=body
        )
    sqs = boto3.client("sqs", region_name=stack.region)
    events = [json.loads(body) for body in queued_bodies(sqs, stack.outputs["IngestQueueUrl"])]
    report.check(
        sorted(e.get("detail", {}).get("object", {}).get("key") for e in events) == sorted(dropped)
        and all(e.get("detail-type") == "Object Created" for e in events),
        f"the uploads' EventBridge events did not all reach the ingest queue: {events}",
    )
    responses = [poll.response for poll in drain(services, stack, "IngestQueueUrl", "IngestFunction")]
    if not report.check(
        bool(responses) and not any(r.get("batchItemFailures") or r.get("errorType") for r in responses),
        f"ingest failed on the dropped images' events: {responses}",
    ):
        return 0
    [execution] = wait_for_executions(stack, 1)
    report.check(execution["status"] == "SUCCEEDED", f"execution {execution['name']}: {execution['status']}")
    # EventBridge delivers at least once: the same event again, in a later SQS batch, starts nothing
    sqs.send_message(QueueUrl=stack.outputs["IngestQueueUrl"], MessageBody=json.dumps(events[0]))
    again = [poll.response for poll in drain(services, stack, "IngestQueueUrl", "IngestFunction")]
    executions = wait_for_executions(stack, 1)
    report.check(
        len(executions) == 1 and again == [{"batchItemFailures": []}],
        f"an event delivered again started another execution or failed: {again}, {len(executions)} executions",
    )
    report.step(
        f"{len(dropped)} images dropped under incoming/: {len(events)} events queued, 1 execution; "
        "one event delivered again started nothing",
        started,
    )
    return len(dropped)


def _scheduled_event(stack: DeployedStack, at: datetime) -> dict[str, Any]:
    """What the Gather function's schedule (an EventBridge rule) sends at ``at``."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": ACCOUNT,
        "time": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": stack.region,
        "resources": [f"arn:aws:events:{stack.region}:{ACCOUNT}:rule/gather-every-minute"],
        "detail": {},
    }


def dropped_images_are_gathered(services: InProcessServices, stack: DeployedStack, report: Report) -> int:
    """The latency dial (MaxWaitMinutes=15): Ingest's mapping on the ingest queue is off; images dropped over a
    quarter of an hour wait there while the Gather function, invoked as its schedule does once a minute (the
    minutes simulated), says it is not time yet; the look that ends the wait starts them as one bulk batch, its task
    stopped after one image as a Spot interruption stops it and run again. That gatherer dies before deleting the
    messages: when they come back, the next gathering deletes them and starts nothing. Returns how many images
    were dropped (0: failed)."""
    import boto3

    from shared.pipeline.gathering import SqsDropQueue

    started = time.monotonic()
    gather = stack.functions["GatherFunction"]
    s3, sqs = boto3.client("s3", region_name=stack.region), boto3.client("sqs", region_name=stack.region)
    noon = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    looks: list[dict[str, Any]] = []

    def look(minute: int) -> dict[str, Any]:
        response, failed = services.invoke(gather, _scheduled_event(stack, noon + timedelta(minutes=minute)))
        looks.append(response)
        return response if not failed else {"failed": response}

    dropped = {
        "incoming/cat.jpg": (SAMPLES / "chelsea-the-cat.jpg").read_bytes(),
        "incoming/coffee.webp": (SAMPLES / "coffee.webp").read_bytes(),
        "incoming/truncated.jpg": (SAMPLES / "chelsea-the-cat.jpg").read_bytes()[:4000],
    }
    report.check(look(0).get("gathered") == 0, f"the first look gathered or failed: {looks[-1]}")
    for minute, (key, body) in zip((1, 7, 13), dropped.items(), strict=True):
        s3.put_object(Bucket=stack.outputs["InputBucketName"], Key=key, Body=body)
        report.check(look(minute).get("due") == "", f"minute {minute}: gathered before the wait was up: {looks[-1]}")
    report.check(
        drain(services, stack, "IngestQueueUrl", "IngestFunction") == [],
        "Lambda polled the ingest queue for Ingest with the dial on",
    )
    received: list[dict[str, Any]] = []
    delete = SqsDropQueue.delete

    def dies_before_deleting(queue: SqsDropQueue, records: list[dict[str, Any]]) -> None:
        received.extend(records)
        raise TimeoutError("Task timed out")  # the gatherer's end, as Lambda would cut it off

    services.interrupt_next_bulk_task = True
    with mock.patch.object(SqsDropQueue, "delete", dies_before_deleting):
        died = look(14)
    [execution] = wait_for_executions(stack, 1)
    batch = json.loads(execution["input"])
    report.check("failed" in died and len(received) == len(dropped), f"the gatherer did not die as meant: {died}")
    report.check(
        execution["status"] == "SUCCEEDED" and batch["lane"] == "bulk" and batch["images"] == len(dropped),
        f"the gathered batch: {execution['status']}, {batch['lane']} lane, {batch['images']} images",
    )
    report.check(
        services.bulk_tasks >= 2, f"the gathered batch's stopped task was not run again: {services.bulk_tasks}"
    )
    for record in received:  # their visibility timeout ends, and they are back
        sqs.change_message_visibility(
            QueueUrl=stack.outputs["IngestQueueUrl"], ReceiptHandle=record["receiptHandle"], VisibilityTimeout=0
        )
    again = look(29)
    report.check(SqsDropQueue.delete is delete, "the gatherer's delete was left patched")
    executions = wait_for_executions(stack, 1)
    left = queued_bodies(sqs, stack.outputs["IngestQueueUrl"])
    report.check(
        again.get("gathered") == len(dropped) and len(executions) == 1 and not left,
        f"the messages back after the gatherer died: {again}, {len(executions)} executions, {len(left)} left",
    )
    report.step(
        f"{len(dropped)} images dropped over 13 minutes waited for the 15-minute look, then ran as one bulk batch "
        f"({batch['lane_reason']}); its stopped task ran again; the gatherer died before deleting, and the next "
        "gathering started nothing twice",
        started,
    )
    return len(dropped)
