"""One run's AWS for the exactly-once checker (tools/local/exactly_once.py): moto with the stack's resources as
template.yaml makes them, a clock of its own, and the functions under test run as Lambda runs them — ended at any
AWS call, throttled at one past botocore's retries, held at one while others run, their batches kept by the poller
when they fail. The queues keep a message for their retention and no longer; the executions Ingest and the gatherer
start run until the checker ends them (each of its groups written, or one job or group failed), or until their
TimeoutSeconds, when EventBridge hands their end to BatchEnded's code (tools/local/drop_executions.py).

One piece: every method moves the same clock, moto and invocations under way; the stack it plays is in
tools/local/drop_stack.py and the executions in tools/local/drop_executions.py."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shared.storage import layout
from tools.local.drop_executions import RESULTS_BUCKET, Broken, Executions
from tools.local.drop_stack import (
    ACCOUNT,
    ALARM_PERIOD_S,
    DEFINITION,
    DEPLOYED_AGAIN,
    INPUT_BUCKET,
    REGION,
    TABLE,
    Stack,
)

# Each service's code for "not now", as botocore raises it once its own retries gave up
THROTTLES = {
    "dynamodb": ("ProvisionedThroughputExceededException", 400),
    "s3": ("SlowDown", 503),
    "sqs": ("RequestThrottled", 403),
    "stepfunctions": ("ThrottlingException", 400),
}


class Killed(BaseException):
    """The function's environment ended at this call (its timeout, or a crash): no code of it runs after."""


@dataclass
class _Invocation:
    """A function running in one thread: its AWS calls counted, ended at ``dies_at`` (or, making fewer calls, after
    its last one, before it answers), a throttle answered at ``throttles_at``, held at ``held_at``."""

    dies_at: int | None = None
    throttles_at: int | None = None
    held_at: int = 0
    calls: int = 0
    deadline: float = float("inf")  # when Lambda ends it
    held: threading.Event = field(default_factory=threading.Event)
    go_on: threading.Event = field(default_factory=threading.Event)
    killed_while_held: bool = False


class FunctionError(Exception):
    """The function raised: Lambda reports a function error, and the poller keeps the batch."""


def _as_function(call: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        try:
            return call(*args)
        except Exception as error:
            raise FunctionError(f"{type(error).__name__}: {error}") from error

    return run


@dataclass(frozen=True)
class Sent:
    """A message in a queue, as the checker follows it: where, since when, and what."""

    queue: str  # the queue's logical id
    at: float
    body: str


class World:
    """One run's AWS: moto, a clock of its own, the invocations under way, and what was dropped and sent."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.clock = time.time()
        self.local = threading.local()
        self.dropped: dict[str, str] = {}  # key -> the event body last sent for it
        self.dropped_at: dict[str, float] = {}  # key -> when it was dropped (its event's first sending)
        self.folders: set[str] = set()
        self.handles: set[str] = set()  # receipt handles of messages received and not deleted
        self.sent: dict[str, Sent] = {}  # message id -> the message, while it is in its queue
        self.expired_unseen: list[str] = []
        self.expired_seen: set[str] = set()  # message ids, and dropped keys, of messages that expired after an alarm
        self.prompted: dict[str, list[str]] = {}  # prompt message id -> the images it names
        self.deployed_again = False
        self.steps = 0

    def now(self) -> float:
        return self.clock

    @contextmanager
    def aws(self) -> Iterator[World]:
        import boto3
        from moto import mock_aws

        from shared.pipeline import ingest
        from shared.storage import objects as storage

        with mock_aws():
            boto3.setup_default_session(region_name=REGION)
            boto3.DEFAULT_SESSION.events.register("before-call", self._before_call)
            boto3.DEFAULT_SESSION.events.register("after-call.sqs.ReceiveMessage", self._received)
            storage.refresh_clients()
            ingest.refresh_clients()
            self.s3 = boto3.client("s3")
            self.sqs = boto3.client("sqs")
            self.dynamodb = boto3.client("dynamodb")
            sfn = boto3.client("stepfunctions")
            for bucket in (INPUT_BUCKET, RESULTS_BUCKET):
                self.s3.create_bucket(Bucket=bucket)
            self.dynamodb.create_table(
                TableName=TABLE,
                AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
                KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
                BillingMode="PAY_PER_REQUEST",
            )
            self.queues = {name: self._queue(name) for name in ("IngestQueue", "PromptsQueue")}
            self.queue = self.queues["IngestQueue"]
            machine = sfn.create_state_machine(
                name="once", definition=DEFINITION, roleArn="arn:aws:iam::123456789012:role/once"
            )
            self.starter = ingest.StepFunctionsStarter(sfn, machine["stateMachineArn"])
            self.sfn, self.machine = sfn, machine["stateMachineArn"]
            self.executions = Executions(self.s3, sfn, self.machine, self.now)
            try:
                yield self
            finally:
                boto3.DEFAULT_SESSION.events.unregister("before-call", self._before_call)
                boto3.DEFAULT_SESSION.events.unregister("after-call.sqs.ReceiveMessage", self._received)
                storage.refresh_clients()
                ingest.refresh_clients()

    def _queue(self, name: str) -> dict[str, str]:
        """A queue and its dead-letter queue, with the template's limits (the retention is the checker's own to keep:
        moto's would count this machine's seconds)."""
        dead = self.sqs.create_queue(QueueName=f"once-{name}-dead")["QueueUrl"]
        dead_arn = self.sqs.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        redrive = {"deadLetterTargetArn": dead_arn, "maxReceiveCount": str(self.stack.max_receives)}
        url = self.sqs.create_queue(
            QueueName=f"once-{name}",
            Attributes={"VisibilityTimeout": str(self.stack.visibility_s), "RedrivePolicy": json.dumps(redrive)},
        )["QueueUrl"]
        return {"url": url, "dead": dead, "name": name}

    def _received(self, parsed: dict[str, Any], **_: Any) -> None:
        """Every message received, by whoever: SQS makes it visible again when its visibility timeout ends."""
        self.handles.update(message["ReceiptHandle"] for message in parsed.get("Messages", []))

    def _before_call(self, model: Any = None, **_: Any) -> None:
        invocation: _Invocation | None = getattr(self.local, "invocation", None)
        if invocation is None:
            return  # the checker's own call, or AWS's (the poller's receive)
        invocation.calls += 1
        if invocation.calls == invocation.held_at:
            invocation.held.set()
            invocation.go_on.wait(timeout=60)
            if invocation.killed_while_held:
                raise Killed("killed while held")
        if invocation.dies_at is not None and invocation.calls >= invocation.dies_at:
            raise Killed(f"died at call {invocation.calls}")
        if invocation.throttles_at == invocation.calls and model is not None:
            from botocore.exceptions import ClientError

            service = model.service_model.service_name
            code, status = THROTTLES.get(service, ("ThrottlingException", 400))
            answer = {
                "Error": {"Code": code, "Message": "Rate exceeded"},
                "ResponseMetadata": {"HTTPStatusCode": status},
            }
            raise ClientError(answer, model.name)  # type: ignore[arg-type]

    # --- what AWS does ------------------------------------------------------------------------------------

    def drop(self, key: str, folder: bool = False) -> None:
        from tools.aws.moto_internals import EventPattern

        body = b"" if folder else f"picture {key}".encode()
        etag = self.s3.put_object(Bucket=INPUT_BUCKET, Key=key, Body=body)["ETag"].strip('"')
        event: dict[str, Any] = {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": "Object Created",
            "source": "aws.s3",
            "account": "123456789012",
            "time": datetime.fromtimestamp(self.clock, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": REGION,
            "resources": [f"arn:aws:s3:::{INPUT_BUCKET}"],
            "detail": {
                "version": "0",
                "bucket": {"name": INPUT_BUCKET},
                "object": {"key": key, "size": len(body), "etag": etag, "sequencer": f"{self.steps:018X}"},
                "request-id": "R",
                "requester": "123456789012",
                "reason": "PutObject",
            },
        }
        if folder:
            self.folders.add(key)
        else:
            self.dropped[key] = json.dumps(event)
            self.dropped_at[key] = self.clock
        if EventPattern(None, self.stack.pattern).matches_event(event):  # type: ignore[arg-type]  # else dropped
            self.send(json.dumps(event))

    def again(self, key: str) -> None:
        """EventBridge delivers the drop's event again ("at least once"), within the day it retries an event."""
        if key in self.dropped and self.clock - self.dropped_at[key] <= self.stack.event_age_s:
            self.send(self.dropped[key])

    def prompt(self, name: str, images: int) -> None:
        """A prompt message naming a prefix of ``images`` new objects (uploaded, not dropped: no events)."""
        keys = [f"prompted/{name}/{n}.jpg" for n in range(images)]
        for key in keys:
            self.s3.put_object(Bucket=INPUT_BUCKET, Key=key, Body=f"picture {key}".encode())
        message = {"prompt": "cat.", "images": [f"s3://{INPUT_BUCKET}/prompted/{name}/"], "caption": False}
        message_id = self.send(json.dumps(message), "PromptsQueue")
        self.prompted[message_id] = [f"s3://{INPUT_BUCKET}/{key}" for key in keys]

    def send(self, body: str, queue: str = "IngestQueue") -> str:
        message_id = str(self.sqs.send_message(QueueUrl=self.queues[queue]["url"], MessageBody=body)["MessageId"])
        self.sent[message_id] = Sent(queue, self.clock, body)
        return message_id

    def time_passes(self, seconds: int) -> None:
        self.clock += seconds
        if seconds >= self.stack.visibility_s:  # every message received and not deleted is visible again
            for handle in sorted(self.handles):
                for queue in self.queues.values():
                    with suppress(Exception):  # deleted, or moved to the dead-letter queue meanwhile
                        self.sqs.change_message_visibility(
                            QueueUrl=queue["url"], ReceiptHandle=handle, VisibilityTimeout=0
                        )
            self.handles.clear()
        self._expire_messages()
        timed_out = [
            arn
            for arn, run in self.executions.running.items()
            if self.clock - run.started_at >= self.stack.execution_timeout_s
        ]
        for arn in timed_out:
            self.executions.time_out(arn)
        if timed_out:  # EventBridge delivers each end as it happens (and retries one it could not, for a day)
            self.run_function("ended", _Invocation())

    def _expire_messages(self) -> None:
        """SQS deletes a message at its queue's retention; one nobody was told of (no alarm on the queue's oldest
        message saw it older than its threshold first) expired unseen."""
        from tools.aws.moto_internals import sqs_backends

        for message_id, sent in list(self.sent.items()):
            age = self.clock - sent.at
            if age < self.stack.retention_s[sent.queue]:
                continue
            queue = sqs_backends["123456789012"][REGION].queues[f"once-{sent.queue}"]
            queue._messages = [m for m in queue._messages if m.id != message_id]
            del self.sent[message_id]
            threshold = self.stack.age_alarm_s.get(sent.queue)
            if threshold is None or threshold + ALARM_PERIOD_S >= age:
                self.expired_unseen.append(f"{sent.queue}: {sent.body[:80]}")
            else:  # lost after the alarm told of it for days: what its messages named is the operator's to send again
                self.expired_seen.add(message_id)
                with suppress(ValueError, KeyError, TypeError):
                    self.expired_seen.add(json.loads(sent.body)["detail"]["object"]["key"])

    def receive(self, limit: int, queue: str = "IngestQueue") -> list[dict[str, Any]]:
        """What Lambda's poller, or a pass, receives: up to ``limit`` visible messages."""
        records: list[dict[str, Any]] = []
        while len(records) < limit:
            answer = self.sqs.receive_message(
                QueueUrl=self.queues[queue]["url"],
                MaxNumberOfMessages=min(10, limit - len(records)),
                AttributeNames=["All"],
            )
            messages = answer.get("Messages", [])
            if not messages:
                break
            for message in messages:
                records.append(
                    {
                        "messageId": message["MessageId"],
                        "receiptHandle": message["ReceiptHandle"],
                        "body": message["Body"],
                        "attributes": {"ApproximateReceiveCount": message["Attributes"]["ApproximateReceiveCount"]},
                        "messageAttributes": {},
                        "md5OfBody": "",
                        "eventSource": "aws:sqs",
                        "eventSourceARN": f"arn:aws:sqs:us-east-1:123456789012:once-{queue}",
                        "awsRegion": REGION,
                    }
                )
        return records

    def delete(self, records: list[dict[str, Any]], queue: str = "IngestQueue") -> None:
        for record in records:
            self.sqs.delete_message(QueueUrl=self.queues[queue]["url"], ReceiptHandle=record["receiptHandle"])
            self.handles.discard(record["receiptHandle"])
            self.sent.pop(record["messageId"], None)

    def deploy_again(self) -> None:
        """The stack is updated with other settings (the groups' size) between two deliveries of a message."""
        self.deployed_again = not self.deployed_again

    # --- the code under test, as a function ------------------------------------------------------------------

    def _settings(self) -> Any:
        from shared.settings import Settings

        return Settings(
            max_wait_minutes=1,  # the dial at its least: every look gathers, the most passes at once
            results_uri=f"s3://{RESULTS_BUCKET}",
            input_buckets=[INPUT_BUCKET],
            idempotency_table=TABLE,
            **(ACCOUNT | (DEPLOYED_AGAIN if self.deployed_again else {})),
        ).ingest

    def _pass(self) -> Any:
        from shared.pipeline.claims import Pass

        return Pass(id=uuid.uuid4().hex, deadline=self.clock + self.stack.timeout_s, clock=self.now)

    def _claims(self) -> Any:
        from shared.pipeline.claims import ClaimTable

        settings = self._settings()
        return ClaimTable(self.dynamodb, TABLE, settings.idempotency_expiry_s, self.starter.exists, self.now, map)

    def ingest(self, invocation: _Invocation, queue: str = "IngestQueue") -> None:
        """Lambda's poller receives a batch and invokes Ingest; what it reports done is deleted, nothing if it died."""
        from shared.pipeline.ingest import ingest_sqs_batch
        from shared.storage.objects import store_for

        records = self.receive(10, queue)
        if not records:
            return
        holder = self._pass()
        invocation.deadline = holder.deadline
        self.local.invocation = invocation
        try:
            response = _as_function(ingest_sqs_batch)(
                {"Records": records},
                self._settings(),
                self.starter,
                store_for,
                [INPUT_BUCKET],
                holder,
                None,
                self._claims(),
            )
        finally:
            self.local.invocation = None
        if invocation.dies_at is not None:  # past its last call, before it answered: the poller deletes nothing
            raise Killed(f"died after its last call ({invocation.calls})")
        failed = {failure["itemIdentifier"] for failure in response["batchItemFailures"]}
        self.delete([record for record in records if record["messageId"] not in failed], queue)
        self._holds_no_claim(holder, invocation)

    def gather(self, invocation: _Invocation) -> None:
        from shared.pipeline.gathering import SqsDropQueue, TableClock, gather_drops
        from shared.storage.objects import store_for

        world = self

        class Queue(SqsDropQueue):
            def delete(self, records: list[dict[str, Any]]) -> None:
                super().delete(records)
                world.handles.difference_update(record["receiptHandle"] for record in records)
                for record in records:
                    world.sent.pop(record["messageId"], None)

        holder = self._pass()
        invocation.deadline = holder.deadline
        now = datetime.fromtimestamp(self.clock, UTC)
        self.local.invocation = invocation
        try:
            _as_function(gather_drops)(
                Queue(self.sqs, self.queue["url"], map, wait_s=0),  # moto's queue is whole: a short poll sees it all
                TableClock(self.dynamodb, TABLE),
                self._settings(),
                self.starter,
                store_for,
                now,
                holder,
                [INPUT_BUCKET],
                self._claims(),
            )
        finally:
            self.local.invocation = None
        self._holds_no_claim(holder, invocation)

    def batch_ended(self, invocation: _Invocation) -> None:
        """EventBridge delivers each waiting end of an execution to BatchEnded, as the template's rule sends it;
        one it cannot deliver is tried again, for the day EventBridge retries an event."""
        from shared.contracts import ExecutionStatusChange
        from shared.pipeline.batch_steps import summarize_ended_execution
        from shared.pipeline.dependencies import Dependencies
        from shared.settings import Settings
        from shared.storage.objects import store_for

        for arn, ended_at in list(self.executions.waiting_events.items()):
            if self.executions.ended[arn] not in self.stack.ended_statuses:
                self.executions.deliver_ended(arn, delivered=False)  # no rule sends it: nothing writes its rows
                continue
            if self.clock - ended_at > self.stack.event_age_s:
                self.executions.deliver_ended(arn, delivered=False)  # to the events' dead-letter queue
                continue
            event = ExecutionStatusChange.model_validate(self.executions.status_change(arn))
            deps = Dependencies(store_for=store_for, image_limits=Settings().image_limits)
            self.local.invocation = invocation
            try:
                _as_function(summarize_ended_execution)(event, deps)
            finally:
                self.local.invocation = None
            self.executions.deliver_ended(arn, delivered=True)

    def _holds_no_claim(self, holder: Any, invocation: _Invocation) -> None:
        """A pass that ended holds no claim in progress: each is started, or released. (Unless a throttle answered
        the marking or the release itself: such a claim is taken over after the pass's deadline, as a dead pass's.)"""
        if invocation.throttles_at is not None and invocation.calls >= invocation.throttles_at:
            return
        items = self.dynamodb.scan(TableName=TABLE)["Items"]
        held = [
            i
            for i in items
            if i.get("pass", {}).get("S") == holder.id and i.get("status", {}).get("S") == "in_progress"
        ]
        if held:
            raise Broken(f"a pass that ended still holds {len(held)} claim(s) in progress")

    # --- after the run ---------------------------------------------------------------------------------------

    def drain(self) -> None:
        """What is left in the queues handled as AWS would, in time: passes that do not die, the clock past every
        deadline and visibility timeout, every execution ended and every end delivered."""
        for _ in range(3 * self.stack.max_receives):
            self.time_passes(self.stack.visibility_s)
            self.run_function("ingest", _Invocation())
            self.run_function("prompts", _Invocation())
            self.run_function("gather", _Invocation())
            self.executions.discover()
            for arn in list(self.executions.running):
                self.executions.end(arn)
            self.run_function("ended", _Invocation())
        for arn in list(self.executions.running):  # rounds handed back
            while arn in self.executions.running:
                self.executions.end(arn)
        self.run_function("ended", _Invocation())

    def run_function(self, kind: str, invocation: _Invocation) -> None:
        """The function run as Lambda runs it: when it dies or fails (a function error, such as Powertools' "all
        records failed" for a batch of malformed messages), its poller deletes nothing."""
        functions: dict[str, Callable[[_Invocation], None]] = {
            "ingest": self.ingest,
            "prompts": lambda invocation: self.ingest(invocation, "PromptsQueue"),
            "gather": self.gather,
            "ended": self.batch_ended,
        }
        with suppress(Killed, FunctionError):
            functions[kind](invocation)

    def started_images(self) -> Counter[str]:
        """Each dropped image's count of executions that annotate it."""
        from shared.contracts import BatchInput

        found: Counter[str] = Counter()
        for execution in self.sfn.list_executions(stateMachineArn=self.machine)["executions"]:
            batch = BatchInput.model_validate_json(
                self.sfn.describe_execution(executionArn=execution["executionArn"])["input"]
            )
            groups = self.executions.read_json(layout.all_groups(batch))
            found.update(
                image["source_uri"].split(f"s3://{INPUT_BUCKET}/", 1)[1]
                for group in groups
                for image in group["images"]
                if image["source_uri"].startswith(f"s3://{INPUT_BUCKET}/incoming/")
            )
        return found

    def check(self) -> None:
        found = self.started_images()
        twice = sorted(key for key, count in found.items() if count > 1)
        never = sorted(key for key in self.dropped if found[key] == 0 and key not in self.expired_seen)
        folders = sorted(key for key in found if key in self.folders)
        if twice or never or folders:
            raise Broken(f"started twice: {twice}; never: {never}; folders started: {folders}")
        if self.expired_unseen:
            raise Broken(f"messages expired unseen: {self.expired_unseen}")
        self._nothing_readable_dead_lettered()
        self.executions.check_rows()
        rows = self.executions.rows()
        rowless = sorted(
            image
            for message_id, images in self.prompted.items()
            for image in images
            if message_id not in self.expired_seen and not any(rows_of[image] for rows_of in rows.values())
        )
        if rowless:
            raise Broken(f"prompted images without a row: {rowless}")

    def _nothing_readable_dead_lettered(self) -> None:
        from shared.errors import RequestRejected
        from shared.pipeline.ingest import parse_body

        readable = []
        for queue in self.queues.values():
            while messages := self.sqs.receive_message(QueueUrl=queue["dead"], MaxNumberOfMessages=10).get("Messages"):
                for message in messages:
                    try:
                        parse_body(message["Body"])
                        readable.append(message["Body"][:80])
                    except RequestRejected:
                        pass
                    self.sqs.delete_message(QueueUrl=queue["dead"], ReceiptHandle=message["ReceiptHandle"])
        if readable:
            raise Broken(f"readable messages in a dead-letter queue: {sorted(readable)}")
