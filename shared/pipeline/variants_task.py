"""The Variants container (Fargate): its entrypoint reads the job from the environment, makes the variants, exits.

Exit status 0 when the variants are written; 1, with the reason in the log, when not (Step Functions then
reports States.TaskFailed, and the workflow's Catch records it for the image).

    # ANNOTATE_VARIANT_JOB='{"batch_id": ..., "request": {..., "variants": ...}, ...}'
    python -m shared.pipeline.variants_task
"""

from __future__ import annotations

import hashlib
import io
import sys
import time

from PIL import Image, ImageOps
from pydantic import ValidationError

from shared.contracts import ImageTask, Variant, VariantsOutput, VariantsRequest
from shared.errors import AnnotateError, validation_reason
from shared.observability import logger
from shared.pipeline.dependencies import Dependencies, Step, dependencies_of
from shared.settings import get_settings
from shared.storage import layout
from shared.storage.images import load_image


def requested_variants(task: ImageTask) -> VariantsRequest:
    """The variants the task's request asks for.

    Raises:
        ValueError: it asks for none (the Variants task runs only for requests that do).
    """
    if task.request.variants is None:
        raise ValueError("the image's request asks for no variants")
    return task.request.variants


def first_seed(task: ImageTask) -> int:
    """The request's seed, or one derived from the image, so that the same task gives the same pictures."""
    seed = requested_variants(task).seed
    return seed if seed is not None else int(hashlib.sha256(task.image.image_id.encode()).hexdigest()[:7], 16)


def run_variant_job(task: ImageTask, deps: Dependencies) -> VariantsOutput:
    """Generate the variants the task asks for, write them and their document; returns the document."""
    started = time.perf_counter()
    request = requested_variants(task)
    init_image = None
    if request.mode == "img2img":
        source = load_image(task.image.source_uri, deps.store_for, deps.image_limits).pixels
        size = request.size
        init_image = ImageOps.fit(source, (size, size), method=Image.Resampling.LANCZOS)
    if deps.generator is None:
        raise TypeError("the Variants task's dependencies have no generator")
    root, batch_id, image_id = task.results_uri, task.batch_id, task.image.image_id
    variants = []
    for index, (picture, seed, seconds) in enumerate(deps.generator.render(request, init_image, first_seed(task))):
        uri = layout.variant_picture(root, batch_id, image_id, index)
        buffer = io.BytesIO()
        picture.save(buffer, format="PNG")
        deps.store_for(uri).write_bytes(uri, buffer.getvalue(), "image/png")
        variants.append(Variant(uri=uri, seed=seed, seconds=seconds))
    elapsed_ms = round((time.perf_counter() - started) * 1000, 1)
    output = VariantsOutput(model=deps.generator.model_name, mode=request.mode, images=variants, ms=elapsed_ms)
    document_uri = layout.variants_document(root, batch_id, image_id)
    deps.store_for(document_uri).write_bytes(
        document_uri, output.model_dump_json(indent=2).encode(), "application/json"
    )
    logger.info("variants written", extra={"image_id": task.image.image_id, "count": len(variants)})
    return output


def run(variant_job: str) -> VariantsOutput:
    """Parse the job (ANNOTATE_VARIANT_JOB) and run it.

    Raises:
        ValueError: no job, or a job that breaks the contract (the message says which field and why).
    """
    if not variant_job:
        raise ValueError("ANNOTATE_VARIANT_JOB is empty: the task needs its job")
    try:
        task = ImageTask.model_validate_json(variant_job)
    except ValidationError as error:
        raise ValueError(f"malformed job: {validation_reason(error)}") from error
    requested_variants(task)  # refused before the model loads
    return run_variant_job(task, dependencies_of(Step.VARIANTS))


def main() -> int:
    try:
        output = run(get_settings().variant_job)
    except (ValueError, AnnotateError, OSError, RuntimeError) as error:
        logger.error("variants failed", extra={"reason": f"{type(error).__name__}: {error}"})
        return 1
    logger.info("variants done", extra={"variants": [variant.uri for variant in output.images]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
