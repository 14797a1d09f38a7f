"""The rehearsal: deploy template.yaml on moto and play the user's story through the deployed resources.

    python -m tools.rehearsal            # make rehearse: both configurations, a report, exit 1 on a failure

Everything comes from the deployed stack: names from its outputs, each function's handler, environment,
memory, timeout and role from Lambda, the workflow as CloudFormation substituted it. Every AWS request a
deployed principal makes is checked against that principal's deployed policies.

One piece: the story is one sequence, told in order, each act reading what the ones before deployed and sent.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

from shared.settings import Profile, Settings
from shared.storage.tables import SCHEMAS
from tools.rehearsal.aws_behaviours import (
    PublishFailed,
    missing_keys_answer_403,
    publish_versions,
    versions_replaced,
)
from tools.rehearsal.calls import record_calls
from tools.rehearsal.iam import Statement, evaluate
from tools.rehearsal.operable import check_operable
from tools.rehearsal.report import Report
from tools.rehearsal.stack import ACCOUNT, MOTO_CONFIG, REPO, DeployedStack, Deployment, deploy, policies, redeploy

REGION = "eu-central-1"  # anything but us-east-1, boto3's and many tools' silent default
SAMPLES = REPO / "samples"
MAX_WAIT_S = 900


def default_deployments() -> list[tuple[Deployment, bool]]:
    """The two configurations: `sam deploy` with only the required answers (variants off, no VPC), and with
    everything on: variants, the bulk lane and the API (the rehearsal makes the VPC the user would name)."""
    everything = {"EnableVariants": "true", "EnableBulk": "true", "EnableApi": "true", "ApiAuth": "API_KEY"}
    everything |= {"HandBackWaitSeconds": "1"}  # its prompt message's group is handed back once: wait a second
    everything |= {"MaxWaitMinutes": "15"}  # its dropped images are gathered
    return [
        (Deployment("annotate-rehearsal", REGION), False),
        (Deployment("annotate-variants", REGION, everything), True),
    ]


def _network(region: str) -> dict[str, str]:
    """Private subnets, each with its own route table, as a user without public subnets names them: the tasks get
    no public address, and the stack adds its S3 gateway endpoint to those route tables."""
    import boto3

    ec2 = boto3.client("ec2", region_name=region)
    vpc = ec2.create_vpc(CidrBlock="10.8.0.0/16")["Vpc"]["VpcId"]
    subnets, route_tables = [], []
    for i, zone in enumerate("ab"):
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.8.{i}.0/24", AvailabilityZone=f"{region}{zone}")
        subnets.append(subnet["Subnet"]["SubnetId"])
        route_tables.append(ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"])
        ec2.associate_route_table(RouteTableId=route_tables[-1], SubnetId=subnets[-1])
    return {
        "VpcId": vpc,
        "SubnetA": subnets[0],
        "SubnetB": subnets[1],
        "TaskPublicIp": "DISABLED",
        "S3GatewayRouteTables": ",".join(route_tables),
    }


def rehearse(deployment: Deployment, with_variants: bool, settings: Settings | None = None) -> Report:
    """Deploy and play the story on a fresh moto; the report says what happened and what failed."""
    from moto import mock_aws

    from shared.pipeline import gathering, ingest
    from shared.storage import objects as storage

    # The user's shell is set for the stack's region (README: export AWS_REGION), as `sam deploy` was, and so
    # are Lambda's and ECS's environments. EMF metrics would go to stdout here, not to CloudWatch. moto decodes
    # the aws-chunked bodies of botocore's default upload checksums at about 15 MB/s, far too slow for the
    # 0.85 GB diffusion model: checksums only where an API requires them.
    region = {
        "AWS_REGION": deployment.region,
        "AWS_DEFAULT_REGION": deployment.region,
        "POWERTOOLS_METRICS_DISABLED": "true",
        "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
    }
    with (
        mock_aws(config=MOTO_CONFIG),
        mock.patch.dict(os.environ, region),
        record_calls(deployment.region, ACCOUNT) as log,
    ):
        storage.refresh_clients()  # clients made before the call log would go unrecorded
        ingest.refresh_clients()
        gathering.deployed_gatherer.cache_clear()
        if with_variants:
            deployment = replace(deployment, parameters=deployment.parameters | _network(deployment.region))
        report = Report(deployment)
        started = time.monotonic()
        stack = deploy(deployment)
        report.completed, report.not_rehearsed = stack.completed, stack.not_rehearsed
        report.step(f"deployed: {len(stack.resources)} resources, {len(stack.functions)} functions", started)
        settings = settings or Settings(profile=Profile.TINY)
        if _published(stack, report, settings):
            check_operable(stack, report)
            _story(stack, report, with_variants, settings, log)
        report.calls = list(log.calls)
        report.failures += log.problems
        _check_iam(stack, report)
    storage.refresh_clients()
    ingest.refresh_clients()
    gathering.deployed_gatherer.cache_clear()
    return report


def _published(stack: DeployedStack, report: Report, settings: Settings, only: list[str] | None = None) -> bool:
    """CloudFormation publishes each SnapStart function's version while it creates the stack (``only`` those an
    update replaces), and Lambda runs the function's init for its snapshot then (aws_behaviours): a failure there
    fails the deployment."""
    from tools.rehearsal.services import settings_of

    started = time.monotonic()
    try:
        published = publish_versions(stack, lambda function: settings_of(function.environment), only)
    except PublishFailed as error:
        report.failures.append(f"the deployment failed: {error}")
        return False
    if published:
        report.step(f"SnapStart versions published, their init run: {', '.join(published)}", started)
    return True


def _check_iam(stack: DeployedStack, report: Report) -> None:
    report.policies = {principal: policies(stack, arn) for principal, arn in stack.principals.items()}
    used: set[str] = set()
    for call in report.calls:
        principal_statements = report.policies.get(call.request.principal)
        if principal_statements is None:
            report.failures.append(f"{call.request.principal} has no role in the stack: {call.request}")
            continue
        decision = evaluate(principal_statements, call.request)
        used |= {f"{call.request.principal}: {s.name}" for s in decision.allowed_by}
        report.check(decision.allowed, f"DENIED {call.request}")
        # Same account: the identity policy allows, and the bucket's policy may still deny.
        bucket_denies = evaluate(stack.bucket_policy(call.request.resource), call.request).denied_by
        report.check(not bucket_denies, f"DENIED by {[s.name for s in bucket_denies]}: {call.request}")
    declared = {f"{p}: {s.name}" for p, found in report.policies.items() for s in found if s.effect == "Allow"}
    # AWS-managed policies are shared wholesale; only the template's own statements should all be needed.
    report.unused_statements = sorted(s for s in declared - used if ":iam::aws:policy/" not in s)


def _wait_for_executions(stack: DeployedStack, expected: int) -> list[dict[str, Any]]:
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


def _drain(services: Any, stack: DeployedStack, queue_output: str, function: str, clock: bool = False) -> list[Any]:
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


def _story(stack: DeployedStack, report: Report, with_variants: bool, settings: Settings, log: Any) -> None:
    from tools.rehearsal.services import InProcessServices

    _push_models(stack, report, with_variants, settings)
    if stack.deployment.redeploy_with:
        before = stack.deployment.parameters
        stack = redeploy(stack)
        overrides = ", ".join(f"{k}={v}" for k, v in stack.deployment.redeploy_with.items())
        try:
            replaced = versions_replaced(stack.template, before, stack.deployment.parameters)
        except PublishFailed as error:
            report.failures.append(f"the update failed: {error}")
            return
        report.steps.append(f"deployed again with {overrides}")
        if not _published(stack, report, settings, replaced):
            return
    services = InProcessServices(stack, log)
    batches = 0
    with services.serving(), missing_keys_answer_403(stack, log):
        if "GatherFunction" in stack.functions:
            dropped = _dropped_images_are_gathered(services, stack, report)
        else:
            dropped = _dropped_images_are_annotated(services, stack, report)
        if dropped and _a_prompt_message_is_annotated(services, stack, report, with_variants):
            batches = 2
            if "BulkCluster" in stack.resources and _a_bulk_message_is_annotated(services, stack, report):
                batches = 3
            _refused_messages_reach_the_dead_letter_queue(services, stack, report)
    if dropped:
        _results_where_athena_reads_them(stack, report, dropped, batches, with_variants=with_variants)
    with services.serving(), missing_keys_answer_403(stack, log):  # after the rows are counted: it writes one
        _missing_objects_read_as_missing(services, stack, report)
        if "ApiFunction" in stack.functions:
            _the_api_answers_through_its_url(services, stack, report)
    report.failures += services.problems


def _push_models(stack: DeployedStack, report: Report, with_variants: bool, settings: Settings) -> None:
    import boto3

    from tools.models.push import push_models, stack_model_uris

    started = time.monotonic()
    cloudformation = boto3.client("cloudformation", region_name=stack.region)
    pushed = push_models(settings, stack_model_uris(stack.deployment.stack_name, cloudformation))
    expected = {"DetectorModelUri", "ClassifierModelUri", "TaggerModelUri", "CaptionModelUri"}
    expected |= {"VariantsModelUri"} if with_variants else set()
    report.check({p.output for p in pushed} == expected, f"models push missed outputs: {[p.output for p in pushed]}")
    report.step(
        "models pushed where the outputs say: " + ", ".join(f"{p.output} ({p.files} files)" for p in pushed), started
    )


def _dropped_images_are_annotated(services: Any, stack: DeployedStack, report: Report) -> int:
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
    events = [json.loads(body) for body in _queued_bodies(sqs, stack.outputs["IngestQueueUrl"])]
    report.check(
        sorted(e.get("detail", {}).get("object", {}).get("key") for e in events) == sorted(dropped)
        and all(e.get("detail-type") == "Object Created" for e in events),
        f"the uploads' EventBridge events did not all reach the ingest queue: {events}",
    )
    responses = [poll.response for poll in _drain(services, stack, "IngestQueueUrl", "IngestFunction")]
    if not report.check(
        bool(responses) and not any(r.get("batchItemFailures") or r.get("errorType") for r in responses),
        f"ingest failed on the dropped images' events: {responses}",
    ):
        return 0
    [execution] = _wait_for_executions(stack, 1)
    report.check(execution["status"] == "SUCCEEDED", f"execution {execution['name']}: {execution['status']}")
    # EventBridge delivers at least once: the same event again, in a later SQS batch, starts nothing
    sqs.send_message(QueueUrl=stack.outputs["IngestQueueUrl"], MessageBody=json.dumps(events[0]))
    again = [poll.response for poll in _drain(services, stack, "IngestQueueUrl", "IngestFunction")]
    executions = _wait_for_executions(stack, 1)
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


def _dropped_images_are_gathered(services: Any, stack: DeployedStack, report: Report) -> int:
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
        _drain(services, stack, "IngestQueueUrl", "IngestFunction") == [],
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
    [execution] = _wait_for_executions(stack, 1)
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
    executions = _wait_for_executions(stack, 1)
    left = _queued_bodies(sqs, stack.outputs["IngestQueueUrl"])
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


def _a_prompt_message_is_annotated(services: Any, stack: DeployedStack, report: Report, with_variants: bool) -> bool:
    """A message naming incoming/. Where the stack waits a second before a hand-back, Detect is refused for one
    image past a child's retries (its first try and the Retry's MaxAttempts): the group is handed back and runs
    again in round 1, its rows the same."""
    import boto3

    started = time.monotonic()
    message: dict[str, Any] = {
        "prompt": "cat. cup.",
        "images": [f"s3://{stack.outputs['InputBucketName']}/incoming/"],
        "caption": False,
    }
    if with_variants:
        message["variants"] = {"prompt": "a watercolor painting", "count": 1, "steps": 1}
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
    services: Any, stack: DeployedStack, report: Report, message: dict[str, Any], executions: int
) -> bool:
    """Send ``message`` to the prompts queue: ingest takes it, and the stack's executions, ``executions`` of them
    now, all succeed."""
    import boto3

    sqs = boto3.client("sqs", region_name=stack.region)
    sqs.send_message(QueueUrl=stack.outputs["PromptsQueueUrl"], MessageBody=json.dumps(message))
    responses = [poll.response for poll in _drain(services, stack, "PromptsQueueUrl", "IngestFunction")]
    if not report.check(responses == [{"batchItemFailures": []}], f"ingest failed on {message}: {responses}"):
        return False
    for execution in _wait_for_executions(stack, executions):
        report.check(execution["status"] == "SUCCEEDED", f"execution {execution['name']}: {execution['status']}")
    return True


def _a_bulk_message_is_annotated(services: Any, stack: DeployedStack, report: Report) -> bool:
    """A message in the bulk lane: its jobs run as Fargate tasks (Spot first, as deployed), the first stopped after
    one image as a Spot interruption stops it and run again; every image still ends as one row."""
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
        services.capacity_providers_used == {"FARGATE_SPOT"},
        f"the bulk tasks ran on {services.capacity_providers_used}, not on Fargate Spot",
    )
    _tasks_reach_s3_privately(services, stack, report)
    report.step(f"a bulk message ran as {tasks} Fargate Spot tasks, the first stopped after one image", started)
    return True


def _tasks_reach_s3_privately(services: Any, stack: DeployedStack, report: Report) -> None:
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


def _missing_objects_read_as_missing(services: Any, stack: DeployedStack, report: Report) -> None:
    """An image deleted after it was planned, and a result document that was never written, are each told as missing
    (a failure that says so, a failure row), not as access denied: S3's 403 to a role that may not list the bucket
    is rehearsed (aws_behaviours)."""
    from shared.contracts import (
        AnnotationRequest,
        Box,
        DescribeInput,
        Detection,
        ImageOutcome,
        ImageRef,
        ImageTask,
        Status,
        WriteGroupTableInput,
    )

    started = time.monotonic()
    request = AnnotationRequest(prompt="cat.")
    results = f"s3://{stack.outputs['ResultsBucketName']}"
    image = ImageRef(image_id="0" * 16, source_uri=f"s3://{stack.outputs['InputBucketName']}/incoming/deleted.jpg")
    task = ImageTask(batch_id="b-missing", request=request, image=image, results_uri=results)
    box = Detection(label="cat", score=0.9, box=Box(x0=0, y0=0, x1=10, y1=10))
    described = DescribeInput(task=task, detections=[box]).model_dump(mode="json")
    for function, payload in (
        ("DetectFunction", task.model_dump(mode="json")),
        ("ClassifyFunction", described),
        ("TagFunction", described),
    ):
        response, failed = services.invoked_by_state_machine(stack.functions[function].arn, None, payload)
        report.check(
            failed and "does not exist" in response.get("errorMessage", ""),
            f"{function} on a deleted image did not say it does not exist: {response.get('errorMessage', response)}",
        )
    outcome = ImageOutcome(image=image, status=Status.SUCCEEDED, result_uri=f"{results}/results/never-written.json")
    group = WriteGroupTableInput(
        batch_id="b-missing",
        group_id="g-000000",
        request=request,
        results_uri=results,
        planned_at=datetime.now(UTC),
        outcomes=[outcome],
    )
    table = stack.functions["WriteGroupTableFunction"].arn
    response, failed = services.invoked_by_state_machine(table, None, group.model_dump(mode="json"))
    report.check(
        not failed and response.get("failed") == 1,
        f"WriteGroupTable did not record a missing result document as a failure row: {response}",
    )
    report.step("a deleted image and an unwritten result document were each told as missing, not as denied", started)


@dataclass
class _FunctionUrl:
    """Calls to the API function's URL as a client makes them: refused by the URL as AWS would (aws_behaviours), or
    handed to the deployed function (as its role, with its environment) as a payload 2.0 event."""

    services: Any
    stack: DeployedStack
    url: str
    auth_type: str
    resource_policy: list[dict[str, Any]]

    def call(
        self, method: str, path: str, *, caller: list[Statement] | None = None, **request: Any
    ) -> tuple[int, bytes]:
        import base64

        import httpx

        from tools.rehearsal.aws_behaviours import function_url_event, function_url_refusal, payload_refusal

        function = self.stack.functions["ApiFunction"]
        refusal = function_url_refusal(self.resource_policy, self.auth_type, f"{function.arn}:live", caller)
        if refusal:
            return 403, refusal.encode()
        built = httpx.Request(method, f"{self.url.rstrip('/')}{path}", **request)
        caller_arn = f"arn:aws:iam::{ACCOUNT}:role/ApiCaller" if caller is not None else ""
        event = function_url_event(self.url, method, path, built.read(), dict(built.headers), caller_arn)
        if too_large := payload_refusal(event):
            return too_large[0], too_large[1].encode()
        response, failed = self.services.invoke(function, event)
        if too_large := payload_refusal(event, response):
            return too_large[0], too_large[1].encode()
        if failed:
            return 502, json.dumps(response).encode()
        body = response.get("body", "")
        return int(response["statusCode"]), base64.b64decode(body) if response.get("isBase64Encoded") else body.encode()


def _the_api_answers_through_its_url(services: Any, stack: DeployedStack, report: Report) -> None:
    """The API function behind its function URL: the URL lets through only what its auth type and policies allow
    (both permissions since October 2025); a recorded annotation of an input-bucket image lands where the workflow's
    results do, with its row (WriteGroupTable, invoked by the API's role); an upload, a streamed chat; the key
    checked in API_KEY mode."""
    import boto3

    from shared.models.cache import forget_loaded_models
    from shared.models.sources import forget_model_files
    from tools.rehearsal.iam import statements

    started = time.monotonic()
    forget_loaded_models()  # the API's environment reads its own models, as its role
    forget_model_files()
    function = stack.functions["ApiFunction"]
    client = boto3.client("lambda", region_name=stack.region)
    config = client.get_function_url_config(FunctionName=function.name, Qualifier="live")
    policy = (
        json.loads(client.get_policy(FunctionName=function.name)["Policy"])["Statement"]
        if config["AuthType"] == "NONE"
        else []
    )
    url = _FunctionUrl(services, stack, config["FunctionUrl"], config["AuthType"], policy)
    live = f"{function.arn}:live"
    signer = statements(
        "ApiCaller",
        {
            "Statement": [
                {"Effect": "Allow", "Action": ["lambda:InvokeFunctionUrl", "lambda:InvokeFunction"], "Resource": live}
            ]
        },
    )
    url_only = statements(
        "ApiCaller", {"Statement": [{"Effect": "Allow", "Action": "lambda:InvokeFunctionUrl", "Resource": live}]}
    )
    headers: dict[str, str] = {}
    caller: list[Statement] | None = signer
    if config["AuthType"] == "NONE":
        secret = boto3.client("secretsmanager", region_name=stack.region)
        key = secret.get_secret_value(SecretId=stack.outputs["ApiKeySecretArn"])["SecretString"]
        headers, caller = {"Authorization": f"Bearer {key}"}, None
        status, _ = url.call("GET", "/v1/models")
        report.check(status == 401, f"the API in API_KEY mode answered {status} to a call without the key")
    else:
        status, _ = url.call("GET", "/health")
        report.check(status == 403, f"an unsigned call to the AWS_IAM URL got {status}, not 403")
        status, _ = url.call("GET", "/health", caller=url_only)
        report.check(status == 403, f"a caller without lambda:InvokeFunction got {status} from the URL, not 403")
    image = f"s3://{stack.outputs['InputBucketName']}/incoming/cat.jpg"
    asked = {"prompt": "cat.", "caption": False, "record": True, "image": image}
    status, body = url.call("POST", "/v1/annotations", json=asked, headers=headers, caller=caller)
    answer = json.loads(body) if status == 200 else {}
    report.check(
        status == 200 and answer.get("status") == "succeeded", f"the API's recorded annotation: {status} {body[:300]!r}"
    )
    if answer:
        bucket, key = answer["result_uri"].removeprefix("s3://").split("/", 1)
        report.check(bucket == stack.outputs["ResultsBucketName"], f"the recorded result went to {bucket}")
        boto3.client("s3", region_name=stack.region).head_object(Bucket=bucket, Key=key)
    gone = asked | {"image": f"s3://{stack.outputs['InputBucketName']}/incoming/deleted.jpg", "record": False}
    status, body = url.call("POST", "/v1/annotations", json=gone, headers=headers, caller=caller)
    report.check(status == 400 and b"does not exist" in body, f"the API on a missing image: {status} {body[:300]!r}")
    upload = {"image": ("coffee.webp", (SAMPLES / "coffee.webp").read_bytes(), "image/webp")}
    status, body = url.call(
        "POST",
        "/v1/annotations",
        files=upload,
        data={"request": '{"prompt": "cup.", "picture": true}'},
        headers=headers,
        caller=caller,
    )
    report.check(status == 200 and b'"picture_base64":"' in body, f"the API's upload: {status} {body[:300]!r}")
    _answers_fit_the_url(url, stack, headers, caller, report)
    chat = {"messages": [{"role": "user", "content": "Name a cat."}], "max_tokens": 8, "stream": True}
    status, body = url.call("POST", "/v1/chat/completions", json=chat, headers=headers, caller=caller)
    report.check(
        status == 200 and body.rstrip().endswith(b"data: [DONE]"), f"the API's streamed chat: {status} {body[:300]!r}"
    )
    status, _ = url.call("POST", "/v1/images/generations", json={"prompt": "a cat"}, headers=headers, caller=caller)
    report.check(status == 501, f"the Lambda API has no image model, yet answered {status}")
    report.step(
        f"the API answered through its {config['AuthType']} function URL: a recorded annotation, an upload, a chat",
        started,
    )


def _answers_fit_the_url(
    url: _FunctionUrl, stack: DeployedStack, headers: dict[str, str], caller: list[Statement] | None, report: Report
) -> None:
    """Lambda's 6 MB each way (aws_behaviours): a 12-megapixel photo's annotated picture comes back whole, within it
    (a JPEG); a body over the app's bound gets the app's 413 in OpenAI's shape, one over Lambda's the URL's own."""
    import io

    import boto3
    from PIL import Image

    photo = Image.open(SAMPLES / "chelsea-the-cat.jpg").convert("RGB").resize((4000, 3000))
    encoded = io.BytesIO()
    photo.save(encoded, format="JPEG", quality=95)
    bucket = stack.outputs["InputBucketName"]
    boto3.client("s3", region_name=stack.region).put_object(
        Bucket=bucket, Key="incoming/large.jpg", Body=encoded.getvalue()
    )
    asked = {"prompt": "cat.", "caption": False, "picture": True, "image": f"s3://{bucket}/incoming/large.jpg"}
    status, body = url.call("POST", "/v1/annotations", json=asked, headers=headers, caller=caller)
    scale = json.loads(body).get("picture_scale") if status == 200 else None
    report.check(status == 200 and scale == 1.0, f"a 4000x3000 photo's picture: {status} {body[:300]!r}")
    for size, expected in ((4_600_000, b'"body_too_large"'), (7_000_000, b"Request must be smaller")):
        upload = {"image": ("big.png", b"\x89PNG" + bytes(size), "image/png")}
        status, body = url.call("POST", "/v1/annotations", files=upload, headers=headers, caller=caller)
        report.check(status == 413 and expected in body, f"a {size:,}-byte upload: {status} {body[:200]!r}")


def _queued_bodies(sqs: Any, queue_url: str) -> list[str]:
    """The queue's messages (ten at most), read without consuming them: made visible again at once. Peeking counts
    as a receive in SQS; the receive limit is rehearsed on the prompts queue, not here."""
    bodies = []
    for message in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", []):
        bodies.append(message["Body"])
        sqs.change_message_visibility(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0)
    return bodies


def _refused_messages_reach_the_dead_letter_queue(services: Any, stack: DeployedStack, report: Report) -> None:
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
    polls = _drain(services, stack, "PromptsQueueUrl", "IngestFunction", clock=True)
    dead = _queued_bodies(sqs, stack.outputs["PromptsDeadLetterQueueUrl"])
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


def _results_where_athena_reads_them(
    stack: DeployedStack, report: Report, dropped: int, batches: int, with_variants: bool
) -> None:
    """The rows are where the Glue tables' projection points, every image of every batch has exactly one, the named
    queries run on them (Athena's SQL through sqlglot on DuckDB)."""
    images = dropped * max(batches, 1)
    with tempfile.TemporaryDirectory(prefix="rehearsal-tables-") as folder:
        _download_todays_tables(stack, report, Path(folder))
        _check_rows(report, Path(folder), images, max(batches, 1), with_variants)
        _run_named_queries(stack, report, Path(folder))
        _query_the_views(stack, report, Path(folder), images)


def _download_todays_tables(stack: DeployedStack, report: Report, local: Path) -> None:
    import boto3

    glue = boto3.client("glue", region_name=stack.region)
    s3 = boto3.client("s3", region_name=stack.region)
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    for table in glue.get_tables(DatabaseName=stack.outputs["GlueDatabaseName"])["TableList"]:
        if table.get("TableType") == "VIRTUAL_VIEW" or table["Name"] not in SCHEMAS:
            continue  # a view, or the evaluations table, which annotate evaluate writes, not the stack
        location = table["Parameters"]["storage.location.template"].replace("${dt}", today)
        bucket, prefix = location.removeprefix("s3://").split("/", 1)
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])]
        report.check(bool(keys), f"no {table['Name']} files under {location}, where the Glue table reads today")
        for key in keys:
            target = local / key
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, key, str(target))


def _check_rows(report: Report, local: Path, images: int, batches: int, with_variants: bool) -> None:
    from tools.results.query import run_local_query

    rows = run_local_query("SELECT source_uri, status, failed_step, error, variants_model FROM images", local)
    rows = rows.to_pylist()
    per_image = Counter(r["source_uri"] for r in rows)
    report.check(len(rows) == images, f"{len(rows)} image rows for {images} images: {per_image}")
    failed = [r for r in rows if r["status"] == "failed"]
    report.check(
        [r["source_uri"].rsplit("/", 1)[-1] for r in failed] == ["truncated.jpg"] * batches,
        f"expected truncated.jpg, dropped and named in the messages, to be the only failures: {failed}",
    )
    if with_variants:
        report.check(any(r["variants_model"] for r in rows), f"no row carries variants: {rows}")
    report.steps.append(f"{len(rows)} image rows ({len(failed)} failed) where the Glue tables' projection reads them")


def _query_the_views(stack: DeployedStack, report: Report, local: Path, images: int) -> None:
    """Each Glue view, decoded as Athena decodes it, runs on the deployed results; images_latest gives one row per
    source image."""
    import base64

    import boto3
    import sqlglot

    from tools.results.query import run_local_query

    glue = boto3.client("glue", region_name=stack.region)
    tables = glue.get_tables(DatabaseName=stack.outputs["GlueDatabaseName"])["TableList"]
    views = {t["Name"]: t for t in tables if t.get("TableType") == "VIRTUAL_VIEW"}
    report.check("images_latest" in views, f"no images_latest view in the Glue database: {sorted(views)}")
    for name, view in views.items():
        encoded = view["ViewOriginalText"].removeprefix("/* Presto View: ").removesuffix(" */")
        original_sql = json.loads(base64.b64decode(encoded))["originalSql"]
        [duckdb_sql] = sqlglot.transpile(original_sql, read="athena", write="duckdb")
        rows = run_local_query(f"SELECT source_uri FROM ({duckdb_sql})", local).column("source_uri").to_pylist()
        if name == "images_latest":
            report.check(len(rows) == len(set(rows)), f"images_latest repeats a source image: {rows}")
    report.steps.append(f"views ran on the deployed results: {', '.join(sorted(views))}")


def _run_named_queries(stack: DeployedStack, report: Report, local: Path) -> None:
    import boto3
    import sqlglot

    from tools.results.query import run_local_query

    athena = boto3.client("athena", region_name=stack.region)
    database, workgroup = stack.outputs["GlueDatabaseName"], stack.outputs["AthenaWorkGroupName"]
    ids = athena.list_named_queries(WorkGroup=workgroup)["NamedQueryIds"]
    report.check(bool(ids), f"the workgroup {workgroup} has no named queries")
    answered = []
    for query_id in ids:
        query = athena.get_named_query(NamedQueryId=query_id)["NamedQuery"]
        report.check(query["Database"] == database, f"named query {query['Name']} is not on {database}")
        [duckdb_sql] = sqlglot.transpile(query["QueryString"], read="athena", write="duckdb")
        try:
            answered.append(f"{query['Name']} ({run_local_query(duckdb_sql, local).num_rows} rows)")
        except Exception as error:  # DuckDB's error types vary; any is a failed query
            report.failures.append(f"named query {query['Name']} failed on the deployed results: {error}")
    report.steps.append("named queries ran: " + ", ".join(answered))


def main() -> int:
    from shared.observability import logger

    logger.setLevel("WARNING")  # the handlers' logs would bury the report
    reports = [rehearse(deployment, variants) for deployment, variants in default_deployments()]
    for report in reports:
        print(report.render(), end="\n\n")
    return 0 if all(r.ok for r in reports) else 1
