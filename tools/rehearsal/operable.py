"""What an operator needs from the deployed stack: alarms that watch the right resources, logs that expire,
bounded executions and consumers, recoverable results, names Athena accepts."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from tools.rehearsal.stack import DeployedStack

if TYPE_CHECKING:
    from tools.rehearsal.story import Report


def _dimensions(alarm: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(metric, dimension name, value) of a plain alarm and of every metric of a metric-math alarm."""
    metrics = [(alarm.get("MetricName"), alarm.get("Dimensions", []))] if alarm.get("MetricName") else []
    metrics += [
        (m["MetricStat"]["Metric"]["MetricName"], m["MetricStat"]["Metric"].get("Dimensions", []))
        for m in alarm.get("Metrics", [])
        if "MetricStat" in m
    ]
    return [(metric, d["Name"], d["Value"]) for metric, dims in metrics for d in dims]


def check_operable(stack: DeployedStack, report: Report) -> None:
    import boto3

    region = stack.region
    alarms = boto3.client("cloudwatch", region_name=region).describe_alarms()["MetricAlarms"]
    watched = {dimension for alarm in alarms for dimension in _dimensions(alarm)}
    sqs = boto3.client("sqs", region_name=region)
    queues = [url for url in sqs.list_queues().get("QueueUrls", [])]
    dead_letter_arns = set()
    for url in queues:
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        if "RedrivePolicy" in attributes:
            dead_letter_arns.add(json.loads(attributes["RedrivePolicy"])["deadLetterTargetArn"])
    report.check(len(dead_letter_arns) == 2, f"expected 2 dead-letter queues, found {sorted(dead_letter_arns)}")
    for arn in dead_letter_arns:
        name = arn.rsplit(":", 1)[-1]
        report.check(
            ("ApproximateNumberOfMessagesVisible", "QueueName", name) in watched,
            f"no alarm on the depth of dead-letter queue {name}",
        )
    for metric in ("ExecutionsFailed", "ExecutionsTimedOut", "ExecutionsAborted"):
        report.check(
            (metric, "StateMachineArn", stack.state_machine_arn) in watched, f"no alarm on the workflow's {metric}"
        )
    for metric in ("Errors", "Throttles"):
        for function in stack.functions.values():
            report.check(
                (metric, "FunctionName", function.name) in watched, f"no alarm on {function.logical_id}'s {metric}"
            )
    report.check(all(a.get("AlarmActions") for a in alarms), "an alarm notifies no one (no AlarmActions)")

    logs = boto3.client("logs", region_name=region)
    groups = {g["logGroupName"]: g for g in logs.describe_log_groups()["logGroups"]}
    for function in stack.functions.values():
        group = groups.get(f"/aws/lambda/{function.name}")
        report.check(bool(group and group.get("retentionInDays")), f"{function.logical_id}'s log group has no retention")
    report.check(all(g.get("retentionInDays") for g in groups.values()), "a log group keeps its logs forever")

    definition = json.loads(
        boto3.client("stepfunctions", region_name=region).describe_state_machine(stateMachineArn=stack.state_machine_arn)[
            "definition"
        ]
    )
    report.check("TimeoutSeconds" in definition, "the workflow has no TimeoutSeconds")
    variants = definition["States"]["AnnotateImages"]["ItemProcessor"]["States"]["Variants"]
    report.check("TimeoutSeconds" in variants, "the Variants task has no TimeoutSeconds")

    lambda_client = boto3.client("lambda", region_name=region)
    for function in stack.functions.values():
        for mapping in lambda_client.list_event_source_mappings(FunctionName=function.name)["EventSourceMappings"]:
            if mapping["EventSourceArn"].startswith("arn:aws:sqs:"):
                report.check(
                    bool(mapping.get("ScalingConfig", {}).get("MaximumConcurrency")),
                    f"{function.logical_id}'s queue {mapping['EventSourceArn']} has no MaximumConcurrency",
                )
    results = stack.outputs["ResultsBucketName"]
    versioning = boto3.client("s3", region_name=region).get_bucket_versioning(Bucket=results)
    report.check(versioning.get("Status") == "Enabled", "the results bucket is not versioned")
    database = stack.outputs["GlueDatabaseName"]
    report.check(bool(re.fullmatch(r"[a-z0-9_]+", database)), f"Glue database {database!r} is not a valid Athena name")
    report.steps.append(f"operable: {len(alarms)} alarms on the right resources, {len(groups)} log groups expire")
