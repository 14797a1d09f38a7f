"""`annotate chaos` (make chaos): generated images through the local workflow, with faults injected where the code
meets AWS, and an account of every image.

Faults, each at a rate given on the command line (and printed):
- the Lambda service refuses an invocation (the local runner's stand-in for Invoke): TooManyRequestsException,
  SnapStartNotReadyException (the model steps, which have SnapStart when EnableSnapStart=true) and
  ServiceException. The function does not run; the Task fails with ``Lambda.<name>`` (tools.step_functions).
- S3 answers a function's request with 503 SlowDown or 500 InternalError, as it does under load. botocore retries
  them; what it gives up on, the code raises as TransientError and the workflow retries.
- one step hangs past its TimeoutSeconds, once: Lambda would end it at the function's timeout, the workflow catches
  the Task's States.Timeout, and only that image is recorded as failed.
- one Fargate task (Variants, for a second, small batch with variants) stops before its container ends, as a host
  or capacity failure stops it: the workflow runs it again.

Everything runs in moto (S3 holds the images and the results, as in AWS mode); the last line printed is
``N images, N rows, 0 lost, F faults injected, R retried, X recorded as failed``.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tools.step_functions import FunctionTimedOut, LambdaServiceError
from tools.workflow import step_timeouts

INPUT_BUCKET, RESULTS_BUCKET = "chaos-input", "chaos-results"
BUCKETS = (INPUT_BUCKET, RESULTS_BUCKET)
MODEL_STEPS = frozenset({"detect", "classify", "tag", "caption"})
# Fewer than any retry policy allows (the workflow's retriers 2 and 4, botocore's legacy mode 4): what an image meets
# is recovered from, unless it is the hang.
MAX_FAULTS_IN_A_ROW = 2
# What a function reads and writes; ingest's own requests (listing, the manifests) are not faulted.
FAULTED_PREFIXES = ("images/", "results/", "tables/", "batches/")


@dataclass(frozen=True)
class Faults:
    throttle: float = 0.05  # Lambda TooManyRequestsException, per invocation
    snapstart_not_ready: float = 0.02  # Lambda SnapStartNotReadyException, per invocation of a model step
    service_error: float = 0.02  # Lambda ServiceException, per invocation
    s3_slowdown: float = 0.03  # S3 503 SlowDown, per request
    s3_internal_error: float = 0.01  # S3 500 InternalError, per request
    hang_step: str | None = "detect"  # the step that hangs once, past its timeout (None: no hang)
    hang_image: int = 2  # the index of the image whose step hangs
    variants_images: int = 2  # images of the second batch, with variants, whose first Fargate task stops (0: none)
    seed: int = 7
    lambda_concurrency: int | None = None  # the account's quota: invocations past it are refused (None: no quota)

    def account(self) -> str:
        quota = f"{self.lambda_concurrency:,}" if self.lambda_concurrency else "no quota"
        return f"account: Lambda concurrency {quota} (a batch's fan-out planned within it)"

    def describe(self) -> str:
        hang = f"{self.hang_step} of image {self.hang_image} hangs once" if self.hang_step else "no hang"
        if self.variants_images:
            hang += f"; a Fargate task of {self.variants_images} images with variants stops once"
        return (
            f"faults: Lambda throttle {self.throttle:.0%}, SnapStart not ready {self.snapstart_not_ready:.0%} "
            f"(model steps), service error {self.service_error:.0%} per invocation; S3 SlowDown "
            f"{self.s3_slowdown:.0%}, 500 {self.s3_internal_error:.0%} per request; {hang}; seed {self.seed}"
        )


@dataclass
class Injector:
    """Draws the faults; counts what it injected and what was tried again after a fault."""

    faults: Faults
    hang_source: str = ""  # the source URI of the image whose step hangs
    injected: Counter[str] = field(default_factory=Counter)
    retried: int = 0
    _faulted: dict[str, int] = field(default_factory=dict)  # call -> the faults it met in a row
    _hung: bool = False
    _task_stopped: bool = False
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def __post_init__(self) -> None:
        self._random = random.Random(self.faults.seed)

    def _draw(self, key: str, choices: list[tuple[str, float]]) -> str | None:
        """The fault to inject into the call ``key`` (None: none); a call again after a fault counts as a retry. A
        call meets at most MAX_FAULTS_IN_A_ROW: the faults are transient, as throttles and service errors are."""
        with self._lock:
            in_a_row = self._faulted.pop(key, 0)
            self.retried += in_a_row > 0
            if in_a_row >= MAX_FAULTS_IN_A_ROW:
                return None
            roll, threshold = self._random.random(), 0.0
            for name, rate in choices:
                threshold += rate
                if roll < threshold:
                    self.injected[name] += 1
                    self._faulted[key] = in_a_row + 1
                    return name
            return None

    def gate(self, function: str, payload: dict[str, Any]) -> None:
        """Before the Lambda service runs ``function`` (or Fargate the Variants container): refuse it, let its one
        hang begin, or stop the one task."""
        key = f"{function}:{hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()}"
        if function == "variants":
            self._stop_once(key)
            return
        source = (payload.get("image") or payload.get("task", {}).get("image") or {}).get("source_uri", "")
        with self._lock:
            hang = bool(self.hang_source) and function == self.faults.hang_step and source == self.hang_source
            hang &= not self._hung
            self._hung |= hang
            if hang:
                self.injected[f"{function} hung past its timeout"] += 1
        if hang:  # Lambda ends it at the function's timeout, which the workflow's TimeoutSeconds equals
            timeout = step_timeouts()[function]
            time.sleep(timeout)
            raise FunctionTimedOut(timeout)
        choices = [("Lambda TooManyRequestsException", self.faults.throttle)]
        if function in MODEL_STEPS:
            choices.append(("Lambda SnapStartNotReadyException", self.faults.snapstart_not_ready))
        choices.append(("Lambda ServiceException", self.faults.service_error))
        fault = self._draw(key, choices)
        if fault:
            raise LambdaServiceError(fault.removeprefix("Lambda "), "injected by annotate chaos")

    def _stop_once(self, key: str) -> None:
        with self._lock:
            stopped = self._draw(key, [("Fargate task stopped", 0.0 if self._task_stopped else 1.0)])
            self._task_stopped |= stopped is not None
        if stopped:
            raise RuntimeError("Task stopped: host capacity was reclaimed (injected by annotate chaos)")

    def s3_answer(self, request: Any, **_: Any) -> Any:
        """Before an S3 request is sent: an error answer from S3, or None to send it."""
        from botocore.awsrequest import AWSResponse
        from moto.core.botocore_stubber import MockRawResponse

        url = urlsplit(request.url)
        host_bucket = url.netloc.split(".", 1)[0]  # virtual-hosted style: bucket.s3.region.amazonaws.com/key
        path = url.path.lstrip("/") if host_bucket in BUCKETS else url.path.lstrip("/").partition("/")[2]
        bucket = host_bucket if host_bucket in BUCKETS else url.path.lstrip("/").partition("/")[0]
        if bucket not in BUCKETS or not path.startswith(FAULTED_PREFIXES):
            return None
        fault = self._draw(
            f"s3:{request.method}:{bucket}/{path}",
            [("S3 SlowDown", self.faults.s3_slowdown), ("S3 InternalError", self.faults.s3_internal_error)],
        )
        if fault is None:
            return None
        code, status = ("SlowDown", 503) if fault == "S3 SlowDown" else ("InternalError", 500)
        body = f"<Error><Code>{code}</Code><Message>injected by annotate chaos</Message></Error>"
        return AWSResponse(request.url, status, {}, MockRawResponse(body))


@dataclass(frozen=True)
class ChaosReport:
    images: int
    rows: int
    lost: int  # images without a row
    duplicated: int  # rows beyond the first of an image
    injected: dict[str, int]
    retried: int
    failed: list[dict[str, Any]]  # the rows recorded as failed
    most_in_flight: int = 0  # Lambda invocations at once, at the most

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

    from shared import storage
    from shared.contracts import PromptMessage
    from shared.ingest import start_batches
    from shared.settings import Profile, use_settings
    from tools.local_runner import REGION, HandlerDispatcher, LocalStarter, local_workflow
    from tools.tiny_models import build_named_models

    with tempfile.TemporaryDirectory(prefix="annotate-chaos-") as folder:
        settings = use_settings(profile=Profile.TINY, data_dir=Path(folder), results_uri=f"s3://{RESULTS_BUCKET}")
        if faults.lambda_concurrency:  # ingest plans the batches within the account's quota
            settings = use_settings(settings.model_copy(update={"lambda_concurrency": faults.lambda_concurrency}))
        build_named_models(settings, variants=faults.variants_images > 0)
        images = generate_images(count, faults.seed)
        with_variants = {
            key.replace("images/", "variants/"): body
            for key, body in generate_images(faults.variants_images, faults.seed + 1).items()
        }
        hung = sorted(images)[faults.hang_image] if faults.hang_step and faults.hang_image < count else ""
        injector = Injector(faults, hang_source=f"s3://{INPUT_BUCKET}/{hung}" if hung else "")
        lambda_service = HandlerDispatcher(gate=injector.gate, timeouts=True, concurrency=faults.lambda_concurrency)
        with local_workflow(aws_limits=True, dispatcher=lambda_service) as run_batch:
            s3 = boto3.client("s3", region_name=REGION)
            for bucket in (INPUT_BUCKET, RESULTS_BUCKET):
                s3.create_bucket(Bucket=bucket)
            for key, body in (images | with_variants).items():
                s3.put_object(Bucket=INPUT_BUCKET, Key=key, Body=body)
            session = boto3.DEFAULT_SESSION
            assert session is not None
            storage.refresh_clients()  # the functions' S3 client is made anew, from the session that injects
            session.events.register_first("before-send.s3", injector.s3_answer, unique_id="annotate-chaos")
            try:
                starter = LocalStarter(run_batch, Path(folder), "annotate-chaos")
                message = PromptMessage(prompt=prompt, images=[f"s3://{INPUT_BUCKET}/images/"], caption=caption)
                start_batches(message, "annotate-chaos", settings.ingest, starter, storage.store_for)
                if with_variants:
                    variants = {"prompt": "a watercolor", "steps": 1, "size": 128}
                    message = PromptMessage(prompt=prompt, images=[f"s3://{INPUT_BUCKET}/variants/"], variants=variants)
                    start_batches(message, "annotate-chaos-variants", settings.ingest, starter, storage.store_for)
            finally:
                session.events.unregister("before-send.s3", unique_id="annotate-chaos")
            rows = _image_rows(s3, Path(folder))
        storage.refresh_clients()
    sources = Counter(row["source_uri"] for row in rows)
    throttled = lambda_service.throttled
    return ChaosReport(
        images=len(images) + len(with_variants),
        rows=len(rows),
        lost=sum(1 for key in images | with_variants if f"s3://{INPUT_BUCKET}/{key}" not in sources),
        duplicated=sum(n - 1 for n in sources.values()),
        # a throttle past the quota is a fault too, and each is retried by the workflow (one it did not outlast ends
        # as a failed row)
        injected=dict(injector.injected) | ({"Lambda concurrency quota": throttled} if throttled else {}),
        retried=injector.retried + throttled,
        failed=[row for row in rows if row["status"] == "failed"],
        most_in_flight=lambda_service.most_in_flight,
    )


def _image_rows(s3: Any, local: Path) -> list[dict[str, Any]]:
    """The images table's rows the run wrote to the results bucket, read from a copy of its tables in ``local``."""
    from tools.query import run_local_query

    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=RESULTS_BUCKET, Prefix="tables/"):
        for item in page.get("Contents", []):
            target = local / item["Key"]
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(RESULTS_BUCKET, item["Key"], str(target))
    query = "SELECT source_uri, status, failed_step, error FROM images ORDER BY source_uri"
    return list(run_local_query(query, local).to_pylist())
