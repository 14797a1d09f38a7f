"""What AWS does that moto does not, taught to the rehearsal: each behaviour with the documentation line it follows.

- S3 answers a missing key with 403 to a principal that may not list the bucket: "If you don't have the
  s3:ListBucket permission, Amazon S3 returns an HTTP status code 403 Access Denied error" (S3 API reference,
  GetObject and HeadObject, Permissions). moto answers 404 to everyone.
- Lambda runs a SnapStart function's init, and its before-snapshot hooks, when a version is published: "Publish a
  function version. Lambda initializes your code, creates a snapshot of the initialized execution environment"
  (Lambda developer guide, Activating and managing Lambda SnapStart). CloudFormation publishes the stack's versions
  while it creates or updates the stack, so an init that raises fails the deployment. moto publishes without
  running anything.
- A function URL lets a call through only with both permissions: "Starting in October 2025, new function URLs will
  require both lambda:InvokeFunctionUrl and lambda:InvokeFunction permissions" (Lambda developer guide, Control
  access to Lambda function URLs). With AuthType NONE the function's resource-based policy "must grant public
  access"; with AWS_IAM the signed caller's identity policy grants them. Anything else is 403 before the function
  runs. moto neither serves the URL nor checks either policy.
- A function URL carries at most 6 MB each way: "Invocation payload (request and response): 6 MB each for request
  and response (synchronous)" (Lambda quotas); a larger request is refused before the function runs (413), a larger
  response fails the invocation (502). moto passes any size.
- PublishVersion publishes nothing new for a function whose code and configuration have not changed: "Lambda
  doesn't publish a version if the function's configuration and code haven't changed since the last version"
  (Lambda API reference, PublishVersion). A stack update that replaces an AWS::Lambda::Version (its Description
  changed: "Update requires: Replacement") of such a function fails with "A version for this Lambda function exists"
  and rolls back. moto publishes a version every time.
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tools.aws.sam_template import by_default
from tools.rehearsal.aws_requests import RequestLog, acting_as, current_principal
from tools.rehearsal.iam import Request, evaluate

if TYPE_CHECKING:
    from tools.rehearsal.stack import DeployedFunction, DeployedStack


@contextmanager
def missing_keys_answer_403(stack: DeployedStack, log: RequestLog) -> Iterator[None]:
    """Inside: a deployed principal's GetObject or HeadObject of a missing key fails with 403 AccessDenied unless its
    role allows s3:ListBucket on the bucket (which is then recorded as a request it made use of)."""
    import boto3

    from shared.storage import objects as storage
    from tools.rehearsal.stack import policies

    # read now, as nobody: a lookup made while a function acts would be recorded as that function's request
    statements = {principal: policies(stack, role) for principal, role in stack.principals.items()}

    def note_bucket(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["rehearsal_bucket"] = params["Bucket"]  # the request's context reaches its after-call event

    def answer(http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        principal = current_principal()
        if principal is None or http_response.status_code != 404:
            return
        bucket = f"arn:aws:s3:::{context['rehearsal_bucket']}"
        # No s3:prefix: a GetObject has none, so a ListBucket allowed only under a prefix does not count
        listing = Request(principal, "s3:ListBucket", bucket, {"aws:SecureTransport": "true"})
        if evaluate(statements[principal], listing).allowed:
            log.add(listing, stack.region)
            return
        parsed["Error"] = {"Code": "AccessDenied", "Message": "Access Denied"}
        parsed.setdefault("ResponseMetadata", {})["HTTPStatusCode"] = 403

    session = boto3.DEFAULT_SESSION
    assert session is not None, "start record_requests first: its session is the one every client is made from"
    hooks = [
        (f"{event}.s3.{operation}", handler, f"rehearsal-403-{event}-{operation}")
        for operation in ("GetObject", "HeadObject")
        for event, handler in (("provide-client-params", note_bucket), ("after-call", answer))
    ]
    for event, handler, unique_id in hooks:
        session.events.register(event, handler, unique_id=unique_id)
    storage.refresh_clients()  # a client copies the session's hooks when it is made: the code's are made anew
    try:
        yield
    finally:
        for event, _, unique_id in hooks:
            session.events.unregister(event, unique_id=unique_id)
        storage.refresh_clients()


class PublishFailed(RuntimeError):
    """What CloudFormation reports when a SnapStart version's init or before-snapshot hook raised: the stack rolls
    back."""


@contextmanager
def _snapstart_runtime() -> Iterator[list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]]]:
    """The Lambda Python runtime's ``snapshot_restore_py`` (present under SnapStart only), as a module whose
    before-snapshot registry this yields."""
    before: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []
    module = types.ModuleType("snapshot_restore_py")

    def register_before_snapshot(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
        before.append((func, args, kwargs))
        return func

    def register_after_restore(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
        return func  # a restore is not rehearsed: the handlers run in the process that published

    module.register_before_snapshot = register_before_snapshot  # type: ignore[attr-defined]
    module.register_after_restore = register_after_restore  # type: ignore[attr-defined]
    saved = sys.modules.get("snapshot_restore_py")
    sys.modules["snapshot_restore_py"] = module
    try:
        yield before
    finally:
        if saved is None:
            sys.modules.pop("snapshot_restore_py", None)
        else:
            sys.modules["snapshot_restore_py"] = saved


# What a function's version does not hold: set on the function itself, whatever version runs
# A SAM function's Policies become a role of its own, which the function names by ARN only: a policy's change is
# the role's, and publishes no version.
NOT_IN_A_VERSION = frozenset({"ReservedConcurrentExecutions", "Tags", "Policies"})


def _with_parameters(template: dict[str, Any], value: Any, parameters: dict[str, str]) -> Any:
    """``value`` as a deployment with ``parameters`` (the others at their defaults) has it: parameter Refs,
    conditions and the parameters a Fn::Sub names resolved."""
    resolved = by_default(template, value, parameters)
    given = {name: parameters.get(name, declared.get("Default")) for name, declared in template["Parameters"].items()}

    def substituted(item: Any) -> Any:
        if isinstance(item, list):
            return [substituted(element) for element in item]
        if not isinstance(item, dict):
            return item
        if set(item) == {"Fn::Sub"}:
            text, variables = (item["Fn::Sub"], {}) if isinstance(item["Fn::Sub"], str) else item["Fn::Sub"]
            for name, parameter in given.items():
                text = text.replace("${" + name + "}", str(parameter))
            return {"Fn::Sub": [text, substituted(variables)]}
        return {key: substituted(element) for key, element in item.items()}

    return substituted(resolved)


def versions_replaced(template: dict[str, Any], before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The functions (logical ids) whose version a stack update from parameters ``before`` to ``after`` replaces, as
    CloudFormation decides it (a version's properties changed) and Lambda then publishes it. Raises
    :class:`PublishFailed` for a replaced version whose function's code and configuration did not change, as
    PublishVersion then publishes nothing and the update fails."""
    resources = template["Resources"]
    versions = {name: version for name, version in resources.items() if version["Type"] == "AWS::Lambda::Version"}
    changed = {
        name
        for name, version in versions.items()
        if _with_parameters(template, version["Properties"], before)
        != _with_parameters(template, version["Properties"], after)
    }
    while True:  # a version whose description names a replaced version's number resolves anew: replaced too
        naming = {name for name in versions if name not in changed and _refs(versions[name]["Properties"]) & changed}
        if not naming:
            break
        changed |= naming
    replaced = []
    for name in (name for name in versions if name in changed):  # in the template's order
        function = versions[name]["Properties"]["FunctionName"]["Ref"]
        configuration = {k: v for k, v in resources[function]["Properties"].items() if k not in NOT_IN_A_VERSION}
        if _with_parameters(template, configuration, before) == _with_parameters(template, configuration, after):
            raise PublishFailed(
                f"PublishVersion of {function} failed: A version for this Lambda function exists. Modify the function"
                " to create a new version (its version's description changed, but not its code or configuration)"
            )
        replaced.append(function)
    return replaced


def _refs(value: Any) -> set[str]:
    """The logical ids ``value`` names with Ref."""
    if isinstance(value, list):
        return set().union(*map(_refs, value)) if value else set()
    if not isinstance(value, dict):
        return set()
    found = set().union(*map(_refs, value.values())) if value else set()
    return found | ({value["Ref"]} if isinstance(value.get("Ref"), str) else set())


def publish_versions(
    stack: DeployedStack, run_as: Callable[[DeployedFunction], Any], only: Collection[str] | None = None
) -> list[str]:
    """PublishVersion of every function deployed with SnapStart on published versions (``only`` those, on an
    update: :func:`versions_replaced`): its module's init (as a new environment runs it) and then its
    before-snapshot hooks, with its deployed settings and as its role (``run_as`` gives that context). Returns the
    functions published; raises :class:`PublishFailed` naming the first that raised, as the stack would fail."""
    published = []
    for function in stack.functions.values():
        if only is not None and function.logical_id not in only:
            continue
        # moto keeps no SnapStart setting: read it from the template as the stack's parameters resolve it
        properties = stack.template["Resources"][function.logical_id]["Properties"]
        snapstart = by_default(stack.template, properties.get("SnapStart", {}), stack.deployment.parameters)
        if snapstart.get("ApplyOn") != "PublishedVersions":
            continue
        with run_as(function), _snapstart_runtime() as before_snapshot, acting_as(function.logical_id):
            try:
                module = importlib.import_module(function.code.module)
                importlib.reload(module)  # init runs anew in the environment Lambda snapshots
                for hook, args, kwargs in before_snapshot:
                    hook(*args, **kwargs)
            except Exception as error:
                raise PublishFailed(
                    f"PublishVersion of {function.logical_id} failed: SnapStart ran its init at deploy time and it "
                    f"raised {type(error).__name__}: {error}. Push the models before deploying with "
                    "EnableSnapStart=true (docs/deploy.md)"
                ) from error
        published.append(function.logical_id)
    return published


def function_url_event(
    url: str, method: str, path: str, body: bytes, headers: dict[str, str], caller: str = ""
) -> dict:
    """The event a function URL hands the function (payload format 2.0); ``caller``: the signing role's ARN."""
    import base64
    import time
    import uuid
    from urllib.parse import urlparse

    host = urlparse(url).netloc
    context: dict[str, Any] = {
        "accountId": "anonymous",
        "apiId": host.split(".", 1)[0],
        "domainName": host,
        "domainPrefix": host.split(".", 1)[0],
        "http": {"method": method, "path": path, "protocol": "HTTP/1.1", "sourceIp": "203.0.113.7", "userAgent": "r"},
        "requestId": str(uuid.uuid4()),
        "routeKey": "$default",
        "stage": "$default",
        "timeEpoch": int(time.time() * 1000),
    }
    if caller:
        context["authorizer"] = {"iam": {"accountId": caller.split(":")[4], "userArn": caller, "userId": "AROA"}}
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": "",
        "headers": {"host": host, **{k.lower(): v for k, v in headers.items()}},
        "requestContext": context,
        "body": base64.b64encode(body).decode(),
        "isBase64Encoded": True,
    }


INVOCATION_PAYLOAD_BYTES = 6 * 2**20  # Lambda's synchronous invocation payload, each way


def payload_refusal(event: dict[str, Any], response: dict[str, Any] | None = None) -> tuple[int, str] | None:
    """The function URL's own answer to a request event, or to the function's response, over Lambda's 6 MB."""
    if len(json.dumps(event)) > INVOCATION_PAYLOAD_BYTES:
        return 413, f"Request must be smaller than {INVOCATION_PAYLOAD_BYTES} bytes for the InvokeFunction operation"
    if response is not None and len(json.dumps(response)) > INVOCATION_PAYLOAD_BYTES:
        return 502, f"Response payload size exceeded maximum allowed payload size ({INVOCATION_PAYLOAD_BYTES} bytes)"
    return None


def _public(statement: dict[str, Any], action: str, condition: tuple[str, Any]) -> bool:
    principal = statement.get("Principal")
    key, value = condition
    return (
        statement.get("Effect") == "Allow"
        and principal in ("*", {"AWS": "*"})
        and statement.get("Action") == action
        and str(statement.get(key, "")).lower() == str(value).lower()
    )


def function_url_refusal(
    resource_policy: list[dict[str, Any]], auth_type: str, function_arn: str, caller: list | None = None
) -> str | None:
    """Why the function URL answers 403 before the function runs, or None when the call gets through. ``caller``:
    the signing principal's policy statements (AWS_IAM)."""
    if auth_type == "NONE":
        url = any(_public(s, "lambda:InvokeFunctionUrl", ("FunctionUrlAuthType", "NONE")) for s in resource_policy)
        invoke = any(_public(s, "lambda:InvokeFunction", ("InvokedViaFunctionUrl", True)) for s in resource_policy)
        if not (url and invoke):
            return "Forbidden: the resource-based policy must grant lambda:InvokeFunctionUrl and lambda:InvokeFunction"
        return None
    for action in ("lambda:InvokeFunctionUrl", "lambda:InvokeFunction"):
        if not evaluate(caller or [], Request("caller", action, function_arn)).allowed:
            return f"Forbidden: the caller may not {action} on {function_arn}"
    return None
