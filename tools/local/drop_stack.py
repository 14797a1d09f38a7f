"""The stack the exactly-once checker's world (tools/local/drop_world.py) plays: what it takes from template.yaml
(the rule's pattern and retry policy, the queues' limits, retention and alarms, the functions' timeout, the workflow's
TimeoutSeconds, which ends reach BatchEnded), and a small account's settings."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

REGION = "us-east-1"
INPUT_BUCKET, TABLE = "once-input", "once-claims"
DEFINITION = json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}})
# A small account's settings, so that the paths that need them run: groups of two and batches of at most three
# images (a gathering of more starts several executions); bulk tasks of three images' worth end within the minute's
# wait; two hand-backs
ACCOUNT: dict[str, Any] = {
    "lambda_concurrency": 9,
    "images_per_group": 2,
    "max_images_per_batch": 3,
    "fargate_vcpus": 4,
    "bulk_task_cpu": 2048,
    "bulk_task_start_s": 30,
    "bulk_seconds_per_image": 10,
    "gathered_bulk_from_images": 3,
    "bulk_images_per_group": 1,
    "hand_backs": 2,
}
# What a deployment of new settings changes between two deliveries of one message: the groups' size
DEPLOYED_AGAIN: dict[str, Any] = {"images_per_group": 1}
# A CloudWatch alarm looks at a queue's oldest message once a period: one it saw older than its threshold raised it
ALARM_PERIOD_S = 300
# EventBridge's own, where a target names no RetryPolicy: a day ("Event retry policy", EventBridge User Guide)
DEFAULT_EVENT_AGE_S = 86_400
# SQS's own, where a queue names no MessageRetentionPeriod: 4 days ("Amazon SQS message quotas")
DEFAULT_RETENTION_S = 345_600


@dataclass(frozen=True)
class Stack:
    """What the checker takes from template.yaml: the rule's pattern and retry policy, each queue's limits, its
    retention and the alarm on its oldest message, the functions' timeout, the workflow's TimeoutSeconds, and the
    statuses of an execution's end that reach BatchEnded."""

    pattern: dict[str, Any]
    visibility_s: int
    max_receives: int
    timeout_s: int
    retention_s: dict[str, int]  # queue logical id -> seconds
    age_alarm_s: dict[str, int]  # queue logical id -> the threshold of the alarm on its oldest message
    event_age_s: int
    execution_timeout_s: int
    ended_statuses: frozenset[str]

    @staticmethod
    def from_template() -> Stack:
        from tools.aws.sam_template import by_default, load_template
        from tools.local.workflow import DEFINITION_PATH

        template = load_template()
        resources = template["Resources"]
        rule = resources["InputObjectCreatedRule"]["Properties"]
        pattern = by_default(template, rule["EventPattern"])
        pattern["detail"]["bucket"]["name"] = [INPUT_BUCKET]
        [target] = rule["Targets"]
        queues = {name: resources[name]["Properties"] for name in ("IngestQueue", "PromptsQueue")}
        timeouts = {resources[name]["Properties"]["Timeout"] for name in ("IngestFunction", "GatherFunction")}
        return Stack(
            pattern=pattern,
            visibility_s=int(queues["IngestQueue"]["VisibilityTimeout"]),
            max_receives=int(queues["IngestQueue"]["RedrivePolicy"]["maxReceiveCount"]),
            timeout_s=max(timeouts),
            retention_s={q: int(p.get("MessageRetentionPeriod", DEFAULT_RETENTION_S)) for q, p in queues.items()},
            age_alarm_s=_age_alarms(template),
            event_age_s=int(target.get("RetryPolicy", {}).get("MaximumEventAgeInSeconds", DEFAULT_EVENT_AGE_S)),
            execution_timeout_s=int(json.loads(DEFINITION_PATH.read_text())["TimeoutSeconds"]),
            ended_statuses=_statuses_sent_to_batch_ended(template),
        )


def _age_alarms(template: dict[str, Any]) -> dict[str, int]:
    """Each queue's alarm on ApproximateAgeOfOldestMessage, by its threshold (at its parameter's default)."""
    from tools.aws.sam_template import by_default

    found = {}
    for resource in template["Resources"].values():
        properties = resource.get("Properties", {})
        if (
            resource["Type"] == "AWS::CloudWatch::Alarm"
            and properties.get("MetricName") == "ApproximateAgeOfOldestMessage"
        ):
            [dimension] = properties["Dimensions"]
            queue = str(dimension["Value"]["Fn::GetAtt"]).split(".")[0]
            found[queue] = int(by_default(template, properties["Threshold"]))
    return found


def _statuses_sent_to_batch_ended(template: dict[str, Any]) -> frozenset[str]:
    """The statuses of an execution's end that a rule of the stack sends to BatchEndedFunction."""
    found: set[str] = set()
    for resource in template["Resources"].values():
        properties = resource.get("Properties", {})
        if resource["Type"] != "AWS::Events::Rule" or "aws.states" not in properties["EventPattern"].get("source", []):
            continue
        targets = [str(target["Arn"].get("Fn::GetAtt")) for target in properties["Targets"]]
        if any(target in ("BatchEndedFunction.Arn", "['BatchEndedFunction', 'Arn']") for target in targets):
            found |= set(properties["EventPattern"]["detail"]["status"])
    return frozenset(found)
