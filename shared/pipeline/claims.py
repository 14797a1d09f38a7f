"""Which dropped images an invocation is the first to start: a claim per S3 event, held until the invocation is
surely over, naming the execution it is started in, so that no image is started twice and none is left behind.

An event (bucket, key, ETag, under the request it is annotated with) is claimed by a *pass* (one invocation of
Ingest or the gatherer): in progress until the pass's deadline, the function's own timeout, when Lambda ends it
whatever it is doing. Before it starts an execution, the pass writes that execution's name into the claims of the
events it holds; once it started, it marks them started. Delivered again, in this batch or another, a started event
is skipped and one in progress is retried later. A claim still in progress past its deadline belongs to a pass that
Lambda ended: if the execution it names exists, the event was started (and is marked so); otherwise it is claimed
anew. The pass itself starts nothing in its last ``PASS_MARGIN_S`` (shared/pipeline/ingest.py), so that its start and
its marks end before Lambda ends it.

Each step is a conditional write on one DynamoDB item (the table template.yaml makes, TTL on ``expiration``):
"Condition expressions ... the write succeeds only if the condition evaluates to true" (DynamoDB Developer Guide,
"Condition expressions"), so two passes never both hold one event. A claim past its ``expiration`` is no claim,
whether DynamoDB's TTL has deleted it yet or not: "Items that have expired, but haven't yet been deleted by TTL,
still appear in reads, queries, and scans" (DynamoDB Developer Guide, "Time to Live"), and TTL deletes them "within a
few days". An event is remembered for longer than any copy of it can wait (shared/settings.py, idempotency_expiry_s).
"""

from __future__ import annotations

import contextvars
import hashlib
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from shared.aws import PARALLEL_CALLS, is_throttle
from shared.observability import logger

# Calls a pass makes at once (within the clients' connection pool, shared/aws.py): DynamoDB answers each in
# milliseconds, so a gathering of 10,000 events claims them in seconds instead of minutes (boto3's clients are
# thread-safe)
_CALLS = ThreadPoolExecutor(PARALLEL_CALLS, thread_name_prefix="aws-calls")

T = TypeVar("T")
R = TypeVar("R")
# How a pass makes its many calls: in parallel; the exactly-once checker makes them one by one, to stop at any
RunAll = Callable[[Callable[[Any], Any], Iterable[Any]], Iterable[Any]]


def in_parallel(call: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``call`` on each item, ``PARALLEL_CALLS`` at a time, in order, each in a copy of the caller's context (what
    its ContextVars hold: the logger's keys, the rehearsal's principal)."""
    calls = [(contextvars.copy_context(), item) for item in items]
    return list(_CALLS.map(lambda each: each[0].run(call, each[1]), calls))


class Claim(StrEnum):
    NEW = "new"  # this pass starts it
    STARTED = "started"  # an earlier pass started it: skip
    IN_FLIGHT = "in flight"  # a live pass is starting it: retry the record later


@dataclass(frozen=True)
class Pass:
    """One invocation's work on dropped images: its name, and its deadline (epoch seconds on ``clock``): when its
    function's timeout ends it. No claim of it is held past then."""

    id: str
    deadline: float
    clock: Callable[[], float] = field(default=time.time, compare=False, repr=False)

    def left_s(self) -> float:
        return self.deadline - self.clock()


@dataclass
class ClaimTable:
    """The claims and intents, as items of one DynamoDB table; ``execution_exists`` tells whether an execution of
    that name was started (Step Functions' DescribeExecution); ``clock`` is epoch seconds."""

    client: Any
    table: str
    expiry_s: int
    execution_exists: Callable[[str], bool]
    clock: Callable[[], float] = time.time
    run_all: RunAll = in_parallel

    @staticmethod
    def key(identity: str) -> dict[str, Any]:
        return {"id": {"S": f"s3-event#{hashlib.sha256(identity.encode()).hexdigest()}"}}

    def _expiration(self) -> dict[str, str]:
        return {"N": str(int(self.clock()) + self.expiry_s)}

    def claim_all(self, identities: Iterable[str], holder: Pass) -> dict[str, Claim]:
        """Each event's claim by ``holder`` (in parallel). Whether the execution a dead pass named exists is asked
        once per execution, however many of its events this pass meets."""
        identities = list(identities)
        exists = _AskedOnce(self.execution_exists)
        claims = self.run_all(lambda identity: self.claim(identity, holder, exists), identities)
        return dict(zip(identities, claims, strict=True))

    def claim(self, identity: str, holder: Pass, exists: Callable[[str], bool] | None = None) -> Claim:
        from botocore.exceptions import ClientError

        item = self.key(identity) | {
            "status": {"S": "in_progress"},
            "pass": {"S": holder.id},
            "until": {"N": str(holder.deadline)},
            "expiration": self._expiration(),
        }
        try:
            self.client.put_item(
                TableName=self.table,
                Item=item,
                ConditionExpression="attribute_not_exists(id) OR #expiration < :now",
                ExpressionAttributeNames={"#expiration": "expiration"},
                ExpressionAttributeValues={":now": {"N": str(int(self.clock()))}},
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
            return Claim.NEW
        except ClientError as error:
            if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            earlier = error.response.get("Item") or {}
        if earlier.get("status", {}).get("S") == "started":
            return Claim.STARTED
        if float(earlier.get("until", {}).get("N", "0")) >= self.clock():
            return Claim.IN_FLIGHT
        return self._after_a_dead_pass(identity, item, earlier, exists or self.execution_exists)

    def _after_a_dead_pass(
        self, identity: str, item: dict[str, Any], earlier: dict[str, Any], exists: Callable[[str], bool]
    ) -> Claim:
        """The claim of a pass past its deadline: started, if the execution it names exists; else taken over. Step
        Functions throttling the question (past botocore's retries) leaves the claim in flight, for a later pass:
        the event's record comes back to the queue, and no pass fails for it."""
        from botocore.exceptions import ClientError

        dead, execution = earlier.get("pass", {}).get("S", ""), earlier.get("execution", {}).get("S", "")
        condition = {
            "ConditionExpression": "#status = :in_progress AND #pass = :dead AND #until < :now",
            "ExpressionAttributeNames": {"#status": "status", "#pass": "pass", "#until": "until"},
        }
        values = {":in_progress": {"S": "in_progress"}, ":dead": {"S": dead}, ":now": {"N": str(self.clock())}}
        try:
            if execution and exists(execution):
                self.client.update_item(
                    TableName=self.table,
                    Key=self.key(identity),
                    UpdateExpression="SET #status = :started",
                    ExpressionAttributeValues=values | {":started": {"S": "started"}},
                    **condition,
                )
                logger.info("a claim of a pass that died: its execution started", extra={"execution": execution})
                return Claim.STARTED
            self.client.put_item(TableName=self.table, Item=item, ExpressionAttributeValues=values, **condition)
            return Claim.NEW
        except ClientError as error:
            if is_throttle(error):
                logger.info("a dead pass's claim left in flight: a throttle", extra={"execution": execution})
                return Claim.IN_FLIGHT
            if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return Claim.IN_FLIGHT  # another pass got there first

    def intend(self, executions: dict[str, list[str]], holder: Pass) -> bool:
        """``holder`` is about to start these executions (name -> the events it annotates): each claim names its
        execution first, for a pass that finds it after ``holder``'s deadline. False: a claim is no longer
        ``holder``'s (another pass took it over, ``holder`` being past its deadline), so nothing may start."""
        named = [(identity, name) for name, identities in executions.items() for identity in identities]
        return all(self.run_all(lambda pair: self._update_own(pair[0], holder, "execution", pair[1]), named))

    def started(self, identities: Iterable[str], holder: Pass) -> None:
        """``holder``'s claims on these events, marked started (in parallel)."""
        held = list(self.run_all(lambda identity: self._update_own(identity, holder, "status", "started"), identities))
        if not all(held):
            logger.warning("claims taken over while their execution started", extra={"pass": holder.id})

    def _update_own(self, identity: str, holder: Pass, name: str, value: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.update_item(
                TableName=self.table,
                Key=self.key(identity),
                UpdateExpression="SET #field = :value",
                ConditionExpression="#pass = :holder",
                ExpressionAttributeNames={"#field": name, "#pass": "pass"},
                ExpressionAttributeValues={":value": {"S": value}, ":holder": {"S": holder.id}},
            )
            return True
        except ClientError as error:
            if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return False

    def release(self, identities: Iterable[str], holder: Pass) -> None:
        """``holder``'s claims on these events dropped: its execution did not start (in parallel)."""
        list(self.run_all(lambda identity: self._release(identity, holder), identities))

    def _release(self, identity: str, holder: Pass) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client.delete_item(
                TableName=self.table,
                Key=self.key(identity),
                ConditionExpression="#pass = :holder AND #status = :in_progress",
                ExpressionAttributeNames={"#pass": "pass", "#status": "status"},
                ExpressionAttributeValues={":holder": {"S": holder.id}, ":in_progress": {"S": "in_progress"}},
            )
        except ClientError as error:
            if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise


class _AskedOnce:
    """``ask``'s answer for each argument, asked once however many threads want it at once; an error (a throttle) is
    the answer too, for the rest of this pass: asking again would only add to the throttling."""

    def __init__(self, ask: Callable[[str], bool]) -> None:
        self._ask, self._lock = ask, threading.Lock()
        self._answers: dict[str, bool | Exception] = {}
        self._asking: dict[str, threading.Lock] = {}

    def __call__(self, name: str) -> bool:
        with self._lock:
            asking = self._asking.setdefault(name, threading.Lock())
        with asking:
            if name not in self._answers:
                try:
                    self._answers[name] = self._ask(name)
                except Exception as error:
                    self._answers[name] = error
            answer = self._answers[name]
        if isinstance(answer, Exception):
            raise answer
        return answer
