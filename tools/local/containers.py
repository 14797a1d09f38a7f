"""The Batch jobs' containers as the local runner runs them: in this process, with the settings in force, placed
and retried by the stack's job queue (tools/local/batch_jobs.py) as Batch would."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from typing import Any

from shared.contracts import ImageOutcome
from shared.pipeline.dependencies import Step, dependencies_of
from shared.settings import get_settings
from tools.local.batch_jobs import JobQueue
from tools.local.step_functions import container_environment

# (function name, payload, error or None), after each invocation, and ("bulk", {"outcome": ...}, None) after each
# image of a bulk task: the CLI's progress display listens.
InvocationListener = Callable[[str, dict[str, Any], BaseException | None], None]
# (function name, payload), before the Lambda service runs an invocation: it may refuse it (LambdaServiceError) or
# delay it, as `annotate chaos` does, without holding the function's environment; ("variants", {"task": job})
# before a Variants job's container runs, and ("bulk", {"job_uri": ..., "image": n}) before each image of a bulk
# job: it may stop the task there (TaskStopped, as Fargate stops it; any other exception is the container's own
# failure); ("batch:place", ...) and ("batch:ended", ...) as tools/local/batch_jobs.py asks them.
InvocationGate = Callable[[str, dict[str, Any]], None]


def run_job_container(
    queue: JobQueue,
    gate: InvocationGate | None,
    listener: InvocationListener | None,
    stopping: threading.Event,
    submit_job_parameters: dict[str, Any],
    job_id: str,
) -> None:
    """Locally a Batch job's container (the Variants step's, or a bulk job's) is this process, with the settings
    in force, placed and retried by the stack's job queue as Batch would; ``gate`` may stop its task, as Fargate may:
    a Variants job before it starts, a bulk job before each of its images."""
    environment = container_environment(submit_job_parameters)
    bulk = "ANNOTATE_BULK_JOB" in environment
    settings = get_settings()

    def container(placed_in: str) -> None:
        if bulk:
            _run_bulk_container(gate, listener, stopping, environment["ANNOTATE_BULK_JOB"])
            return
        from shared.pipeline.variants_task import run

        job = environment.get("ANNOTATE_VARIANT_JOB", "")
        if gate:
            gate("variants", {"task": json.loads(job or "{}"), "environment": placed_in})
        run(job)

    vcpus = (settings.bulk_task_cpu if bulk else settings.variants_task_cpu) / 1024
    queue.run("bulk" if bulk else "variants", vcpus, container)


# A bulk task takes every core of its machine: here, one at a time (the Map may start many at once).
BULK_TASK_AT_A_TIME = threading.Lock()


def _run_bulk_container(
    gate: InvocationGate | None, listener: InvocationListener | None, run_stopping: threading.Event, job_uri: str
) -> None:
    from shared.pipeline.bulk import read_job, run_job

    dependencies = dependencies_of(Step.WRITE_RESULT)
    checks = itertools.count()

    def stopping() -> bool:  # the gate's TaskStopped ends the task between two images, as Fargate stops it
        if gate:
            gate("bulk", {"job_uri": job_uri, "image": next(checks)})
        return run_stopping.is_set()

    def on_image(outcome: ImageOutcome) -> None:
        if listener:
            listener("bulk", {"outcome": outcome.model_dump(mode="json")}, None)

    with BULK_TASK_AT_A_TIME:
        run_job(read_job(job_uri, dependencies.store_for), dependencies_of, stopping, on_image)
