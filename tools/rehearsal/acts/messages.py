"""Messages on the prompts queue: one in the Lambda lane (a group handed back once), one in the bulk lane (a task
stopped as Spot stops it), and the malformed and hostile ones that end in the dead-letter queue."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from tools.rehearsal.acts.common import drain, queued_bodies, wait_for_executions
from tools.rehearsal.report import Report
from tools.rehearsal.stack import DeployedStack

if TYPE_CHECKING:
    from tools.rehearsal.services import InProcessServices


def a_prompt_message_is_annotated(
    services: InProcessServices, stack: DeployedStack, report: Report, with_variants: bool
) -> bool:
    """A message naming incoming/. Where the stack waits a second before a hand-back, Detect is refused for one
    image past a child's retries (its first try and the Retry's MaxAttempts): the group is handed back and runs
    again in round 1, its rows the same."""
    import boto3

    started = time.monotonic()
    message: dict[str, Any] = {
        "prompt": "cat. cup.",
        "images": [f"s3://{stack.outputs['InputBucketName']}/incoming/"],
        "caption": False,
        "embeddings": "boxes",
        "masks": True,
    }
    if with_variants:
        # the smallest picture a request may ask for: a 512-pixel one takes 40 s a job here, the same code path
        message["variants"] = {"prompt": "a watercolor painting", "count": 1, "steps": 1, "size": 128}
    hand_back = stack.deployment.parameters.get("HandBackWaitSeconds") == "1"
    if hand_back:
        services.throttle("DetectFunction", "cat.jpg", 1 + _throttle_retries("Detect"))
    if not _message_runs(services, stack, report, message, executions=2):
        return False
    if hand_back:
        listed = boto3.client("s3", region_name=stack.region).list_objects_v2(
            Bucket=stack.outputs["ResultsBucketName"], Prefix="manifests/"
        )
        rounds = [item["Key"] for item in listed.get("Contents", []) if item["Key"].endswith(".groups.1.json")]
        if not report.check(len(rounds) == 1, f"no group was handed back to round 1: {listed.get('Contents')}"):
            return False
    handed_back = "; Detect throttled past its retries, its group ran again" if hand_back else ""
    report.step(
        f"a prompt message naming incoming/ (variants: {'yes' if with_variants else 'no'}) ran{handed_back}", started
    )
    return True


def _throttle_retries(state: str) -> int:
    """How often the workflow's ``state`` retries a throttle within a child."""
    from tools.local.workflow import DEFINITION_PATH, all_states

    [task] = [found for name, found in all_states(json.loads(DEFINITION_PATH.read_text())) if name == state]
    return sum(r["MaxAttempts"] for r in task["Retry"] if "Lambda.TooManyRequestsException" in r["ErrorEquals"])


def _message_runs(
    services: InProcessServices, stack: DeployedStack, report: Report, message: dict[str, Any], executions: int
) -> bool:
    """Send ``message`` to the prompts queue: ingest takes it, and the stack's executions, ``executions`` of them
    now, all succeed."""
    import boto3

    sqs = boto3.client("sqs", region_name=stack.region)
    sqs.send_message(QueueUrl=stack.outputs["PromptsQueueUrl"], MessageBody=json.dumps(message))
    responses = [poll.response for poll in drain(services, stack, "PromptsQueueUrl", "IngestFunction")]
    if not report.check(responses == [{"batchItemFailures": []}], f"ingest failed on {message}: {responses}"):
        return False
    for execution in wait_for_executions(stack, executions):
        report.check(execution["status"] == "SUCCEEDED", f"execution {execution['name']}: {execution['status']}")
    return True


def a_bulk_message_is_annotated(services: InProcessServices, stack: DeployedStack, report: Report) -> bool:
    """A message in the bulk lane: its jobs run as AWS Batch jobs on the deployed job queue (Fargate Spot first), the
    first stopped after one image as a Spot interruption stops it and run again by the job definition's retry
    strategy; every image still ends as one row."""
    started, tasks_before = time.monotonic(), services.bulk_tasks
    message = {
        "prompt": "cat. cup. saucer.",  # another request: another batch, annotated anew
        "images": [f"s3://{stack.outputs['InputBucketName']}/incoming/"],
        "caption": False,
        "lane": "bulk",
    }
    services.interrupt_next_bulk_task = True
    if not _message_runs(services, stack, report, message, executions=3):
        return False
    tasks = services.bulk_tasks - tasks_before
    report.check(tasks >= 2, f"the stopped bulk task was not run again ({tasks} tasks)")
    report.check(
        services.environments_used == {"FARGATE_SPOT"},
        f"the bulk jobs ran on {services.environments_used}, not on Fargate Spot",
    )
    _tasks_reach_s3_privately(services, stack, report)
    report.step(f"a bulk message ran as {tasks} Batch jobs on Fargate Spot, the first stopped after one image", started)
    return True


def _tasks_reach_s3_privately(services: InProcessServices, stack: DeployedStack, report: Report) -> None:
    """In private subnets the tasks ask for no public address (each would be billed), and their subnets' route
    tables carry the stack's S3 gateway endpoint."""
    import boto3

    ec2 = boto3.client("ec2", region_name=stack.region)
    public = {network.get("AssignPublicIp") for network in services.task_networks}
    report.check(public == {"DISABLED"}, f"tasks in private subnets asked for public addresses: {public}")
    subnets = {subnet for network in services.task_networks for subnet in network["Subnets"]}
    tables = ec2.describe_route_tables(Filters=[{"Name": "association.subnet-id", "Values": sorted(subnets)}])
    needed = {table["RouteTableId"] for table in tables["RouteTables"]}
    endpoints = ec2.describe_vpc_endpoints(
        Filters=[{"Name": "service-name", "Values": [f"com.amazonaws.{stack.region}.s3"]}]
    )["VpcEndpoints"]
    served = {table for endpoint in endpoints for table in endpoint.get("RouteTableIds", [])}
    report.check(
        bool(needed) and needed <= served, f"the tasks' route tables {sorted(needed)}: S3 endpoint on {served}"
    )


def refused_messages_reach_the_dead_letter_queue(
    services: InProcessServices, stack: DeployedStack, report: Report
) -> None:
    """Malformed and hostile messages fail on every receive and land in the dead-letter queue after the
    queue's receive limit; none starts anything. The rehearsal's clock: a failed message is made visible
    again at once instead of after the visibility timeout."""
    import boto3

    started = time.monotonic()
    sqs = boto3.client("sqs", region_name=stack.region)
    sfn = boto3.client("stepfunctions", region_name=stack.region)
    before = len(sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"])
    queue_url = stack.outputs["PromptsQueueUrl"]
    refused = [
        "not json",
        json.dumps({"prompt": "cat.", "images": ["/etc/passwd"]}),
        json.dumps({"prompt": "cat.", "images": ["s3://someone-elses-bucket/x.jpg"]}),
    ]
    for body in refused:
        sqs.send_message(QueueUrl=queue_url, MessageBody=body)
    polls = drain(services, stack, "PromptsQueueUrl", "IngestFunction", clock=True)
    dead = queued_bodies(sqs, stack.outputs["PromptsDeadLetterQueueUrl"])
    report.check(
        sorted(dead) == sorted(refused),
        f"{len(dead)} of {len(refused)} refused messages in the prompts dead-letter queue after {len(polls)} polls",
    )
    executions = len(sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"])
    report.check(executions == before, f"refused messages started {executions - before} executions")
    report.step(
        f"{len(refused)} malformed or hostile messages, refused on each of {len(polls)} polls, reached the prompts "
        "dead-letter queue and started nothing",
        started,
    )
