"""The account's quotas, shared by the batches that run at once: Lambda invocations in flight and Fargate CPU.

Each quota is one item of the claims' table: the batches holding part of it, each with how much and until when. A
batch takes its share when it is started (at most what is free; :func:`shared.pipeline.ingest.start_batches`) and
gives it back when it ends (:func:`shared.pipeline.steps.summarize_batch`); a batch that never gives it back (its
execution stopped by hand, or timed out, where no state of it runs) holds it until its lease, a bound on how long
it runs. Planned within what is free, overlapping batches do not throttle each other: Lambda refuses invocations past
the account's concurrency ("TooManyRequestsException ... Rate Exceeded", Lambda API reference, Invoke), and ECS a task
past the account's Fargate vCPUs ("You've reached the limit on the number of vCPUs you can run concurrently", Amazon
ECS service quotas).

Each take and give-back reads the item and writes it back on the condition that nobody wrote it meanwhile ("the
write succeeds only if the condition evaluates to true", DynamoDB Developer Guide, "Condition expressions"), so two
passes starting batches at once never both take the last of a quota.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from shared.contracts import BatchInput, ImageGroup
from shared.errors import TransientError
from shared.observability import MetricUnit, logger, metrics
from shared.pipeline.batches import INVOCATIONS_PER_IMAGE, PlannedBatch
from shared.settings import IngestSettings

# Writes lost to another's in a row before a take gives up (TransientError: the record comes back to the queue)
MOST_CONFLICTS = 20


class Quota(StrEnum):
    """What a batch takes: Lambda invocations in flight, or Fargate CPU units (1,024 a vCPU)."""

    LAMBDA = "lambda-invocations"
    FARGATE = "fargate-cpu"


@dataclass(frozen=True)
class Holding:
    amount: int
    until: float  # epoch seconds
    lease_s: float  # how long it was taken for


@dataclass
class CapacityLedger:
    """The quotas' items in ``table``; ``clock`` is epoch seconds."""

    client: Any
    table: str
    clock: Callable[[], float] = time.time

    @staticmethod
    def key(quota: Quota) -> dict[str, Any]:
        return {"id": {"S": f"capacity#{quota}"}}

    def holdings(self, quota: Quota) -> dict[str, Holding]:
        """Who holds part of ``quota`` now (a lease past its end holds nothing)."""
        return self._read(quota)[0]

    def free(self, quota: Quota, limit: int) -> int:
        return max(0, limit - sum(holding.amount for holding in self.holdings(quota).values()))

    def take(self, quota: Quota, holder: str, wanted: int, least: int, limit: int, lease_s: float) -> int:
        """``holder``'s share of ``quota``: ``wanted``, or what is free if less, or 0 when less than ``least`` is
        free. A holder taking again replaces its share (a batch delivered twice holds one share)."""
        granted = 0

        def grant(holdings: dict[str, Holding]) -> None:
            nonlocal granted
            holdings.pop(holder, None)
            free = limit - sum(holding.amount for holding in holdings.values())
            granted = min(wanted, free) if free >= least else 0
            if granted:
                holdings[holder] = Holding(granted, self.clock() + lease_s, lease_s)

        self._change(quota, grant)
        if granted < wanted:
            logger.info(
                "less capacity free than wanted",
                extra={"quota": str(quota), "holder": holder, "wanted": wanted, "granted": granted},
            )
            metrics.add_metric(name="CapacityShort", unit=MetricUnit.Count, value=1)
        return granted

    def hold(self, quota: Quota, holder: str, amount: int, lease_s: float) -> None:
        """``holder``'s share set to ``amount``, free or not."""
        self._change(
            quota, lambda holdings: holdings.update({holder: Holding(amount, self.clock() + lease_s, lease_s)})
        )

    def renew(self, quota: Quota, holder: str, wait_s: float) -> None:
        """``holder``'s share (if it holds one) kept for its lease after ``wait_s``: a batch waiting to run its next
        round."""

        def extend(holdings: dict[str, Holding]) -> None:
            if held := holdings.get(holder):
                holdings[holder] = Holding(held.amount, self.clock() + wait_s + held.lease_s, held.lease_s)

        self._change(quota, extend)

    def give_back(self, quota: Quota, holder: str) -> None:
        self._change(quota, lambda holdings: holdings.pop(holder, None))

    def _change(self, quota: Quota, change: Callable[[dict[str, Holding]], object]) -> None:
        for _ in range(MOST_CONFLICTS):
            holdings, version = self._read(quota)
            before = dict(holdings)
            change(holdings)
            if holdings == before or self._write(quota, holdings, version):
                return
        raise TransientError(f"the {quota} ledger was written by others {MOST_CONFLICTS} times in a row")

    def _read(self, quota: Quota) -> tuple[dict[str, Holding], int]:
        item = self.client.get_item(TableName=self.table, Key=self.key(quota), ConsistentRead=True).get("Item", {})
        now = self.clock()
        holdings = {
            holder: Holding(
                int(value["M"]["amount"]["N"]), float(value["M"]["until"]["N"]), float(value["M"]["lease_s"]["N"])
            )
            for holder, value in item.get("holders", {}).get("M", {}).items()
        }
        live = {holder: holding for holder, holding in holdings.items() if holding.until > now}
        return live, int(item.get("version", {}).get("N", "0"))

    def _write(self, quota: Quota, holdings: dict[str, Holding], version: int) -> bool:
        from botocore.exceptions import ClientError

        holders = {
            holder: {
                "M": {
                    "amount": {"N": str(holding.amount)},
                    "until": {"N": str(holding.until)},
                    "lease_s": {"N": str(holding.lease_s)},
                }
            }
            for holder, holding in holdings.items()
        }
        try:
            self.client.put_item(
                TableName=self.table,
                Item=self.key(quota) | {"holders": {"M": holders}, "version": {"N": str(version + 1)}},
                ConditionExpression="attribute_not_exists(id) OR version = :read",
                ExpressionAttributeValues={":read": {"N": str(version)}},
            )
            return True
        except ClientError as error:
            if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return False


# Bounds on how long a batch runs, for its lease: an Express child (a group) ends within five minutes ("Maximum
# execution duration: 5 minutes", Step Functions, "Choosing workflow type"); a bulk task is run twice its planned time,
# after up to half an hour waiting for Spot capacity (RunBulkJob's retries)
CHILD_LIMIT_S = 300
BATCH_OVERHEAD_S = 600
SPOT_WAIT_S = 1800


def limits(settings: IngestSettings) -> dict[Quota, int]:
    """The account's quotas as the stack's parameters say (LambdaConcurrency, less one invocation for Ingest;
    FargateVcpus)."""
    return {Quota.LAMBDA: max(1, settings.lambda_concurrency - 1), Quota.FARGATE: settings.fargate_vcpus * 1024}


def unit_of(batch: BatchInput, images: int, settings: IngestSettings) -> dict[Quota, int]:
    """What the batch takes of each quota for ``images`` running at once in the Lambda lane (each one's Classify and
    Tag side by side, and a Variants task each where asked), or for a task in the bulk lane."""
    if batch.lane == "bulk":
        return {Quota.FARGATE: settings.bulk_task_cpu}
    unit = {Quota.LAMBDA: images * INVOCATIONS_PER_IMAGE}
    if batch.request.variants is not None:
        unit[Quota.FARGATE] = images * settings.variants_task_cpu
    return unit


def lease_s(batch: BatchInput, units: int, images_per_job: int, settings: IngestSettings) -> float:
    """How long the batch runs at most, ``units`` at once."""
    if batch.lane == "bulk":
        rounds = -(-batch.bulk_jobs // units)
        task_s = settings.bulk_task_start_s + images_per_job * settings.bulk_seconds_per_image
        return 2 * rounds * task_s + SPOT_WAIT_S + BATCH_OVERHEAD_S
    return -(-batch.groups // units) * CHILD_LIMIT_S + BATCH_OVERHEAD_S


def take_share(ledger: CapacityLedger, planned: PlannedBatch, settings: IngestSettings) -> PlannedBatch:
    """``planned`` within what its quotas have free, its share held in the ledger by its execution: fewer bulk
    tasks at once; in the Lambda lane fewer groups at once, then smaller groups. At least one task, or one image at
    a time: a batch whose images are claimed must start (SQS's receive limit would end them in the dead-letter
    queue), and what it then runs past the quota is throttled and handed back."""
    batch = planned.input
    bulk = batch.lane == "bulk"
    size = max(len(group.images) for group in planned.groups)
    per_unit = unit_of(batch, 1, settings)  # a bulk task, or an image of the Lambda lane
    wanted = batch.bulk_concurrency if bulk else batch.group_concurrency * size
    quota_limits = limits(settings)
    images_per_job = size * max(1, planned.groups_per_job)
    lease = lease_s(batch, batch.bulk_concurrency if bulk else batch.group_concurrency, images_per_job, settings)
    units = wanted
    for quota, amount in per_unit.items():
        granted = ledger.take(quota, batch.share_holder, amount * wanted, amount, quota_limits[quota], lease)
        units = min(units, granted // amount)
    units = max(1, units)
    if bulk:
        planned = replace(planned, input=batch.model_copy(update={"bulk_concurrency": units}))
    elif units < size:  # groups of what may run at once, one at a time
        planned = regrouped(planned, units)
    elif units < wanted:
        planned = replace(planned, input=batch.model_copy(update={"group_concurrency": units // size}))
    if units < wanted:  # the share they need, for the longer time they take
        batch = planned.input
        at_once = batch.bulk_concurrency if bulk else batch.group_concurrency
        held = units if bulk else at_once * max(len(group.images) for group in planned.groups)
        for quota, amount in per_unit.items():
            ledger.hold(quota, batch.share_holder, amount * held, lease_s(batch, at_once, images_per_job, settings))
    return planned


def regrouped(planned: PlannedBatch, size: int) -> PlannedBatch:
    """The batch's images in groups of ``size``, one group at a time."""
    images = [image for group in planned.groups for image in group.images]
    groups = [
        ImageGroup(group_id=f"g-{index:06d}", images=images[offset : offset + size])
        for index, offset in enumerate(range(0, len(images), size))
    ]
    update = {"groups": len(groups), "group_concurrency": 1}
    return replace(planned, input=planned.input.model_copy(update=update), groups=groups)


def give_back_share(ledger: CapacityLedger, holder: str) -> None:
    for quota in Quota:
        ledger.give_back(quota, holder)


def renew_share(ledger: CapacityLedger, holder: str, wait_s: float) -> None:
    """A batch's share kept while it waits ``wait_s`` for its next round, and that round's lease after."""
    for quota in Quota:
        ledger.renew(quota, holder, wait_s)
