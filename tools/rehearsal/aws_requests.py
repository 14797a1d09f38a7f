"""Every AWS request a deployed principal makes during the rehearsal, as IAM would see it.

A botocore hook on the default session sees each call of every client made after :func:`record_requests` starts;
the principal is whoever the rehearsal is acting as in that thread (:func:`acting_as`): a function while its
handler runs, the ingest function while Lambda polls its queue for it, the state machine's role while it
invokes a function or runs a task. Calls made as nobody are the user's own (uploads, sends) and not checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from tools.rehearsal.iam import Request

_principal: ContextVar[str | None] = ContextVar("rehearsal_principal", default=None)


@contextmanager
def acting_as(principal: str) -> Iterator[None]:
    token = _principal.set(principal)
    try:
        yield
    finally:
        _principal.reset(token)


def current_principal() -> str | None:
    return _principal.get()


def _object(params: Mapping[str, Any], region: str, account: str) -> str:
    return f"arn:aws:s3:::{params['Bucket']}/{params['Key']}"


def _bucket(params: Mapping[str, Any], region: str, account: str) -> str:
    return f"arn:aws:s3:::{params['Bucket']}"


def _queue(params: Mapping[str, Any], region: str, account: str) -> str:
    # https://sqs.REGION.amazonaws.com/ACCOUNT/NAME
    owner, name = urlparse(params["QueueUrl"]).path.strip("/").split("/")[-2:]
    return f"arn:aws:sqs:{region}:{owner}:{name}"


def _table(params: Mapping[str, Any], region: str, account: str) -> str:
    return f"arn:aws:dynamodb:{region}:{account}:table/{params['TableName']}"


def _prefix(params: Mapping[str, Any]) -> dict[str, str]:
    return {"s3:prefix": params.get("Prefix", "")}


# (IAM prefix, operation) -> (IAM action, resource ARN from the parameters, condition keys from the parameters).
# A call that is not here fails the rehearsal: an unmapped call would be an unchecked one.
Mapper = tuple[str, Callable[[Mapping[str, Any], str, str], str], Callable[[Mapping[str, Any]], dict[str, str]]]


def _function(params: Mapping[str, Any], region: str, account: str) -> str:
    name = str(params["FunctionName"])
    return name if name.startswith("arn:") else f"arn:aws:lambda:{region}:{account}:function:{name}"


def _no_keys(params: Mapping[str, Any]) -> dict[str, str]:
    return {}


OPERATIONS: dict[tuple[str, str], Mapper] = {
    ("s3", "GetObject"): ("s3:GetObject", _object, _no_keys),
    ("s3", "HeadObject"): ("s3:GetObject", _object, _no_keys),  # HEAD is authorised as GetObject
    ("s3", "PutObject"): ("s3:PutObject", _object, _no_keys),
    ("s3", "DeleteObject"): ("s3:DeleteObject", _object, _no_keys),
    ("s3", "ListObjectsV2"): ("s3:ListBucket", _bucket, _prefix),
    ("s3", "ListObjects"): ("s3:ListBucket", _bucket, _prefix),
    ("states", "StartExecution"): ("states:StartExecution", lambda p, r, a: p["stateMachineArn"], _no_keys),
    ("dynamodb", "GetItem"): ("dynamodb:GetItem", _table, _no_keys),
    ("dynamodb", "PutItem"): ("dynamodb:PutItem", _table, _no_keys),
    ("dynamodb", "UpdateItem"): ("dynamodb:UpdateItem", _table, _no_keys),
    ("dynamodb", "DeleteItem"): ("dynamodb:DeleteItem", _table, _no_keys),
    ("sqs", "ReceiveMessage"): ("sqs:ReceiveMessage", _queue, _no_keys),
    ("sqs", "DeleteMessage"): ("sqs:DeleteMessage", _queue, _no_keys),
    ("sqs", "DeleteMessageBatch"): ("sqs:DeleteMessage", _queue, _no_keys),
    ("sqs", "GetQueueAttributes"): ("sqs:GetQueueAttributes", _queue, _no_keys),
    ("lambda", "Invoke"): ("lambda:InvokeFunction", _function, _no_keys),
    ("secretsmanager", "GetSecretValue"): ("secretsmanager:GetSecretValue", lambda p, r, a: p["SecretId"], _no_keys),
}


@dataclass(frozen=True)
class SeenRequest:
    request: Request
    region: str  # the region of the client that made it


@dataclass
class RequestLog:
    region: str
    account: str
    requests: list[SeenRequest] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # unmapped operations, clients for the wrong region

    def add(self, request: Request, region: str) -> None:
        self.requests.append(SeenRequest(request, region))
        if region != self.region:
            self.problems.append(f"{request.principal}: {request.action} from a client for {region}, not {self.region}")

    def hook(self, params: Mapping[str, Any], model: Any, context: Mapping[str, Any], **_: Any) -> None:
        principal = current_principal()
        if principal is None:
            return
        service = model.service_model.endpoint_prefix
        region = str(context.get("client_region"))
        mapper = OPERATIONS.get((service, model.name))
        if mapper is None:
            self.problems.append(f"{principal}: {service}:{model.name} is not mapped to IAM in aws_requests.py")
            return
        action, resource, keys = mapper
        # boto3 speaks HTTPS unless told otherwise, and nothing here tells it otherwise.
        condition_keys = keys(params) | {"aws:SecureTransport": "true"}
        self.add(Request(principal, action, resource(params, region, self.account), condition_keys), region)


@contextmanager
def record_requests(region: str, account: str) -> Iterator[RequestLog]:
    """Inside: every call of a boto3 client made here (``boto3.client(...)``) is recorded for its principal."""
    import boto3

    log = RequestLog(region, account)
    boto3.setup_default_session()  # clients made before this one do not carry the hook: none may be reused
    session = boto3.DEFAULT_SESSION
    assert session is not None
    session.events.register("provide-client-params", log.hook, unique_id="annotate-rehearsal")
    try:
        yield log
    finally:
        session.events.unregister("provide-client-params", unique_id="annotate-rehearsal")
