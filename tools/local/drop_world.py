"""One run's AWS for the exactly-once checker (tools/local/exactly_once.py): moto with the stack's resources as
template.yaml makes them, a clock of its own, and the functions under test run as Lambda runs them — ended at any
AWS call, held at one while others run, their batches kept by the poller when they fail. The executions they start
run until the checker ends them (each of its groups written, or one job or group failed), and SummarizeBatch's own
code hands back or ends them; an account of a few Lambda invocations and Fargate vCPUs is what they share."""

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

REGION = "us-east-1"
INPUT_BUCKET, TABLE = "once-input", "once-claims"
DEFINITION = json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}})
# A new account's quotas, small enough that overlapping batches meet them: 8 invocations for batches (Ingest keeps
# one), 4 Fargate vCPUs (two bulk tasks); a bulk task of 3 images' worth ends within the minute's wait
ACCOUNT: dict[str, Any] = {
    "lambda_concurrency": 9,
    "images_per_group": 2,
    "fargate_vcpus": 4,
    "bulk_task_cpu": 2048,
    "bulk_task_start_s": 30,
    "bulk_seconds_per_image": 10,
    "gathered_bulk_from_images": 3,
    "bulk_images_per_group": 1,
    "hand_backs": 2,
}


class Killed(BaseException):
    """The function's environment ended at this call (its timeout, or a crash): no code of it runs after."""


@dataclass(frozen=True)
class Stack:
    """What the checker takes from template.yaml: the rule's pattern, the queue's limits, the functions' timeout."""

    pattern: dict[str, Any]
    visibility_s: int
    max_receives: int
    timeout_s: int

    @staticmethod
    def from_template() -> Stack:
        from tools.aws.sam_template import by_default, load_template

        template = load_template()
        resources = template["Resources"]
        pattern = by_default(template, resources["InputObjectCreatedRule"]["Properties"]["EventPattern"])
        pattern["detail"]["bucket"]["name"] = [INPUT_BUCKET]
        queue = resources["IngestQueue"]["Properties"]
        timeouts = {resources[name]["Properties"]["Timeout"] for name in ("IngestFunction", "GatherFunction")}
        return Stack(
            pattern, int(queue["VisibilityTimeout"]), int(queue["RedrivePolicy"]["maxReceiveCount"]), max(timeouts)
        )


@dataclass
class _Invocation:
    """A function running in one thread: its AWS calls counted, ended at ``dies_at``, held at ``held_at``."""

    dies_at: int | None = None
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


class World:
    """One run's AWS: moto, a clock of its own, the invocations under way, and what was dropped."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.clock = time.time()
        self.local = threading.local()
        self.dropped: dict[str, str] = {}  # key -> the event body last sent for it
        self.folders: set[str] = set()
        self.handles: set[str] = set()  # receipt handles of messages received and not deleted
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
            dead = self.sqs.create_queue(QueueName="once-dead")["QueueUrl"]
            dead_arn = self.sqs.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"])["Attributes"][
                "QueueArn"
            ]
            redrive = {"deadLetterTargetArn": dead_arn, "maxReceiveCount": str(self.stack.max_receives)}
            self.queue = self.sqs.create_queue(
                QueueName="once-ingest",
                Attributes={"VisibilityTimeout": str(self.stack.visibility_s), "RedrivePolicy": json.dumps(redrive)},
            )["QueueUrl"]
            self.dead = dead
            machine = sfn.create_state_machine(
                name="once", definition=DEFINITION, roleArn="arn:aws:iam::123456789012:role/once"
            )
            self.starter = ingest.StepFunctionsStarter(sfn, machine["stateMachineArn"])
            self.sfn, self.machine = sfn, machine["stateMachineArn"]
            self.executions = Executions(self.s3, sfn, self.machine, self._settings)
            try:
                yield self
            finally:
                boto3.DEFAULT_SESSION.events.unregister("before-call", self._before_call)
                boto3.DEFAULT_SESSION.events.unregister("after-call.sqs.ReceiveMessage", self._received)
                storage.refresh_clients()
                ingest.refresh_clients()

    def _received(self, parsed: dict[str, Any], **_: Any) -> None:
        """Every message received, by whoever: SQS makes it visible again when its visibility timeout ends."""
        self.handles.update(message["ReceiptHandle"] for message in parsed.get("Messages", []))

    def _before_call(self, **_: Any) -> None:
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
        if EventPattern(None, self.stack.pattern).matches_event(event):  # type: ignore[arg-type]  # else dropped
            self.sqs.send_message(QueueUrl=self.queue, MessageBody=json.dumps(event))

    def send(self, body: str) -> None:
        self.sqs.send_message(QueueUrl=self.queue, MessageBody=body)

    def time_passes(self, seconds: int) -> None:
        self.clock += seconds
        if seconds >= self.stack.visibility_s:  # every message received and not deleted is visible again
            for handle in sorted(self.handles):
                with suppress(Exception):  # deleted, or moved to the dead-letter queue meanwhile
                    self.sqs.change_message_visibility(QueueUrl=self.queue, ReceiptHandle=handle, VisibilityTimeout=0)
            self.handles.clear()

    def receive(self, limit: int) -> list[dict[str, Any]]:
        """What Lambda's poller, or a pass, receives: up to ``limit`` visible messages."""
        records: list[dict[str, Any]] = []
        while len(records) < limit:
            answer = self.sqs.receive_message(
                QueueUrl=self.queue, MaxNumberOfMessages=min(10, limit - len(records)), AttributeNames=["All"]
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
                        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:once-ingest",
                        "awsRegion": REGION,
                    }
                )
        return records

    def delete(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            self.sqs.delete_message(QueueUrl=self.queue, ReceiptHandle=record["receiptHandle"])
            self.handles.discard(record["receiptHandle"])

    # --- the code under test, as a function ------------------------------------------------------------------

    def _settings(self) -> Any:
        from shared.settings import Settings

        return Settings(
            max_wait_minutes=1,  # the dial at its least: every look gathers, the most passes at once
            results_uri=f"s3://{RESULTS_BUCKET}",
            input_buckets=[INPUT_BUCKET],
            idempotency_table=TABLE,
            **ACCOUNT,
        ).ingest

    def _pass(self) -> Any:
        from shared.pipeline.claims import Pass

        return Pass(id=uuid.uuid4().hex, deadline=self.clock + self.stack.timeout_s, clock=self.now)

    def _claims(self) -> Any:
        from shared.pipeline.claims import ClaimTable

        settings = self._settings()
        return ClaimTable(self.dynamodb, TABLE, settings.idempotency_expiry_s, self.starter.exists, self.now, map)

    def ingest(self, invocation: _Invocation) -> None:
        """Lambda's poller receives a batch and invokes Ingest; what it reports done is deleted, nothing if it died."""
        from shared.pipeline.ingest import ingest_sqs_batch
        from shared.storage.objects import store_for

        records = self.receive(10)
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
        failed = {failure["itemIdentifier"] for failure in response["batchItemFailures"]}
        self.delete([record for record in records if record["messageId"] not in failed])
        self._holds_no_claim(holder)

    def gather(self, invocation: _Invocation) -> None:
        from shared.pipeline.gathering import SqsDropQueue, TableClock, gather_drops
        from shared.storage.objects import store_for

        world = self

        class Queue(SqsDropQueue):
            def delete(self, records: list[dict[str, Any]]) -> None:
                super().delete(records)
                world.handles.difference_update(record["receiptHandle"] for record in records)

        holder = self._pass()
        invocation.deadline = holder.deadline
        now = datetime.fromtimestamp(self.clock, UTC)
        self.local.invocation = invocation
        try:
            _as_function(gather_drops)(
                Queue(self.sqs, self.queue, map, wait_s=0),  # moto's queue is whole: a short poll sees it all
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
        self._holds_no_claim(holder)

    def _holds_no_claim(self, holder: Any) -> None:
        """A pass that ended holds no claim in progress: each is started, or released."""
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
        """What is left in the queue handled as AWS would, in time: passes that do not die, the clock past every
        deadline and visibility timeout."""
        for _ in range(3 * self.stack.max_receives):
            self.time_passes(self.stack.visibility_s)
            self.run_function("ingest", _Invocation())
            self.run_function("gather", _Invocation())
            self.executions.discover()
            for arn in list(self.executions.running):
                self.executions.end(arn)
        for arn in list(self.executions.running):  # rounds handed back
            while arn in self.executions.running:
                self.executions.end(arn)

    def run_function(self, kind: str, invocation: _Invocation) -> None:
        """The function run as Lambda runs it: when it dies or fails (a function error, such as Powertools' "all
        records failed" for a batch of malformed messages), its poller deletes nothing."""
        with suppress(Killed, FunctionError):
            (self.ingest if kind == "ingest" else self.gather)(invocation)

    def started_images(self) -> Counter[str]:
        """Each image's count of executions that annotate it."""
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
            )
        return found

    def check(self) -> None:
        from shared.errors import RequestRejected
        from shared.pipeline.ingest import parse_body

        found = self.started_images()
        twice = sorted(key for key, count in found.items() if count > 1)
        never = sorted(key for key in self.dropped if found[key] == 0)
        folders = sorted(key for key in found if key in self.folders)
        if twice or never or folders:
            raise Broken(f"started twice: {twice}; never: {never}; folders started: {folders}")
        readable = []
        while messages := self.sqs.receive_message(QueueUrl=self.dead, MaxNumberOfMessages=10).get("Messages"):
            for message in messages:
                try:
                    parse_body(message["Body"])
                    readable.append(json.loads(message["Body"])["detail"]["object"]["key"])
                except RequestRejected:
                    pass
                self.sqs.delete_message(QueueUrl=self.dead, ReceiptHandle=message["ReceiptHandle"])
        if readable:
            raise Broken(f"readable events in the dead-letter queue: {sorted(readable)}")
