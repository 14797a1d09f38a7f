"""A deployed stack's outputs: where its buckets, queues, state machine and tables are."""

from __future__ import annotations

from typing import Any

from shared.errors import RequestRejected


def stack_outputs(stack_name: str, required: tuple[str, ...] = (), cloudformation: Any = None) -> dict[str, str]:
    """The stack's outputs by name; boto3 resolves the region (AWS_REGION, or the profile's).

    Raises:
        RequestRejected: the stack does not exist (in this region, for these credentials), or lacks a ``required``
            output (another template's stack).
    """
    import boto3
    from botocore.exceptions import ClientError

    client = cloudformation or boto3.client("cloudformation")
    try:
        [stack] = client.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as error:
        raise RequestRejected(f"stack {stack_name!r}: {error.response['Error']['Message']}") from error
    outputs = {output["OutputKey"]: output["OutputValue"] for output in stack.get("Outputs", [])}
    missing = [name for name in required if name not in outputs]
    if missing:
        raise RequestRejected(f"stack {stack_name!r} has no output {', '.join(missing)}: is it this project's stack?")
    return outputs
