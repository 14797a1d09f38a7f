"""The bulk lane writes the Lambda lane's rows: the same images and request through `annotate run --lane bulk`, or
through shared/bulk.run_job, give the workflow's result documents and one row per image; a task killed or stopped
part way and run again loses nothing and annotates nothing twice. Real tiny models; the workflow through the local
runner."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter
from typer.testing import CliRunner

from shared.contracts import BatchInput, BulkJob, BulkJobRef, ImageGroup, ImageResult, PromptMessage
from shared.observability import metrics
from shared.pipeline.bulk import Stopped, run_job
from shared.pipeline.dependencies import dependencies_of
from shared.pipeline.ingest import start_batches
from shared.settings import Settings, use_settings
from shared.storage import layout
from shared.storage.objects import LocalStore, store_for
from tests.conftest import SAMPLES
from tools.bench.cost_lanes import BULK_S3_GETS_PER_IMAGE
from tools.cli import app
from tools.local.batch_jobs import TaskStopped
from tools.local.runner import LocalStarter, local_workflow
from tools.results.query import run_local_query

pytestmark = pytest.mark.slow
ROWS = "SELECT image_id, status, len(detections) AS boxes, caption FROM images ORDER BY image_id"
BOX_ROWS = "SELECT image_id, detection_index, label, vector FROM box_embeddings ORDER BY image_id, detection_index"
MASK_ROWS = "SELECT image_id, detection_index, counts, area, score, model FROM masks ORDER BY image_id, detection_index"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The samples and an empty file."""
    images = tmp_path_factory.mktemp("bulk-inputs")
    shutil.copytree(SAMPLES, images, dirs_exist_ok=True)
    (images / "empty.jpg").write_bytes(b"")
    return images


def _annotate_run(images: Path, data: Path, lane: str) -> None:
    arguments = ["run", str(images), "--prompt", "dog. cat.", "--profile", "tiny", "--embeddings", "boxes", "--masks"]
    result = CliRunner().invoke(app, [*arguments, "--data-dir", str(data), "--lane", lane])
    assert result.exit_code == 1 and "3 succeeded, 1 failed" in result.output, result.output


@pytest.fixture(scope="module")
def by_workflow(inputs: Path, tmp_path_factory: pytest.TempPathFactory, tiny_settings: Settings) -> Path:
    """The inputs annotated by the workflow in the Lambda lane, captions on, the boxes' embeddings and masks kept."""
    data = tmp_path_factory.mktemp("lambda-lane")
    _annotate_run(inputs, data, "lambda")
    return data


def _job(workflow: Path, results_uri: str) -> BulkJob:
    """The workflow's batch as a bulk job writing to ``results_uri``, its images in groups of two."""
    [batch_file] = [p for p in (workflow / "manifests").glob("b-*.json") if ".groups." not in p.name]
    batch = BatchInput.model_validate_json(batch_file.read_bytes())
    groups = TypeAdapter(list[ImageGroup]).validate_json(batch_file.with_suffix(".groups.0.json").read_bytes())
    images = [image for group in groups for image in group.images]
    pairs = [ImageGroup(group_id=f"g-{n:06d}", images=images[2 * n : 2 * n + 2]) for n in range(len(images) // 2)]
    return BulkJob(
        batch_id=batch.batch_id,
        request=batch.request,
        results_uri=results_uri,
        planned_at=batch.planned_at,
        groups=pairs,
    )


def _documents(root: Path) -> dict[str, dict[str, object]]:
    found = {}
    for path in root.glob("results/b-*/*.json"):
        if layout.is_result_document(path.name):
            result = ImageResult.model_validate_json(path.read_bytes())
            found[result.image_id] = result.model_dump(
                mode="json",
                include={"status", "error", "detections", "width", "height", "embedding", "box_embeddings", "masks"},
            ) | {"caption": result.caption and result.caption.caption}
    return found


def test_the_bulk_worker_writes_the_lambda_lanes_documents_and_rows(by_workflow: Path, settings_in: Settings) -> None:
    # GIVEN the workflow's batch as a bulk job writing elsewhere
    job = _job(by_workflow, str(settings_in.data_dir.resolve()))
    # WHEN the worker runs it
    annotated = run_job(job, dependencies_of)
    # THEN every image has the workflow's document (boxes, classes, attributes, caption, embeddings, failure) and row
    assert annotated == 4
    # AND the steps' metrics, which no handler emits here, are not kept from one group to the next
    assert not metrics.metric_set
    assert _documents(settings_in.data_dir) == _documents(by_workflow) != {}
    assert run_local_query(ROWS, settings_in.data_dir).to_pylist() == run_local_query(ROWS, by_workflow).to_pylist()
    boxes = run_local_query(BOX_ROWS, by_workflow).to_pylist()
    assert run_local_query(BOX_ROWS, settings_in.data_dir).to_pylist() == boxes != []
    masks = run_local_query(MASK_ROWS, by_workflow).to_pylist()
    assert run_local_query(MASK_ROWS, settings_in.data_dir).to_pylist() == masks != []


def test_the_worker_asks_the_store_for_each_image_once_and_reads_nothing_back(
    by_workflow: Path, settings_in: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the workflow's batch as a bulk job, and every read of the store counted
    job = _job(by_workflow, str(settings_in.data_dir.resolve()))
    reads: Counter[str] = Counter()
    read_bytes = LocalStore.read_bytes

    def counted(store: LocalStore, uri: str, max_bytes: int | None = None) -> bytes:
        reads[uri] += 1
        return read_bytes(store, uri, max_bytes)

    monkeypatch.setattr(LocalStore, "read_bytes", counted)
    # WHEN the worker runs it
    run_job(job, dependencies_of)
    # THEN it read each image once (its steps share the bytes) and asked once whether its result was written (a
    # retried job's skip): the GETs annotate cost prices; what it wrote (the boxes' embeddings, the result), it did
    # not read back
    images = [image.source_uri for group in job.groups for image in group.images]
    assert sorted(uri for uri in reads if uri in images) == sorted(images)
    assert reads.total() == len(images) * BULK_S3_GETS_PER_IMAGE
    assert set(reads.values()) == {1}


def test_annotate_run_in_the_bulk_lane_gives_the_lambda_lanes_documents_and_rows(
    inputs: Path, by_workflow: Path, tmp_path: Path
) -> None:
    # GIVEN the images and request the Lambda lane annotated
    # WHEN `annotate run --lane bulk` annotates them: the same workflow file, its bulk Map's task run in-process
    _annotate_run(inputs, tmp_path, "bulk")
    # THEN the batch ran in the bulk lane, and every image has the Lambda lane's document and row
    [manifest] = (tmp_path / "manifests").glob("b-*.bulk.0.json")
    assert TypeAdapter(list[BulkJobRef]).validate_json(manifest.read_bytes())
    assert _documents(tmp_path) == _documents(by_workflow) != {}
    assert run_local_query(ROWS, tmp_path).to_pylist() == run_local_query(ROWS, by_workflow).to_pylist()


def test_a_bulk_task_killed_mid_job_is_run_again_and_every_image_ends_as_one_row(
    inputs: Path, tmp_path: Path, tiny_settings: Settings
) -> None:
    # GIVEN one bulk job of two groups of two images, whose first task Fargate Spot reclaims before its third image
    settings = use_settings(
        tiny_settings.model_copy(update={"data_dir": tmp_path, "bulk_images_per_group": 2, "bulk_concurrency": 1})
    )
    message = PromptMessage(prompt="dog. cat.", images=[str(inputs)], lane="bulk")
    tries: list[int] = []

    def gate(kind: str, payload: dict[str, Any]) -> None:
        if kind == "bulk":
            tries.append(payload["image"])
            if tries.count(2) == 1 and payload["image"] == 2:
                raise TaskStopped("Your Spot Task was interrupted.")  # Fargate Spot's reclaim, as Batch reports it

    # WHEN the message runs through the local workflow
    with local_workflow(gate=gate) as run:
        starter = LocalStarter(run, settings.data_dir, "test")
        start_batches(message, "test", settings.ingest, starter, store_for)
    [(batch, result)] = starter.results

    # THEN the batch ran as one job, the job definition's retry strategy ran the reclaimed task again, and the batch
    # succeeded with every image
    assert (batch.lane, batch.bulk_jobs, result.status) == ("bulk", 1, "SUCCEEDED")
    assert tries == [0, 1, 2, 0, 1, 2, 3]
    assert result.summary is not None and (result.summary.succeeded, result.summary.failed) == (3, 1)
    # AND each image has exactly one row: the retry skipped the two it found written
    counts = run_local_query("SELECT image_id, count(*) AS n FROM images GROUP BY 1", tmp_path).to_pylist()
    assert len(counts) == 4 and {row["n"] for row in counts} == {1}


def test_a_job_stopped_part_way_and_run_again_writes_each_image_once(by_workflow: Path, settings_in: Settings) -> None:
    # GIVEN a job whose task is told to stop before its fourth image (a Spot interruption's SIGTERM)
    job = _job(by_workflow, str(settings_in.data_dir.resolve()))
    asked = iter(range(100))
    with pytest.raises(Stopped, match="g-000001 after 1 of its images"):
        run_job(job, dependencies_of, stopping=lambda: next(asked) >= 3)
    # THEN the finished group's rows are written, the stopped group's are not yet
    assert [
        row["n"] for row in run_local_query("SELECT count(*) AS n FROM images", settings_in.data_dir).to_pylist()
    ] == [2]

    # WHEN the job is run again
    annotated = run_job(job, dependencies_of)
    # THEN only the image not yet done is annotated, and every image has exactly one row
    assert annotated == 1
    counts = run_local_query("SELECT image_id, count(*) AS n FROM images GROUP BY 1", settings_in.data_dir).to_pylist()
    assert len(counts) == 4 and {row["n"] for row in counts} == {1}


def test_the_worker_process_stops_on_sigterm_between_images_and_its_retry_finishes_the_job(
    tmp_path: Path, tiny_settings: Settings
) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from shared.contracts import AnnotationRequest
    from shared.pipeline.batches import image_ref
    from shared.storage.objects import LocalStore

    # GIVEN eight images in four groups, as one job file, and the worker as its own process (the container's command)
    store, images = LocalStore(), []
    for index in range(8):
        path = tmp_path / "in" / f"cat-{index}.jpg"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes((SAMPLES / "chelsea-the-cat.jpg").read_bytes())
        images.append(image_ref(str(path), store.fingerprint(str(path))))
    results = tmp_path / "results-root"
    job = BulkJob(
        batch_id="b-" + "7" * 20,
        request=AnnotationRequest(prompt="cat."),
        results_uri=str(results),
        planned_at="2026-12-01T00:00:00Z",  # type: ignore[arg-type]
        groups=[ImageGroup(group_id=f"g-{n:06d}", images=images[2 * n : 2 * n + 2]) for n in range(4)],
    )
    (tmp_path / "job.json").write_text(job.model_dump_json())
    environment = os.environ | {"ANNOTATE_PROFILE": "tiny", "ANNOTATE_BULK_JOB": str(tmp_path / "job.json")}
    command = [sys.executable, "-m", "shared.pipeline.bulk"]

    # WHEN it is sent SIGTERM once its first image is written (Fargate's stop on a Spot interruption)
    worker = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(results.glob("results/*/*.json")) and worker.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    worker.send_signal(signal.SIGTERM)
    stopped_with = worker.wait(timeout=120)
    written = len(list(results.glob("results/*/*.json")))

    # THEN it ends between two images with 143, the status the job definition's retry strategy retries on, having kept
    # what it wrote
    assert stopped_with == 143 and 1 <= written < 8
    # AND the retried job finishes: every image has exactly one row
    assert subprocess.run(command, env=environment, check=False, capture_output=True, timeout=300).returncode == 0
    counts = run_local_query("SELECT image_id, count(*) AS n FROM images GROUP BY 1", results).to_pylist()
    assert len(counts) == 8 and {row["n"] for row in counts} == {1}
