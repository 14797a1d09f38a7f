"""The rehearsal's IAM evaluation on known allow and deny cases, and the call log's mapping of requests."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from moto import mock_aws

from tools.rehearsal.aws_requests import acting_as, record_requests
from tools.rehearsal.iam import Request, UnknownConditionOperator, evaluate, statements, wildcard_match

MODELS = "arn:aws:s3:::models-bucket"


def policy(*statement: dict[str, Any]) -> list[Any]:
    return statements("test", {"Version": "2012-10-17", "Statement": list(statement)})


LIST_MODEL = {
    "Sid": "ListModel",
    "Effect": "Allow",
    "Action": ["s3:ListBucket"],
    "Resource": MODELS,
    "Condition": {"StringLike": {"s3:prefix": "models/grounding-dino-tiny/*"}},
}


def allowed(statements_: list[Any], action: str, resource: str, **context: str) -> bool:
    return evaluate(statements_, Request("Fn", action, resource, context)).allowed


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("models/grounding-dino-tiny/", True),  # what the code lists: the folder with its slash
        ("models/grounding-dino-tiny/sub/", True),
        ("models/grounding-dino-tiny", False),  # the bug this rehearsal was built to find: no slash, denied
        ("models/convnext-tiny-224/", False),
        ("", False),
    ],
)
def test_string_like_on_s3_prefix_matches_only_the_model_folder(prefix: str, expected: bool) -> None:
    assert allowed(policy(LIST_MODEL), "s3:ListBucket", MODELS, **{"s3:prefix": prefix}) is expected


def test_a_condition_key_missing_from_the_request_fails_the_condition() -> None:
    assert not allowed(policy(LIST_MODEL), "s3:ListBucket", MODELS)


def test_actions_match_case_insensitively_and_by_wildcard_resources_do_not() -> None:
    read = policy({"Effect": "Allow", "Action": "S3:getobject", "Resource": "arn:aws:s3:::in/incoming/*"})
    assert allowed(read, "s3:GetObject", "arn:aws:s3:::in/incoming/a/b.jpg")
    assert not allowed(read, "s3:GetObject", "arn:aws:s3:::in/Incoming/b.jpg")
    assert not allowed(read, "s3:PutObject", "arn:aws:s3:::in/incoming/b.jpg")
    assert not allowed(read, "s3:GetObject", "arn:aws:s3:::in/results/b.jpg")


def test_a_write_only_prefix_does_not_allow_reading_it() -> None:
    write = policy({"Effect": "Allow", "Action": ["s3:PutObject"], "Resource": "arn:aws:s3:::out/results/*"})
    assert allowed(write, "s3:PutObject", "arn:aws:s3:::out/results/b/x.json")
    assert not allowed(write, "s3:GetObject", "arn:aws:s3:::out/results/b/x.variants.json")


def test_an_explicit_deny_wins_over_an_allow() -> None:
    both = policy(
        {"Effect": "Allow", "Action": "sqs:*", "Resource": "*"},
        {"Effect": "Deny", "Action": "sqs:DeleteMessage", "Resource": "arn:aws:sqs:eu-central-1:1:q"},
    )
    assert allowed(both, "sqs:ReceiveMessage", "arn:aws:sqs:eu-central-1:1:q")
    assert not allowed(both, "sqs:DeleteMessage", "arn:aws:sqs:eu-central-1:1:q")


def test_arn_equals_on_the_ecs_cluster_and_negated_operators() -> None:
    run = policy(
        {
            "Effect": "Allow",
            "Action": "ecs:RunTask",
            "Resource": "arn:aws:ecs:eu-central-1:1:task-definition/v:1",
            "Condition": {"ArnEquals": {"ecs:cluster": "arn:aws:ecs:eu-central-1:1:cluster/c"}},
        }
    )
    definition = "arn:aws:ecs:eu-central-1:1:task-definition/v:1"
    assert allowed(run, "ecs:RunTask", definition, **{"ecs:cluster": "arn:aws:ecs:eu-central-1:1:cluster/c"})
    assert not allowed(run, "ecs:RunTask", definition, **{"ecs:cluster": "arn:aws:ecs:eu-central-1:1:cluster/x"})
    not_tls = policy(
        {"Effect": "Allow", "Action": "s3:*", "Resource": "*", "Condition": {"StringNotEquals": {"k": "v"}}}
    )
    assert allowed(not_tls, "s3:GetObject", "arn:aws:s3:::b/k")  # a negated operator holds for a missing key
    assert not allowed(not_tls, "s3:GetObject", "arn:aws:s3:::b/k", k="v")


def test_not_action_and_wildcards_are_iams_not_fnmatchs() -> None:
    assert wildcard_match("arn:aws:s3:::b/[x]*", "arn:aws:s3:::b/[x]y")
    assert not wildcard_match("arn:aws:s3:::b/[x]*", "arn:aws:s3:::b/xy")
    assert wildcard_match("lambda:Invoke?unction", "lambda:InvokeFunction")
    everything_but = policy({"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"})
    assert allowed(everything_but, "s3:GetObject", "arn:aws:s3:::b/k")
    assert not allowed(everything_but, "iam:PassRole", "arn:aws:iam::1:role/r")


def test_an_unknown_condition_operator_is_an_error_not_a_match() -> None:
    odd = policy({"Effect": "Allow", "Action": "s3:*", "Resource": "*", "Condition": {"DateGreaterThan": {"k": "1"}}})
    with pytest.raises(UnknownConditionOperator):
        allowed(odd, "s3:GetObject", "arn:aws:s3:::b/k", k="2")


def test_the_call_log_maps_requests_to_iam_and_names_a_client_of_the_wrong_region() -> None:
    # GIVEN a stack in eu-central-1 and a function whose code builds an S3 client for us-east-1
    with mock_aws(), record_requests("eu-central-1", "123456789012") as log:
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="models-bucket")  # as nobody: not logged
        right = boto3.client("s3", region_name="eu-central-1")
        wrong = boto3.client("s3", region_name="us-east-1")
        # WHEN the function lists its model folder with both
        with acting_as("DetectFunction"):
            right.list_objects_v2(Bucket="models-bucket", Prefix="models/grounding-dino-tiny/")
            wrong.head_bucket(Bucket="models-bucket")

    # THEN the listing is recorded as IAM sees it, and the other call is a problem naming function and region
    [listing] = [call.request for call in log.requests]
    assert listing == Request(
        "DetectFunction",
        "s3:ListBucket",
        MODELS,
        {"s3:prefix": "models/grounding-dino-tiny/", "aws:SecureTransport": "true"},
    )
    assert log.problems == ["DetectFunction: s3:HeadBucket is not mapped to IAM in aws_requests.py"]


def test_a_client_for_another_region_is_a_problem_naming_the_function() -> None:
    with mock_aws(), record_requests("eu-central-1", "123456789012") as log:
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="input-bucket")
        with acting_as("IngestFunction"):
            boto3.client("s3", region_name="us-east-1").list_objects_v2(Bucket="input-bucket", Prefix="incoming/")
    assert log.problems == ["IngestFunction: s3:ListBucket from a client for us-east-1, not eu-central-1"]
