"""The latency dial on moto: dropped images' events wait in the ingest queue until their wait is up (or a bulk
task's worth waits), then start as one batch in the lane the rule picks, each image once, whatever dies."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from moto import mock_aws

from shared.contracts import BatchInput
from shared.pipeline import gathering, ingest
from shared.pipeline.batches import gathered_lane
from shared.pipeline.claims import Pass
from shared.pipeline.gathering import SqsDropQueue, TableClock, gather_drops, gather_due
from shared.settings import IngestSettings, Settings
from shared.storage import objects as storage
from tests.conftest import SAMPLES
from tests.integration.test_ingest import S3_EVENT
from tools.local.runner import create_idempotency_table

REGION = "us-east-1"
NOON = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def dial(minutes: int = 15, **update: Any) -> IngestSettings:
    return Settings(
        max_wait_minutes=minutes,
        results_uri="s3://annotate-results",
        input_buckets=["annotate-input"],
        idempotency_table="annotate-idempotency",
        **update,
    ).ingest


@pytest.fixture
def aws() -> Iterator[dict[str, Any]]:
    with mock_aws():
        storage.refresh_clients()
        ingest.refresh_clients()
        s3 = boto3.client("s3", region_name=REGION)
        for bucket in ("annotate-input", "annotate-results"):
            s3.create_bucket(Bucket=bucket)
        create_idempotency_table("annotate-idempotency", REGION)
        sqs = boto3.client("sqs", region_name=REGION)
        url = sqs.create_queue(QueueName="annotate-ingest", Attributes={"VisibilityTimeout": "1800"})["QueueUrl"]
        sfn = boto3.client("stepfunctions", region_name=REGION)
        definition = json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}})
        arn = sfn.create_state_machine(
            name="annotate", definition=definition, roleArn="arn:aws:iam::123456789012:role/sfn"
        )["stateMachineArn"]
        yield {"s3": s3, "sqs": sqs, "url": url, "sfn": sfn, "arn": arn}
    storage.refresh_clients()
    ingest.refresh_clients()


def drop(aws: dict[str, Any], count: int, start: int = 0) -> None:
    """``count`` images put into the input bucket, each object-created event sent to the ingest queue."""
    cat = (SAMPLES / "chelsea-the-cat.jpg").read_bytes()
    for number in range(start, start + count):
        key = f"incoming/cat-{number}.jpg"
        etag = aws["s3"].put_object(Bucket="annotate-input", Key=key, Body=cat + key.encode())["ETag"].strip('"')
        event = copy.deepcopy(S3_EVENT)
        event["detail"]["object"].update(key=key, etag=etag)
        aws["sqs"].send_message(QueueUrl=aws["url"], MessageBody=json.dumps(event))


def look(aws: dict[str, Any], settings: IngestSettings, now: datetime, queue: Any = None) -> gathering.GatherReport:
    starter = ingest.StepFunctionsStarter(aws["sfn"], aws["arn"])
    queue = queue or SqsDropQueue(aws["sqs"], aws["url"])
    clock = TableClock(boto3.client("dynamodb", region_name=REGION), "annotate-idempotency")
    holder = Pass(id=f"look-{now.isoformat()}", deadline=time.time() + 300)
    return gather_drops(queue, clock, settings, starter, storage.store_for, now, holder, ["annotate-input"])


def batches(aws: dict[str, Any]) -> list[BatchInput]:
    listed = aws["sfn"].list_executions(stateMachineArn=aws["arn"])["executions"]
    return [
        BatchInput.model_validate_json(aws["sfn"].describe_execution(executionArn=e["executionArn"])["input"])
        for e in listed
    ]


def queued(aws: dict[str, Any]) -> int:
    attributes = aws["sqs"].get_queue_attributes(
        QueueUrl=aws["url"], AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


def test_the_rule_takes_the_bulk_lane_when_a_task_pays_and_ends_within_the_wait() -> None:
    settings = dial(15)
    per_task = int((15 * 60 - settings.bulk_task_start_s) // settings.bulk_seconds_per_image)
    assert gathered_lane(177, settings).lane == "bulk"  # the study's 17,000 a day, gathered for 15 minutes
    assert gathered_lane(177, settings).images_per_task == per_task
    assert "within the 15 min wait" in gathered_lane(177, settings).reason
    assert gathered_lane(1, settings).lane == "lambda"  # one task's start and model load costs more than Lambda
    assert gathered_lane(1, dial(15, gathered_bulk_from_images=1)).lane == "bulk"
    assert gathered_lane(177, dial(1)).lane == "lambda"  # the start and model load outlast a minute's wait
    assert gathered_lane(177, dial(15, bulk_enabled=False)).reason == "the stack has no bulk lane"
    # More tasks than the account's Fargate vCPUs run at once (3 of 2 vCPUs on 6): Lambda ends it in time instead
    assert gathered_lane(per_task * 3, dial(15, fargate_vcpus=6)).lane == "bulk"
    assert gathered_lane(per_task * 3 + 1, dial(15, fargate_vcpus=6)).lane == "lambda"


def test_a_gathered_bulk_batch_has_as_few_tasks_as_end_within_the_wait() -> None:
    from shared.contracts import PromptMessage
    from shared.pipeline.batches import plan_batches
    from shared.storage.objects import MemoryStore

    settings = dial(15).model_copy(update={"results_root": "mem://results"})
    store = MemoryStore()
    for number in range(150):
        store.write_bytes(f"mem://input/{number}.jpg", b"image %d" % number)
    message = PromptMessage(prompt="dog.", images=[f"mem://input/{number}.jpg" for number in range(150)])
    [planned] = plan_batches(message, settings, store, choice=gathered_lane(150, settings))
    # one task ((15 min - 76.5 s) / 5.03 s: 163 images end within the wait), its 150 images in groups of 38 at most
    # (40 is the most a group holds)
    assert (planned.input.lane, planned.input.bulk_jobs, planned.input.groups) == ("bulk", 1, 4)
    assert max(len(group.images) for group in planned.groups) == 38
    [(_, job)] = planned.bulk_jobs()
    assert sum(len(group.images) for group in job.groups) == 150


def test_gathering_is_due_when_the_wait_is_up_or_a_bulk_task_s_worth_waits() -> None:
    settings = dial(15)
    fill = gathered_lane(10_000, settings).images_per_task
    assert gather_due(NOON, None, 0, settings) == "every 15 min"
    assert gather_due(NOON + timedelta(minutes=13), NOON, 5, settings) == ""
    # the schedule looks once a minute: the look a minute before the wait is up gathers, so none waits longer
    assert gather_due(NOON + timedelta(minutes=14), NOON, 5, settings) == "every 15 min"
    assert gather_due(NOON + timedelta(minutes=2), NOON, fill, settings) == f"{fill} images fill a bulk task"


def test_drops_wait_then_start_as_one_bulk_batch_and_leave_the_queue(aws: dict[str, Any]) -> None:
    settings = dial(15)
    # GIVEN a look at noon, when nothing waits, then an image dropped each minute for 13 minutes
    assert look(aws, settings, NOON).gathered == 0
    for minute in range(13):
        drop(aws, 1, start=minute)
        assert look(aws, settings, NOON + timedelta(minutes=minute, seconds=30)).due == ""
    assert batches(aws) == [] and queued(aws) == 13
    # WHEN the look a minute before the wait is up comes
    report = look(aws, settings, NOON + timedelta(minutes=14))
    # THEN every image starts in one batch, in the bulk lane, and the queue is empty
    [batch] = batches(aws)
    assert (report.gathered, report.returned, report.lane) == (13, 0, "bulk")
    assert (batch.lane, batch.images, batch.bulk_jobs) == ("bulk", 13, 1)
    assert batch.lane_reason == report.lane_reason and "bulk task" in batch.lane_reason
    assert queued(aws) == 0


def test_a_gatherer_that_dies_before_deleting_starts_nothing_twice(aws: dict[str, Any]) -> None:
    received: list[dict[str, Any]] = []

    class DiesBeforeDeleting(SqsDropQueue):
        def delete(self, records: list[dict[str, Any]]) -> None:
            received.extend(records)
            raise TimeoutError("the gatherer's time ran out")

    settings = dial(15)
    drop(aws, 5)
    with pytest.raises(TimeoutError):
        look(aws, settings, NOON, DiesBeforeDeleting(aws["sqs"], aws["url"]))
    assert len(batches(aws)) == 1 and len(received) == 5
    for record in received:  # their visibility timeout ends: the messages are back
        aws["sqs"].change_message_visibility(
            QueueUrl=aws["url"], ReceiptHandle=record["receiptHandle"], VisibilityTimeout=0
        )
    report = look(aws, settings, NOON + timedelta(minutes=15))
    assert (report.gathered, report.returned) == (5, 0)
    assert len(batches(aws)) == 1 and queued(aws) == 0  # their claims said they had started: deleted, not started


def test_a_malformed_message_is_left_for_the_next_look_and_the_rest_start(aws: dict[str, Any]) -> None:
    settings = dial(15)
    drop(aws, 2)
    aws["sqs"].send_message(QueueUrl=aws["url"], MessageBody="{not json")
    report = look(aws, settings, NOON)
    # the two images start; the malformed message is visible again at once, for the queue's receive limit to end
    assert (report.gathered, report.returned) == (3, 1) and len(batches(aws)) == 1
    [back] = aws["sqs"].receive_message(QueueUrl=aws["url"], MaxNumberOfMessages=10)["Messages"]
    assert back["Body"] == "{not json"
