"""Images dropped one at a time, gathered into batches at bulk prices: the latency dial (``max_wait_minutes``).

With the dial at N minutes, S3's events wait in the ingest queue instead of reaching Ingest. Once a minute the
gatherer looks at the queue: when N minutes have passed since it last gathered, or sooner when a bulk task's worth of
images waits, it receives every waiting event and starts them as one batch through Ingest's own code (each event
claimed once), in the lane :func:`~shared.pipeline.batches.gathered_lane` picks for their number; then it deletes
the messages that started. A gatherer that dies after starting loses nothing and starts nothing twice: its messages
come back after the queue's visibility timeout, their claims say they started, and they are deleted then.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel

from shared.errors import RequestRejected
from shared.observability import MetricUnit, logger, metrics
from shared.pipeline.batches import LaneChoice, gathered_lane
from shared.pipeline.claims import ClaimTable, Pass, RunAll, in_parallel
from shared.pipeline.ingest import WorkflowStarter, dynamodb_client, ingest_sqs_batch, parse_body
from shared.settings import IngestSettings
from shared.storage.objects import StoreFor

# Most events one gathering receives (a thousand ReceiveMessage calls of ten); what is left is still due next minute
MAX_GATHERED = 10_000
# The schedule looks once a minute: gathering from a minute before the wait is up keeps each drop's wait within it
SCHEDULE_S = 60


class DropQueue(Protocol):
    """Where dropped images' events wait: the ingest queue on AWS."""

    def waiting(self) -> int: ...

    def receive(self, limit: int, more: Callable[[], bool]) -> list[dict[str, Any]]:
        """Up to ``limit`` waiting messages, as Lambda's SQS event records (messageId, receiptHandle, body), for as
        long as ``more()``."""
        ...

    def delete(self, records: list[dict[str, Any]]) -> None: ...

    def release(self, records: list[dict[str, Any]]) -> None:
        """Visible again at once: the next look tries them (the queue's receive limit ends a malformed one)."""
        ...


class GatherReport(BaseModel):
    """What one look at the queue did."""

    waiting: int
    due: str = ""  # why it gathered; empty: not yet
    gathered: int = 0
    returned: int = 0  # messages left in the queue for a later look (malformed, or not started)
    lane: str = ""
    lane_reason: str = ""


def gather_due(
    now: datetime,
    last: datetime | None,
    waiting: int,
    settings: IngestSettings,
    wait_s: float | None = None,
    look_every_s: float = SCHEDULE_S,
) -> str:
    """Why gathering is due now, or "" if it is not: the wait is up (within the schedule's minute), or the images
    waiting fill a bulk task (what one annotates within the wait). The wait runs whether images wait or not, so the
    first drop after a quiet hour waits with the ones after it instead of starting alone. ``wait_s``: the wait, if
    not the stack's; ``look_every_s``: how often the caller looks."""
    wait_s = settings.max_wait_minutes * 60 if wait_s is None else wait_s
    if last is None or now - last >= timedelta(seconds=wait_s - look_every_s):
        return f"every {wait_s / 60:g} min"
    fill = gathered_lane(waiting, settings, wait_s).images_per_task
    if fill and waiting >= fill:
        return f"{waiting} images fill a bulk task"
    return ""


class GatherClock(Protocol):
    """When the gatherer last gathered."""

    def last(self) -> datetime | None: ...

    def mark(self, when: datetime) -> None: ...


class TableClock:
    """The gatherer's clock as one item of the table the S3 events' claims are kept in (its key is no claim's)."""

    KEY: ClassVar[dict[str, Any]] = {"id": {"S": "gatherer#last-gathered"}}

    def __init__(self, client: Any, table: str) -> None:
        self._dynamodb, self._table = client, table

    def last(self) -> datetime | None:
        item = self._dynamodb.get_item(TableName=self._table, Key=self.KEY, ConsistentRead=True).get("Item")
        return datetime.fromisoformat(item["gathered_at"]["S"]) if item else None

    def mark(self, when: datetime) -> None:
        self._dynamodb.put_item(TableName=self._table, Item={**self.KEY, "gathered_at": {"S": when.isoformat()}})


def gather_drops(
    queue: DropQueue,
    clock: GatherClock,
    settings: IngestSettings,
    starter: WorkflowStarter,
    store_for: StoreFor,
    now: datetime,
    holder: Pass,
    allowed_buckets: Collection[str] | None = None,
    claims: ClaimTable | None = None,
) -> GatherReport:
    """One look at the queue: if gathering is due, start what waits as one batch and delete what started.

    The pass (``holder``) receives for a third of its time at most: each message it receives and does not start
    comes back, and counts toward the queue's maxReceiveCount (3) before the dead-letter queue ("the number of times
    a message is delivered to the source queue before being moved to the dead-letter queue", Amazon SQS Developer
    Guide, "Using dead-letter queues"), so a pass takes no more than it can start in time.
    """
    waiting = queue.waiting()
    due = gather_due(now, clock.last(), waiting, settings)
    if not due:
        logger.info("not gathering yet", extra={"waiting": waiting})
        return GatherReport(waiting=waiting)
    receive_until_s = holder.left_s() * 2 / 3
    records = queue.receive(MAX_GATHERED, lambda: holder.left_s() > receive_until_s)
    chosen: list[LaneChoice] = []

    def lane_for(images: int) -> LaneChoice:
        chosen.append(gathered_lane(images, settings))
        return chosen[-1]

    response = ingest_sqs_batch(
        {"Records": records}, settings, starter, store_for, allowed_buckets, holder, lane_for, claims
    )
    returned = {failure["itemIdentifier"] for failure in response["batchItemFailures"]}
    queue.delete([record for record in records if record["messageId"] not in returned])
    # A malformed message is visible again at once, for the queue's receive limit to end it in the dead-letter queue;
    # one another live pass holds, or whose start failed, comes back after the visibility timeout (30 minutes, past
    # any pass's deadline): released at once, it would be received by the looks meanwhile, each counting toward that
    # limit, and end there unstarted.
    queue.release([record for record in records if record["messageId"] in returned and _malformed(record)])
    clock.mark(now)
    report = GatherReport(
        waiting=waiting,
        due=due,
        gathered=len(records),
        returned=len(returned),
        lane=chosen[0].lane if chosen else "",
        lane_reason=chosen[0].reason if chosen else "",
    )
    logger.info("gathered", extra=report.model_dump())
    metrics.add_metric(name="ImagesGathered", unit=MetricUnit.Count, value=len(records) - len(returned))
    return report


class SqsDropQueue:
    """The ingest queue, read by the gatherer."""

    def __init__(self, client: Any, url: str, run_all: RunAll = in_parallel, wait_s: int = 1) -> None:
        self._sqs, self._url, self._run_all, self._wait_s = client, url, run_all, wait_s

    def waiting(self) -> int:
        attributes = self._sqs.get_queue_attributes(QueueUrl=self._url, AttributeNames=["ApproximateNumberOfMessages"])
        return int(attributes["Attributes"]["ApproximateNumberOfMessages"])

    def receive(self, limit: int, more: Callable[[], bool]) -> list[dict[str, Any]]:
        # Long polling, even for a second: "short polling ... samples only a subset of the servers", so a short poll
        # can answer empty while messages wait; a long poll "queries all of the servers" (Amazon SQS Developer
        # Guide, "Amazon SQS short and long polling").
        records: list[dict[str, Any]] = []
        while len(records) < limit and more():
            answer = self._sqs.receive_message(
                QueueUrl=self._url, MaxNumberOfMessages=min(10, limit - len(records)), WaitTimeSeconds=self._wait_s
            )
            messages = answer.get("Messages", [])
            if not messages:
                break
            records += [
                {"messageId": m["MessageId"], "receiptHandle": m["ReceiptHandle"], "body": m["Body"]} for m in messages
            ]
        return records

    def delete(self, records: list[dict[str, Any]]) -> None:
        def delete_ten(entries: list[dict[str, Any]]) -> None:
            failed = self._sqs.delete_message_batch(QueueUrl=self._url, Entries=entries).get("Failed", [])
            if failed:  # they come back after the visibility timeout, and their claims skip them then
                logger.warning("messages not deleted", extra={"failed": failed})

        list(self._run_all(delete_ten, _batches_of_ten(records)))

    def release(self, records: list[dict[str, Any]]) -> None:
        def release_ten(entries: list[dict[str, Any]]) -> None:
            visible = [entry | {"VisibilityTimeout": 0} for entry in entries]
            self._sqs.change_message_visibility_batch(QueueUrl=self._url, Entries=visible)

        list(self._run_all(release_ten, _batches_of_ten(records)))


def _batches_of_ten(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Entries for SQS's batch calls, which take at most ten."""
    return [
        [{"Id": str(index), "ReceiptHandle": record["receiptHandle"]} for index, record in enumerate(chunk)]
        for chunk in (records[start : start + 10] for start in range(0, len(records), 10))
    ]


@functools.cache
def deployed_gatherer(queue_url: str, table: str) -> tuple[SqsDropQueue, TableClock]:
    """The ingest queue and the clock in the claims' table, one client each per process (the region is boto3's
    own: the function's in Lambda)."""
    import boto3

    if not queue_url or not table:
        raise RequestRejected("ANNOTATE_DROPS_QUEUE_URL and ANNOTATE_IDEMPOTENCY_TABLE must be set to gather")
    return SqsDropQueue(boto3.client("sqs"), queue_url), TableClock(dynamodb_client(), table)


def _malformed(record: dict[str, Any]) -> bool:
    try:
        parse_body(record["body"])
    except RequestRejected:
        return True
    return False
