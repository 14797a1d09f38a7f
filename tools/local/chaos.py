"""`annotate chaos` (make chaos): generated images through the local workflow, with faults injected where the code
meets AWS, and an account of every image.

The account (printed first): a Lambda concurrency quota, past which invocations are refused as Lambda refuses them,
with the stack's reservations where the quota leaves room for them (Ingest's, the gatherer's and the API's; Lambda
keeps 100 unreserved, so a new account of 10 has none, and Ingest then competes with the batches); SnapStart versions
that a quiet fortnight made inactive, answering SnapStartNotReadyException while they re-initialise; the images sent
as prompt messages, each through Ingest (an invocation of its own, throttled like any other: its message comes back
after the queue's visibility timeout, and counts toward the queue's maxReceiveCount), whose batches overlap and share
the quota; Fargate vCPUs, the stack's Batch job queue's (Spot, then on-demand).

Faults, each at a rate given on the command line (and printed), drawn for every call on its own (a call may meet
any number in a row: what outlasts a child's retries is handed back to the parent, and what outlasts that fails):
- the Lambda service refuses an invocation (the local runner's stand-in for Invoke): TooManyRequestsException,
  SnapStartNotReadyException (the model steps, which have SnapStart when EnableSnapStart=true) and
  ServiceException. The function does not run; the Task fails with ``Lambda.<name>`` (tools.local.step_functions).
- S3 answers a function's request with 503 SlowDown or 500 InternalError, as it does under load. botocore retries
  them; what it gives up on, the code raises as TransientError and the workflow retries.
- one step hangs past its TimeoutSeconds, once: Lambda would end it at the function's timeout, the workflow catches
  the Task's States.Timeout, and only that image is recorded as failed.
- one Fargate task (Variants, for a second, small batch with variants) is reclaimed by Fargate Spot before its
  container ends: Batch runs the job again (its job definition's retry strategy).
- Fargate Spot has no capacity for a while: the job queue places jobs on on-demand Fargate meanwhile.

Everything runs in moto (S3 holds the images and the results, as in AWS mode); the last line printed is
``N images, N rows, 0 lost, F faults injected, R retried, X recorded as failed``. The run fails when an image has
no row or more than one, or when one other than the hung image is recorded as failed; a message Ingest could not
take before the queue's receive limit (dead-lettered) loses its images, and counts as lost.
"""

from __future__ import annotations

import io
import json
import random
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.local.chaos_faults import (
    HAND_BACK_WAIT_S,
    HAND_BACKS,
    INPUT_BUCKET,
    RESULTS_BUCKET,
    SMALL_MEMORY_PARAMETERS,
    VISIBILITY_S,
    Faults,
    Injector,
)
from tools.local.step_functions import LambdaServiceError

if TYPE_CHECKING:
    from shared.contracts import PromptMessage


@dataclass(frozen=True)
class ChaosReport:
    images: int
    rows: int
    lost: int  # images without a row
    duplicated: int  # rows beyond the first of an image
    injected: dict[str, int]
    retried: int
    failed: list[dict[str, Any]]  # the rows recorded as failed
    hung_source: str = ""  # the image whose step hung: the one failure expected
    most_in_flight: int = 0  # Lambda invocations at once, at the most
    run_s: float = 0.0  # from the first message to the last row
    busy_s: float = 0.0  # the functions' time, summed over every invocation
    lambda_concurrency: int | None = None
    handed_back: int = 0  # groups the workflow ran again in a later round
    most_fargate_vcpus: float = 0.0  # Fargate vCPUs of one compute environment's jobs at once, at the most
    on_demand_jobs: int = 0  # job attempts the queue placed on on-demand Fargate
    ingest_throttled: int = 0  # Ingest invocations refused, their messages back in the queue
    dead_lettered: int = 0  # messages moved to the dead-letter queue after the queue's receive limit

    @property
    def unexpected_failures(self) -> list[dict[str, Any]]:
        return [row for row in self.failed if row["source_uri"] != self.hung_source]

    @property
    def timing(self) -> str:
        """The run's time against the quota's ideal: the functions' time spread evenly over the concurrency."""
        line = f"took {self.run_s:.0f} s"
        if self.lambda_concurrency:
            ideal = self.busy_s / self.lambda_concurrency
            line += (
                f" against the quota's ideal {ideal:.0f} s ({self.busy_s:.0f} s of functions' time / "
                f"{self.lambda_concurrency} at once): {self.run_s / max(ideal, 1e-9):.1f}x"
            )
        return line + f"; {self.handed_back} groups handed back to a later round"

    @property
    def line(self) -> str:
        return (
            f"{self.images} images, {self.rows} rows, {self.lost} lost, {sum(self.injected.values())} faults "
            f"injected, {self.retried} retried, {len(self.failed)} recorded as failed"
        )


def generate_images(count: int, seed: int) -> dict[str, bytes]:
    """``count`` small JPEG pictures of coloured shapes, different each, by name."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    images = {}
    for index in range(count):
        size = (rng.randint(96, 200), rng.randint(72, 160))
        picture = Image.new("RGB", size, tuple(rng.randint(0, 255) for _ in range(3)))
        draw = ImageDraw.Draw(picture)
        for _ in range(3):
            x0, y0 = rng.randint(0, size[0] - 20), rng.randint(0, size[1] - 20)
            box = (x0, y0, x0 + rng.randint(10, 60), y0 + rng.randint(10, 60))
            draw.ellipse(box, fill=tuple(rng.randint(0, 255) for _ in range(3)))
        buffer = io.BytesIO()
        picture.save(buffer, "JPEG", quality=85)
        images[f"images/{index:05d}.jpg"] = buffer.getvalue()
    return images


def run_chaos(count: int, faults: Faults, prompt: str = "cat. dog.", caption: bool = True) -> ChaosReport:
    """Annotate ``count`` generated images through the local workflow with ``faults``; account for each image."""
    import boto3

    from shared.settings import Profile, use_settings
    from shared.storage import objects as storage
    from tools.local.batch_jobs import ON_DEMAND, stack_job_queue
    from tools.local.runner import REGION, HandlerDispatcher, local_workflow
    from tools.models.tiny_models import build_named_models

    with tempfile.TemporaryDirectory(prefix="annotate-chaos-") as folder:
        settings = use_settings(
            profile=Profile.TINY,
            data_dir=Path(folder),
            results_uri=f"s3://{RESULTS_BUCKET}",
            hand_backs=HAND_BACKS,
            hand_back_wait_s=HAND_BACK_WAIT_S,
        )
        # the stack's LambdaConcurrency: the account's quota less what the stack reserves
        unreserved = (faults.lambda_concurrency or 0) - sum(faults.reservations().values())
        account: dict[str, Any] = {"lambda_concurrency": unreserved} if faults.lambda_concurrency else {}
        if faults.fargate_vcpus:
            account["fargate_vcpus"] = faults.fargate_vcpus
        if faults.function_memory_mb:  # Detect on the runtime such an account deploys
            account["detector_runtime"] = SMALL_MEMORY_PARAMETERS["DetectorRuntime"]
        # ingest plans the batches within the account's quotas; the bulk message's images run two to a group, so
        # that its jobs are several tasks
        settings = use_settings(settings.model_copy(update=account | {"bulk_images_per_group": 2}))
        build_named_models(settings, variants=faults.variants_images > 0)
        images, with_variants, bulk = _chaos_images(count, faults)
        hung = sorted(images)[faults.hang_image] if faults.hang_step and faults.hang_image < count else ""
        hung_source = f"s3://{INPUT_BUCKET}/{hung}" if hung else ""
        injector = Injector(faults, hang_source=hung_source)
        lambda_service = HandlerDispatcher(
            gate=injector.gate,
            timeouts=True,
            concurrency=faults.lambda_concurrency,
            reserved=faults.reservations(),
        )
        job_queue = stack_job_queue(settings.fargate_vcpus, gate=injector.gate, stopping=lambda_service.stopping)
        with local_workflow(aws_limits=True, dispatcher=lambda_service, job_queue=job_queue) as run_batch:
            s3 = boto3.client("s3", region_name=REGION)
            for bucket in (INPUT_BUCKET, RESULTS_BUCKET):
                s3.create_bucket(Bucket=bucket)
            for key, body in (images | with_variants | bulk).items():
                s3.put_object(Bucket=INPUT_BUCKET, Key=key, Body=body)
            session = boto3.DEFAULT_SESSION
            assert session is not None
            storage.refresh_clients()  # the functions' S3 client is made anew, from the session that injects
            session.events.register_first("before-send.s3", injector.s3_answer, unique_id="annotate-chaos")
            started = time.monotonic()
            try:
                messages = _chaos_messages(faults, count, prompt, caption, bool(bulk), bool(with_variants))
                ingest = _IngestQueue(lambda_service, run_batch, Path(folder), settings.ingest, faults)
                dead_lettered = ingest.deliver(messages)
            finally:
                session.events.unregister("before-send.s3", unique_id="annotate-chaos")
            run_s = time.monotonic() - started
            rows = _image_rows(s3, Path(folder))
            handed_back = _groups_handed_back(s3)
        storage.refresh_clients()
    sources = Counter(row["source_uri"] for row in rows)
    throttled = lambda_service.throttled
    return ChaosReport(
        images=len(images) + len(with_variants) + len(bulk),
        rows=len(rows),
        lost=sum(1 for key in images | with_variants | bulk if f"s3://{INPUT_BUCKET}/{key}" not in sources),
        duplicated=sum(n - 1 for n in sources.values()),
        # a throttle past the quota is a fault too, and each is retried by the workflow (one it did not outlast ends
        # as a failed row), or by the queue (Ingest's)
        injected=dict(injector.injected) | ({"Lambda concurrency quota": throttled} if throttled else {}),
        retried=injector.retried + throttled,
        failed=[row for row in rows if row["status"] == "failed"],
        hung_source=hung_source,
        most_in_flight=lambda_service.most_in_flight,
        run_s=run_s,
        busy_s=lambda_service.busy_s,
        lambda_concurrency=faults.lambda_concurrency,
        handed_back=handed_back,
        most_fargate_vcpus=max(job_queue.most_vcpus.values(), default=0.0),
        on_demand_jobs=job_queue.placed.get(ON_DEMAND, 0),
        ingest_throttled=ingest.throttled,
        dead_lettered=dead_lettered,
    )


def _chaos_images(count: int, faults: Faults) -> tuple[dict[str, bytes], dict[str, bytes], dict[str, bytes]]:
    """The images of each message: batch n's under images/<n>/, then those with variants, then the bulk lane's."""
    images = {
        key.replace("images/", f"images/{index % faults.batches}/"): body
        for index, (key, body) in enumerate(sorted(generate_images(count, faults.seed).items()))
    }
    with_variants = {
        key.replace("images/", "variants/"): body
        for key, body in generate_images(faults.variants_images, faults.seed + 1).items()
    }
    bulk = {
        key.replace("images/", "bulk/"): body
        for key, body in generate_images(faults.bulk_images, faults.seed + 2).items()
    }
    return images, with_variants, bulk


def _chaos_messages(
    faults: Faults, count: int, prompt: str, caption: bool, bulk: bool, with_variants: bool
) -> list[PromptMessage]:
    from shared.contracts import PromptMessage

    messages = [
        PromptMessage(prompt=prompt, images=[f"s3://{INPUT_BUCKET}/images/{n}/"], caption=caption)
        for n in range(min(faults.batches, count))
    ]
    if bulk:
        messages.append(PromptMessage(prompt=prompt, images=[f"s3://{INPUT_BUCKET}/bulk/"], caption=False, lane="bulk"))
    if with_variants:
        variants = {"prompt": "a watercolor", "steps": 1, "size": 128}
        messages.append(PromptMessage(prompt=prompt, images=[f"s3://{INPUT_BUCKET}/variants/"], variants=variants))
    return messages


class _IngestQueue:
    """The prompts queue and its poller: each message handed to Ingest as its own invocation (counted against the
    account's concurrency, or Ingest's reservation), ``message_interval_s`` apart. A throttled invocation is retried
    with backoff "until the message's timestamp exceeds your queue's visibility timeout" (Lambda operator guide,
    "Handling errors for an SQS event source"), when the message is received again; past the queue's
    maxReceiveCount (the template's) SQS moves it to the dead-letter queue. The executions Ingest starts run on, each
    on a thread of its own, as Step Functions runs them."""

    def __init__(self, lambda_service: Any, run_batch: Any, folder: Path, settings: Any, faults: Faults) -> None:
        from tools.aws.sam_template import load_template
        from tools.local.runner import LocalStarter

        self._lambda, self._settings, self._faults = lambda_service, settings, faults
        self._executions: list[threading.Thread] = []
        self._starter = LocalStarter(self._run_in_the_background(run_batch), folder, "annotate-chaos")
        queue = load_template()["Resources"]["PromptsQueue"]["Properties"]
        self.max_receives = int(queue["RedrivePolicy"]["maxReceiveCount"])
        self.throttled = self.dead = 0
        self._counting = threading.Lock()

    def _run_in_the_background(self, run_batch: Any) -> Any:
        from tools.local.runner import ExecutionResult

        def start(batch: Any, name: str | None = None) -> ExecutionResult:
            thread = threading.Thread(target=run_batch, args=(batch, name), daemon=True)
            thread.start()
            self._executions.append(thread)
            return ExecutionResult(execution_arn=name or batch.batch_id, status="RUNNING", summary=None, error=None)

        return start

    def deliver(self, messages: list[PromptMessage]) -> int:
        """Every message to Ingest, each retried until it is taken or dead-lettered; returns how many were, once
        every execution started has ended."""
        pollers = [
            threading.Thread(target=self._poll, args=(index, message), daemon=True)
            for index, message in enumerate(messages)
        ]
        for poller in pollers:
            poller.start()
        for poller in pollers:
            poller.join()
        for thread in self._executions:
            thread.join()
        return self.dead

    def _poll(self, index: int, message: PromptMessage) -> None:
        from shared.pipeline.ingest import start_batches
        from shared.storage.objects import store_for

        time.sleep(index * self._faults.message_interval_s)
        ingest = partial(start_batches, message, f"chaos-{index}", self._settings, self._starter, store_for)
        for _ in range(self.max_receives):  # each a receive: the message is in flight for the visibility timeout
            visible_again, backoff = time.monotonic() + VISIBILITY_S, 0.25
            while time.monotonic() < visible_again:
                try:
                    self._lambda.run_as("ingest", ingest)
                    return
                except LambdaServiceError:
                    with self._counting:
                        self.throttled += 1
                    time.sleep(min(backoff, max(0.0, visible_again - time.monotonic())))
                    backoff = min(2 * backoff, 5.0)
        with self._counting:  # SQS moves it to the dead-letter queue: its images have no row
            self.dead += 1


def _groups_handed_back(s3: Any) -> int:
    """Groups run again in a later round, over every batch: the rounds' manifests that SummarizeBatch wrote."""
    listed = s3.list_objects_v2(Bucket=RESULTS_BUCKET, Prefix="manifests/").get("Contents", [])
    count = 0
    for item in listed:
        name = item["Key"].rsplit("/", 1)[-1]
        if ".groups." in name and not name.endswith(".groups.0.json"):
            count += len(json.loads(s3.get_object(Bucket=RESULTS_BUCKET, Key=item["Key"])["Body"].read()))
    return count


def _image_rows(s3: Any, local: Path) -> list[dict[str, Any]]:
    """The images table's rows the run wrote to the results bucket, read from a copy of its tables in ``local``."""
    from tools.results.query import run_local_query

    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=RESULTS_BUCKET, Prefix="tables/"):
        for item in page.get("Contents", []):
            target = local / item["Key"]
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(RESULTS_BUCKET, item["Key"], str(target))
    query = "SELECT source_uri, status, failed_step, error FROM images ORDER BY source_uri"
    return list(run_local_query(query, local).to_pylist())
