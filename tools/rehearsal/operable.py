"""What an operator needs from the deployed stack: alarms that watch the right resources, logs that expire,
bounded executions and consumers, recoverable results, names Athena accepts."""

from __future__ import annotations

import json
import re
from typing import Any

from tools.local.workflow import all_states
from tools.rehearsal.report import Report
from tools.rehearsal.stack import DeployedStack


def _dimensions(alarm: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(metric, dimension name, value) of a plain alarm and of every metric of a metric-math alarm."""
    metrics = [(str(alarm["MetricName"]), alarm.get("Dimensions", []))] if alarm.get("MetricName") else []
    metrics += [
        (m["MetricStat"]["Metric"]["MetricName"], m["MetricStat"]["Metric"].get("Dimensions", []))
        for m in alarm.get("Metrics", [])
        if "MetricStat" in m
    ]
    return [(metric, d["Name"], d["Value"]) for metric, dims in metrics for d in dims]


def _check_alarms(stack: DeployedStack, report: Report) -> int:
    import boto3

    region = stack.region
    alarms = boto3.client("cloudwatch", region_name=region).describe_alarms()["MetricAlarms"]
    watched = {dimension for alarm in alarms for dimension in _dimensions(alarm)}
    sqs = boto3.client("sqs", region_name=region)
    redrives = [
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])
        .get("Attributes", {})
        .get("RedrivePolicy")
        for url in sqs.list_queues().get("QueueUrls", [])
    ]
    dead_letter_queues = {json.loads(r)["deadLetterTargetArn"].rsplit(":", 1)[-1] for r in redrives if r}
    report.check(len(dead_letter_queues) == 2, f"expected 2 dead-letter queues, found {sorted(dead_letter_queues)}")
    expected = {("ApproximateNumberOfMessagesVisible", "QueueName", name) for name in dead_letter_queues}
    expected |= {(m, "StateMachineArn", stack.state_machine_arn) for m in WORKFLOW_METRICS}
    expected |= {(m, "FunctionName", f.name) for m in ("Errors", "Throttles") for f in stack.functions.values()}
    for metric, dimension, value in sorted(expected - watched):
        report.failures.append(f"no alarm watches {metric} of {dimension}={value}")
    report.check(all(a.get("AlarmActions") for a in alarms), "an alarm notifies no one (no AlarmActions)")
    return len(alarms)


WORKFLOW_METRICS = ("ExecutionsFailed", "ExecutionsTimedOut", "ExecutionsAborted")


def _check_log_retention(stack: DeployedStack, report: Report) -> int:
    import boto3

    groups = {
        g["logGroupName"]: g for g in boto3.client("logs", region_name=stack.region).describe_log_groups()["logGroups"]
    }
    for function in stack.functions.values():
        group = groups.get(f"/aws/lambda/{function.name}")
        report.check(
            bool(group and group.get("retentionInDays")), f"{function.logical_id}'s log group has no retention"
        )
    report.check(all(g.get("retentionInDays") for g in groups.values()), "a log group keeps its logs forever")
    return len(groups)


def _check_bounds(stack: DeployedStack, report: Report) -> None:
    import boto3

    region = stack.region
    sfn = boto3.client("stepfunctions", region_name=region)
    definition = json.loads(sfn.describe_state_machine(stateMachineArn=stack.state_machine_arn)["definition"])
    report.check("TimeoutSeconds" in definition, "the workflow has no TimeoutSeconds")
    [variants] = [state for name, state in all_states(definition) if name == "Variants"]
    report.check("TimeoutSeconds" in variants, "the Variants task has no TimeoutSeconds")
    lambda_client = boto3.client("lambda", region_name=region)
    for function in stack.functions.values():
        for mapping in lambda_client.list_event_source_mappings(FunctionName=function.name)["EventSourceMappings"]:
            report.check(
                bool(mapping.get("ScalingConfig", {}).get("MaximumConcurrency")),
                f"{function.logical_id}'s event source {mapping['EventSourceArn']} has no MaximumConcurrency",
            )
    versioning = boto3.client("s3", region_name=region).get_bucket_versioning(Bucket=stack.outputs["ResultsBucketName"])
    report.check(versioning.get("Status") == "Enabled", "the results bucket is not versioned")
    database = stack.outputs["GlueDatabaseName"]
    report.check(bool(re.fullmatch(r"[a-z0-9_]+", database)), f"Glue database {database!r} is not a valid Athena name")


def check_operable(stack: DeployedStack, report: Report) -> None:
    alarms = _check_alarms(stack, report)
    groups = _check_log_retention(stack, report)
    _check_bounds(stack, report)
    report.steps.append(f"operable: {alarms} alarms watch the right resources, {groups} log groups expire")
