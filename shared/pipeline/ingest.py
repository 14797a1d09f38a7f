"""From messages to workflow executions: prompt messages and S3 object-created events (via EventBridge).

The SQS-triggered ingest function and the local `annotate send` / `annotate run` share this code; only the
:class:`WorkflowStarter` differs (Step Functions in AWS, the local runner on a laptop).
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.parser.models import S3EventNotificationEventBridgeModel
from pydantic import TypeAdapter, ValidationError

from shared.aws import client, is_throttle
from shared.contracts import AnnotationRequest, BatchInput, ImageGroup, PromptMessage
from shared.errors import RequestRejected, TransientError, validation_reason
from shared.observability import MetricUnit, logger, metrics
from shared.pipeline.batches import LaneChoice, PlannedBatch, groups_per_bulk_job, plan_batches
from shared.pipeline.claims import Claim, ClaimTable, Pass
from shared.pipeline.tracing import tracer
from shared.settings import IngestSettings
from shared.storage import layout
from shared.storage.objects import StoreFor, is_s3, split_s3

# "Amazon SQS, Amazon EventBridge, and AWS Lambda asynchronous invocations now support payloads of up to 1 MB" (AWS
# Compute Blog, "More room to build: serverless services now support payloads up to 1 MB", 2026-01-29): what the
# queues accept is read; a local file may not exceed it either
MAX_MESSAGE_BYTES = 1024 * 1024


class WorkflowStarter(Protocol):
    def start(self, batch: BatchInput, name: str) -> str:
        """Start one execution; starting the same ``name`` again must not start a second one."""
        ...

    def exists(self, name: str) -> bool:
        """Whether an execution of that name was started."""
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
    except RecursionError as error:  # a message of thousands of nested brackets: the parser's stack runs out
        raise RequestRejected("message is not a valid message: its JSON is nested too deeply") from error
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
    uri = layout.dead_letter(results_root, digest)
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
    choice: LaneChoice | None = None,
    fingerprints: Mapping[str, str] | None = None,
    intend: Callable[[dict[str, list[str]]], None] | None = None,
    before_start: Callable[[], None] | None = None,
    started: Callable[[str, list[str]], None] | None = None,
) -> list[str]:
    """Plan the message's batches (in ``choice``'s lane, if given), write each one's input and groups manifest beside
    the results, and start one execution each (one per message unless it names more than ``max_images_per_batch``
    images).

    ``allowed_buckets`` is AWS mode: only ``s3://`` locations in those buckets are accepted (None: local mode).
    ``fingerprints``: what the images' content is known to be (an S3 event's ETag), not asked of S3 again.
    ``intend``: told, before anything starts, each execution's name and the images (URIs) it annotates.
    ``before_start``: called before each start (it raises to start nothing more: a pass out of time).
    ``started``: told each execution's name and its images (URIs) once it started, before the next is planned.
    """
    if allowed_buckets is not None:
        refuse_outside_buckets(message.images, allowed_buckets)
    if message.variants is not None and not settings.variants_enabled:
        raise RequestRejected("the message asks for variants, but this stack was deployed without them")
    batches = plan_batches(message, settings, store_for, choice=choice, fingerprints=fingerprints)
    if not batches:
        raise RequestRejected("the message's locations hold no images: " + ", ".join(message.images[:5]))
    names = [execution_name(batch.input.batch_id, f"{delivery}#{index}") for index, batch in enumerate(batches)]
    batches = [
        replace(batch, input=batch.input.model_copy(update={"execution": name}))
        for name, batch in zip(names, batches, strict=True)
    ]
    if intend is not None:
        intend({name: batch.image_uris() for name, batch in zip(names, batches, strict=True)})
    executions: list[str] = []
    for name, batch in zip(names, batches, strict=True):
        if before_start is not None:
            before_start()
        written = written_once(batch, store_for, settings)
        executions.append(starter.start(written.input, name))
        if started is not None:
            started(name, written.image_uris())
    logger.info(
        "batches started",
        extra={
            "delivery": delivery,
            "lane": batches[0].input.lane,
            "batches": len(executions),
            "executions": executions,
        },
    )
    metrics.add_metric(name="BatchesStarted", unit=MetricUnit.Count, value=len(executions))
    metrics.add_metric(name="ImagesStarted", unit=MetricUnit.Count, value=sum(b.input.images for b in batches))
    return executions


def written_once(batch: PlannedBatch, store_for: StoreFor, settings: IngestSettings) -> PlannedBatch:
    """The batch as its manifests hold it, each written once: the groups manifest, then its input (S3's conditional
    write, If-None-Match). A batch planned before (a message delivered again after a pass that wrote them and died,
    under another deployment's settings) is started as it was planned then, so that the execution, its Map and
    SummarizeBatch read one grouping. Its bulk jobs are a function of the groups and the input alone."""
    groups_uri = layout.all_groups(batch.input)
    if not store_for(groups_uri).write_once(groups_uri, batch.groups_manifest(), "application/json"):
        earlier = TypeAdapter(list[ImageGroup]).validate_json(store_for(groups_uri).read_bytes(groups_uri))
        if earlier != batch.groups:
            logger.info("a batch planned before: its groups kept", extra={"batch_id": batch.input.batch_id})
            update = {"groups": len(earlier), "images": sum(len(group.images) for group in earlier)}
            if batch.input.lane == "bulk":
                update["bulk_jobs"] = -(-len(earlier) // groups_per_bulk_job(len(earlier), settings))
            batch = replace(batch, groups=earlier, input=batch.input.model_copy(update=update))
    input_uri = layout.batch_input(batch.input.results_uri, batch.input.batch_id)
    document = batch.input.model_dump_json(indent=2).encode()
    if not store_for(input_uri).write_once(input_uri, document, "application/json"):
        earlier_input = BatchInput.model_validate_json(store_for(input_uri).read_bytes(input_uri))
        batch = replace(batch, input=earlier_input.model_copy(update={"execution": batch.input.execution}))
    if batch.input.lane == "bulk":
        batch.write_bulk_jobs(store_for)
    return batch


@dataclass(frozen=True)
class S3Object:
    """A dropped image as its event names it: its identity is bucket, key and ETag."""

    bucket: str
    key: str
    etag: str

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def event_identity(event: S3Object, request: AnnotationRequest) -> str:
    """What makes a drop one: the object, its content (ETag), and what it is annotated with."""
    digest = hashlib.sha256(request.model_dump_json().encode()).hexdigest()
    return f"{event.bucket}/{event.key}@{event.etag}#{digest}"


# A pass starts nothing in the last PASS_MARGIN_S before its function's timeout: its start (with botocore's retries)
# and its claims' marks end before Lambda ends it.
PASS_MARGIN_S = 30


def lambda_pass(context: Any) -> Pass:
    """This invocation as a pass: named by its request, due when Lambda ends it (the function's timeout)."""
    return Pass(id=context.aws_request_id, deadline=time.time() + context.get_remaining_time_in_millis() / 1000)


def ingest_sqs_batch(
    event: dict[str, Any],
    settings: IngestSettings,
    starter: WorkflowStarter,
    store_for: StoreFor,
    allowed_buckets: Collection[str] | None = None,
    holder: Pass | None = None,
    dropped_lane: Callable[[int], LaneChoice] | None = None,
    claims: ClaimTable | None = None,
) -> dict[str, Any]:
    """Handle one SQS batch: each prompt message starts its own batches; the S3 events are grouped into one, in the
    lane ``dropped_lane`` picks for their number (gathered images), or as a message with lane auto. A folder marker
    (a key ending in /, what a console's "Create folder" makes) is no image: it is acknowledged and skipped.

    ``allowed_buckets``: AWS mode, see :func:`start_batches`. ``holder``: this invocation as a pass (its claims on S3
    events are held until its deadline, see shared/pipeline/claims.py); ``claims``: the claims' table (default: the
    settings' idempotency table; none in local mode).

    Returns the partial batch response: the records that failed (a malformed message, a start that failed, an S3
    event another invocation is starting) come back to the queue, and after the queue's receive limit reach its
    dead-letter queue; the rest succeed.
    """
    dropped: dict[str, S3Object] = {}  # SQS message id -> the object its event names
    holder = holder or Pass(id=uuid.uuid4().hex, deadline=time.time() + 2 * PASS_MARGIN_S)

    def handle(record: SQSRecord) -> None:
        try:
            parsed = parse_body(record.body)
            if isinstance(parsed, PromptMessage):
                start_batches(
                    parsed,
                    record.message_id,
                    settings,
                    starter,
                    store_for,
                    allowed_buckets,
                    before_start=lambda: in_time(holder),
                )
                return
        except RequestRejected as error:
            logger.warning("message rejected", extra={"message_id": record.message_id, "reason": str(error)})
            metrics.add_metric(name="MessagesRejected", unit=MetricUnit.Count, value=1)
            raise
        detail = parsed.detail
        if detail.object.key.endswith("/"):  # "Create folder": a 0-byte object named like a prefix, no image
            logger.info("a folder marker: not an image", extra={"key": detail.object.key})
            return
        etag = detail.object.etag or detail.object.sequencer or ""
        dropped[record.message_id] = S3Object(bucket=detail.bucket.name, key=detail.object.key, etag=etag)

    processor = BatchProcessor(event_type=EventType.SQS)
    with processor(records=event.get("Records", []), handler=handle):
        processor.process()
    response: dict[str, Any] = dict(processor.response())
    if dropped:
        if claims is None and settings.idempotency_table:
            claims = claim_table(settings, starter)
        retry = _start_dropped(dropped, settings, starter, store_for, allowed_buckets, holder, claims, dropped_lane)
        response["batchItemFailures"] += [{"itemIdentifier": message_id} for message_id in retry]
    return response


def in_time(holder: Pass) -> None:
    """Raises once ``holder`` is in its last ``PASS_MARGIN_S``: what it would start then might outlive its deadline
    (a StartExecution and its claims' marks, each with botocore's retries), after which another pass may take its
    claims over and start their images again."""
    if holder.left_s() < PASS_MARGIN_S:
        raise TransientError(f"pass {holder.id} is out of time: what is left is left for another")


def claim_table(settings: IngestSettings, starter: WorkflowStarter) -> ClaimTable:
    """The claims in the settings' idempotency table; an execution a dead pass named exists if ``starter`` says so."""
    return ClaimTable(dynamodb_client(), settings.idempotency_table, settings.idempotency_expiry_s, starter.exists)


def _start_dropped(
    dropped: dict[str, S3Object],
    settings: IngestSettings,
    starter: WorkflowStarter,
    store_for: StoreFor,
    allowed_buckets: Collection[str] | None,
    holder: Pass,
    claims: ClaimTable | None,
    dropped_lane: Callable[[int], LaneChoice] | None = None,
) -> list[str]:
    """Start the dropped images no pass started before as one batch (several, past ``max_images_per_batch``); returns
    the SQS message ids to retry. Each batch's events are marked started as soon as it started, so that a pass that
    fails between two batches releases only the events of those it did not start."""
    request = AnnotationRequest(prompt=settings.ingest_prompt)
    identities = {message_id: event_identity(event, request) for message_id, event in dropped.items()}
    events = {identities[message_id]: event for message_id, event in dropped.items()}  # one however often delivered
    claimed = claims.claim_all(events, holder) if claims else dict.fromkeys(events, Claim.NEW)
    skipped = [events[identity].uri for identity, claim in claimed.items() if claim is Claim.STARTED]
    in_flight = {identity for identity, claim in claimed.items() if claim is Claim.IN_FLIGHT}
    if skipped or in_flight:
        logger.info(
            "S3 events started before or in flight", extra={"started": skipped[:20], "in_flight": len(in_flight)}
        )
        metrics.add_metric(name="DuplicateEvents", unit=MetricUnit.Count, value=len(skipped))
    new = {identity: events[identity] for identity, claim in claimed.items() if claim is Claim.NEW}
    retry = [message_id for message_id, identity in identities.items() if identity in in_flight]
    if not new:
        return retry
    by_uri: dict[str, list[str]] = {}  # an object dropped twice with other content is annotated once, as it is now
    for identity, event in new.items():
        by_uri.setdefault(event.uri, []).append(identity)
    unstarted = set(new)

    def intend(executions: dict[str, list[str]]) -> None:
        in_time(holder)
        named = {name: [identity for uri in uris for identity in by_uri[uri]] for name, uris in executions.items()}
        if claims and not claims.intend(named, holder):
            raise TransientError(f"pass {holder.id} lost its claims past its deadline")

    def started(name: str, uris: list[str]) -> None:
        identities_started = [identity for uri in uris for identity in by_uri.get(uri, [])]
        unstarted.difference_update(identities_started)
        if claims:
            claims.started(identities_started, holder)

    message = PromptMessage(prompt=settings.ingest_prompt, images=sorted(by_uri))
    delivery = "|".join(sorted(f"{event.uri}@{event.etag}" for event in new.values()))
    try:
        choice = dropped_lane(len(new)) if dropped_lane else None
        fingerprints = {event.uri: event.etag for event in new.values() if event.etag}
        executions = start_batches(
            message,
            delivery,
            settings,
            starter,
            store_for,
            allowed_buckets,
            choice,
            fingerprints,
            intend,
            before_start=lambda: in_time(holder),
            started=started,
        )
    except Exception:
        logger.exception("starting the S3 batch failed", extra={"images": len(new), "unstarted": len(unstarted)})
        if claims:
            claims.release(unstarted, holder)
        return retry + [message_id for message_id, identity in identities.items() if identity in unstarted]
    logger.info("S3 events started", extra={"images": len(new), "executions": executions})
    return retry


class StepFunctionsStarter:
    """Starts executions of the deployed workflow; a name that already ran is a redelivery, not an error."""

    def __init__(self, client: Any, state_machine_arn: str) -> None:
        self._sfn = client
        self._arn = state_machine_arn

    def start(self, batch: BatchInput, name: str) -> str:
        from botocore.exceptions import ClientError

        try:
            return str(
                self._sfn.start_execution(stateMachineArn=self._arn, name=name, input=batch.model_dump_json())[
                    "executionArn"
                ]
            )
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code == "ExecutionAlreadyExists":
                logger.info("execution already started", extra={"execution_name": name})
                return self._arn.replace(":stateMachine:", ":execution:") + f":{name}"
            if is_throttle(error):
                raise TransientError(f"StartExecution failed: {error}") from error
            raise

    def exists(self, name: str) -> bool:
        from botocore.exceptions import ClientError

        arn = self._arn.replace(":stateMachine:", ":execution:") + f":{name}"
        try:
            self._sfn.describe_execution(executionArn=arn)
            return True
        except ClientError as error:
            if error.response.get("Error", {}).get("Code", "") == "ExecutionDoesNotExist":
                return False
            raise


def dynamodb_client() -> Any:
    """One client per process (shared/aws.py)."""
    return client("dynamodb")


@functools.cache
def deployed_starter(state_machine_arn: str) -> StepFunctionsStarter:
    """The starter of the deployed workflow; one client per process, reused while the function is warm."""
    if not state_machine_arn:
        raise RequestRejected("ANNOTATE_STATE_MACHINE_ARN is not set")
    return StepFunctionsStarter(client("stepfunctions"), state_machine_arn)


def refresh_clients() -> None:
    """New AWS clients on next use (a test's or the rehearsal's fresh moto, or a new region)."""
    from shared.aws import refresh_clients as new_clients

    new_clients()
    deployed_starter.cache_clear()
