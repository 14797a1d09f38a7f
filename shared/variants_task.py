"""The Variants container's entrypoint (Fargate): read the job from the environment, run it, exit.

Exit status 0 when the variants are written; 1, with the reason in the log, when not (Step Functions then
reports States.TaskFailed, and the workflow's Catch records it for the image).

    python -m shared.variants_task   # ANNOTATE_VARIANT_JOB='{"batch_id": ..., "request": {..., "variants": ...}, ...}'
"""

from __future__ import annotations

import sys

from pydantic import ValidationError

from shared.contracts import ImageTask, VariantsOutput
from shared.dependencies import Step, dependencies_of
from shared.errors import AnnotateError, validation_reason
from shared.observability import logger
from shared.settings import get_settings
from shared.variants import requested_variants, run_variant_job


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
