"""`make rehearse` as tests: template.yaml deployed on moto in eu-central-1, with and without variants, the
user's story played through the deployed resources, every request checked against its principal's role."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

import boto3
import pytest

from shared.storage import objects as storage
from tools.rehearsal.iam import evaluate
from tools.rehearsal.report import Report
from tools.rehearsal.stack import TEMPLATE_PATH
from tools.rehearsal.story import default_deployments, rehearse

pytestmark = pytest.mark.slow
BARE = default_deployments()[0][0]


@pytest.fixture(scope="module")
def reports() -> dict[bool, Report]:
    return {variants: rehearse(deployment, variants) for deployment, variants in default_deployments()}


@pytest.mark.parametrize("variants", [False, True], ids=["variants-off", "variants-on"])
def test_the_deployed_stack_runs_the_users_story(reports: dict[bool, Report], variants: bool) -> None:
    report = reports[variants]
    assert report.ok, report.render()
    assert report.deployment.region != "us-east-1"


def test_without_variants_the_stack_deploys_with_only_the_required_answers(reports: dict[bool, Report]) -> None:
    assert reports[False].deployment.parameters == {}
    assert reports[True].deployment.parameters.keys() == {
        "EnableVariants",
        "EnableBulk",
        "VpcId",
        "SubnetA",
        "SubnetB",
        "EnableApi",
        "ApiAuth",
        "HandBackWaitSeconds",  # a second, not a minute: its story waits out a hand-back
        "MaxWaitMinutes",  # 15: its dropped images are gathered
        "StorePictures",  # true: WriteResult, the bulk task and the API store pictures, each on its role
        "TaskPublicIp",  # DISABLED: its subnets are private
        "S3GatewayRouteTables",  # their route tables, which get the stack's S3 endpoint
    }


def test_with_the_dial_at_15_minutes_drops_wait_and_run_as_one_bulk_batch_and_a_dead_gatherer_loses_nothing(
    reports: dict[bool, Report],
) -> None:
    # GIVEN the stack with MaxWaitMinutes=15: images dropped at minutes 1, 7 and 13, the Gather function invoked as
    # its schedule does, once a minute
    [gathered] = [step for step in reports[True].steps if "waited for the 15-minute look" in step]
    # THEN they started at the look that ended the wait, as one batch in the bulk lane (its reason written on it),
    # whose stopped task ran again; the gatherer died before deleting them, and none started twice
    assert "ran as one bulk batch (3 gathered images in 1 bulk task(s)" in gathered
    assert "within the 15 min wait" in gathered
    # AND the gatherer received and deleted them, read and wrote its clock and claims, and started the execution,
    # each as its own role (checked against its policies)
    gather_calls = {
        call.request.action for call in reports[True].requests if call.request.principal == "GatherFunction"
    }
    assert {
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:GetQueueAttributes",
        "states:StartExecution",
    } <= gather_calls
    assert {"dynamodb:GetItem", "dynamodb:PutItem"} <= gather_calls


def test_a_group_throttled_past_a_childs_retries_is_handed_back_and_annotated_on_the_deployed_stack(
    reports: dict[bool, Report],
) -> None:
    # GIVEN the deployed state machine, its roles, and Detect refused for one image past a child's retries: the
    # group's round-1 manifest was written by SummarizeBatch's role and read by the state machine's (both checked
    # against their policies), and the execution succeeded with one row per image (the story's own checks)
    [step] = [step for step in reports[True].steps if step.startswith("a prompt message naming incoming/")]
    assert "Detect throttled past its retries, its group ran again" in step


def test_the_api_answers_through_its_public_url_with_the_stack_s_key(reports: dict[bool, Report]) -> None:
    # GIVEN the stack with EnableApi=true ApiAuth=API_KEY: a public function URL (both permissions, aws_behaviours)
    [answered] = [step for step in reports[True].steps if step.startswith("the API answered")]
    assert "through its NONE function URL" in answered
    # THEN the API function read the stack's key and invoked WriteGroupTable for a recorded call, each as its role
    api_calls = {call.request.action for call in reports[True].requests if call.request.principal == "ApiFunction"}
    assert {"secretsmanager:GetSecretValue", "lambda:InvokeFunction", "s3:PutObject"} <= api_calls


def test_a_bulk_message_runs_as_batch_jobs_on_fargate_spot_as_their_role_and_a_stopped_one_loses_nothing(
    reports: dict[bool, Report],
) -> None:
    # GIVEN the stack with EnableBulk=true, and a message in the bulk lane whose first task is stopped after one image
    [ran] = [step for step in reports[True].steps if step.startswith("a bulk message ran")]
    # THEN Batch ran the job again (the deployed job definition's retry strategy), on the deployed queue's first
    # compute environment, Fargate Spot
    assert "as 2 Batch jobs on Fargate Spot" in ran
    # AND the state machine submitted and followed them as its role allows
    machine_calls = {
        call.request.action for call in reports[True].requests if call.request.principal == "AnnotateWorkflow"
    }
    assert {"batch:SubmitJob", "batch:DescribeJobs"} <= machine_calls
    # AND the task read its job, images and models and wrote results, rows and summaries as its task role
    task_calls = {
        (call.request.action, call.request.resource.split(":::", 1)[-1].split("/", 1)[-1].split("/", 1)[0])
        for call in reports[True].requests
        if call.request.principal == "BulkTaskRole"
    }
    assert {
        ("s3:GetObject", "manifests"),
        ("s3:PutObject", "results"),
        ("s3:PutObject", "pictures"),
        ("s3:PutObject", "tables"),
    } <= task_calls
    # AND in the deployment's private subnets it asked for no public address and reached S3 by the stack's endpoint
    network = [failure for failure in reports[True].failures if "public address" in failure or "S3 endpoint" in failure]
    assert not network
    # AND every image of the three batches has one row (checked in the story: 9 rows, the truncated image failing)
    assert "9 image rows (3 failed)" in "\n".join(reports[True].steps)


@pytest.mark.parametrize("variants", [False, True], ids=["variants-off", "variants-on"])
def test_an_execution_stopped_by_hand_ends_as_rows_through_the_deployed_rule_and_batch_ended(
    reports: dict[bool, Report], variants: bool
) -> None:
    # GIVEN an execution stopped as soon as it started, its status change matching the deployed ExecutionEndedRule
    [ended] = [step for step in reports[variants].steps if step.startswith("an execution stopped by hand")]
    # THEN BatchEnded, the rule's target, gave every image of the batch a row
    assert "reached BatchEndedFunction through ExecutionEndedRule" in ended
    calls = {
        call.request.action for call in reports[variants].requests if call.request.principal == "BatchEndedFunction"
    }
    assert {"s3:GetObject", "s3:ListBucket", "s3:PutObject"} <= calls


def test_what_moto_does_not_create_is_made_through_its_api_and_the_rest_is_reported(
    reports: dict[bool, Report],
) -> None:
    completed = "\n".join(reports[True].completed)
    for kind in ("Glue::Table", "Athena::NamedQuery", "CloudWatch::Alarm", "Lambda::Alias", "S3::BucketPolicy"):
        assert f"(AWS::{kind})" in completed
    assert "ManagedPolicyArns AWSLambdaSQSQueueExecutionRole" in completed
    assert reports[True].not_rehearsed == []
    assert "Resources not rehearsed:\n  - none" in reports[True].render()


def test_every_principal_acted_and_each_template_statement_a_call_used_is_needed_by_it(
    reports: dict[bool, Report],
) -> None:
    for report in reports.values():
        acting = {call.request.principal for call in report.requests}
        assert acting >= {
            "IngestFunction",
            "DetectFunction",
            "WriteResultFunction",
            "WriteGroupTableFunction",
            "SummarizeBatchFunction",
        }
        for principal, statements in report.policies.items():
            requests = [call.request for call in report.requests if call.request.principal == principal]
            for statement in statements:
                if ":iam::aws:policy/" in statement.policy or not any(statement.applies_to(r) for r in requests):
                    continue
                # GIVEN the role without this one statement, WHEN the same requests are evaluated
                rest = [s for s in statements if s is not statement]
                denied = [r for r in requests if not evaluate(rest, r).allowed]
                # THEN at least one is denied: no statement is a duplicate of another
                assert denied, f"{principal}: {statement.name} is not needed by any request on its own"


def test_a_first_deploy_with_snapstart_fails_as_on_aws_naming_the_function_and_what_to_do() -> None:
    # GIVEN the template deployed with EnableSnapStart=true where there is no stack yet: its models bucket is empty
    report = rehearse(replace(BARE, stack_name="annotate-snapstart", parameters={"EnableSnapStart": "true"}), False)
    # THEN publishing Detect's version runs its init, which finds no model: the deployment fails, saying so
    assert not report.ok
    [failure] = report.failures
    assert failure.startswith("the deployment failed: PublishVersion of DetectFunction failed"), failure
    assert "Push the models before deploying with EnableSnapStart=true" in failure


def test_with_snapstart_the_readmes_order_deploys_and_publishes_each_model_function_with_its_model() -> None:
    # GIVEN the README's order: deploy (SnapStart off), push the models, deploy again with EnableSnapStart=true
    deployment = replace(
        BARE, stack_name="annotate-ordered", parameters={"EnableApi": "true"}, redeploy_with={"EnableSnapStart": "true"}
    )
    # WHEN it is rehearsed
    report = rehearse(deployment, False)
    # THEN the second deployment publishes the four model functions, whose init loads each model, and the story runs
    # through their aliases (the workflow's substitutions with SnapStart)
    assert report.ok, report.render()
    [published] = [step for step in report.steps if step.startswith("SnapStart versions published")]
    invoked = {call.request.resource for call in report.requests if call.request.action == "lambda:InvokeFunction"}
    for function in ("DetectFunction", "ClassifyFunction", "TagFunction", "CaptionFunction"):
        assert function in published
        assert any(f"-{function}-" in arn and arn.endswith(":live") for arn in invoked), invoked
    # the API function too, its init loading all four models; then it answers signed calls through its URL
    assert "ApiFunction" in published
    assert any(step.startswith("the API answered through its AWS_IAM function URL") for step in report.steps)


def _without_statement(tmp_path: Path, function: str, sid: str, template: Path = TEMPLATE_PATH) -> Path:
    """``template`` with one statement (by Sid) taken out of one function's policies."""
    lines = template.read_text().splitlines(keepends=True)
    begin = lines.index(f"  {function}:\n")
    first = next(i for i in range(begin, len(lines)) if lines[i].strip() == f"- Sid: {sid}")
    depth = len(lines[first]) - len(lines[first].lstrip())
    last = next(i for i in range(first + 1, len(lines)) if len(lines[i]) - len(lines[i].lstrip()) <= depth)
    mutated = tmp_path / "template.yaml"
    mutated.write_text("".join(lines[:first] + lines[last:]))
    return mutated


def _sids(template: Path, function: str) -> list[str]:
    from samtranslator.yaml_helper import yaml_parse

    policies = yaml_parse(template.read_text())["Resources"][function]["Properties"]["Policies"]
    return [s.get("Sid") for p in policies if "Statement" in p for s in p["Statement"]]


def test_a_missing_statement_and_a_client_for_another_region_each_fail_the_rehearsal_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One rehearsal for the three mistakes (each costs a minute): they are told apart by their messages.
    # GIVEN a template whose Detect role may not list its model folder, nor the input bucket, all else equal
    template = _without_statement(tmp_path, "DetectFunction", "ListModel")
    template = _without_statement(tmp_path, "DetectFunction", "TellMissingImages", template)
    assert _sids(template, "DetectFunction") == ["ReadImages", "ReadModel"]
    assert _sids(template, "ClassifyFunction") == _sids(TEMPLATE_PATH, "ClassifyFunction")

    # AND code that builds its S3 client for us-east-1, as every function once did
    @functools.lru_cache(maxsize=1)
    def us_east_1_store() -> storage.S3Store:
        return storage.S3Store(boto3.client("s3", region_name="us-east-1"))

    monkeypatch.setattr(storage, "_s3_store", us_east_1_store)

    # WHEN the stack (in eu-central-1) is rehearsed
    report = rehearse(replace(BARE, template_file=template), False)

    # THEN it fails naming the function, the action and the resource that was denied
    denied = [f for f in report.failures if f.startswith("DENIED DetectFunction: s3:ListBucket on arn:aws:s3:::")]
    assert denied, report.render()
    # AND, S3 answering a missing image with 403 to a role that may not list the bucket, Detect says access denied
    missing = "DetectFunction on a deleted image did not say it does not exist"
    assert any(f.startswith(missing) and "AccessDenied" in f for f in report.failures), report.render()
    assert not any(f.startswith(("ClassifyFunction on a deleted image", "TagFunction on a")) for f in report.failures)
    # AND naming each function and action that used a client for the wrong region
    wrong = {
        f.split(" from ")[0] for f in report.failures if f.endswith("from a client for us-east-1, not eu-central-1")
    }
    assert {
        "IngestFunction: s3:PutObject",  # its manifests (a dropped image's event names it: no HEAD)
        "DetectFunction: s3:ListBucket",
        "WriteGroupTableFunction: s3:PutObject",
    } <= wrong
