"""The workflow definition on moto's interpreter and the real handlers, storage and the models faked: the merge of the
steps' results and every failure path, in seconds."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from shared.contracts import (
    AnnotationRequest,
    Box,
    Detection,
    ImageRef,
    ImageResult,
    ImageTask,
    PictureFormat,
    PromptMessage,
)
from shared.errors import ModelUnavailable
from shared.pipeline.batches import plan_batches
from shared.pipeline.dependencies import use_dependencies
from shared.pipeline.one_image import annotate_image
from shared.settings import Settings
from shared.storage import layout
from shared.storage.images import decode_image
from shared.storage.render import result_picture
from tests.fakes import FakeDetector, FakeModels
from tools.local.runner import ExecutionResult, local_workflow

RESULTS = "s3://results"
DOG = Detection(label="dog", score=0.9, box=Box(x0=4, y0=4, x1=40, y1=30))
CAT = Detection(label="cat", score=0.8, box=Box(x0=20, y0=10, x1=60, y1=46))


def jpeg(width: int = 64, height: int = 48) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), "brown").save(buffer, format="JPEG")
    return buffer.getvalue()


@pytest.fixture
def fakes() -> Iterator[FakeModels]:
    models = FakeModels(detector=FakeDetector([DOG, CAT]))
    models.store.objects["s3://in/a.jpg"] = jpeg()
    use_dependencies(models.dependencies)
    yield models
    use_dependencies(None)


@pytest.fixture(scope="module")
def workflow() -> Iterator:
    with local_workflow() as run:
        yield run


def run_batch(
    workflow, fakes: FakeModels, images_per_group: int = 10, **request: object
) -> tuple[ExecutionResult, dict[str, ImageResult]]:
    """GIVEN the images in the fake store, WHEN one batch runs, THEN its result documents by source URI."""
    message = PromptMessage.model_validate({"prompt": "dog. cat.", "images": ["s3://in/"], **request})
    settings = Settings(results_uri=RESULTS, images_per_group=images_per_group).ingest
    [batch] = plan_batches(message, settings, lambda _: fakes.store)
    fakes.store.objects[layout.all_groups(batch.input)] = batch.groups_manifest()  # as ingest writes it
    result = workflow(batch.input)
    folder = f"{RESULTS}/results/{batch.input.batch_id}/"
    documents = [
        ImageResult.model_validate_json(data)
        for uri, data in fakes.store.objects.items()
        if uri.startswith(folder) and layout.is_result_document(uri)
    ]
    return result, {document.source_uri: document for document in documents}


def table_rows(fakes: FakeModels, name: str) -> list[dict]:
    uris = sorted(uri for uri in fakes.store.objects if f"/tables/{name}/" in uri)
    return [row for uri in uris for row in pq.read_table(io.BytesIO(fakes.store.objects[uri])).to_pylist()]


def test_the_steps_results_are_merged_into_one_row_per_image(workflow, fakes: FakeModels) -> None:
    fakes.store.objects["s3://in/b.png"] = jpeg(32, 32)

    result, documents = run_batch(workflow, fakes, job_id="survey-2026")

    assert result.summary is not None and (result.summary.succeeded, result.summary.failed) == (2, 0)
    document = documents["s3://in/a.jpg"]
    assert [(d.label, d.class_label, [a.value for a in d.attributes]) for d in document.detections] == [
        ("dog", "kind of dog", ["black", "solid"]),
        ("cat", "kind of cat", ["black", "solid"]),
    ]
    assert document.caption is not None and document.caption.caption == "Found 1 dog, 1 cat."
    # No picture is stored (store_pictures is off): it is drawn where it is looked at, from the document and source
    assert document.annotated_uri is None and not any("/pictures/" in uri for uri in fakes.store.objects)
    picture, picture_format = result_picture(document, fakes.store, fakes.image_limits)
    assert picture_format == "jpeg" and picture[:2] == b"\xff\xd8"
    # Each step's time for this image, in the document and in the row
    assert all(ms is not None and ms > 0 for ms in (document.detect_ms, document.classify_ms, document.tag_ms))
    assert document.caption.ms is not None and document.caption.ms > 0
    images = table_rows(fakes, "images")
    row = next(row for row in images if row["image_id"] == document.image_id)
    assert (row["detect_ms"], row["caption_ms"]) == (document.detect_ms, document.caption.ms)
    # The row names its job, the models that made it and the settings that change their output
    assert row["job_id"] == "survey-2026"
    assert (row["detector_model"], row["classifier_model"], row["tagger_model"]) == (
        "fake-detect",
        "fake-classify",
        "fake-tag",
    )
    assert json.loads(row["output_settings"]) == {s: {"step": s} for s in ("classify", "detect", "tag")}
    assert sorted(row["source_uri"] for row in images) == ["s3://in/a.jpg", "s3://in/b.png"]
    assert len(table_rows(fakes, "detections")) == 4
    # Fetches: Detect, Classify and Tag read the image once each (the picture drawn above, once more); WriteResult
    # and the caption need no pixels.
    assert fakes.store.reads["s3://in/a.jpg"] == 4


def test_one_process_reads_and_decodes_an_image_once_and_writes_what_the_workflow_writes(workflow, fakes) -> None:
    # GIVEN an image annotated by the workflow, each step reading and decoding it again
    _, documents = run_batch(workflow, fakes)
    by_workflow = documents["s3://in/a.jpg"]
    fakes.store.reads.clear()
    # WHEN one process annotates it with the same request (the bulk lane, the API, local mode)
    task = ImageTask(
        batch_id=by_workflow.batch_id,
        request=AnnotationRequest(prompt="dog. cat."),
        image=ImageRef(image_id=by_workflow.image_id, source_uri=by_workflow.source_uri),
        results_uri="s3://elsewhere",
    )
    by_one = annotate_image(task, fakes.dependencies)
    # THEN it read the image once, for all its steps, and wrote the workflow's document and picture
    assert fakes.store.reads["s3://in/a.jpg"] == 1
    assert by_one.detections == by_workflow.detections
    assert by_one.caption and by_workflow.caption and by_one.caption.caption == by_workflow.caption.caption
    assert by_one.annotated_uri is None and by_workflow.annotated_uri is None
    # AND given the image decoded already (the API decodes an upload to refuse it before any model), it reads none
    decoded = decode_image(fakes.store.objects["s3://in/a.jpg"], max_pixels=fakes.image_limits.max_image_pixels)
    fakes.store.reads.clear()
    assert annotate_image(task, fakes.dependencies, decoded).detections == by_workflow.detections
    assert fakes.store.reads["s3://in/a.jpg"] == 0


def test_a_stored_picture_is_the_one_drawn_when_looked_at_and_both_paths_store_the_same(
    workflow, fakes: FakeModels
) -> None:
    fakes.store_pictures = True  # StorePictures=true

    _, documents = run_batch(workflow, fakes)

    document = documents["s3://in/a.jpg"]
    stored = fakes.store.objects[document.annotated_uri or ""]
    assert document.annotated_uri == layout.picture(RESULTS, document.batch_id, document.image_id, PictureFormat.JPEG)
    drawn, _ = result_picture(document.model_copy(update={"annotated_uri": None}), fakes.store, fakes.image_limits)
    assert stored == drawn
    by_one = annotate_image(
        ImageTask(
            batch_id=document.batch_id,
            request=AnnotationRequest(prompt="dog. cat."),
            image=ImageRef(image_id=document.image_id, source_uri=document.source_uri),
            results_uri="s3://elsewhere",
        ),
        fakes.dependencies,
    )
    assert fakes.store.objects[by_one.annotated_uri or ""] == stored


@pytest.mark.parametrize(
    ("broken", "failed_step", "classes", "attributes"),
    [("classifier", "classify", False, True), ("tagger", "tag", True, False), ("both", "classify,tag", False, False)],
)
def test_a_failed_describe_branch_keeps_the_other_branchs_results(
    workflow, fakes: FakeModels, broken: str, failed_step: str, classes: bool, attributes: bool
) -> None:
    if broken in {"classifier", "both"}:
        fakes.classifier.failure = ModelUnavailable("classifier weights are missing")
    if broken in {"tagger", "both"}:
        fakes.tagger.failure = RuntimeError("tagger crashed")

    _, documents = run_batch(workflow, fakes)

    document = documents["s3://in/a.jpg"]
    assert (document.status, document.failed_step) == ("failed", failed_step)
    assert all(bool(d.class_label) is classes and bool(d.attributes) is attributes for d in document.detections)
    assert len(document.detections) == 2 and document.caption
    assert (document.classify_ms is not None) is classes and (document.tag_ms is not None) is attributes
    if broken == "classifier":
        assert document.error == "classify: ModelUnavailable: classifier weights are missing"


def test_a_rejected_image_ends_as_a_detect_failure_and_the_batch_goes_on(workflow, fakes: FakeModels) -> None:
    fakes.store.objects["s3://in/empty.jpg"] = b""

    result, documents = run_batch(workflow, fakes)

    assert result.summary is not None and (result.summary.succeeded, result.summary.failed) == (1, 1)
    failed = documents["s3://in/empty.jpg"]
    assert (failed.failed_step, failed.error) == ("detect", "detect: ImageRejected: file is empty")
    assert failed.annotated_uri is None and failed.caption is None


def test_a_detector_failure_skips_every_later_step(fakes: FakeModels) -> None:
    fakes.detector.failure = ModelUnavailable("no detector weights")
    invoked: list[str] = []

    with local_workflow(lambda name, payload, error: invoked.append(name)) as workflow:
        _, documents = run_batch(workflow, fakes)

    document = documents["s3://in/a.jpg"]
    assert (document.failed_step, document.detections, document.caption) == ("detect", [], None)
    # the functions that ran: Detect, then the result and the rows; no model step after Detect
    assert "detect" in invoked and "write_result" in invoked
    assert not {"classify", "tag", "caption"} & set(invoked), invoked


def test_a_caption_failure_is_recorded_and_the_rest_is_kept(workflow, fakes: FakeModels) -> None:
    fakes.captioner.failure = ModelUnavailable("no GGUF here")

    _, documents = run_batch(workflow, fakes)

    document = documents["s3://in/a.jpg"]
    assert (document.failed_step, document.error) == ("caption", "caption: ModelUnavailable: no GGUF here")
    assert document.detections and all(d.class_label and d.attributes for d in document.detections)


def test_an_image_without_boxes_is_embedded_not_classified_and_still_gets_a_caption(
    workflow, fakes: FakeModels
) -> None:
    fakes.detector.boxes = []

    _, documents = run_batch(workflow, fakes)

    document = documents["s3://in/a.jpg"]
    assert (document.status, document.detections, document.classify_ms) == ("succeeded", [], None)
    assert document.embedding is not None and document.embedding.model == "fake-tagger"
    assert document.caption is not None and document.caption.caption == "Found nothing."
    assert fakes.store.reads["s3://in/a.jpg"] == 2  # Detect and Tag (its embedding)


def test_boxes_asked_for_are_kept_as_rows_of_their_own_beside_the_image_s(workflow, fakes: FakeModels) -> None:
    _, documents = run_batch(workflow, fakes, embeddings="boxes")

    document = documents["s3://in/a.jpg"]
    assert document.box_embeddings is not None and document.box_embeddings.model == "fake-tagger"
    assert len(document.box_embeddings.vectors) == 2 and document.embedding is not None
    assert all(d.attributes for d in document.detections)  # tagged as without them
    rows = table_rows(fakes, "box_embeddings")
    assert [(row["detection_index"], row["label"]) for row in rows] == [(0, "dog"), (1, "cat")]
    # the same float32 values (the document writes each as its shortest decimal)
    as_written = np.array(document.box_embeddings.vectors, np.float32)
    assert np.array_equal(np.array([row["vector"] for row in rows], np.float32), as_written)
    assert len(table_rows(fakes, "embeddings")) == 1


def test_an_image_without_boxes_has_no_box_embeddings_written(workflow, fakes: FakeModels) -> None:
    fakes.detector.boxes = []

    _, documents = run_batch(workflow, fakes, embeddings="boxes")

    document = documents["s3://in/a.jpg"]
    assert document.embedding is not None and document.box_embeddings is None
    assert not any(uri.endswith(".boxes.json") for uri in fakes.store.objects)


def test_no_box_embeddings_are_kept_unless_asked_for(workflow, fakes: FakeModels) -> None:
    _, documents = run_batch(workflow, fakes)

    assert documents["s3://in/a.jpg"].box_embeddings is None and table_rows(fakes, "box_embeddings") == []
    assert not any(uri.endswith(".boxes.json") for uri in fakes.store.objects)


def test_an_image_without_boxes_skips_describe_where_no_embedding_is_asked_for(workflow, fakes: FakeModels) -> None:
    fakes.detector.boxes = []

    _, documents = run_batch(workflow, fakes, embeddings="none")

    document = documents["s3://in/a.jpg"]
    assert (document.status, document.detections, document.embedding) == ("succeeded", [], None)
    assert fakes.store.reads["s3://in/a.jpg"] == 1  # Detect


def test_a_failure_writing_the_result_still_ends_as_a_failure_row(workflow, fakes: FakeModels) -> None:
    fakes.store.failing_writes = ("s3://results/results/",)

    result, _ = run_batch(workflow, fakes, caption=False)

    assert result.summary is not None and result.summary.failed == 1
    [row] = table_rows(fakes, "images")
    assert (row["status"], row["failed_step"]) == ("failed", "write_result")
    assert row["error"].startswith("OSError: no space left for s3://results/results/")


def test_variants_are_written_beside_the_result(workflow, fakes: FakeModels) -> None:
    _, documents = run_batch(
        workflow, fakes, caption=False, variants={"prompt": "a watercolor", "size": 128, "count": 2, "seed": 5}
    )

    document = documents["s3://in/a.jpg"]
    assert document.status == "succeeded" and document.variants is not None
    assert [v.seed for v in document.variants.images] == [5, 6] and document.variants.ms > 0
    assert all(fakes.store.objects[v.uri].startswith(b"\x89PNG") for v in document.variants.images)


def test_a_variants_failure_is_a_task_failure_and_the_rest_is_kept(workflow, fakes: FakeModels) -> None:
    fakes.generator.failure = ModelUnavailable("no diffusion model here")

    _, documents = run_batch(workflow, fakes, caption=False, variants={"prompt": "a watercolor", "size": 128})

    document = documents["s3://in/a.jpg"]
    assert (document.failed_step, document.variants) == ("variants", None)
    assert document.error.startswith(
        "variants: States.TaskFailed: Essential container in task exited: ModelUnavailable"
    )
    assert document.detections and document.caption is None


def test_a_group_that_cannot_write_its_rows_ends_as_failure_rows_and_the_other_groups_are_kept(
    workflow, fakes: FakeModels
) -> None:
    fakes.store.objects["s3://in/b.png"] = jpeg(32, 32)
    fakes.store.failing_writes = ("-g-000000.parquet",)

    result, documents = run_batch(workflow, fakes, images_per_group=1, caption=False)

    assert result.summary is not None and result.summary.unfinished_groups == ["g-000000"]
    assert (result.summary.succeeded, result.summary.failed, result.summary.groups) == (1, 1, 2)
    rows = {row["source_uri"]: row for row in table_rows(fakes, "images")}
    assert rows["s3://in/b.png"]["status"] == "succeeded"
    assert (rows["s3://in/a.jpg"]["status"], rows["s3://in/a.jpg"]["failed_step"]) == ("failed", "group")
    assert rows["s3://in/a.jpg"]["error"].startswith("group g-000000 did not finish")
    assert documents["s3://in/a.jpg"].status == "succeeded"  # its result document stays, for a rerun of the batch


def test_a_rerun_that_finishes_every_group_replaces_the_failure_rows(workflow, fakes: FakeModels) -> None:
    fakes.store.objects["s3://in/b.png"] = jpeg(32, 32)
    fakes.store.failing_writes = ("-g-000000.parquet",)
    run_batch(workflow, fakes, images_per_group=1, caption=False)
    fakes.store.failing_writes = ()

    result, _ = run_batch(workflow, fakes, images_per_group=1, caption=False)

    assert result.summary is not None and result.summary.unfinished_groups == []
    rows = table_rows(fakes, "images")
    assert sorted((row["source_uri"], row["status"]) for row in rows) == [
        ("s3://in/a.jpg", "succeeded"),
        ("s3://in/b.png", "succeeded"),
    ]


def test_a_failure_writing_the_summary_fails_the_execution_with_its_reason(workflow, fakes: FakeModels) -> None:
    fakes.store.failing_writes = ("/summary.json",)

    result, _ = run_batch(workflow, fakes, caption=False)

    assert result.status == "FAILED" and result.summary is None
    assert "no space left" in (result.error or "")
    assert len(table_rows(fakes, "images")) == 1  # the group's rows were written before


def test_a_stopped_run_leaves_the_workflow_emulator_quiet_while_its_execution_winds_down() -> None:
    """A stopped run's execution goes on in its thread until the process ends, against moto's backends, reset once
    the run is left: whatever it then meets is not printed over the user's last lines."""
    import logging
    import threading

    interpreter = logging.getLogger("moto.stepfunctions.parser")
    before = interpreter.level
    stopping = threading.Event()
    try:
        with local_workflow(stopping=stopping):
            stopping.set()  # Ctrl-C, or SIGTERM
        assert interpreter.level == logging.CRITICAL
    finally:
        interpreter.setLevel(before)
