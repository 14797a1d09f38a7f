"""The account's quotas shared by the batches running at once, on moto's DynamoDB: each batch takes its share of
what is free when it starts and gives it back when it ends, so overlapping batches never plan past the account."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import boto3
import pytest
from moto import mock_aws

from shared.contracts import BatchInput, BulkJobRef, GroupSummary, ImageGroup, ImageRef, SummarizeInput
from shared.pipeline.capacity import CapacityLedger, Quota
from shared.pipeline.dependencies import Dependencies
from shared.pipeline.steps import summarize_batch
from shared.settings import Settings
from shared.storage import layout
from shared.storage.objects import store_for
from tests.integration.test_gathering import NOON, batches, dial, drop, look, queued
from tests.integration.test_gathering import aws as aws  # the fixture, shared
from tools.local.runner import create_idempotency_table

TABLE = "annotate-idempotency"


@pytest.fixture
def ledger() -> Iterator[CapacityLedger]:
    with mock_aws():
        create_idempotency_table(TABLE, "us-east-1")
        yield CapacityLedger(boto3.client("dynamodb", region_name="us-east-1"), TABLE)


def test_a_take_grants_what_is_free_and_a_give_back_frees_it(ledger: CapacityLedger) -> None:
    assert ledger.take(Quota.LAMBDA, "b-1", wanted=8, least=2, limit=10, lease_s=600) == 8
    assert ledger.take(Quota.LAMBDA, "b-2", wanted=8, least=2, limit=10, lease_s=600) == 2  # what b-1 left
    assert ledger.take(Quota.LAMBDA, "b-3", wanted=8, least=2, limit=10, lease_s=600) == 0  # nothing left
    assert ledger.take(Quota.LAMBDA, "b-2", wanted=2, least=2, limit=10, lease_s=600) == 2  # its own, replaced
    assert ledger.free(Quota.FARGATE, 4096) == 4096  # another quota
    ledger.give_back(Quota.LAMBDA, "b-1")
    assert ledger.take(Quota.LAMBDA, "b-3", wanted=8, least=2, limit=10, lease_s=600) == 8


def test_a_share_never_given_back_is_free_again_after_its_lease_and_a_renewal_keeps_it(
    ledger: CapacityLedger,
) -> None:
    now = [1_000.0]
    ledger.clock = lambda: now[0]
    ledger.take(Quota.FARGATE, "stopped", wanted=4096, least=2048, limit=4096, lease_s=600)
    ledger.take(Quota.LAMBDA, "waiting", wanted=10, least=2, limit=10, lease_s=600)
    now[0] += 500
    ledger.renew(Quota.LAMBDA, "waiting", wait_s=300)  # handed back: 300 s of wait, then its lease again
    now[0] += 101
    assert ledger.free(Quota.FARGATE, 4096) == 4096  # its execution was stopped by hand: the lease ended
    assert ledger.free(Quota.LAMBDA, 10) == 0
    now[0] += 800
    assert ledger.free(Quota.LAMBDA, 10) == 10


def test_a_take_that_another_wrote_before_reads_again_and_never_grants_more_than_the_quota(
    ledger: CapacityLedger,
) -> None:
    # GIVEN a pass that reads the ledger, and another pass that takes 8 of 10 before the first one writes
    class WrittenBetween:
        def __init__(self, client: Any) -> None:
            self.client, self.interleaved = client, False

        def get_item(self, **call: Any) -> Any:
            return self.client.get_item(**call)

        def put_item(self, **call: Any) -> Any:
            if not self.interleaved:
                self.interleaved = True
                assert ledger.take(Quota.LAMBDA, "other", wanted=8, least=1, limit=10, lease_s=600) == 8
            return self.client.put_item(**call)

    first = CapacityLedger(WrittenBetween(ledger.client), TABLE)
    # WHEN the first takes 8 too: its write is refused (the ledger changed since it read), it reads again
    granted = first.take(Quota.LAMBDA, "first", wanted=8, least=1, limit=10, lease_s=600)
    # THEN it is granted what the other left, and the two hold the quota between them
    assert granted == 2
    assert {holder: held.amount for holder, held in ledger.holdings(Quota.LAMBDA).items()} == {"other": 8, "first": 2}


def test_an_overlapping_gathered_batch_takes_the_lambda_lane_while_the_first_holds_the_fargate_vcpus(
    aws: dict[str, Any],
) -> None:
    # GIVEN an account of 4 Fargate vCPUs (two 2-vCPU bulk tasks) and 100 invocations, and a gathered bulk batch
    # running in both of its tasks
    settings = dial(2, fargate_vcpus=4, lambda_concurrency=101, bulk_images_per_group=5)  # a task takes 9 images
    drop(aws, 15)
    first = look(aws, settings, NOON)
    [running] = batches(aws)
    assert (first.lane, running.bulk_concurrency) == ("bulk", 2)
    # WHEN more images gather while it runs
    drop(aws, 15, start=15)
    second = look(aws, settings, NOON + timedelta(minutes=2))
    # THEN they start on Lambda, within the invocations, since the Fargate vCPUs are held
    [later] = [batch for batch in batches(aws) if batch.batch_id != running.batch_id]
    assert second.lane == "lambda" and "beside the batches running" in second.lane_reason
    assert later.group_concurrency * 10 * 2 <= 100 and later.images == 15
    ledger = CapacityLedger(boto3.client("dynamodb", region_name="us-east-1"), TABLE)
    assert {holder: held.amount for holder, held in ledger.holdings(Quota.FARGATE).items()} == {running.execution: 4096}


def test_nothing_is_gathered_while_the_batches_running_hold_every_invocation(aws: dict[str, Any]) -> None:
    # GIVEN an account of 10 invocations (11 less Ingest's), no bulk lane, and a batch that holds them
    settings = dial(15, lambda_concurrency=11, bulk_enabled=False)
    drop(aws, 30)
    look(aws, settings, NOON)
    [running] = batches(aws)
    assert running.group_concurrency == 1  # groups of 5: 10 invocations
    # WHEN more images wait and the wait is up
    drop(aws, 3, start=30)
    report = look(aws, settings, NOON + timedelta(minutes=15))
    # THEN they wait in the queue, until the batch gives its share back
    assert report.gathered == 0 and "leave room" in report.due and queued(aws) == 3
    CapacityLedger(boto3.client("dynamodb", region_name="us-east-1"), TABLE).give_back(Quota.LAMBDA, running.execution)
    assert look(aws, settings, NOON + timedelta(minutes=30)).gathered == 3 and queued(aws) == 0


def _bulk_round(results: str, groups: list[ImageGroup], hand_backs: int) -> SummarizeInput:
    batch = BatchInput(
        batch_id="b-" + "2" * 20,
        request={"prompt": "dog. cat."},
        results_uri=results,
        planned_at=NOON,
        images=sum(len(group.images) for group in groups),
        groups=len(groups),
        group_concurrency=1,
        lane="bulk",
        bulk_jobs=2,
        bulk_concurrency=2,
        hand_backs=hand_backs,
    )
    return SummarizeInput.model_validate(batch.model_dump() | {"error": {"Error": "BulkJobFailed", "Cause": "quota"}})


@pytest.mark.parametrize("hand_backs", [0, 1])
def test_a_bulk_batch_hands_back_the_groups_of_a_failed_job_and_gives_its_share_back_when_it_ends(
    ledger: CapacityLedger, tmp_path: Any, hand_backs: int
) -> None:
    # GIVEN a bulk batch of four groups in two jobs, holding 4 vCPUs, whose second job failed (a quota, past its
    # retries) after the first wrote its two groups
    results = tmp_path.as_uri()
    groups = [
        ImageGroup(group_id=f"g-{n:06d}", images=[ImageRef(image_id=f"{n:016x}", source_uri=f"s3://in/{n}.jpg")])
        for n in range(4)
    ]
    state = _bulk_round(results, groups, hand_backs)
    store_for(layout.all_groups(state)).write_bytes(
        layout.all_groups(state), b"[" + b",".join(g.model_dump_json().encode() for g in groups) + b"]"
    )
    for group in groups[:2]:
        uri = layout.group_summary(results, state.batch_id, group.group_id)
        summary = GroupSummary(
            batch_id=state.batch_id,
            group_id=group.group_id,
            succeeded=1,
            failed=0,
            images_table_uri="",
            detections_table_uri="",
        )
        store_for(uri).write_bytes(uri, summary.model_dump_json().encode())
    ledger.take(Quota.FARGATE, state.batch_id, wanted=4096, least=2048, limit=4096, lease_s=3600)
    deps = Dependencies(store_for=store_for, image_limits=Settings().image_limits, ledger=ledger)
    # WHEN it is summarized
    summary = summarize_batch(state, deps)
    if hand_backs:
        # THEN with a round left, the two unwritten groups are handed back as the next round's jobs, and the batch
        # keeps its share through the wait
        assert summary.handed_back is not None and summary.failed == 0
        next_round = state.model_copy(update={"round": 1})
        refs = [BulkJobRef.model_validate(ref) for ref in _json(layout.bulk_manifest(next_round))]
        handed = [group["group_id"] for ref in refs for group in _json(ref.job_uri)["groups"]]
        assert handed == ["g-000002", "g-000003"]
        assert ledger.free(Quota.FARGATE, 4096) == 0
    else:
        # THEN after its last round, they are failure rows, and its share is given back
        assert summary.handed_back is None and (summary.succeeded, summary.failed) == (2, 2)
        assert ledger.free(Quota.FARGATE, 4096) == 4096


def _json(uri: str) -> Any:
    import json

    return json.loads(store_for(uri).read_bytes(uri))


def test_a_batch_planned_past_what_is_free_runs_fewer_images_at_once_in_smaller_groups(
    ledger: CapacityLedger,
) -> None:
    from shared.pipeline.batches import PlannedBatch
    from shared.pipeline.capacity import take_share

    # GIVEN an account of 30 invocations (29 for batches) of which another batch holds 20, and a batch of 40 images
    # planned alone: groups of 10, all at once
    settings = dial(15, lambda_concurrency=30)
    ledger.take(Quota.LAMBDA, "other", wanted=20, least=20, limit=29, lease_s=600)
    images = [ImageRef(image_id=f"{n:016x}", source_uri=f"s3://in/{n}.jpg") for n in range(40)]
    groups = [ImageGroup(group_id=f"g-{n:06d}", images=images[n * 10 : n * 10 + 10]) for n in range(4)]
    batch = BatchInput(
        batch_id="b-" + "3" * 20,
        request={"prompt": "dog."},
        results_uri="s3://out",
        planned_at=NOON,
        images=40,
        groups=4,
        group_concurrency=4,
    )
    # WHEN it takes its share
    taken = take_share(ledger, PlannedBatch(input=batch, groups=groups), settings)
    # THEN it runs the 4 images the 9 free invocations hold at once, as groups of 4 one at a time, every image kept
    assert [len(group.images) for group in taken.groups] == [4] * 10
    assert (taken.input.groups, taken.input.group_concurrency) == (10, 1)
    assert [image for group in taken.groups for image in group.images] == images
    assert ledger.holdings(Quota.LAMBDA)[batch.batch_id].amount == 8
