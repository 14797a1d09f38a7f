"""How a batch ends, on moto's S3: SummarizeBatch hands a failed job's groups back or gives them failure rows, and an
execution that ended without it (timed out, failed, stopped) gets the same rows from BatchEnded's handler, as
EventBridge delivers its end; a throttled listing is a TransientError the workflow retries."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pyarrow.parquet as pq
import pytest
from moto import mock_aws

from functions.batch_ended.app import handler
from shared.contracts import BatchInput, BulkJobRef, GroupSummary, ImageGroup, ImageRef, SummarizeInput
from shared.errors import TransientError
from shared.pipeline.batch_steps import summarize_batch
from shared.pipeline.dependencies import Dependencies
from shared.settings import Settings
from shared.storage import layout
from shared.storage import objects as storage
from shared.storage.objects import store_for
from shared.storage.tables import table_file_uris
from tools.local.runner import LocalContext

NOON = datetime(2026, 12, 6, 12, tzinfo=UTC)
RESULTS = "s3://annotate-results"


@pytest.fixture
def s3() -> Iterator[Any]:
    with mock_aws():
        storage.refresh_clients()
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="annotate-results")
        yield client
    storage.refresh_clients()


def _groups(count: int) -> list[ImageGroup]:
    return [
        ImageGroup(group_id=f"g-{n:06d}", images=[ImageRef(image_id=f"{n:016x}", source_uri=f"s3://in/{n}.jpg")])
        for n in range(count)
    ]


def _planned(groups: list[ImageGroup], **update: Any) -> BatchInput:
    batch = BatchInput(
        batch_id="b-" + "2" * 20,
        request={"prompt": "dog. cat."},
        results_uri=RESULTS,
        planned_at=NOON,
        images=len(groups),
        groups=len(groups),
        group_concurrency=1,
        execution="b-2222-0123456789abcdef",
    ).model_copy(update=update)
    uri = layout.all_groups(batch)
    store_for(uri).write_bytes(uri, b"[" + b",".join(g.model_dump_json().encode() for g in groups) + b"]")
    return batch


def _written(batch: BatchInput, groups: list[ImageGroup]) -> None:
    """The groups' children wrote their rows and summaries."""
    for group in groups:
        uri = layout.group_summary(batch.results_uri, batch.batch_id, group.group_id)
        summary = GroupSummary(
            batch_id=batch.batch_id,
            group_id=group.group_id,
            succeeded=len(group.images),
            failed=0,
            images_table_uri="",
            detections_table_uri="",
        )
        store_for(uri).write_bytes(uri, summary.model_dump_json().encode())


def _failure_rows(s3: Any, batch: BatchInput) -> list[dict[str, Any]]:
    uri = table_file_uris(batch.results_uri, f"{batch.batch_id}-unfinished", batch.planned_at)["images"]
    body = s3.get_object(Bucket="annotate-results", Key=uri.removeprefix(f"{RESULTS}/"))["Body"].read()
    return pq.read_table(io.BytesIO(body)).select(["source_uri", "status", "error"]).to_pylist()


@pytest.mark.parametrize("hand_backs", [0, 1])
def test_a_bulk_batch_hands_back_the_groups_of_a_failed_job_or_gives_them_failure_rows(
    s3: Any, hand_backs: int
) -> None:
    # GIVEN a bulk batch of four groups in two jobs, whose second job failed past Batch's retries after the first
    # wrote its two groups
    groups = _groups(4)
    batch = _planned(groups, lane="bulk", bulk_jobs=2, bulk_concurrency=2, hand_backs=hand_backs)
    _written(batch, groups[:2])
    failed = {"Error": "BulkJobFailed", "Cause": "the job failed past AWS Batch's retries"}
    state = SummarizeInput.model_validate(batch.model_dump() | {"error": failed})
    deps = Dependencies(store_for=store_for, image_limits=Settings().image_limits)
    # WHEN it is summarized
    summary = summarize_batch(state, deps)
    if hand_backs:
        # THEN with a round left, the two unwritten groups are the next round's jobs
        assert summary.handed_back is not None and summary.failed == 0
        next_round = batch.model_copy(update={"round": 1})
        refs = [BulkJobRef.model_validate(ref) for ref in _json(layout.bulk_manifest(next_round))]
        assert [g["group_id"] for ref in refs for g in _json(ref.job_uri)["groups"]] == ["g-000002", "g-000003"]
    else:
        # THEN after its last round, they are failure rows
        assert summary.handed_back is None and (summary.succeeded, summary.failed) == (2, 2)
        assert [row["source_uri"] for row in _failure_rows(s3, batch)] == ["s3://in/2.jpg", "s3://in/3.jpg"]


def _json(uri: str) -> Any:
    return json.loads(store_for(uri).read_bytes(uri))


def _ended(batch: BatchInput, status: str) -> dict[str, Any]:
    """The event Step Functions sends EventBridge on a Standard execution's status change, as AWS documents it."""
    return {
        "version": "0",
        "id": "315c1398-40ff-a850-213b-158f73e60175",
        "detail-type": "Step Functions Execution Status Change",
        "source": "aws.states",
        "account": "123456789012",
        "time": "2026-12-08T12:00:00Z",
        "region": "us-east-1",
        "resources": [f"arn:aws:states:us-east-1:123456789012:execution:annotate:{batch.execution}"],
        "detail": {
            "executionArn": f"arn:aws:states:us-east-1:123456789012:execution:annotate:{batch.execution}",
            "stateMachineArn": "arn:aws:states:us-east-1:123456789012:stateMachine:annotate",
            "name": batch.execution,
            "status": status,
            "startDate": 1796558400000,
            "stopDate": 1796731200000,
            "input": batch.model_dump_json(),
            "output": None,
            "inputDetails": {"included": True},
            "outputDetails": None,
            "error": "States.Timeout" if status == "TIMED_OUT" else None,
            "cause": None,
        },
    }


@pytest.mark.parametrize("status", ["TIMED_OUT", "ABORTED"])
def test_an_execution_that_ended_without_its_summary_gets_failure_rows_for_the_groups_it_left(
    s3: Any, status: str
) -> None:
    # GIVEN a batch of three groups, one written, when its execution reached its TimeoutSeconds (or was stopped):
    # no state of it runs any more, SummarizeBatch included
    groups = _groups(3)
    batch = _planned(groups, hand_backs=5)
    _written(batch, groups[:1])
    # WHEN EventBridge delivers its end to BatchEnded
    summary = handler(_ended(batch, status), LocalContext(function_name="batch_ended", aws_request_id="r"))
    # THEN each image of the two groups it left has a failure row saying how the execution ended (no hand-back:
    # nothing would run it), and the batch's summary says so
    rows = _failure_rows(s3, batch)
    assert [row["source_uri"] for row in rows] == ["s3://in/1.jpg", "s3://in/2.jpg"]
    said = {"TIMED_OUT": "timed out", "ABORTED": "aborted"}[status]
    assert all(row["status"] == "failed" and said in row["error"] for row in rows), rows
    assert summary["handed_back"] is None and (summary["succeeded"], summary["failed"]) == (1, 2)
    # AND delivered again (EventBridge delivers at least once), it writes the same rows, not more
    handler(_ended(batch, status), LocalContext(function_name="batch_ended", aws_request_id="again"))
    assert len(_failure_rows(s3, batch)) == 2


def test_an_ended_execution_that_is_not_a_batch_is_left_as_it_is(s3: Any) -> None:
    event = _ended(_planned(_groups(1)), "FAILED")
    event["detail"]["input"] = json.dumps({"something": "else"})
    assert handler(event, LocalContext(function_name="batch_ended", aws_request_id="r")) is None


def test_a_listing_s3_throttles_past_botocore_s_retries_is_a_transient_error(s3: Any) -> None:
    # GIVEN S3 answering the listing's page with 503 SlowDown (past botocore's retries)
    client = storage._s3_store()._s3
    slow_down = {"Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."}}

    def throttled(**_: Any) -> None:
        from botocore.exceptions import ClientError

        raise ClientError(slow_down | {"ResponseMetadata": {"HTTPStatusCode": 503}}, "ListObjectsV2")  # type: ignore[arg-type]

    client.meta.events.register("before-call.s3.ListObjectsV2", throttled)
    try:
        # THEN it is the TransientError SummarizeBatch's Retry names, not botocore's ClientError
        with pytest.raises(TransientError, match="SlowDown"):
            list(store_for(f"{RESULTS}/batches/").list_uris(f"{RESULTS}/batches/"))
    finally:
        client.meta.events.unregister("before-call.s3.ListObjectsV2", throttled)


@pytest.mark.parametrize("where", ["s3", "local", "memory"])
def test_an_object_written_once_is_not_written_over(s3: Any, where: str, tmp_path: Any) -> None:
    from shared.storage.objects import MemoryStore

    uri = {"s3": f"{RESULTS}/manifests/b.json", "local": str(tmp_path / "b.json"), "memory": "mem://b.json"}[where]
    store = MemoryStore() if where == "memory" else store_for(uri)
    # THEN the first write writes, and a second of other bytes does not ("If-None-Match: *", S3's conditional write)
    assert store.write_once(uri, b"first") is True
    assert store.write_once(uri, b"second") is False
    assert store.read_bytes(uri) == b"first"
