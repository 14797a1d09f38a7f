"""The two ways an image is routed through its steps run the same steps on every branch: the workflow (the ASL's
Choice states, DescribeWanted, ClassifyWanted/NothingToClassify, SegmentWanted/NothingToSegment and CaptionWanted,
on moto's interpreter) and one process (shared/pipeline/one_image.py: the bulk lane, the API, local mode). Every
combination of boxes found or not, each embeddings option and a caption asked or not; masks asked with boxes or
none; a detector and a segmenter that fail, on fakes. Where both segment, they write the same masks."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

import pytest

from shared.contracts import AnnotationRequest, Box, Detection, ImageRef, ImageResult, ImageTask, PromptMessage
from shared.errors import ModelUnavailable
from shared.pipeline.batches import plan_batches
from shared.pipeline.dependencies import ANNOTATION_MODEL_STEPS, Dependencies, Step, use_dependencies
from shared.pipeline.one_image import annotate_image
from shared.settings import Settings
from shared.storage import layout
from tests.fakes import FakeDetector, FakeModels
from tests.functional.test_workflow import jpeg
from tools.local.runner import local_workflow

RESULTS = "s3://results"
DOG = Detection(label="dog", score=0.9, box=Box(x0=4, y0=4, x1=40, y1=30))
# What runs per image, by either route (the batch's own functions, WriteGroupTable and SummarizeBatch, are not routing)
PER_IMAGE = {step.value for step in (*ANNOTATION_MODEL_STEPS, Step.WRITE_RESULT)}

CASES = (
    [
        pytest.param(boxes, embeddings, caption, False, None, id=f"{len(boxes)} boxes-{embeddings}-caption {caption}")
        for boxes, embeddings, caption in itertools.product(([], [DOG]), ("none", "image", "boxes"), (False, True))
    ]
    + [pytest.param([DOG], "image", True, False, "masks", id="masks-1 box")]
    + [pytest.param([], "image", True, False, "masks", id="masks-0 boxes")]
    + [pytest.param([DOG], "image", True, False, "segmenter fails", id="masks-the segmenter fails")]
    + [pytest.param([DOG], "image", True, True, None, id="the detector fails")]
)


@pytest.fixture
def workflow() -> Iterator:
    invoked: list[str] = []
    with local_workflow(lambda name, payload, error: invoked.append(name)) as run:
        yield run, invoked


@pytest.mark.parametrize(("boxes", "embeddings", "caption", "detector_fails", "masks"), CASES)
def test_the_workflow_and_one_process_run_the_same_steps_on_every_branch(
    workflow, boxes: list[Detection], embeddings: str, caption: bool, detector_fails: bool, masks: str | None
) -> None:
    run, invoked = workflow
    fakes = FakeModels(detector=FakeDetector(boxes))
    fakes.store.objects["s3://in/a.jpg"] = jpeg()
    if detector_fails:
        fakes.detector.failure = ModelUnavailable("no detector weights")
    if masks == "segmenter fails":
        fakes.segmenter.failure = ModelUnavailable("no segmenter export")
    use_dependencies(fakes.dependencies)
    try:
        # WHEN the workflow annotates the image
        options = {"embeddings": embeddings, "caption": caption, "masks": masks is not None}
        message = PromptMessage(prompt="dog.", images=["s3://in/a.jpg"], **options)  # type: ignore[arg-type]
        [batch] = plan_batches(message, Settings(results_uri=RESULTS).ingest, lambda _: fakes.store)
        fakes.store.objects[layout.all_groups(batch.input)] = batch.groups_manifest()
        assert run(batch.input).summary is not None
        by_workflow = {name for name in invoked if name in PER_IMAGE}

        # AND one process annotates it
        ran: set[str] = set()

        def recording(step: Step) -> Dependencies:
            ran.add(step.value)
            return replace(fakes.dependencies(step))

        request = AnnotationRequest(prompt="dog.", **options)  # type: ignore[arg-type]
        task = ImageTask(
            batch_id=batch.input.batch_id,
            request=request,
            image=ImageRef(image_id="0" * 16, source_uri="s3://in/a.jpg"),
            results_uri="s3://elsewhere",
        )
        in_one_process = annotate_image(task, recording)
    finally:
        use_dependencies(None)

    # THEN both ran the same steps
    assert ran == by_workflow, (sorted(ran), sorted(by_workflow))
    assert "detect" in ran and "write_result" in ran
    assert ("segment" in ran) is (masks is not None and bool(boxes))
    # AND wrote the same masks (or the same failure)
    [document] = [
        uri for uri in fakes.store.objects if uri.startswith(f"{RESULTS}/results/") and layout.is_result_document(uri)
    ]
    by_workflow_result = ImageResult.model_validate_json(fakes.store.objects[document])
    assert by_workflow_result.masks == in_one_process.masks
    assert by_workflow_result.failed_step == in_one_process.failed_step
    if masks == "masks" and boxes:
        assert in_one_process.masks is not None and in_one_process.masks.masks[0] is not None
    if masks == "segmenter fails":
        assert in_one_process.failed_step == "segment" and in_one_process.masks is None
