"""What the acts share: the samples they drop, and how they wait for the stack's executions and queues."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tools.rehearsal.stack import REPO, DeployedStack

if TYPE_CHECKING:
    from tools.rehearsal.services import InProcessServices

SAMPLES = REPO / "samples"
MAX_WAIT_S = 900


def wait_for_executions(stack: DeployedStack, expected: int) -> list[dict[str, Any]]:
    import boto3

    sfn = boto3.client("stepfunctions", region_name=stack.region)
    deadline = time.monotonic() + MAX_WAIT_S
    while True:
        executions = sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
        if len(executions) >= expected and all(e["status"] != "RUNNING" for e in executions):
            return [sfn.describe_execution(executionArn=e["executionArn"]) for e in executions]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(executions)} executions, some still running after {MAX_WAIT_S} s")
        time.sleep(0.2)


def drain(
    services: InProcessServices, stack: DeployedStack, queue_output: str, function: str, clock: bool = False
) -> list[Any]:
    """Poll the queue until it has nothing visible. ``clock``: the rehearsal's clock, which makes a failed
    message visible again at once instead of after the queue's visibility timeout."""
    import boto3

    sqs = boto3.client("sqs", region_name=stack.region)
    url = stack.outputs[queue_output]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    polls = []
    while (poll := services.poll(arn, stack.functions[function])) is not None:
        polls.append(poll)
        for receipt in poll.failed_receipts if clock else []:
            sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=receipt, VisibilityTimeout=0)
    return polls


def queued_bodies(sqs: Any, queue_url: str) -> list[str]:
    """The queue's messages (ten at most), read without consuming them: made visible again at once. Peeking counts
    as a receive in SQS; the receive limit is rehearsed on the prompts queue, not here."""
    bodies = []
    for message in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", []):
        bodies.append(message["Body"])
        sqs.change_message_visibility(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0)
    return bodies
