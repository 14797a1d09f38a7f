"""The bulk lane's worker: a batch of groups on one Fargate (Spot) task, written as the Lambda lane writes them.

Each image goes through the one-image path (shared/pipeline/one_image.py: the same steps, the same result document) and
each group's rows through WriteGroupTable's code, once per group. While an image runs, the next one's questions to S3
are asked (its result written by an earlier try? if not, its bytes). A retried job skips every image whose result
document is already written, so a task stopped part way (a Spot interruption's SIGTERM, two minutes before the end)
loses nothing and writes each image once.

    python -m shared.pipeline.bulk   # ANNOTATE_BULK_JOB=s3://results/manifests/<batch_id>.bulk/<n>.json
"""

from __future__ import annotations

import contextvars
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

from pydantic import ValidationError

from shared.contracts import (
    BulkJob,
    ImageGroup,
    ImageOutcome,
    ImageRef,
    ImageResult,
    ImageTask,
    WriteGroupTableInput,
)
from shared.errors import AnnotateError, ImageRejected, validation_reason
from shared.observability import logger, metrics
from shared.pipeline import steps
from shared.pipeline.dependencies import Dependencies, Step, dependencies_of
from shared.pipeline.one_image import annotate_image
from shared.settings import get_settings
from shared.storage import layout
from shared.storage.objects import ObjectStore, StoreFor

DependenciesOf = Callable[[Step], Dependencies]
OnImage = Callable[[ImageOutcome], None]


class Stopped(Exception):
    """The task was told to stop (SIGTERM) between two images; what is written stays."""


@dataclass
class _ReadAhead:
    """What the worker asks S3 of each image, asked on a second thread while the image before it runs: whether an
    earlier try of the job wrote its result and, if not, its bytes (which its steps then share, as their store)."""

    store_for: StoreFor
    max_bytes: int
    _pool: ThreadPoolExecutor
    _results: dict[str, Future[ImageResult | None]]
    _images: dict[str, Future[bytes]]

    def fetch(self, task: ImageTask) -> None:
        uri = task.image.source_uri
        if uri not in self._results:
            # in the caller's context, as if the caller asked: its log keys, and whoever the caller acts as
            run = contextvars.copy_context().run
            self._results[uri] = self._pool.submit(run, _done, task, self.store_for)
            self._images[uri] = self._pool.submit(run, self._unless_done, uri, self._results[uri])

    def _unless_done(self, uri: str, result: Future[ImageResult | None]) -> bytes:
        return b"" if result.result() is not None else self.store_for(uri).read_bytes(uri, self.max_bytes)

    def done(self, uri: str) -> ImageResult | None:
        return self._results[uri].result()

    def forget(self, uri: str) -> None:
        self._results.pop(uri, None)
        self._images.pop(uri, None)

    def __call__(self, uri: str) -> ObjectStore:
        return self if uri in self._images else self.store_for(uri)  # type: ignore[return-value]

    def read_bytes(self, uri: str, max_bytes: int | None = None) -> bytes:
        return self._images[uri].result()  # an ImageRejected raised there is raised here, for the step to record


def _done(task: ImageTask, store_for: StoreFor) -> ImageResult | None:
    """The image's result document, when an earlier try of the job wrote it."""
    document = layout.result_document(task.results_uri, task.batch_id, task.image.image_id)
    try:
        return ImageResult.model_validate_json(store_for(document).read_bytes(document))
    except (ImageRejected, ValidationError):
        return None


def run_job(
    job: BulkJob,
    dependencies_of: DependenciesOf,
    stopping: Callable[[], bool] = lambda: False,
    on_image: OnImage = lambda outcome: None,
) -> int:
    """Annotate the job's images and write each group's rows; returns how many images it annotated (the others
    were done before). ``on_image`` hears of each image as it ends.

    Raises:
        Stopped: ``stopping()`` became true; the groups not finished are left to the retried job.
    """
    common = dependencies_of(Step.WRITE_RESULT)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="read-ahead")
    read_ahead = _ReadAhead(common.store_for, common.image_limits.max_image_bytes, pool, {}, {})
    annotated = 0
    try:
        for group in job.groups:
            annotated += _run_group(job, group, dependencies_of, read_ahead, stopping, on_image)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return annotated


def _run_group(
    job: BulkJob,
    group: ImageGroup,
    dependencies_of: DependenciesOf,
    read_ahead: _ReadAhead,
    stopping: Callable[[], bool],
    on_image: OnImage,
) -> int:
    def task_of(ref: ImageRef) -> ImageTask:
        return ImageTask(batch_id=job.batch_id, request=job.request, image=ref, results_uri=job.results_uri)

    def with_read_ahead(step: Step) -> Dependencies:
        return replace(dependencies_of(step), store_for=read_ahead)

    outcomes, annotated = [], 0
    written: dict[str, ImageResult] = {}  # by location: the table write reads none of them back
    for index, ref in enumerate(group.images):
        if stopping():
            raise Stopped(f"stopped in {group.group_id} after {index} of its images; the retry writes the rest")
        for ahead in group.images[index : index + 2]:
            read_ahead.fetch(task_of(ahead))
        result = read_ahead.done(ref.source_uri)
        if result is None:
            result = annotate_image(task_of(ref), with_read_ahead)
            annotated += 1
        read_ahead.forget(ref.source_uri)
        if result.result_uri:
            written[result.result_uri] = result
        outcomes.append(ImageOutcome(image=ref, status=result.status, error=result.error, result_uri=result.result_uri))
        on_image(outcomes[-1])
    table_input = WriteGroupTableInput(
        batch_id=job.batch_id,
        group_id=group.group_id,
        request=job.request,
        results_uri=job.results_uri,
        planned_at=job.planned_at,
        outcomes=outcomes,
    )
    steps.write_group_table(table_input, dependencies_of(Step.WRITE_GROUP_TABLE), known=written)
    # The steps add their measurements to Powertools' metrics, which a Lambda handler emits and clears at the end of
    # each invocation; a task running hundreds of images would keep them all. Its measurements are in its rows.
    metrics.clear_metrics()
    return annotated


def read_job(job_uri: str, store_for: StoreFor) -> BulkJob:
    """The job document ANNOTATE_BULK_JOB names.

    Raises:
        ValueError: no job named, or one that breaks the contract.
    """
    if not job_uri:
        raise ValueError("ANNOTATE_BULK_JOB is empty: the task needs the location of its job")
    try:
        return BulkJob.model_validate_json(store_for(job_uri).read_bytes(job_uri))
    except ValidationError as error:
        raise ValueError(f"malformed job {job_uri}: {validation_reason(error)}") from error


# The exit code of a task told to stop (SIGTERM, as the shell reports a process it ended: 128 + 15): a Spot
# interruption, which the job definition's retry strategy runs again (template.yaml, BulkJobDefinition)
EXIT_STOPPED = 143


def run_task(stopping: Callable[[], bool]) -> int:
    """The task's job (ANNOTATE_BULK_JOB), run to its end: 0 when every group's rows are written; ``EXIT_STOPPED``
    when told to stop between two images, which Batch runs again (skipping what is done); 1 (the reason logged)
    otherwise: the job fails, and the workflow hands its groups back to a later round."""
    try:
        job = read_job(get_settings().bulk_job, dependencies_of(Step.WRITE_RESULT).store_for)
        annotated = run_job(job, dependencies_of, stopping)
    except Stopped as stopped:
        logger.warning("bulk job stopped between two images", extra={"reason": str(stopped)})
        return EXIT_STOPPED
    except (ValueError, AnnotateError, OSError) as error:
        logger.error("bulk job ended early", extra={"reason": f"{type(error).__name__}: {error}"})
        return 1
    logger.info("bulk job done", extra={"groups": len(job.groups), "annotated": annotated})
    return 0


def main() -> int:
    """The container's entrypoint."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # Fargate's stop (a Spot interruption): end between images
    return run_task(stop.is_set)


if __name__ == "__main__":
    sys.exit(main())
