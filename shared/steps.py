"""What each workflow state does. Handlers in ``functions/`` parse their event and call one of these."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from shared.contracts import (
    BatchSummary,
    DetectOutput,
    ImageOutcome,
    ImageResult,
    ImageTask,
    Status,
    WriteResultInput,
    WriteTableInput,
)
from shared.detection import Detector, load_detector
from shared.errors import ImageRejected
from shared.images import load_image
from shared.observability import logger
from shared.render import draw_detections
from shared.settings import Settings
from shared.storage import join_uri, store_for
from shared.tables import write_batch_tables

RESULTS_PREFIX = "results"


def result_uris(task: ImageTask) -> tuple[str, str]:
    """Where the image's result document and annotated picture go."""
    base = join_uri(task.results_uri, RESULTS_PREFIX, task.batch_id, task.image.image_id)
    return f"{base}.json", f"{base}.png"


def detect(task: ImageTask, settings: Settings, detector: Detector | None = None) -> DetectOutput:
    """Decode the image and find the request's phrases in it."""
    image = load_image(task.image.source_uri, settings)
    detector = detector or load_detector(settings)
    detections = detector.detect(
        image.pixels, task.request.phrases, task.request.box_threshold, task.request.text_threshold
    )
    logger.info(
        "detected",
        extra={"image_id": task.image.image_id, "boxes": len(detections), "width": image.width},
    )
    return DetectOutput(width=image.width, height=image.height, detections=detections)


def write_result(state: WriteResultInput, settings: Settings) -> ImageOutcome:
    """Write the image's result document (and, when it succeeded, the annotated picture)."""
    json_uri, png_uri = result_uris(state)
    failed_step, failure = next(iter(state.failures.items()), (None, None))
    error = failure.reason if failure else None
    if failure is None and state.detection is None:
        failed_step, error = "detect", "the workflow produced no detection result"
    annotated_uri = None
    if failed_step is None and state.detection is not None:
        image = load_image(state.image.source_uri, settings)
        store_for(png_uri).write_bytes(png_uri, draw_detections(image.pixels, state.detection.detections), "image/png")
        annotated_uri = png_uri
    result = ImageResult(
        image_id=state.image.image_id,
        source_uri=state.image.source_uri,
        batch_id=state.batch_id,
        status=Status.FAILED if failed_step else Status.SUCCEEDED,
        error=error,
        failed_step=failed_step,
        width=state.detection.width if state.detection else None,
        height=state.detection.height if state.detection else None,
        prompt=state.request.prompt,
        detections=state.detection.detections if state.detection else [],
        annotated_uri=annotated_uri,
        result_uri=json_uri,
        processed_at=datetime.now(UTC),
    )
    store_for(json_uri).write_bytes(json_uri, result.model_dump_json(indent=2).encode(), "application/json")
    logger.info("result written", extra={"image_id": result.image_id, "status": result.status, "error": result.error})
    return ImageOutcome(
        image_id=result.image_id,
        source_uri=result.source_uri,
        status=result.status,
        error=result.error,
        result_uri=json_uri,
    )


def write_table(state: WriteTableInput, settings: Settings) -> BatchSummary:
    """Gather the batch's result documents into the ``images`` and ``detections`` tables."""
    now = datetime.now(UTC)
    results = [_result_of(outcome, state, now) for outcome in state.outcomes]
    uris = write_batch_tables(results, state.results_uri, state.batch_id, now)
    failed = sum(result.status is Status.FAILED for result in results)
    logger.info("tables written", extra={"batch_id": state.batch_id, "images": len(results), "failed": failed})
    return BatchSummary(
        batch_id=state.batch_id,
        succeeded=len(results) - failed,
        failed=failed,
        images_table_uri=uris["images"],
        detections_table_uri=uris["detections"],
    )


def _result_of(outcome: ImageOutcome, state: WriteTableInput, now: datetime) -> ImageResult:
    """The image's result document; when there is none (writing it failed), a failure row from the outcome."""
    if outcome.result_uri:
        try:
            document = store_for(outcome.result_uri).read_bytes(outcome.result_uri)
            return ImageResult.model_validate(json.loads(document))
        except ImageRejected:
            logger.warning("result document missing", extra={"result_uri": outcome.result_uri})
    return ImageResult(
        image_id=outcome.image_id,
        source_uri=outcome.source_uri,
        batch_id=state.batch_id,
        status=Status.FAILED,
        error=outcome.write_failure.reason if outcome.write_failure else "the result document was not written",
        failed_step="write_result",
        prompt=state.request.prompt,
        processed_at=now,
    )
