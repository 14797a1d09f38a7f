"""template.yaml against what AWS documents of its services: how long queues keep a message and who is told before
one is lost, what EventBridge does with an event it cannot deliver, who may take the account's Lambda concurrency,
and how the Fargate work waits in AWS Batch's queue."""

from __future__ import annotations

import json
from typing import Any

from tests.unit.test_template import RESOURCES, _rule_holds, statements
from tests.unit.test_workflow_definition import template
from tools.local.workflow import DEFINITION_PATH

SQS_MOST_RETENTION_S = 1_209_600  # "14 days" (Amazon SQS message quotas)


def _source_queues() -> dict[str, dict[str, Any]]:
    return {
        name: resource["Properties"]
        for name, resource in RESOURCES.items()
        if resource["Type"] == "AWS::SQS::Queue" and "RedrivePolicy" in resource["Properties"]
    }


def _alarms_on(metric: str) -> dict[str, dict[str, Any]]:
    """The alarms on ``metric`` of a queue, by the queue's logical id."""
    found = {}
    for resource in RESOURCES.values():
        properties = resource.get("Properties", {})
        if resource["Type"] == "AWS::CloudWatch::Alarm" and properties.get("MetricName") == metric:
            [dimension] = properties["Dimensions"]
            found[str(dimension["Value"]["Fn::GetAtt"]).split(".")[0]] = properties
    return found


def test_a_queued_message_is_kept_14_days_and_an_alarm_tells_of_it_days_before_it_could_expire() -> None:
    parameters = template()["Parameters"]
    ages = _alarms_on("ApproximateAgeOfOldestMessage")
    for name, queue in _source_queues().items():
        assert queue["MessageRetentionPeriod"] == SQS_MOST_RETENTION_S, name
        # "set the maxReceiveCount on the source queue's redrive policy to at least 5" (Lambda developer guide)
        assert queue["RedrivePolicy"]["maxReceiveCount"] >= 5, name
        threshold = ages[name]["Threshold"]
        assert threshold == {"Ref": "OldestMessageAlarmSeconds"}, name
        assert parameters["OldestMessageAlarmSeconds"]["MaxValue"] * 2 <= SQS_MOST_RETENTION_S
    # the dead-letter queues, which keep a message's first enqueue time: alarmed at their first message
    visible = _alarms_on("ApproximateNumberOfMessagesVisible")
    dead = [
        name for name, r in RESOURCES.items() if r["Type"] == "AWS::SQS::Queue" and name.endswith("DeadLetterQueue")
    ]
    assert dead and all(visible[name]["Threshold"] == 0 for name in dead)


def test_every_event_bridge_target_retries_for_a_day_then_keeps_the_event_in_a_dead_letter_queue() -> None:
    rules = {name: r["Properties"] for name, r in RESOURCES.items() if r["Type"] == "AWS::Events::Rule"}
    [dead_letter_policy] = [
        statements(r)
        for r in RESOURCES.values()
        if r["Type"] == "AWS::SQS::QueuePolicy" and r["Properties"]["Queues"] == [{"Ref": "EventsDeadLetterQueue"}]
    ]
    [allowed] = [s for s in dead_letter_policy if s["Effect"] == "Allow"]
    senders = {str(arn["Fn::GetAtt"]).split(".")[0] for arn in allowed["Condition"]["ArnEquals"]["aws:SourceArn"]}
    assert rules
    for name, rule in rules.items():
        for target in rule.get("Targets", []):
            assert target["RetryPolicy"]["MaximumEventAgeInSeconds"] == 86_400, name
            assert str(target["DeadLetterConfig"]["Arn"]["Fn::GetAtt"]).startswith("EventsDeadLetterQueue"), name
            assert name in senders, name


def test_an_execution_that_ends_without_its_summary_reaches_batch_ended() -> None:
    rule = RESOURCES["ExecutionEndedRule"]["Properties"]
    assert rule["EventPattern"]["detail"]["stateMachineArn"] == [{"Ref": "AnnotateWorkflow"}]
    assert set(rule["EventPattern"]["detail"]["status"]) == {"TIMED_OUT", "FAILED", "ABORTED"}
    [target] = rule["Targets"]
    assert str(target["Arn"]["Fn::GetAtt"]).startswith("BatchEndedFunction")
    permission = RESOURCES["ExecutionEndedPermission"]["Properties"]
    assert permission["Principal"] == "events.amazonaws.com"
    assert str(permission["SourceArn"]["Fn::GetAtt"]).startswith("ExecutionEndedRule")
    # the workflow does time out: the rule is what gives its images their rows then
    assert json.loads(DEFINITION_PATH.read_text())["TimeoutSeconds"] > 0


def test_ingest_and_the_gatherer_keep_their_own_concurrency_where_the_account_has_some_to_reserve() -> None:
    for function, parameter in (
        ("IngestFunction", "IngestReservedConcurrency"),
        ("GatherFunction", "GatherReservedConcurrency"),
    ):
        reserved = RESOURCES[function]["Properties"]["ReservedConcurrentExecutions"]
        condition, when_reserved, otherwise = reserved["Fn::If"]
        assert when_reserved == {"Ref": parameter} and otherwise == {"Ref": "AWS::NoValue"}
        assert template()["Conditions"][condition] == {"Fn::Not": [{"Fn::Equals": [{"Ref": parameter}, 0]}]}
    # at least what its queues' pollers may hand it at once, or Lambda throttles its own pollers
    sources = RESOURCES["IngestFunction"]["Properties"]["Events"].values()
    pollers = sum(source["Properties"]["ScalingConfig"]["MaximumConcurrency"] for source in sources)
    assert template()["Parameters"]["IngestReservedConcurrency"]["Default"] >= pollers


def test_a_public_api_key_url_needs_a_reservation_so_that_no_caller_takes_the_batches_concurrency() -> None:
    loaded = template()
    [assertion] = loaded["Rules"]["ApiByKeyNeedsAReservation"]["Assertions"]
    condition = loaded["Rules"]["ApiByKeyNeedsAReservation"]["RuleCondition"]
    defaults = {name: str(p.get("Default", "")) for name, p in loaded["Parameters"].items()}
    by_key = defaults | {"EnableApi": "true", "ApiAuth": "API_KEY"}
    assert _rule_holds(condition, by_key) and not _rule_holds(condition, defaults | {"EnableApi": "true"})
    assert _rule_holds(assertion["Assert"], by_key)
    assert not _rule_holds(assertion["Assert"], by_key | {"ApiReservedConcurrency": "0"})


def test_the_fargate_work_is_submitted_to_the_stack_s_batch_queue_and_nothing_else() -> None:
    # the state machine's Batch statements: submit to its queue with its definitions, follow, end; no "*" action
    machine = next(r for r in RESOURCES.values() if r["Type"] == "AWS::Serverless::StateMachine")
    batch = [s for s in statements(machine) if any(a.startswith("batch:") for a in s["Action"])]
    by_action = {action: s["Resource"] for s in batch for action in s["Action"]}
    assert set(by_action) == {"batch:SubmitJob", "batch:DescribeJobs", "batch:TerminateJob"}
    assert {"Ref": "FargateJobQueue"} in by_action["batch:SubmitJob"]
    # each compute environment's vCPUs are a parameter: the account's share, Spot's and on-demand's
    maximum = {
        RESOURCES[name]["Properties"]["ComputeResources"]["Type"]: RESOURCES[name]["Properties"]["ComputeResources"][
            "MaxvCpus"
        ]
        for name in ("FargateSpotEnvironment", "FargateOnDemandEnvironment")
    }
    assert maximum == {"FARGATE_SPOT": {"Ref": "FargateVcpus"}, "FARGATE": {"Ref": "FargateOnDemandVcpus"}}
    # the jobs' network as the tasks' was: a public address only where asked, one architecture for the queue
    for name in ("BulkJobDefinition", "VariantsJobDefinition"):
        container = RESOURCES[name]["Properties"]["ContainerProperties"]
        assert container["NetworkConfiguration"] == {"AssignPublicIp": {"Ref": "TaskPublicIp"}}
        assert container["RuntimePlatform"]["CpuArchitecture"] == {"Ref": "FargateArchitecture"}
        assert RESOURCES[name]["Properties"]["PlatformCapabilities"] == ["FARGATE"]
