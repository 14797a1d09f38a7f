"""From a prompt message to batches of image groups: expand folders and prefixes, name images and batches by content."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from shared.contracts import (
    AnnotationRequest,
    BatchInput,
    BulkJob,
    BulkJobRef,
    ImageGroup,
    ImageRef,
    Lane,
    PromptMessage,
)
from shared.errors import RequestRejected
from shared.settings import IngestSettings
from shared.storage import layout
from shared.storage.objects import StoreFor, is_s3, local_path, local_uri


def expand_locations(
    locations: list[str],
    store_for: StoreFor,
    results_root: str | None = None,
    fingerprints: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Every image a message names, with its fingerprint (content digest, or S3's ETag): files as they are, local
    folders and S3 prefixes ending in '/' expanded. A prefix's ETags come from its listing (one request per 1,000
    objects); a named object costs one HEAD, unless ``fingerprints`` has it (an S3 event's ETag). Nothing under
    ``results_root`` is an input: the results of a run in a folder of photos sit inside that folder.

    A location that does not exist is kept (fingerprint 'missing'), so that it ends as a failure row rather than
    silently vanishing; so is a symlink loop.

    Raises:
        RequestRejected: a location is the results folder or lies inside it.
    """
    results = results_root.rstrip("/") + "/" if results_root else None

    def an_input(uri: str) -> bool:
        return not (results and uri.startswith(results))

    found: dict[str, str] = {}
    for location in locations:
        if not is_s3(location):
            path = local_path(location).expanduser().absolute()
            # a symlink loop is kept as named: it ends as its failure row
            with contextlib.suppress(RuntimeError, OSError):
                path = path.resolve()
            location = local_uri(path)
        if not an_input(location + "/"):
            raise RequestRejected(f"{location} is where results are written, not an image or a folder of images")
        store = store_for(location)
        if not is_s3(location):  # a local fingerprint reads the file: the results' files are left out first
            uris = store.list_uris(location) if local_path(location).is_dir() else [location]
            listed: Iterable[tuple[str, str]] = ((uri, store.fingerprint(uri)) for uri in uris if an_input(uri))
        elif location.endswith("/"):
            listed = (entry for entry in store.list_fingerprinted(location) if an_input(entry[0]))
        elif fingerprints and location in fingerprints:
            listed = [(location, fingerprints[location])]
        else:
            listed = [(location, store.fingerprint(location))]
        for uri, fingerprint in listed:
            found.setdefault(uri, fingerprint)
    return found


def image_ref(uri: str, fingerprint: str) -> ImageRef:
    return ImageRef(image_id=hashlib.sha256(f"{uri}\0{fingerprint}".encode()).hexdigest()[:16], source_uri=uri)


# Request fields added since batches were first named, hashed only when set away from their default: a message
# delivered before a deployment that added one, and again after it, still names the batch it named first.
FIELDS_HASHED_WHEN_SET = ("masks",)


def batch_id(request: AnnotationRequest, images: list[ImageRef]) -> str:
    """Derived from the images' content and the request, so the same inputs and options name the same batch."""
    unset = {
        name for name in FIELDS_HASHED_WHEN_SET if getattr(request, name) == type(request).model_fields[name].default
    }
    digest = hashlib.sha256(request.model_dump_json(exclude=unset).encode())
    for image in sorted(images, key=lambda ref: ref.image_id):
        digest.update(image.image_id.encode())
    return f"b-{digest.hexdigest()[:20]}"


@dataclass(frozen=True)
class PlannedBatch:
    """An execution's input and the groups its Distributed Map reads from the groups manifest."""

    input: BatchInput
    groups: list[ImageGroup]

    @property
    def groups_per_job(self) -> int:
        """The bulk lane's: the batch's groups shared evenly by its jobs, in every round (a function of the input
        alone, so that a job's document is the same whoever writes it)."""
        return -(-self.input.groups // max(1, self.input.bulk_jobs))

    def image_uris(self) -> list[str]:
        return [image.source_uri for group in self.groups for image in group.images]

    def groups_manifest(self) -> bytes:
        return b"[" + b",".join(group.model_dump_json().encode() for group in self.groups) + b"]"

    def bulk_jobs(self) -> list[tuple[BulkJobRef, BulkJob]]:
        """The bulk lane's jobs (``input.bulk_jobs`` of them), each with the manifest item that names it."""
        batch, per_job = self.input, self.groups_per_job
        return [
            (
                BulkJobRef(job_uri=layout.bulk_job(batch.results_uri, batch.batch_id, number, batch.round)),
                BulkJob(
                    batch_id=batch.batch_id,
                    request=batch.request,
                    results_uri=batch.results_uri,
                    planned_at=batch.planned_at,
                    groups=self.groups[start : start + per_job],
                ),
            )
            for number, start in enumerate(range(0, len(self.groups), per_job))
        ]

    def write_bulk_jobs(self, store_for: StoreFor) -> None:
        """Each bulk job's document, then the manifest the bulk lane's Distributed Map reads (a JSON array of their
        locations): the Map starts no task before all of its jobs exist."""
        jobs = self.bulk_jobs()
        for ref, job in jobs:
            store_for(ref.job_uri).write_bytes(ref.job_uri, job.model_dump_json().encode(), "application/json")
        manifest = b"[" + b",".join(ref.model_dump_json().encode() for ref, _ in jobs) + b"]"
        uri = layout.bulk_manifest(self.input)
        store_for(uri).write_bytes(uri, manifest, "application/json")


@dataclass(frozen=True)
class LaneChoice:
    """A batch's lane and why (written on the batch for ``annotate status``); for gathered images, the images each
    bulk task takes so that it ends within the wait."""

    lane: Lane
    reason: str
    images_per_task: int = 0


def choose_lane(message: PromptMessage, images: int, settings: IngestSettings) -> LaneChoice:
    """The message's lane; ``auto`` is bulk from ``bulk_from_images`` images where the stack has the lane and the
    request can run there.

    Raises:
        RequestRejected: bulk asked of a stack without the lane, or with variants (made by the Lambda lane's task).
    """
    if message.lane == "auto":
        wanted = settings.bulk_enabled and message.variants is None and images >= settings.bulk_from_images
        return LaneChoice(
            "bulk" if wanted else "lambda", f"auto: {images} images, bulk from {settings.bulk_from_images}"
        )
    if message.lane == "bulk" and not settings.bulk_enabled:
        raise RequestRejected("the message asks for the bulk lane, but this stack was deployed without it")
    if message.lane == "bulk" and message.variants is not None:
        raise RequestRejected("variants are made in the lambda lane: send the message with lane lambda or auto")
    return LaneChoice(message.lane, "the message asked for it")


def gathered_lane(images: int, settings: IngestSettings, wait_s: float | None = None) -> LaneChoice:
    """The cheapest lane that ends gathered images within the wait (``max_wait_minutes``): the bulk lane's Fargate
    Spot tasks from ``gathered_bulk_from_images`` images (where a task's start and model load costs less than Lambda
    would for them), each task taking at most what it annotates within the wait, as long as the tasks that needs
    may run at once; Lambda otherwise, whose fan-out ends any batch in minutes. ``wait_s``: the wait, if not the
    stack's (``annotate watch`` takes fractions of a minute)."""
    wait_s = settings.max_wait_minutes * 60 if wait_s is None else wait_s
    wait = f"{wait_s / 60:g} min"
    start_s, per_image_s = settings.bulk_task_start_s, settings.bulk_seconds_per_image
    per_task = int((wait_s - start_s) // per_image_s)
    if not settings.bulk_enabled:
        return LaneChoice("lambda", "the stack has no bulk lane")
    if images < settings.gathered_bulk_from_images:
        return LaneChoice(
            "lambda",
            f"{images} image(s): a bulk task's start and model load ({start_s:.0f} s) pays from "
            f"{settings.gathered_bulk_from_images}",
        )
    if per_task < 1:
        return LaneChoice("lambda", f"a bulk task's start and model load ({start_s:.0f} s) outlasts the wait")
    tasks, at_once = -(-images // per_task), bulk_tasks_at_once(settings)
    if tasks > at_once:
        return LaneChoice(
            "lambda", f"{images} images need {tasks} bulk tasks to end within {wait}; {at_once} may run at once"
        )
    ends_s = start_s + -(-images // tasks) * per_image_s  # the images shared evenly between the tasks
    return LaneChoice(
        "bulk",
        f"{images} gathered images in {tasks} bulk task(s) of at most {per_task}: {start_s:.0f} s start and model "
        f"load + {per_image_s:g} s an image end in {ends_s / 60:.1f} min, within the {wait} wait",
        images_per_task=per_task,
    )


def bulk_tasks_at_once(settings: IngestSettings) -> int:
    """``bulk_concurrency``, within the stack's Fargate Spot vCPUs: past them Batch holds a job RUNNABLE "until vCPUs
    are available" in its compute environments (AWS Batch User Guide, "Job states"), which the batches running at
    once share; planned within them, a batch alone never waits."""
    return max(1, min(settings.bulk_concurrency, settings.fargate_vcpus * 1024 // settings.bulk_task_cpu))


def groups_per_bulk_job(groups: int, settings: IngestSettings) -> int:
    """At most ``groups_per_bulk_job``, and fewer when the batch would otherwise leave some of the tasks that may run
    at once idle: with 100 tasks at once, 1,000 groups run as 100 tasks of 10 groups, not 20 of 50."""
    return max(1, min(settings.groups_per_bulk_job, -(-groups // bulk_tasks_at_once(settings))))


def variants_tasks_at_once(settings: IngestSettings) -> int:
    """Variants jobs a batch runs at once: as many as the stack's Fargate Spot vCPUs hold (one at the least), so that
    a batch alone never waits in Batch's queue, a wait its children's time would pay for."""
    return max(1, settings.fargate_vcpus * 1024 // settings.variants_task_cpu)


def within_tasks(images: int, groups: int, tasks: int) -> tuple[int, int]:
    """(images per group, groups at once) of ``images`` and ``groups`` with at most ``tasks`` images at once: groups
    shrink first, then fewer run at once."""
    images = min(images, tasks)
    return images, max(1, min(groups, tasks // images))


# The Lambda invocations one image holds at once, at most: Classify and Tag run side by side (Describe's Parallel)
INVOCATIONS_PER_IMAGE = 2


def lambda_fan_out(settings: IngestSettings) -> tuple[int, int]:
    """(images per group, groups at once) of a Lambda-lane batch, within the concurrency it may use: past it Lambda
    refuses invocations (TooManyRequestsException), which a child retries for seconds, with backoff and jitter,
    before it hands its group back to the parent to wait minutes: planned within it, a batch alone is never
    throttled, and batches at once are throttled by Lambda itself. One invocation is left for Ingest, for an account
    whose quota leaves nothing to reserve. Groups shrink before their count does: a group's images all run at once,
    so a child's time stays one image's, within Express's 5 minutes."""
    budget = max(INVOCATIONS_PER_IMAGE, settings.lambda_concurrency - 1)
    images = max(1, min(settings.images_per_group, budget // INVOCATIONS_PER_IMAGE))
    groups = max(1, min(settings.group_concurrency, budget // (images * INVOCATIONS_PER_IMAGE)))
    return images, groups


def _tasks_within(images: int, per_task: int, most_per_group: int) -> tuple[int, int]:
    """(images per group, groups per task) for ``images`` in as few tasks of at most about ``per_task`` images as
    hold them, shared evenly: 177 images, 197 a task and groups of 40 give one task of 5 groups of 36."""
    tasks = -(-images // per_task)
    task_images = -(-images // tasks)
    groups = -(-task_images // most_per_group)
    return -(-task_images // groups), groups


def plan_batches(
    message: PromptMessage,
    settings: IngestSettings,
    store_for: StoreFor,
    now: datetime | None = None,
    choice: LaneChoice | None = None,
    fingerprints: Mapping[str, str] | None = None,
) -> list[PlannedBatch]:
    """The executions that annotate everything ``message`` names: one, unless it names more images than one
    execution takes (``max_images_per_batch``), each in groups of ``images_per_group`` (``bulk_images_per_group`` in
    the bulk lane), fewer where the account's Lambda concurrency needs it (:func:`lambda_fan_out`) or, for variants,
    its Fargate vCPUs (:func:`variants_tasks_at_once`). ``choice``: the
    lane already chosen (gathered images: :func:`gathered_lane`), a bulk task per group of its size."""
    request = message.request()
    planned_at = now or datetime.now(UTC)
    refs = [
        image_ref(uri, fingerprint)
        for uri, fingerprint in expand_locations(message.images, store_for, settings.results_root, fingerprints).items()
    ]
    batches = []
    lane = choice or choose_lane(message, min(len(refs), settings.max_images_per_batch), settings)
    for start in range(0, len(refs), settings.max_images_per_batch):
        chunk = refs[start : start + settings.max_images_per_batch]
        size, at_once = lambda_fan_out(settings)
        if request.variants is not None:  # each image runs a Variants task on Fargate
            size, at_once = within_tasks(size, at_once, variants_tasks_at_once(settings))
        per_job = 0
        if lane.lane == "bulk":
            size = settings.bulk_images_per_group
            if lane.images_per_task:  # as few tasks as end in time, their images shared evenly
                size, per_job = _tasks_within(len(chunk), lane.images_per_task, size)
        groups = [
            ImageGroup(group_id=f"g-{index:06d}", images=chunk[offset : offset + size])
            for index, offset in enumerate(range(0, len(chunk), size))
        ]
        per_job = per_job or groups_per_bulk_job(len(groups), settings)
        batch = BatchInput(
            batch_id=batch_id(request, chunk),
            request=request,
            results_uri=settings.results_root,
            planned_at=planned_at,
            images=len(chunk),
            groups=len(groups),
            group_concurrency=at_once,
            lane=lane.lane,
            lane_reason=lane.reason,
            bulk_jobs=-(-len(groups) // per_job) if lane.lane == "bulk" else 0,
            bulk_concurrency=bulk_tasks_at_once(settings),
            hand_backs=settings.hand_backs,
            hand_back_wait_s=settings.hand_back_wait_s,
        )
        batches.append(PlannedBatch(input=batch, groups=groups))
    return batches
