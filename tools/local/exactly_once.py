"""The exactly-once checker: every image object dropped ends in exactly one execution, and every image as exactly
one row, whatever AWS does.

A seeded scheduler (its own: a run is a list of steps drawn from ``random.Random(seed)``, so a seed is a repro)
drives the code that turns dropped images and prompt messages into executions and rows — the EventBridge rule,
Ingest on the ingest and prompts queues, the gatherer, the claims, the manifests, StartExecution, SummarizeBatch and
BatchEnded — over moto, choosing at each step what AWS may do next (tools/local/drop_world.py plays it):

- an image dropped, or a console's folder (a 0-byte ``name/``), its event filtered by the template's own rule;
- an event delivered again (EventBridge and SQS deliver "at least once"), and so out of order, within the day
  EventBridge retries an event (the rule target's RetryPolicy);
- a prompt message naming a prefix of new images (on the prompts queue);
- the stack deployed again with other settings (the groups' size), between two deliveries of one message;
- Ingest (Lambda's SQS poller: a batch of up to ten, from either queue) or a gathering pass, dying at any AWS call
  (its timeout, or a crash: between StartExecution and marking its claims among them), or answered a throttle at any
  call past botocore's retries (DynamoDB, S3, SQS, Step Functions), and then leaving its messages where SQS keeps them;
- passes at once: one held at any call while the clock passes (into its last 30 s, or past its timeout) and up to
  six others run, events delivered again meanwhile; then it goes on, or dies;
- time passing, by minutes or days: claims expire, a received message's visibility timeout ends and it is received
  again (counting toward the queue's maxReceiveCount of the template, past which SQS moves it to the dead-letter
  queue), a message is deleted at its queue's retention, an execution ends at the workflow's TimeoutSeconds (its end
  then delivered to BatchEnded if a rule of the template sends it there, retried for a day, throttled or not);
- a malformed message;
- a running execution's round ending: every group written, or one bulk job (failed past Batch's retries) or one
  Lambda group (throttled past its retries) not, which SummarizeBatch's code hands back to a later round or turns
  into failure rows.

After every pass it checks that a pass that ended holds no claim in progress. After every run (once whatever is left
in the queues has been handled, every execution ended and every end delivered): every image object dropped is in
exactly one execution and no folder in any; every image any round of a batch named has exactly one row of that batch
(a result, or a failure row with its reason); every prompted image has a row; nothing readable is in a dead-letter
queue; and no message expired unseen: one that waits past its queue's retention (nothing took it for 14 days) must
have raised the alarm on its queue's oldest message days before, and only then may what it names have no row. A
broken run is shrunk to the fewest steps that still break it, and printed with its seed.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from unittest import mock

from tools.local.drop_stack import Stack
from tools.local.drop_world import Broken, World, _Invocation


@dataclass(frozen=True)
class Step:
    """One thing AWS does (``kind``), with what it needs."""

    kind: str
    name: str = ""
    dies_at: int | None = None  # the pass's AWS call at which its function ends (None: it does not)
    throttles_at: int | None = None  # the pass's AWS call answered a throttle past botocore's retries (None: none)
    held_at: int = 0  # the call at which a pass is held while others run
    seconds: int = 0
    meanwhile: int = 0  # passes that run while one is held
    again: bool = False  # every event delivered again while one is held
    which: int = 0  # the running execution a round of ends (counted from the oldest, modulo how many run)
    fails: bool = False  # that round's last job or group is not written
    images: int = 0  # a prompt's images

    def __str__(self) -> str:
        said = {
            "dies_at": self.dies_at,
            "throttles_at": self.throttles_at,
            "held_at": self.held_at or None,
            "seconds": self.seconds or None,
            "meanwhile": self.meanwhile or None,
            "again": self.again or None,
            "which": self.which if self.kind == "end" else None,
            "fails": self.fails or None,
            "images": self.images or None,
        }
        return " ".join([self.kind, self.name, *(f"{k}={v}" for k, v in said.items() if v is not None)]).strip()


# What a step may be, weighted by repetition
KINDS: tuple[str, ...] = ("drop",) * 3 + ("folder",) + ("again",) * 2 + ("ingest",) * 2 + ("gather",) * 2
KINDS += ("end",) * 2 + ("time",) * 2 + ("prompt",) * 2 + ("prompts",) * 2 + ("both", "malformed", "deploy", "ended")
# A pass makes ten to thirty AWS calls: a death, a throttle or a hold anywhere in them, most often before its last
CALLS = 24
# The failures a message meets in a run (its receiving passes' deaths and throttles), besides those of a pass holding
# its claim, at most: Lambda's SQS guide asks for a maxReceiveCount of at least 5 ("set the maxReceiveCount on the
# source queue's redrive policy to at least 5", Using Lambda with Amazon SQS), which these leave room for
FAILURES = 3
# Days, for time to pass beyond the workflow's TimeoutSeconds (2 days) and the retention SQS has by default (4)
DAY = 86_400


def draw_steps(chance: random.Random, count: int, most_failures: int = FAILURES) -> list[Step]:
    """``count`` steps; at most ``most_failures`` functions die or meet a throttle (a message received by as many
    passes as the queue's maxReceiveCount that all fail is moved to the dead-letter queue by SQS, whatever the code
    does)."""
    steps: list[Step] = []
    names = failures = prompts = 0
    for _ in range(count):
        kind = chance.choice(KINDS)
        fault = chance.choice([None, "dies", "throttles"]) if failures < most_failures else None
        at = chance.randint(1, CALLS)
        dies, throttles = (at if fault == "dies" else None), (at if fault == "throttles" else None)
        failures += fault is not None and kind in ("ingest", "prompts", "gather", "both", "ended")
        if kind in ("drop", "folder"):
            names += 1
            steps.append(Step(kind, name=f"{kind}-{names}"))
        elif kind == "again":
            steps.append(Step(kind, name=f"drop-{chance.randint(1, max(1, names))}"))
        elif kind in ("ingest", "prompts", "gather", "ended"):
            steps.append(Step(kind, dies_at=dies, throttles_at=throttles))
        elif kind == "both":
            # held for no time, a minute, into its last PASS_MARGIN_S, or past its timeout (when Lambda ends it)
            steps.append(
                Step(
                    kind,
                    name=chance.choice(["ingest", "prompts", "gather"]),
                    held_at=chance.randint(1, CALLS),
                    dies_at=dies,
                    throttles_at=throttles,
                    seconds=chance.choice([0, 60, 285, 400]),
                    meanwhile=chance.randint(1, 6),
                    again=chance.random() < 0.5,
                )
            )
        elif kind == "time":
            steps.append(Step(kind, seconds=chance.choice([60, 300, 1800, 2 * DAY + 60, 5 * DAY])))
        elif kind == "end":
            steps.append(Step(kind, which=chance.randint(0, 3), fails=chance.random() < 0.3))
        elif kind == "prompt":
            prompts += 1
            steps.append(Step(kind, name=f"p{prompts}", images=chance.randint(1, 4)))
        else:
            steps.append(Step(kind))
    return steps


def play(steps: list[Step], stack: Stack) -> str | None:
    """One run of ``steps``: what broke (and after which step), or None."""
    from shared.observability import metrics

    world = World(stack)
    with world.aws():
        try:
            for number, step in enumerate(steps, start=1):
                world.steps = number
                try:
                    _do(world, step)
                    world.executions.discover()
                except Broken as broken:
                    return f"after step {number} ({step}): {broken}"
                finally:
                    metrics.clear_metrics()  # Powertools prints them at 100 values, as if a handler ended
            world.drain()
            world.check()
        except Broken as broken:
            return f"at the end: {broken}"
    return None


def _do(world: World, step: Step) -> None:
    functions = ("ingest", "prompts", "gather", "ended")
    actions: dict[str, Callable[[], object]] = {
        "drop": lambda: world.drop(f"incoming/{step.name}.jpg"),
        "folder": lambda: world.drop(f"incoming/{step.name}/", folder=True),
        "again": lambda: world.again(f"incoming/{step.name}.jpg"),
        "both": lambda: _two_at_once(world, step),
        "time": lambda: world.time_passes(step.seconds),
        "malformed": lambda: world.send("{not json"),
        "prompt": lambda: world.prompt(step.name, step.images),
        "deploy": world.deploy_again,
        "end": lambda: _end_a_round(world, step),
    }
    if step.kind in functions:
        world.run_function(step.kind, _Invocation(dies_at=step.dies_at, throttles_at=step.throttles_at))
    else:
        actions[step.kind]()


def _end_a_round(world: World, step: Step) -> None:
    if world.executions.running:
        running = list(world.executions.running)
        world.executions.end(running[step.which % len(running)], step.fails)


def _two_at_once(world: World, step: Step) -> None:
    """A pass (``step.name``) held at a call while the clock passes and other passes run; then it goes on, or dies
    (as the step says, or because its function's timeout passed meanwhile: Lambda ended it)."""
    held = _Invocation(held_at=step.held_at, throttles_at=step.throttles_at)
    errors: list[BaseException] = []

    def first() -> None:
        try:
            world.run_function(step.name, held)
        except BaseException as error:  # a broken invariant, reported by the main thread
            errors.append(error)
        finally:
            held.held.set()

    thread = threading.Thread(target=first, daemon=True)
    thread.start()
    held.held.wait(timeout=60)
    if step.again:
        for key in list(world.dropped):
            world.again(key)
    for number in range(step.meanwhile):  # the looks of the gatherer's schedule, and Ingest's polls, meanwhile
        world.time_passes(step.seconds // step.meanwhile)
        world.run_function(("ingest", "gather", "prompts")[number % 3], _Invocation())
    held.killed_while_held = step.dies_at is not None or world.clock > held.deadline
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
    # Powertools prints a metric's values as CloudWatch's JSON once it holds 100 of them, disabled or not
    # (cloudwatch_emf/cloudwatch.py, add_metric): a long step would print them among the report
    try:
        with mock.patch.object(metrics, "add_metric", lambda *_, **__: None):
            yield
    finally:
        metrics.clear_metrics()
        logger.setLevel(level)
        batch.setLevel(batch_level)


def _check_one(
    stack: Stack, run: int, seed: int, steps_per_run: int, report: Report, say: Callable[[str], None]
) -> None:
    from shared.observability import metrics

    steps = draw_steps(random.Random(seed + run), steps_per_run)
    report.runs += 1
    report.steps += len(steps)
    broken = play(steps, stack)
    metrics.clear_metrics()
    if broken is not None:
        fewest, why = shrink(steps, stack)
        said = f"seed {seed + run}: broken {why}; the fewest steps: " + "; ".join(map(str, fewest))
        report.broken.append(said)
        say(said)
