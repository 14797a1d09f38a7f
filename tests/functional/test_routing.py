"""The two ways an image is routed through its steps run the same steps on every branch: the workflow (the ASL's
Choice states, DescribeWanted, ClassifyWanted/NothingToClassify and CaptionWanted, on moto's interpreter) and one
process (shared/pipeline/one_image.py: the bulk lane, the API, local mode). Every combination of boxes found or not,
each embeddings option and a caption asked or not, and a detector that fails, on fakes."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

import pytest

from shared.contracts import AnnotationRequest, Box, Detection, ImageRef, ImageTask, PromptMessage
from shared.errors import ModelUnavailable
from shared.pipeline.batches import plan_batches
from shared.pipeline.dependencies import Dependencies, Step, use_dependencies
from shared.pipeline.one_image import annotate_image
from shared.settings import Settings
from shared.storage import layout
from tests.fakes import FakeDetector, FakeModels
from tests.functional.test_workflow import jpeg
from tools.local.runner import local_workflow

RESULTS = "s3://results"
DOG = Detection(label="dog", score=0.9, box=Box(x0=4, y0=4, x1=40, y1=30))
# What runs per image, by either route (the batch's own functions, WriteGroupTable and SummarizeBatch, are not routing)
PER_IMAGE = {step.value for step in (Step.DETECT, Step.CLASSIFY, Step.TAG, Step.CAPTION, Step.WRITE_RESULT)}

CASES = [
    pytest.param(boxes, embeddings, caption, False, id=f"{len(boxes)} boxes-{embeddings}-caption {caption}")
    for boxes, embeddings, caption in itertools.product(([], [DOG]), ("none", "image", "boxes"), (False, True))
] + [pytest.param([DOG], "image", True, True, id="the detector fails")]


@pytest.fixture
def workflow() -> Iterator:
    invoked: list[str] = []
    with local_workflow(lambda name, payload, error: invoked.append(name)) as run:
        yield run, invoked


@pytest.mark.parametrize(("boxes", "embeddings", "caption", "detector_fails"), CASES)
def test_the_workflow_and_one_process_run_the_same_steps_on_every_branch(
    workflow, boxes: list[Detection], embeddings: str, caption: bool, detector_fails: bool
) -> None:
    run, invoked = workflow
    fakes = FakeModels(detector=FakeDetector(boxes))
    fakes.store.objects["s3://in/a.jpg"] = jpeg()
    if detector_fails:
        fakes.detector.failure = ModelUnavailable("no detector weights")
    use_dependencies(fakes.dependencies)
    try:
        # WHEN the workflow annotates the image
        message = PromptMessage(prompt="dog.", images=["s3://in/a.jpg"], embeddings=embeddings, caption=caption)
        [batch] = plan_batches(message, Settings(results_uri=RESULTS).ingest, lambda _: fakes.store)
        fakes.store.objects[layout.all_groups(batch.input)] = batch.groups_manifest()
        assert run(batch.input).summary is not None
        by_workflow = {name for name in invoked if name in PER_IMAGE}

        # AND one process annotates it
        ran: set[str] = set()

        def recording(step: Step) -> Dependencies:
            ran.add(step.value)
            return replace(fakes.dependencies(step))

        request = AnnotationRequest(prompt="dog.", embeddings=embeddings, caption=caption)  # type: ignore[arg-type]
        task = ImageTask(
            batch_id=batch.input.batch_id,
            request=request,
            image=ImageRef(image_id="0" * 16, source_uri="s3://in/a.jpg"),
            results_uri="s3://elsewhere",
        )
        annotate_image(task, recording)
    finally:
        use_dependencies(None)

    # THEN both ran the same steps
    assert ran == by_workflow, (sorted(ran), sorted(by_workflow))
    assert "detect" in ran and "write_result" in ran
