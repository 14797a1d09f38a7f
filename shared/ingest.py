"""From messages to workflow executions: prompt messages and S3 object-created events (via EventBridge).

The SQS-triggered ingest function and the local `annotate send` / `annotate run` share this code; only the
:class:`WorkflowStarter` differs (Step Functions in AWS, the local runner on a laptop).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.parser.models import S3EventNotificationEventBridgeModel
from pydantic import ValidationError

from shared.batches import plan_batches
from shared.contracts import BatchManifest, PromptMessage
from shared.errors import RequestRejected, TransientError, validation_reason
from shared.observability import MetricUnit, logger, metrics, tracer
from shared.settings import IngestSettings
from shared.storage import StoreFor, is_s3, join_uri, split_s3

MANIFESTS_PREFIX = "manifests"
MAX_MESSAGE_BYTES = 256 * 1024  # SQS's own limit; a local file may not exceed it either


class WorkflowStarter(Protocol):
    def start(self, manifest: BatchManifest, name: str) -> str:
        """Start one execution; starting the same ``name`` again must not start a second one."""
        ...


def parse_body(body: str) -> PromptMessage | S3EventNotificationEventBridgeModel:
    """A prompt message, or an S3 object-created event as EventBridge delivers it.

    Raises:
        RequestRejected: the body is neither; the message says why.
    """
    if len(body.encode()) > MAX_MESSAGE_BYTES:
        raise RequestRejected(f"message is over {MAX_MESSAGE_BYTES} bytes")
    try:
        document = json.loads(body)
    except ValueError as error:
        raise RequestRejected(f"message is not JSON: {error}") from error
    try:
        if isinstance(document, dict) and document.get("source") == "aws.s3":
            event = S3EventNotificationEventBridgeModel.model_validate(document)
            if event.detail_type != "Object Created":
                raise RequestRejected(f"S3 event {event.detail_type!r} is not an object creation")
            return event
        return PromptMessage.model_validate(document)
    except ValidationError as error:
        raise RequestRejected(validation_reason(error)) from error


def dead_letter(body: str, reason: str, source: str, results_root: str, store_for: StoreFor) -> str:
    """Keep a rejected message with its reason (the local dead-letter place); returns where it went."""
    digest = hashlib.sha256(body.encode(errors="replace")).hexdigest()[:16]
    uri = join_uri(results_root, "dead-letter", f"{digest}.json")
    record = {"source": source, "reason": reason, "body": body}
    store_for(uri).write_bytes(uri, json.dumps(record, indent=2).encode(), "application/json")
    logger.warning("message dead-lettered", extra={"source": source, "reason": reason, "dead_letter_uri": uri})
    return uri


def execution_name(batch_id: str, delivery: str) -> str:
    """Deterministic: the same batch from the same delivery (a redelivered message) gets the same name."""
    return f"{batch_id}-{hashlib.sha256(delivery.encode()).hexdigest()[:16]}"


def refuse_outside_buckets(locations: list[str], buckets: Collection[str]) -> None:
    """AWS mode: every location must be an ``s3://`` object or prefix in one of ``buckets``.

    Local paths would otherwise be read from the function's own file system (``/var/task``, ``/etc``) and
    copied into the results bucket; other buckets may belong to someone else.

    Raises:
        RequestRejected: the first location that is not allowed, and why.
    """
    if not buckets:
        raise RequestRejected("no input bucket is configured (ANNOTATE_INPUT_BUCKETS): every location is refused")
    for location in locations:
        if not is_s3(location):
            raise RequestRejected(f"{location!r} is not an s3:// location; only s3:// objects and prefixes are read")
        try:
            bucket, _ = split_s3(location)
        except ValueError as error:
            raise RequestRejected(str(error)) from error
        if bucket not in buckets:
            raise RequestRejected(
                f"{location!r} is not in an input bucket of this stack ({', '.join(sorted(buckets))})"
            )


@tracer.capture_method
def start_batches(
    message: PromptMessage,
    delivery: str,
    settings: IngestSettings,
    starter: WorkflowStarter,
    store_for: StoreFor,
    allowed_buckets: Collection[str] | None = None,
) -> list[str]:
    """Plan the message's batches, keep their manifests beside the results, and start one execution each.

    ``allowed_buckets`` is AWS mode: only ``s3://`` locations in those buckets are accepted (None: local mode).
    """
    if allowed_buckets is not None:
        refuse_outside_buckets(message.images, allowed_buckets)
    if message.variants is not None and not settings.variants_enabled:
        raise RequestRejected("the message asks for variants, but this stack was deployed without them")
    manifests = plan_batches(message, settings.max_images_per_batch, settings.results_root, store_for)
    if not manifests:
        raise RequestRejected("the message's locations hold no images: " + ", ".join(message.images[:5]))
    started = []
    for index, manifest in enumerate(manifests):
        uri = join_uri(settings.results_root, MANIFESTS_PREFIX, f"{manifest.batch_id}.json")
        store_for(uri).write_bytes(uri, manifest.model_dump_json(indent=2).encode(), "application/json")
        started.append(starter.start(manifest, execution_name(manifest.batch_id, f"{delivery}#{index}")))
    logger.info("batches started", extra={"delivery": delivery, "batches": len(started), "executions": started})
    metrics.add_metric(name="BatchesStarted", unit=MetricUnit.Count, value=len(started))
    metrics.add_metric(name="ImagesStarted", unit=MetricUnit.Count, value=sum(len(m.images) for m in manifests))
    return started


@dataclass
class _S3Group:
    record_ids: list[str] = field(default_factory=list)
    uris: list[str] = field(default_factory=list)
    identities: list[str] = field(default_factory=list)


def ingest_sqs_batch(
    event: dict[str, Any],
    settings: IngestSettings,
    starter: WorkflowStarter,
    store_for: StoreFor,
    allowed_buckets: Collection[str] | None = None,
) -> dict[str, Any]:
    """Handle one SQS batch: each prompt message starts its own batches; the S3 events are grouped into one.

    ``allowed_buckets``: AWS mode, see :func:`start_batches`.

    Returns the partial batch response: the records that failed (a malformed message, a start that failed)
    come back to the queue, and after the queue's receive limit reach its dead-letter queue; the rest succeed.
    """
    s3_group = _S3Group()

    def handle(record: SQSRecord) -> None:
        try:
            parsed = parse_body(record.body)
            if isinstance(parsed, PromptMessage):
                start_batches(parsed, record.message_id, settings, starter, store_for, allowed_buckets)
                return
        except RequestRejected as error:
            logger.warning("message rejected", extra={"message_id": record.message_id, "reason": str(error)})
            metrics.add_metric(name="MessagesRejected", unit=MetricUnit.Count, value=1)
            raise
        detail = parsed.detail
        s3_group.record_ids.append(record.message_id)
        s3_group.uris.append(f"s3://{detail.bucket.name}/{detail.object.key}")
        s3_group.identities.append(f"{detail.bucket.name}/{detail.object.key}@{detail.object.sequencer}")

    processor = BatchProcessor(event_type=EventType.SQS)
    with processor(records=event.get("Records", []), handler=handle):
        processor.process()
    response: dict[str, Any] = dict(processor.response())
    if s3_group.uris:
        message = PromptMessage(prompt=settings.ingest_prompt, images=s3_group.uris)
        try:
            start_batches(message, "|".join(sorted(s3_group.identities)), settings, starter, store_for, allowed_buckets)
        except Exception:
            logger.exception("starting the S3 batch failed", extra={"images": len(s3_group.uris)})
            response["batchItemFailures"] += [{"itemIdentifier": record_id} for record_id in s3_group.record_ids]
    return response


class StepFunctionsStarter:
    """Starts executions of the deployed workflow; a name that already ran is a redelivery, not an error."""

    def __init__(self, client: Any, state_machine_arn: str) -> None:
        self._sfn = client
        self._arn = state_machine_arn

    def start(self, manifest: BatchManifest, name: str) -> str:
        from botocore.exceptions import ClientError

        try:
            return str(
                self._sfn.start_execution(stateMachineArn=self._arn, name=name, input=manifest.model_dump_json())[
                    "executionArn"
                ]
            )
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code == "ExecutionAlreadyExists":
                logger.info("execution already started", extra={"name": name})
                return self._arn.replace(":stateMachine:", ":execution:") + f":{name}"
            if code in {"ThrottlingException", "ServiceUnavailable", "InternalFailure"}:
                raise TransientError(f"StartExecution failed: {error}") from error
            raise


@functools.cache
def deployed_starter(state_machine_arn: str) -> StepFunctionsStarter:
    """The starter of the deployed workflow; one client per process, reused while the function is warm.

    The client's region is boto3's own resolution (Lambda sets AWS_REGION to the function's region).
    """
    import boto3

    if not state_machine_arn:
        raise RequestRejected("ANNOTATE_STATE_MACHINE_ARN is not set")
    return StepFunctionsStarter(boto3.client("stepfunctions"), state_machine_arn)
