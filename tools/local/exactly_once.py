"""The exactly-once checker: every image object dropped ends in exactly one execution, whatever AWS does.

A seeded scheduler (its own: a run is a list of steps drawn from ``random.Random(seed)``, so a seed is a repro)
drives the code that turns dropped images into executions — the EventBridge rule, Ingest on the ingest queue, the
gatherer, the claims, StartExecution — over moto, choosing at each step what AWS may do next:

- an image dropped, or a console's folder (a 0-byte ``name/``), its event filtered by the template's own rule;
- an event delivered again (EventBridge and SQS deliver "at least once"), and so out of order;
- Ingest (Lambda's SQS poller: a batch of up to ten) or a gathering pass, dying at any AWS call (its timeout, or a
  crash: between StartExecution and marking its claims among them) and then leaving its messages where SQS keeps
  them;
- two passes at once: one held at any call while the clock passes (up to past its deadline) and another runs, then
  let go on, or killed;
- time passing: claims expire, a received message's visibility timeout ends and it is received again (counting
  toward the queue's maxReceiveCount of the template, past which SQS moves it to the dead-letter queue);
- a malformed message.

After every pass it checks that a pass that ended holds no claim in progress; after every run (once whatever is left
in the queue has been handled), that every image object dropped is in exactly one execution, no folder in any, and
nothing readable in the dead-letter queue. A broken run is shrunk to the fewest steps that still break it, and
printed with its seed. Not modelled yet: the bulk lane's Fargate tasks and the account's concurrency (issue 45's
points 3 and 4).
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

REGION = "us-east-1"
INPUT_BUCKET, RESULTS_BUCKET, TABLE = "once-input", "once-results", "once-claims"
DEFINITION = json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}})


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


@dataclass(frozen=True)
class Step:
    """One thing AWS does (``kind``), with what it needs."""

    kind: str
    name: str = ""
    dies_at: int | None = None  # the pass's AWS call at which its function ends (None: it does not)
    held_at: int = 0  # the call at which a pass is held while another runs
    seconds: int = 0

    def __str__(self) -> str:
        said = {"dies_at": self.dies_at, "held_at": self.held_at or None, "seconds": self.seconds or None}
        return " ".join([self.kind, self.name, *(f"{k}={v}" for k, v in said.items() if v is not None)]).strip()


KINDS = ("drop", "drop", "drop", "folder", "again", "ingest", "ingest", "gather", "gather", "both", "time", "malformed")


def draw_steps(chance: random.Random, count: int, most_deaths: int) -> list[Step]:
    """``count`` steps; at most ``most_deaths`` functions die (a message received by as many passes as the queue's
    maxReceiveCount that all die is moved to the dead-letter queue by SQS, whatever the code does)."""
    steps: list[Step] = []
    names = deaths = 0
    for _ in range(count):
        kind = chance.choice(KINDS)
        dies = chance.choice([None, None, chance.randint(1, 40)]) if deaths < most_deaths else None
        deaths += dies is not None and kind in ("ingest", "gather", "both")
        if kind in ("drop", "folder"):
            names += 1
            steps.append(Step(kind, name=f"{kind}-{names}"))
        elif kind == "again":
            steps.append(Step(kind, name=f"drop-{chance.randint(1, max(1, names))}"))
        elif kind in ("ingest", "gather"):
            steps.append(Step(kind, dies_at=dies))
        elif kind == "both":
            seconds = chance.choice([0, 60, 400])
            steps.append(Step(kind, held_at=chance.randint(1, 30), dies_at=dies, seconds=seconds))
        elif kind == "time":
            steps.append(Step(kind, seconds=chance.choice([60, 300, 1800])))
        else:
            steps.append(Step(kind))
    return steps


@dataclass
class _Invocation:
    """A function running in one thread: its AWS calls counted, ended at ``dies_at``, held at ``held_at``."""

    dies_at: int | None = None
    held_at: int = 0
    calls: int = 0
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


class Broken(AssertionError):
    """An invariant broken: what, and after which step."""


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
            try:
                yield self
            finally:
                boto3.DEFAULT_SESSION.events.unregister("before-call", self._before_call)
                storage.refresh_clients()
                ingest.refresh_clients()

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
        from moto.events.models import EventPattern

        body = b"" if folder else f"picture {key}".encode()
        etag = self.s3.put_object(Bucket=INPUT_BUCKET, Key=key, Body=body)["ETag"].strip('"')
        event = {
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
        if EventPattern(None, self.stack.pattern).matches_event(event):  # the rule: else EventBridge drops it
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
                self.handles.add(message["ReceiptHandle"])
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
            max_wait_minutes=15,
            results_uri=f"s3://{RESULTS_BUCKET}",
            input_buckets=[INPUT_BUCKET],
            idempotency_table=TABLE,
        ).ingest

    def _pass(self) -> Any:
        from shared.pipeline.claims import Pass
        from shared.pipeline.ingest import PASS_MARGIN_S

        return Pass(id=uuid.uuid4().hex, deadline=self.clock + self.stack.timeout_s - PASS_MARGIN_S, clock=self.now)

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
            def receive(self, limit: int, more: Callable[[], bool]) -> list[dict[str, Any]]:
                records = super().receive(limit, more)
                world.handles.update(record["receiptHandle"] for record in records)
                return records

            def delete(self, records: list[dict[str, Any]]) -> None:
                super().delete(records)
                world.handles.difference_update(record["receiptHandle"] for record in records)

        holder = self._pass()
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
            _, key = batch.groups_uri.split(f"s3://{RESULTS_BUCKET}/", 1)
            groups = json.loads(self.s3.get_object(Bucket=RESULTS_BUCKET, Key=key)["Body"].read())
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


def play(steps: list[Step], stack: Stack) -> str | None:
    """One run of ``steps``: what broke (and after which step), or None."""
    world = World(stack)
    with world.aws():
        try:
            for number, step in enumerate(steps, start=1):
                world.steps = number
                try:
                    _do(world, step)
                except Broken as broken:
                    return f"after step {number} ({step}): {broken}"
            world.drain()
            world.check()
        except Broken as broken:
            return f"at the end: {broken}"
    return None


def _do(world: World, step: Step) -> None:
    if step.kind == "drop":
        world.drop(f"incoming/{step.name}.jpg")
    elif step.kind == "folder":
        world.drop(f"incoming/{step.name}/", folder=True)
    elif step.kind == "again":
        if world.dropped.get(f"incoming/{step.name}.jpg"):
            world.send(world.dropped[f"incoming/{step.name}.jpg"])
    elif step.kind in ("ingest", "gather"):
        world.run_function(step.kind, _Invocation(dies_at=step.dies_at))
    elif step.kind == "both":
        _two_at_once(world, step)
    elif step.kind == "time":
        world.time_passes(step.seconds)
    elif step.kind == "malformed":
        world.send("{not json")


def _two_at_once(world: World, step: Step) -> None:
    """A gathering pass held at a call; meanwhile the clock passes and Ingest runs; then it goes on, or dies."""
    held = _Invocation(held_at=step.held_at, killed_while_held=step.dies_at is not None)
    errors: list[BaseException] = []

    def first() -> None:
        try:
            world.run_function("gather", held)
        except BaseException as error:  # a broken invariant, reported by the main thread
            errors.append(error)
        finally:
            held.held.set()

    thread = threading.Thread(target=first, daemon=True)
    thread.start()
    held.held.wait(timeout=60)
    world.time_passes(step.seconds)
    world.run_function("ingest", _Invocation())
    world.run_function("gather", _Invocation())
    held.go_on.set()
    thread.join(timeout=60)
    if errors:
        raise errors[0]


def shrink(steps: list[Step], stack: Stack) -> tuple[list[Step], str]:
    """The fewest of ``steps`` (in order) that still break a run: chunks left out, then single steps."""
    broken = play(steps, stack)
    assert broken is not None
    size = max(1, len(steps) // 2)
    while size >= 1:
        start = 0
        while start < len(steps):
            fewer = steps[:start] + steps[start + size :]
            found = play(fewer, stack) if fewer else None
            if found is not None:
                steps, broken = fewer, found
            else:
                start += size
        size //= 2
    return steps, broken


@dataclass
class Report:
    runs: int = 0
    steps: int = 0
    broken: list[str] = field(default_factory=list)

    @property
    def line(self) -> str:
        return f"exactly once: {self.runs} runs, {self.steps} steps, {len(self.broken)} broken"


def check_exactly_once(runs: int, steps_per_run: int, seed: int, say: Callable[[str], None] = print) -> Report:
    """``runs`` runs of ``steps_per_run`` steps, the n-th seeded ``seed + n``; each broken one shrunk and said."""
    stack = Stack.from_template()
    report = Report()
    with _quiet():
        for run in range(runs):
            _check_one(stack, run, seed, steps_per_run, report, say)
    return report


@contextmanager
def _quiet() -> Iterator[None]:
    """The functions' logs and metrics are Lambda's: here a run says what broke, in its own lines."""
    import logging

    from shared.observability import logger, metrics

    level, batch = logger.log_level, logging.getLogger("aws_lambda_powertools.utilities.batch")
    logger.setLevel("CRITICAL")
    batch_level = batch.level
    batch.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        metrics.clear_metrics()
        logger.setLevel(level)
        batch.setLevel(batch_level)


def _check_one(
    stack: Stack, run: int, seed: int, steps_per_run: int, report: Report, say: Callable[[str], None]
) -> None:
    from shared.observability import metrics

    steps = draw_steps(random.Random(seed + run), steps_per_run, stack.max_receives - 1)
    report.runs += 1
    report.steps += len(steps)
    broken = play(steps, stack)
    metrics.clear_metrics()
    if broken is not None:
        fewest, why = shrink(steps, stack)
        said = f"seed {seed + run}: broken {why}; the fewest steps: " + "; ".join(map(str, fewest))
        report.broken.append(said)
        say(said)
