"""What each workflow state does. Handlers in ``functions/`` parse their event and call one of these with their
step's :class:`~shared.pipeline.dependencies.Dependencies`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import TypeVar

from PIL import Image

from shared.contracts import (
    AnnotationRequest,
    BoxAttributes,
    BoxClasses,
    BoxEmbeddings,
    BoxMasks,
    BranchFailure,
    CaptionOutput,
    ClassifyOutput,
    DescribeInput,
    DescribeOutput,
    Detection,
    DetectOutput,
    FailedStep,
    GroupSummary,
    ImageEmbedding,
    ImageOutcome,
    ImageResult,
    ImageState,
    ImageTask,
    MadeBy,
    SegmentOutput,
    Status,
    StepFailure,
    TagOutput,
    VariantsOutput,
    WriteGroupTableInput,
    float32_values,
)
from shared.errors import ImageRejected
from shared.models.captioning import image_facts
from shared.observability import MetricUnit, logger, metrics
from shared.pipeline.crops import crop_boxes
from shared.pipeline.dependencies import Dependencies
from shared.storage import layout
from shared.storage.images import LoadedImage, load_image
from shared.storage.render import draw_detections

T = TypeVar("T")
P = TypeVar("P")


def _required(port: P | None, name: str) -> P:
    if port is None:
        raise TypeError(f"this function's dependencies have no {name}")
    return port


def _image(uri: str, deps: Dependencies) -> LoadedImage:
    """The image at ``uri``, read and decoded; once per image where one process runs its steps (``deps.decoded``)."""
    if deps.decoded is None:
        return load_image(uri, deps.store_for, deps.image_limits)
    if uri not in deps.decoded:
        deps.decoded[uri] = load_image(uri, deps.store_for, deps.image_limits)
    return deps.decoded[uri]


def _write_step_document(uri: str, data: bytes, deps: Dependencies) -> None:
    """A document one step writes for a later one; kept in ``deps.written`` too, where one process runs both."""
    deps.store_for(uri).write_bytes(uri, data, "application/json")
    if deps.written is not None:
        deps.written[uri] = data


def _step_document(uri: str, deps: Dependencies) -> bytes:
    return deps.written[uri] if deps.written and uri in deps.written else deps.store_for(uri).read_bytes(uri)


def _elapsed_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


def detect(task: ImageTask, deps: Dependencies) -> DetectOutput:
    """Decode the image and find the request's phrases in it."""
    started = time.perf_counter()
    image = _image(task.image.source_uri, deps)
    detections = _required(deps.detector, "detector").detect(
        image.pixels, task.request.phrases, task.request.box_threshold, task.request.text_threshold
    )
    logger.info(
        "detected",
        extra={"image_id": task.image.image_id, "boxes": len(detections), "width": image.width},
    )
    return DetectOutput(
        width=image.width,
        height=image.height,
        content_sha256=image.content_sha256 or None,
        detections=detections,
        ms=_elapsed_ms(started),
        made_by=deps.made_by,
    )


def box_crops(task: DescribeInput, deps: Dependencies) -> list[Image.Image | str]:
    """The crops Classify and Tag both describe: one read and decode of the image, then each box with its margin
    (or why the box has no crop)."""
    image = _image(task.task.image.source_uri, deps)
    return crop_boxes(image.pixels, [d.box for d in task.detections], deps.crop_margin)


def _per_box(
    task: DescribeInput, deps: Dependencies, describe: Callable[[list[Image.Image], list[str]], list[T]]
) -> list[T | str]:
    """``describe`` over the crops of the image's boxes, in one call; a box without a crop gets the reason."""
    crops = box_crops(task, deps)
    kept = [
        (crop, detection.label)
        for crop, detection in zip(crops, task.detections, strict=True)
        if not isinstance(crop, str)
    ]
    described = iter(describe([crop for crop, _ in kept], [label for _, label in kept]) if kept else [])
    logger.info(
        "described",
        extra={"image_id": task.task.image.image_id, "boxes": len(kept), "skipped": len(crops) - len(kept)},
    )
    return [crop if isinstance(crop, str) else next(described) for crop in crops]


def classify(task: DescribeInput, deps: Dependencies) -> ClassifyOutput:
    """Classify every box of the image, in one batch."""
    started = time.perf_counter()
    model = _required(deps.classifier, "classifier")
    results = _per_box(task, deps, lambda crops, labels: model.classify(crops, labels, task.task.request.top_k))
    return ClassifyOutput(
        classes=[BoxClasses(skipped=r) if isinstance(r, str) else BoxClasses(top_k=r) for r in results],
        ms=_elapsed_ms(started),
        made_by=deps.made_by,
    )


def tag(task: DescribeInput, deps: Dependencies) -> TagOutput:
    """Tag every box of the image with the request's attribute vocabularies, in one batch; and, where the request
    asks, embed the whole image (its own forward: the boxes' tags stay what they were without it) and keep the
    boxes' crop embeddings (the tags' own forward) in a document beside the image's result."""
    started = time.perf_counter()
    model = _required(deps.tagger, "tagger")
    deps = deps if deps.decoded is not None else replace(deps, decoded={})  # the crops and the embedding: one decode
    request, image = task.task.request, task.task.image
    vocabularies = request.attributes
    box_embeddings_uri = None
    if request.embeddings == "boxes" and task.detections:
        tagged = _per_box(
            task, deps, lambda crops, labels: list(zip(*model.tag_and_embed(crops, labels, vocabularies), strict=True))
        )
        results = [r if isinstance(r, str) else r[0] for r in tagged]
        vectors = BoxEmbeddings(
            model=model.name,
            revision=model.revision,
            vectors=[None if isinstance(r, str) else float32_values(r[1]) for r in tagged],
        )
        box_embeddings_uri = layout.box_embeddings_document(task.task.results_uri, task.task.batch_id, image.image_id)
        _write_step_document(box_embeddings_uri, vectors.model_dump_json().encode(), deps)
    else:
        results = _per_box(task, deps, lambda crops, labels: model.tag(crops, labels, vocabularies))
    embedding = None
    if request.embeddings != "none":
        [vector] = model.embed_images([_image(image.source_uri, deps).pixels])
        embedding = ImageEmbedding(model=model.name, revision=model.revision, vector=float32_values(vector))
    return TagOutput(
        tags=[BoxAttributes(skipped=r) if isinstance(r, str) else BoxAttributes(attributes=r) for r in results],
        embedding=embedding,
        box_embeddings_uri=box_embeddings_uri,
        ms=_elapsed_ms(started),
        made_by=deps.made_by,
    )


def segment(task: DescribeInput, deps: Dependencies) -> SegmentOutput:
    """A mask for every box of the image (one image encoding, its boxes decoded in one batch), written to a document
    beside the image's result document, where WriteResult reads it in."""
    started = time.perf_counter()
    model = _required(deps.segmenter, "segmenter")
    image = task.task.image
    masks = model.segment(_image(image.source_uri, deps).pixels, [detection.box for detection in task.detections])
    uri = layout.masks_document(task.task.results_uri, task.task.batch_id, image.image_id)
    document = BoxMasks(model=model.name, revision=model.revision, masks=masks)
    _write_step_document(uri, document.model_dump_json().encode(), deps)
    made = sum(mask is not None for mask in masks)
    logger.info("segmented", extra={"image_id": image.image_id, "boxes": len(masks), "masks": made})
    return SegmentOutput(masks_uri=uri, masks=made, ms=_elapsed_ms(started), made_by=deps.made_by)


def describe_wanted(request: AnnotationRequest, detections: list[Detection]) -> bool:
    """Whether the Describe state runs for an image (the workflow's DescribeWanted): boxes to classify and tag, or
    an embedding to make."""
    return bool(detections) or request.embeddings != "none"


def segment_wanted(request: AnnotationRequest, detections: list[Detection]) -> bool:
    """Whether Describe's Segment branch segments (the workflow's SegmentWanted): boxes, and a request for masks."""
    return bool(detections) and request.masks


def merged_detections(
    detections: list[Detection], description: DescribeOutput | None
) -> tuple[list[Detection], dict[FailedStep, StepFailure]]:
    """The detections with what Classify and Tag found merged in, and the failures of those that failed."""
    if description is None:
        return detections, {}
    failures = {}
    if isinstance(description.classify, BranchFailure):
        failures[FailedStep.CLASSIFY] = description.classify.failure
    elif description.classify is not None:
        detections = [
            d.model_copy(
                update={
                    "top_k": c.top_k,
                    "class_label": c.top_k[0].label if c.top_k else None,
                    "class_score": c.top_k[0].score if c.top_k else None,
                    "skipped": c.skipped,
                }
            )
            for d, c in zip(detections, description.classify.classes, strict=True)
        ]
    if isinstance(description.segment, BranchFailure):
        failures[FailedStep.SEGMENT] = description.segment.failure
    if isinstance(description.tag, BranchFailure):
        failures[FailedStep.TAG] = description.tag.failure
    else:
        detections = [
            d.model_copy(update={"attributes": t.attributes, "skipped": d.skipped or t.skipped})
            for d, t in zip(detections, description.tag.tags, strict=True)
        ]
    return detections, failures


def caption(state: ImageState, deps: Dependencies) -> CaptionOutput:
    """Write the image's caption from what Detect, Classify and Tag found."""
    started = time.perf_counter()
    if state.detection is None:
        raise ValueError("Caption needs the Detect step's output")
    detections, _ = merged_detections(state.detection.detections, state.description)
    facts = image_facts(state.task.request, state.detection.width, state.detection.height, detections)
    captioner = _required(deps.captioner, "captioner")
    image = _image(state.task.image.source_uri, deps).pixels if captioner.multimodal else None
    output = captioner.caption(facts, image, as_json=state.task.request.caption_format == "json")
    output = output.model_copy(update={"ms": _elapsed_ms(started)})
    for name, unit, value in (
        ("CaptionTimeToFirstToken", MetricUnit.Milliseconds, output.ttft_ms),
        ("CaptionTokensPerSecond", MetricUnit.CountPerSecond, output.tokens_per_s),
        ("CaptionPromptTokens", MetricUnit.Count, output.prompt_tokens),
        ("CaptionCompletionTokens", MetricUnit.Count, output.completion_tokens),
        ("CaptionPeakMemory", MetricUnit.Megabytes, output.peak_rss_mb),
    ):
        metrics.add_metric(name=name, unit=unit, value=value)
    logger.info("captioned", extra={"image_id": state.task.image.image_id, "ttft_ms": output.ttft_ms})
    return output


def write_result(state: ImageState, deps: Dependencies) -> ImageOutcome:
    """Write the image's result document (and, when it was detected and ``store_pictures`` asks, the annotated
    picture)."""
    result = write_result_document(state, deps)
    return ImageOutcome(image=state.task.image, status=result.status, error=result.error, result_uri=result.result_uri)


def write_result_document(state: ImageState, deps: Dependencies) -> ImageResult:
    """``write_result``'s document, as written (the one-image path keeps it rather than read it back)."""
    task = state.task
    json_uri = layout.result_document(task.results_uri, task.batch_id, task.image.image_id)
    detections, failures = merged_detections(state.detection.detections if state.detection else [], state.description)
    failures = state.failures | failures
    if not failures and state.detection is None:
        failures = {
            FailedStep.DETECT: StepFailure(Error="NoDetectionResult", Cause="the workflow produced no detection result")
        }
    variants = None
    if state.variants_task is not None:
        variants, failure = _variants_document(state, deps)
        failures |= {FailedStep.VARIANTS: failure} if failure else {}
    tagged = state.description.tag if state.description and isinstance(state.description.tag, TagOutput) else None
    masks = _masks(state.description.segment if state.description else None, deps)
    annotated_uri = None
    if state.detection is not None and deps.store_pictures:
        image = _image(task.image.source_uri, deps)
        picture = draw_detections(
            image.pixels, detections, deps.picture_max_side, deps.picture_format, masks.masks if masks else None
        )
        annotated_uri = layout.picture(task.results_uri, task.batch_id, task.image.image_id, deps.picture_format)
        deps.store_for(annotated_uri).write_bytes(annotated_uri, picture, deps.picture_format.media_type)
    result = ImageResult(
        image_id=task.image.image_id,
        source_uri=task.image.source_uri,
        batch_id=task.batch_id,
        job_id=task.request.job_id,
        status=Status.FAILED if failures else Status.SUCCEEDED,
        error="; ".join(f"{step}: {failure.reason}" for step, failure in failures.items()) or None,
        failed_step=",".join(failures) or None,
        width=state.detection.width if state.detection else None,
        height=state.detection.height if state.detection else None,
        content_sha256=state.detection.content_sha256 if state.detection else None,
        prompt=task.request.prompt,
        detections=detections,
        detect_ms=state.detection.ms if state.detection else None,
        classify_ms=_branch_ms(state.description.classify) if state.description else None,
        tag_ms=_branch_ms(state.description.tag) if state.description else None,
        segment_ms=_branch_ms(state.description.segment) if state.description else None,
        made_by=_made_by(state),
        caption=state.caption,
        variants=variants,
        embedding=tagged.embedding if tagged else None,
        box_embeddings=_box_embeddings(tagged, deps),
        masks=masks,
        annotated_uri=annotated_uri,
        result_uri=json_uri,
        processed_at=datetime.now(UTC),
    )
    deps.store_for(json_uri).write_bytes(json_uri, result.document(), "application/json")
    logger.info("result written", extra={"image_id": result.image_id, "status": result.status, "error": result.error})
    return result


def _box_embeddings(tag: TagOutput | None, deps: Dependencies) -> BoxEmbeddings | None:
    """The boxes' embeddings Tag wrote for the image, where the request asked for them."""
    if tag is None or tag.box_embeddings_uri is None:
        return None
    return BoxEmbeddings.model_validate_json(_step_document(tag.box_embeddings_uri, deps))


def _masks(segmented: SegmentOutput | BranchFailure | None, deps: Dependencies) -> BoxMasks | None:
    """The boxes' masks Segment wrote for the image, where the request asked for them."""
    if not isinstance(segmented, SegmentOutput):
        return None
    return BoxMasks.model_validate_json(_step_document(segmented.masks_uri, deps))


_Output = DetectOutput | ClassifyOutput | TagOutput | SegmentOutput


def _made_by(state: ImageState) -> dict[str, MadeBy]:
    outputs: dict[str, _Output | BranchFailure | None] = {"detect": state.detection}
    if state.description is not None:
        description = state.description
        outputs |= {"classify": description.classify, "tag": description.tag, "segment": description.segment}
    return {step: output.made_by for step, output in outputs.items() if isinstance(output, _Output)}


def _branch_ms(output: ClassifyOutput | TagOutput | SegmentOutput | BranchFailure | None) -> float | None:
    return None if output is None or isinstance(output, BranchFailure) else output.ms


def _variants_document(state: ImageState, deps: Dependencies) -> tuple[VariantsOutput | None, StepFailure | None]:
    """The document the Variants task wrote for this image, or why there is none."""
    document_uri = layout.variants_document(state.task.results_uri, state.task.batch_id, state.task.image.image_id)
    try:
        return VariantsOutput.model_validate_json(deps.store_for(document_uri).read_bytes(document_uri)), None
    except ImageRejected:
        return None, StepFailure(Error="NoVariantsDocument", Cause=f"the Variants task wrote no {document_uri}")


def write_group_table(
    state: WriteGroupTableInput, deps: Dependencies, known: Mapping[str, ImageResult] | None = None
) -> GroupSummary:
    """Gather the group's result documents into its file of each table its request fills (shared/storage/tables.py's
    SCHEMAS: ``images``, ``detections``, ``embeddings``, ``box_embeddings``, and ``masks`` where the request asks),
    and keep the group's summary where SummarizeBatch finds it. A document in ``known`` (by its location) is not
    read again: the bulk worker holds what it wrote."""
    # pyarrow: only WriteGroupTable's and SummarizeBatch's packages
    from shared.storage.tables import tables_written, write_table_files

    now = datetime.now(UTC)
    results = [_result_of(outcome, state, deps, now, known or {}) for outcome in state.outcomes]
    stem = f"{state.batch_id}-{state.group_id}"
    tables = tables_written(state.request.masks)
    uris = write_table_files(results, state.results_uri, stem, state.planned_at, deps.store_for, tables)
    failed = sum(result.status is Status.FAILED for result in results)
    summary = GroupSummary(
        batch_id=state.batch_id,
        group_id=state.group_id,
        succeeded=len(results) - failed,
        failed=failed,
        images_table_uri=uris["images"],
        detections_table_uri=uris["detections"],
    )
    uri = layout.group_summary(state.results_uri, state.batch_id, state.group_id)
    deps.store_for(uri).write_bytes(uri, summary.model_dump_json().encode(), "application/json")
    logger.info(
        "group tables written", extra=summary.model_dump(include={"batch_id", "group_id", "succeeded", "failed"})
    )
    return summary


def _result_of(
    outcome: ImageOutcome,
    state: WriteGroupTableInput,
    deps: Dependencies,
    now: datetime,
    known: Mapping[str, ImageResult],
) -> ImageResult:
    """The image's result document; when there is none (writing it failed), a failure row from the outcome."""
    if outcome.result_uri is not None and outcome.result_uri in known:
        return known[outcome.result_uri]
    if outcome.result_uri:
        try:
            document = deps.store_for(outcome.result_uri).read_bytes(outcome.result_uri)
            return ImageResult.model_validate(json.loads(document))
        except ImageRejected:
            logger.warning("result document missing", extra={"result_uri": outcome.result_uri})
    return ImageResult(
        image_id=outcome.image.image_id,
        source_uri=outcome.image.source_uri,
        batch_id=state.batch_id,
        job_id=state.request.job_id,
        status=Status.FAILED,
        error=outcome.write_failure.reason if outcome.write_failure else "the result document was not written",
        failed_step=FailedStep.WRITE_RESULT,
        prompt=state.request.prompt,
        processed_at=now,
    )
