"""One image annotated in one process, as the workflow annotates it: Detect; then, where it found boxes, Classify and
Tag (and Segment where the request asks for masks); then Caption where the request asks; then WriteResult. Each
step's failure is recorded as the workflow's Catch records it (a Lambda error's type and message), so the result
document is the one the workflow writes. The synchronous side and a bulk worker call this; tests hold it to the
workflow's rows and, on every branch of the ASL's Choice states, to the steps the workflow runs
(tests/functional/test_routing.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from shared.contracts import (
    BranchFailure,
    DescribeInput,
    DescribeOutput,
    FailedStep,
    ImageResult,
    ImageState,
    ImageTask,
    StepFailure,
)
from shared.pipeline import steps
from shared.pipeline.dependencies import Dependencies, Step
from shared.storage.images import LoadedImage

T = TypeVar("T")
DependenciesOf = Callable[[Step], Dependencies]


def _failure(error: Exception) -> StepFailure:
    """What a Task's Catch records of a Lambda error: its type, and the error payload as the cause."""
    cause = {"errorType": type(error).__name__, "errorMessage": str(error)}
    return StepFailure(Error=type(error).__name__, Cause=json.dumps(cause))


def _run(step: Callable[[], T]) -> T | StepFailure:
    try:
        return step()
    except Exception as error:  # a step's exception is its Task's error, which the workflow catches
        return _failure(error)


def annotate_image(
    task: ImageTask, dependencies_of_step: DependenciesOf, decoded_image: LoadedImage | None = None
) -> ImageResult:
    """The image's result document, written where the workflow writes it (``task.results_uri``), and returned.
    ``decoded_image``: the image, where the caller decoded it already (the API, to refuse it before any model runs).

    Raises:
        ValueError: the request asks for variants, which the workflow makes in a Fargate task.
    """
    if task.request.variants is not None:
        raise ValueError("variants are made by the workflow's Fargate task, not in one process")
    # the steps share one decode of the image (a 12 MP photo's is 0.1 s), and what one writes for another
    decoded = {task.image.source_uri: decoded_image} if decoded_image else {}
    written: dict[str, bytes] = {}

    def dependencies_of(step: Step) -> Dependencies:
        return replace(dependencies_of_step(step), decoded=decoded, written=written)

    state = ImageState(task=task)
    detection = _run(lambda: steps.detect(task, dependencies_of(Step.DETECT)))
    if isinstance(detection, StepFailure):
        state = state.model_copy(update={"failures": {FailedStep.DETECT: detection}})
    else:
        state = state.model_copy(update={"detection": detection})
        if steps.describe_wanted(task.request, detection.detections):
            described = DescribeInput(task=task, detections=detection.detections)
            classify = (
                _run(lambda: steps.classify(described, dependencies_of(Step.CLASSIFY)))
                if detection.detections
                else None  # as the workflow's NothingToClassify
            )
            tag = _run(lambda: steps.tag(described, dependencies_of(Step.TAG)))
            segment = (
                _run(lambda: steps.segment(described, dependencies_of(Step.SEGMENT)))
                if steps.segment_wanted(task.request, detection.detections)
                else None  # as the workflow's NothingToSegment
            )
            description = DescribeOutput(
                classify=BranchFailure(failure=classify) if isinstance(classify, StepFailure) else classify,
                tag=BranchFailure(failure=tag) if isinstance(tag, StepFailure) else tag,
                segment=BranchFailure(failure=segment) if isinstance(segment, StepFailure) else segment,
            )
            state = state.model_copy(update={"description": description})
        if task.request.caption:
            caption = _run(lambda: steps.caption(state, dependencies_of(Step.CAPTION)))
            update = {"failures": {FailedStep.CAPTION: caption}} if isinstance(caption, StepFailure) else {}
            state = state.model_copy(update=update or {"caption": caption})
    return steps.write_result_document(state, dependencies_of(Step.WRITE_RESULT))
