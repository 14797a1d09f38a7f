"""The rehearsal's function URL refuses what AWS's would: since October 2025 a call needs both
lambda:InvokeFunctionUrl and lambda:InvokeFunction, from the public policy (NONE) or the signer's (AWS_IAM)."""

from __future__ import annotations

from tools.rehearsal.aws_behaviours import function_url_refusal
from tools.rehearsal.iam import statements

LIVE = "arn:aws:lambda:eu-central-1:123456789012:function:api:live"
PUBLIC_URL = {"Effect": "Allow", "Principal": "*", "Action": "lambda:InvokeFunctionUrl", "FunctionUrlAuthType": "NONE"}
PUBLIC_INVOKE = {"Effect": "Allow", "Principal": "*", "Action": "lambda:InvokeFunction", "InvokedViaFunctionUrl": True}


def _signer(*actions: str) -> list:
    return statements("caller", {"Statement": [{"Effect": "Allow", "Action": list(actions), "Resource": LIVE}]})


def test_a_public_url_needs_both_public_permissions() -> None:
    assert function_url_refusal([PUBLIC_URL, PUBLIC_INVOKE], "NONE", LIVE) is None
    for partial in ([PUBLIC_URL], [PUBLIC_INVOKE], [PUBLIC_URL, PUBLIC_INVOKE | {"InvokedViaFunctionUrl": False}]):
        assert (function_url_refusal(partial, "NONE", LIVE) or "").startswith("Forbidden")


def test_a_signed_url_needs_the_caller_to_hold_both_actions() -> None:
    both = _signer("lambda:InvokeFunctionUrl", "lambda:InvokeFunction")
    assert function_url_refusal([], "AWS_IAM", LIVE, both) is None
    refusal = function_url_refusal([], "AWS_IAM", LIVE, _signer("lambda:InvokeFunctionUrl"))
    assert refusal and "lambda:InvokeFunction " in refusal
    assert function_url_refusal([], "AWS_IAM", LIVE, None)
