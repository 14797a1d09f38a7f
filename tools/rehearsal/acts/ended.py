"""An execution that ends without its own last word: stopped by hand while it runs, it gets its images' rows from
BatchEnded, which the deployed rule sends its status change to, as EventBridge would."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.local.step_functions import status_change_event
from tools.rehearsal.acts.common import drain
from tools.rehearsal.report import Report
from tools.rehearsal.stack import DeployedStack

if TYPE_CHECKING:
    from tools.rehearsal.services import InProcessServices


def a_stopped_execution_ends_as_failure_rows(services: InProcessServices, stack: DeployedStack, report: Report) -> None:
    """A message's execution is stopped (StopExecution, as someone would from the console) once an image is in
    Detect (held there until the stop, so that none has written its row). Its status change, as Step Functions sends
    it to EventBridge, matches the deployed ExecutionEndedRule, whose target is BatchEndedFunction, invoked here as
    EventBridge invokes it: every image of the batch then has a row saying the execution was aborted."""
    import boto3

    from tools.aws.moto_internals import EventPattern

    started = time.monotonic()
    sfn, events = (boto3.client(name, region_name=stack.region) for name in ("stepfunctions", "events"))
    before = {e["executionArn"] for e in sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]}
    message = {"prompt": "saucer.", "images": [f"s3://{stack.outputs['InputBucketName']}/incoming/"], "caption": False}
    boto3.client("sqs", region_name=stack.region).send_message(
        QueueUrl=stack.outputs["PromptsQueueUrl"], MessageBody=json.dumps(message)
    )
    with services.holding("DetectFunction"):
        drain(services, stack, "PromptsQueueUrl", "IngestFunction")
        [arn] = _new_executions(sfn, stack, before)
        # Stopped while a task runs, not while its Map starts a child: there, moto 5.2.5's interpreter fails the
        # execution ("pop from empty list") where AWS aborts it. Its stop waits for the running task to return,
        # so the held invocations are released once the stop is asked, and return into a stopped execution.
        services.wait_until_held("DetectFunction")
        _stop(sfn, arn)
    execution = _ended(sfn, arn)
    event = status_change_event(execution)
    rule = events.describe_rule(Name=stack.resources["ExecutionEndedRule"])
    if not report.check(
        EventPattern(None, json.loads(rule["EventPattern"])).matches_event(event),  # type: ignore[arg-type]
        f"the execution's end ({execution['status']}) does not match ExecutionEndedRule",
    ):
        return
    [target] = events.list_targets_by_rule(Rule=stack.resources["ExecutionEndedRule"])["Targets"]
    function = stack.function_by_arn(target["Arn"])
    response, failed = services.invoke(function, event)
    if not report.check(not failed, f"{function.logical_id} failed on {execution['name']}: {response}"):
        return
    rows = _rows_of(stack, json.loads(execution["input"])["batch_id"])
    images = json.loads(execution["input"])["images"]
    aborted = [row for row in rows if row["status"] == "failed" and "aborted" in (row["error"] or "")]
    report.check(
        len(rows) == images and len(aborted) == images,
        f"a stopped execution of {images} images left rows {rows}",
    )
    report.step(
        f"an execution stopped by hand reached {function.logical_id} through ExecutionEndedRule: "
        f"{len(aborted)} of its {images} images' rows say it was aborted",
        started,
    )


def _new_executions(sfn: Any, stack: DeployedStack, before: set[str]) -> list[str]:
    return [
        e["executionArn"]
        for e in sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
        if e["executionArn"] not in before
    ]


def _stop(sfn: Any, arn: str) -> None:
    """StopExecution, once moto's interpreter has begun the execution: before, moto 5.2.5 raises AttributeError (its
    worker has no environment yet) where AWS stops it all the same."""
    deadline = time.monotonic() + 10
    while True:
        try:
            sfn.stop_execution(executionArn=arn, error="Stopped", cause="stopped by hand (the rehearsal)")
            return
        except AttributeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _ended(sfn: Any, arn: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while (execution := sfn.describe_execution(executionArn=arn))["status"] == "RUNNING":
        if time.monotonic() > deadline:
            raise TimeoutError(f"{arn} still running a minute after it was stopped")
        time.sleep(0.1)
    return dict(execution)


def _rows_of(stack: DeployedStack, batch_id: str) -> list[dict[str, Any]]:
    import boto3

    from tools.results.query import run_local_query

    s3 = boto3.client("s3", region_name=stack.region)
    bucket = stack.outputs["ResultsBucketName"]
    with tempfile.TemporaryDirectory(prefix="rehearsal-ended-") as folder:
        for item in s3.list_objects_v2(Bucket=bucket, Prefix="tables/images/").get("Contents", []):
            if f"/{batch_id}-" in item["Key"]:
                target = Path(folder) / item["Key"]
                target.parent.mkdir(parents=True, exist_ok=True)
                s3.download_file(bucket, item["Key"], str(target))
        query = f"SELECT source_uri, status, error FROM images WHERE batch_id = '{batch_id}'"
        return list(run_local_query(query, Path(folder)).to_pylist())
