"""Many images per message, locally: the Distributed Map over groups, a group that fails, an S3 event delivered
twice. Real tiny models, the real definition on moto's interpreter."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from PIL import Image
from typer.testing import CliRunner

from shared.contracts import PromptMessage
from shared.pipeline import ingest
from shared.pipeline.batches import plan_batches
from shared.pipeline.ingest import ingest_sqs_batch
from shared.settings import Settings, use_settings
from shared.storage import objects as storage
from shared.storage.objects import store_for
from tests.conftest import SAMPLES
from tests.integration.test_ingest import S3_EVENT, sqs_event
from tools.cli import app
from tools.local.runner import REGION, HandlerDispatcher, LocalStarter, create_idempotency_table, local_workflow
from tools.results.query import run_local_query

STATE_LIMIT = 256 * 1024  # Step Functions' limit on an execution's input, output and every state


@pytest.fixture
def invocation_sizes(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[int]]]:
    """The JSON size of every Lambda payload and response, by function: the states the workflow passes."""
    sizes: dict[str, list[int]] = defaultdict(list)
    invoke = HandlerDispatcher.invoke

    def measured(dispatcher: HandlerDispatcher, function: str, payload: dict[str, Any]) -> tuple[dict, bool]:
        response, failed = invoke(dispatcher, function, payload)
        name = function.rsplit(":function:", 1)[-1].removeprefix("annotate-")
        sizes[name] += [len(json.dumps(payload)), len(json.dumps(response))]
        return response, failed

    monkeypatch.setattr(HandlerDispatcher, "invoke", measured)
    yield sizes


def small_images(folder: Path, count: int) -> Path:
    folder.mkdir()
    colors = random.Random(7)
    for index in range(count):
        color = (colors.randrange(256), colors.randrange(256), index % 256)
        Image.new("RGB", (48, 40), color).save(folder / f"{index:04d}.jpg")
    return folder


def _run_measured(images: int, tmp_path: Path, sizes: dict[str, list[int]]) -> dict[str, int]:
    """``images`` small images through `annotate run`; the largest state each function was passed or answered."""
    sizes.clear()
    folder = small_images(tmp_path / f"images-{images}", images)
    data_dir = tmp_path / f"data-{images}"
    result = CliRunner().invoke(
        app,
        ["run", str(folder), "--prompt", "dog. cat.", "--profile", "tiny", "--no-caption", "--data-dir", str(data_dir)],
    )
    assert result.exit_code == 0, result.output
    assert f"{images} succeeded, 0 failed" in result.output
    [counts] = run_local_query(
        "SELECT count(*) AS n, count(DISTINCT image_id) AS ids, count(DISTINCT source_uri) AS sources FROM images",
        data_dir,
    ).to_pylist()
    assert counts == {"n": images, "ids": images, "sources": images}
    assert len(sizes["write_group_table"]) == 2 * images // 10  # groups of 10: one child workflow each
    return {name: max(measured) for name, measured in sizes.items()}


def test_every_image_ends_as_one_row_and_no_state_grows_with_the_batch(
    tmp_path: Path, tiny_settings: Settings, invocation_sizes: dict[str, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the detector at its smallest size (the runs measure states, not accuracy)
    monkeypatch.setenv("ANNOTATE_DETECTION_SHORT_SIDE", "224")
    # WHEN `annotate run` annotates 30 small images (3 child workflows), then 150 (15)
    few = _run_measured(30, tmp_path, invocation_sizes)
    many = _run_measured(150, tmp_path, invocation_sizes)
    # THEN every image has exactly one row (above), and the largest state any execution passed (a group's outcomes,
    # WriteGroupTable's input; an image's full state, WriteResult's input; the batch's summary) is the same with five
    # times the images, give or take a count's digits and an image's boxes (which vary with its pixels: 2%
    # measured), and far below Step Functions' 256 KiB: a million images pass the same states
    assert few.keys() == many.keys()
    assert {name: many[name] <= few[name] * 1.1 + 16 for name in few} == dict.fromkeys(few, True), (few, many)
    assert all(size < STATE_LIMIT / 4 for size in many.values()), many
    artifacts = Path("test-artifacts")
    artifacts.mkdir(exist_ok=True)
    (artifacts / "state-sizes.json").write_text(json.dumps({"limit": STATE_LIMIT, "largest": many}, indent=2))


def test_a_group_that_cannot_write_its_rows_ends_as_failure_rows_beside_the_other_groups(
    tmp_path: Path, tiny_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN three images in groups of one, and the first group's table file unwritable (a folder in its place)
    monkeypatch.setenv("ANNOTATE_IMAGES_PER_GROUP", "1")
    data_dir = tmp_path / "data"
    message = PromptMessage(prompt="cat.", images=[str(SAMPLES)], caption=False)
    settings = Settings(profile="tiny", data_dir=data_dir)
    [batch] = plan_batches(message, settings.ingest, store_for)
    day = f"dt={batch.input.planned_at:%Y-%m-%d}"
    (data_dir / "tables" / "images" / day / f"{batch.input.batch_id}-g-000000.parquet").mkdir(parents=True)

    # WHEN the images are annotated
    result = CliRunner().invoke(
        app, ["run", str(SAMPLES), "--prompt", "cat.", "--profile", "tiny", "--no-caption", "--data-dir", str(data_dir)]
    )

    # THEN the run says one failed, and every image has exactly one row: the first group's a failure with why
    assert result.exit_code == 1, result.output
    assert "2 succeeded, 1 failed" in result.output
    rows = run_local_query("SELECT source_uri, status, failed_step, error FROM images ORDER BY source_uri", data_dir)
    rows = rows.to_pylist()
    assert len(rows) == 3 and len({row["source_uri"] for row in rows}) == 3
    [failed] = [row for row in rows if row["status"] == "failed"]
    assert failed["failed_step"] == "group" and failed["error"].startswith("group g-000000 did not finish")
    summary = json.loads((data_dir / "batches" / batch.input.batch_id / "summary.json").read_text())
    assert (summary["unfinished"], summary["succeeded"], summary["failed"]) == (1, 2, 1)


def test_an_s3_event_delivered_again_in_another_sqs_batch_is_annotated_once(
    tmp_path: Path, tiny_settings: Settings
) -> None:
    cat = (SAMPLES / "chelsea-the-cat.jpg").read_bytes()
    with local_workflow() as run:
        # GIVEN two images dropped into a bucket, and the table that remembers the events started
        storage.refresh_clients()
        ingest.refresh_clients()
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket="annotate-input")
        events = {}
        for key in ("incoming/a.jpg", "incoming/b.jpg"):
            put = s3.put_object(Bucket="annotate-input", Key=key, Body=cat + key.encode())
            event = json.loads(json.dumps(S3_EVENT))
            event["detail"]["object"] |= {"key": key, "etag": put["ETag"].strip('"')}
            events[key] = json.dumps(event)
        create_idempotency_table("annotate-idempotency")
        settings = use_settings(
            tiny_settings.model_copy(
                update={
                    "data_dir": tmp_path / "data",
                    "idempotency_table": "annotate-idempotency",
                    "ingest_prompt": "cat.",
                }
            )
        )
        starter = LocalStarter(run, settings.data_dir, "s3-events")

        # WHEN both events come in one SQS batch, and the first again in another
        first = ingest_sqs_batch(sqs_event(*events.values()), settings.ingest, starter, store_for)
        again = ingest_sqs_batch(sqs_event(events["incoming/a.jpg"]), settings.ingest, starter, store_for)
    storage.refresh_clients()
    ingest.refresh_clients()

    # THEN one execution ran, and each image has one row under the request
    assert first == again == {"batchItemFailures": []}
    assert [result.status for _, result in starter.results] == ["SUCCEEDED"]
    rows = run_local_query("SELECT image_id, prompt FROM images", settings.data_dir).to_pylist()
    assert len(rows) == len({row["image_id"] for row in rows}) == 2
    assert {row["prompt"] for row in rows} == {"cat."}
