"""`annotate chaos` (make chaos): generated images through the local workflow, with faults injected where the code
meets AWS, and an account of every image.

The account (printed first): a Lambda concurrency quota, past which invocations are refused as Lambda refuses them;
SnapStart versions that a quiet fortnight made inactive, answering SnapStartNotReadyException while they
re-initialise; the images sent as overlapping batches, which share the quota.

Faults, each at a rate given on the command line (and printed), drawn for every call on its own (a call may meet
any number in a row: what outlasts a child's retries is handed back to the parent, and what outlasts that fails):
- the Lambda service refuses an invocation (the local runner's stand-in for Invoke): TooManyRequestsException,
  SnapStartNotReadyException (the model steps, which have SnapStart when EnableSnapStart=true) and
  ServiceException. The function does not run; the Task fails with ``Lambda.<name>`` (tools.local.step_functions).
- S3 answers a function's request with 503 SlowDown or 500 InternalError, as it does under load. botocore retries
  them; what it gives up on, the code raises as TransientError and the workflow retries.
- one step hangs past its TimeoutSeconds, once: Lambda would end it at the function's timeout, the workflow catches
  the Task's States.Timeout, and only that image is recorded as failed.
- one Fargate task (Variants, for a second, small batch with variants) stops before its container ends, as a host
  or capacity failure stops it: the workflow runs it again.

Everything runs in moto (S3 holds the images and the results, as in AWS mode); the last line printed is
``N images, N rows, 0 lost, F faults injected, R retried, X recorded as failed``. The run fails when an image has
no row or more than one, or when one other than the hung image is recorded as failed.
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tools.local.step_functions import FargateRefused, FunctionTimedOut, LambdaServiceError
from tools.local.workflow import step_timeouts

INPUT_BUCKET, RESULTS_BUCKET = "chaos-input", "chaos-results"
LEDGER_TABLE = "chaos-quotas"  # the account's quotas the batches share (shared/pipeline/capacity.py)
BUCKETS = (INPUT_BUCKET, RESULTS_BUCKET)
MODEL_STEPS = frozenset({"detect", "classify", "tag", "caption"})
# Hand-backs as the template deploys them (HandBacks), but the parent's first wait (HandBackWaitSeconds, 60 on AWS)
# shortened so that a run takes minutes
HAND_BACKS, HAND_BACK_WAIT_S = 5, 5
# What a function reads and writes; ingest's own requests (listing, the manifests) are not faulted.
FAULTED_PREFIXES = ("images/", "results/", "tables/", "batches/")


# What a stack on an account whose functions may have at most 3,008 MB is deployed with (docs/deploy.md, "Detect and a
# new account's memory quota"): Detect on ONNX Runtime, whose sizes share their weights, measured to fit.
SMALL_MEMORY_PARAMETERS = {"DetectorRuntime": "onnxruntime", "DetectMemorySize": "3008"}


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
    snapstart_reinit_s: float = 0.0  # each model function re-initialises for this long from its first invocation
    batches: int = 1  # the images are sent as this many messages at once, whose batches overlap
    bulk_images: int = 0  # images of a bulk-lane message sent with them, its jobs run as Fargate (Spot) tasks
    fargate_vcpus: int | None = None  # the account's Fargate vCPUs: a task past them is not started (None: no quota)
    spot_shortage_s: float = 0.0  # Fargate Spot has no capacity for this long from the first Spot task
    function_memory_mb: int | None = None  # the account's largest function memory (None: Lambda's 10,240 MB)
    shared_budget: bool = True  # the batches take their shares from one ledger (False: each plans within the whole)

    def account(self) -> str:
        quota = f"{self.lambda_concurrency:,}" if self.lambda_concurrency else "no quota"
        line = f"account: Lambda concurrency {quota}"
        if self.snapstart_reinit_s:
            line += f", SnapStart versions inactive (re-initialising for {self.snapstart_reinit_s:g} s)"
        if self.fargate_vcpus:
            line += f", Fargate {self.fargate_vcpus} vCPUs"
        if self.spot_shortage_s:
            line += f", no Fargate Spot capacity for {self.spot_shortage_s:g} s"
        if self.function_memory_mb:
            deployed = " ".join(f"{name}={value}" for name, value in SMALL_MEMORY_PARAMETERS.items())
            line += f", functions at most {self.function_memory_mb:,} MB (deployed with {deployed})"
        if self.batches > 1 or self.bulk_images:
            bulk = f" and a bulk one of {self.bulk_images} images" if self.bulk_images else ""
            line += f", {self.batches} batches at once{bulk}"
            line += ", sharing its quotas" if self.shared_budget else ", each planning within the whole quotas"
        return line + f"; a hand-back waits {HAND_BACK_WAIT_S} s"

    def functions_over_memory(self) -> list[str]:
        """The functions the stack deploys on this account (with :data:`SMALL_MEMORY_PARAMETERS` where its memory
        quota needs them) that ask more memory than it allows: CreateFunction would refuse them."""
        from tools.aws.sam_template import deployed_memory_mb, load_template

        if not self.function_memory_mb:
            return []
        memory = deployed_memory_mb(load_template(), SMALL_MEMORY_PARAMETERS)
        return [f"{name} {mb:,} MB" for name, mb in sorted(memory.items()) if mb > self.function_memory_mb]

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
    _faulted: set[str] = field(default_factory=set)  # calls whose last try met a fault
    _first_invoked: dict[str, float] = field(default_factory=dict)  # model function -> when it was first invoked
    fargate_vcpus_in_use: dict[str, float] = field(default_factory=dict)  # by capacity provider
    most_fargate_vcpus: float = 0.0
    _hung: bool = False
    _task_stopped: bool = False
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def __post_init__(self) -> None:
        self._random = random.Random(self.faults.seed)

    def _draw(self, key: str, choices: list[tuple[str, float]]) -> str | None:
        """The fault to inject into the call ``key`` (None: none), drawn anew for each try; a call again after a
        fault counts as a retry."""
        with self._lock:
            if key in self._faulted:
                self._faulted.discard(key)
                self.retried += 1
            roll, threshold = self._random.random(), 0.0
            for name, rate in choices:
                threshold += rate
                if roll < threshold:
                    self.injected[name] += 1
                    self._faulted.add(key)
                    return name
            return None

    def _reinitialising(self, function: str) -> bool:
        """Whether the model function's SnapStart version is still re-initialising, from its first invocation on: a
        version "becomes Inactive when it hasn't been invoked for 14 days", and invoking it answers
        SnapStartNotReadyException, "Wait until the function version reaches the Active state, and then invoke it
        again" (Lambda developer guide, "Troubleshooting SnapStart errors")."""
        if function not in MODEL_STEPS or not self.faults.snapstart_reinit_s:
            return False
        with self._lock:
            since = time.monotonic() - self._first_invoked.setdefault(function, time.monotonic())
        return since < self.faults.snapstart_reinit_s

    def gate(self, function: str, payload: dict[str, Any]) -> None:
        """Before the Lambda service runs ``function`` (or Fargate the Variants container): refuse it, let its one
        hang begin, or stop the one task."""
        if function.startswith("fargate:"):
            self._fargate(function, payload)
            return
        if function == "bulk":  # a bulk task between two images: Spot's interruption is tests/e2e/test_bulk_worker.py's
            return
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
        reinitialising = self._reinitialising(function)
        choices = [("Lambda SnapStartNotReadyException (re-initialising)", 1.0)] if reinitialising else []
        choices.append(("Lambda TooManyRequestsException", self.faults.throttle))
        if function in MODEL_STEPS:
            choices.append(("Lambda SnapStartNotReadyException", self.faults.snapstart_not_ready))
        choices.append(("Lambda ServiceException", self.faults.service_error))
        fault = self._draw(key, choices)
        if fault:
            raise LambdaServiceError(fault.removeprefix("Lambda ").split()[0], "injected by annotate chaos")

    def _fargate(self, event: str, task: dict[str, Any]) -> None:
        """A Fargate task (a bulk job's or a Variants one) starting or stopped: ECS refuses one past the account's
        vCPUs ("You've reached the limit on the number of vCPUs you can run concurrently", ECS's service quotas:
        Spot's and on-demand's are quotas apart), and a Spot one while Spot has no capacity; a started task holds
        its vCPUs until it stops."""
        provider = task["capacity_provider"]
        with self._lock:
            if event == "fargate:stop":
                self.fargate_vcpus_in_use[provider] -= task["vcpus"]
                return
            refusal = ""
            if provider == "FARGATE_SPOT" and self.faults.spot_shortage_s:
                since = time.monotonic() - self._first_invoked.setdefault("fargate spot", time.monotonic())
                refusal = "Capacity is unavailable at this time" if since < self.faults.spot_shortage_s else ""
            quota, in_use = self.faults.fargate_vcpus, self.fargate_vcpus_in_use.get(provider, 0.0)
            if not refusal and quota and in_use + task["vcpus"] > quota:
                refusal = "You've reached the limit on the number of vCPUs you can run concurrently"
            fault = self._draw(f"fargate:{provider}", [(f"Fargate: {refusal}", 1.0)] if refusal else [])
            if fault:
                raise FargateRefused(f"{refusal} (annotate chaos)")
            self.fargate_vcpus_in_use[provider] = in_use + task["vcpus"]
            self.most_fargate_vcpus = max(self.most_fargate_vcpus, in_use + task["vcpus"])

    def _stop_once(self, key: str) -> None:
        with self._lock:
            stopped = self._draw(key, [("Fargate task stopped", 0.0 if self._task_stopped else 1.0)])
            self._task_stopped |= stopped is not None
        if stopped:
            raise RuntimeError("Task stopped: host capacity was reclaimed (injected by annotate chaos)")

    def s3_answer(self, request: Any, **_: Any) -> Any:
        """Before an S3 request is sent: an error answer from S3, or None to send it."""
        from botocore.awsrequest import AWSResponse

        from tools.aws.moto_internals import MockRawResponse

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
    hung_source: str = ""  # the image whose step hung: the one failure expected
    most_in_flight: int = 0  # Lambda invocations at once, at the most
    run_s: float = 0.0  # from the first message to the last row
    busy_s: float = 0.0  # the functions' time, summed over every invocation
    lambda_concurrency: int | None = None
    handed_back: int = 0  # groups the workflow ran again in a later round
    most_fargate_vcpus: float = 0.0  # Fargate vCPUs of one capacity provider's tasks at once, at the most

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

    from shared.contracts import PromptMessage
    from shared.pipeline.ingest import capacity_ledger, refresh_clients, start_batches
    from shared.settings import Profile, use_settings
    from shared.storage import objects as storage
    from tools.local.runner import REGION, HandlerDispatcher, LocalStarter, create_idempotency_table, local_workflow
    from tools.models.tiny_models import build_named_models

    with tempfile.TemporaryDirectory(prefix="annotate-chaos-") as folder:
        settings = use_settings(
            profile=Profile.TINY,
            data_dir=Path(folder),
            results_uri=f"s3://{RESULTS_BUCKET}",
            hand_backs=HAND_BACKS,
            hand_back_wait_s=HAND_BACK_WAIT_S,
            idempotency_table=LEDGER_TABLE if faults.shared_budget else "",  # where SummarizeBatch gives shares back
        )
        account: dict[str, Any] = {"lambda_concurrency": faults.lambda_concurrency} if faults.lambda_concurrency else {}
        if faults.fargate_vcpus:
            account["fargate_vcpus"] = faults.fargate_vcpus
        if faults.function_memory_mb:  # Detect on the runtime such an account deploys
            account["detector_runtime"] = SMALL_MEMORY_PARAMETERS["DetectorRuntime"]
        # ingest plans the batches within the account's quotas; the bulk message's images run two to a group, so
        # that its jobs are several tasks
        settings = use_settings(settings.model_copy(update=account | {"bulk_images_per_group": 2}))
        build_named_models(settings, variants=faults.variants_images > 0)
        # the images of batch n under images/<n>/ (the messages name a prefix each)
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
        hung = sorted(images)[faults.hang_image] if faults.hang_step and faults.hang_image < count else ""
        hung_source = f"s3://{INPUT_BUCKET}/{hung}" if hung else ""
        injector = Injector(faults, hang_source=hung_source)
        lambda_service = HandlerDispatcher(gate=injector.gate, timeouts=True, concurrency=faults.lambda_concurrency)
        with local_workflow(aws_limits=True, dispatcher=lambda_service) as run_batch:
            s3 = boto3.client("s3", region_name=REGION)
            for bucket in (INPUT_BUCKET, RESULTS_BUCKET):
                s3.create_bucket(Bucket=bucket)
            for key, body in (images | with_variants | bulk).items():
                s3.put_object(Bucket=INPUT_BUCKET, Key=key, Body=body)
            ledger = None
            if faults.shared_budget:
                create_idempotency_table(LEDGER_TABLE)
                refresh_clients()  # the ledger's DynamoDB client, moto's
                ledger = capacity_ledger(settings.ingest)
            session = boto3.DEFAULT_SESSION
            assert session is not None
            storage.refresh_clients()  # the functions' S3 client is made anew, from the session that injects
            session.events.register_first("before-send.s3", injector.s3_answer, unique_id="annotate-chaos")
            started = time.monotonic()
            try:
                starter = LocalStarter(run_batch, Path(folder), "annotate-chaos")
                messages = [
                    PromptMessage(prompt=prompt, images=[f"s3://{INPUT_BUCKET}/images/{n}/"], caption=caption)
                    for n in range(min(faults.batches, count))
                ]
                if bulk:
                    messages.append(
                        PromptMessage(prompt=prompt, images=[f"s3://{INPUT_BUCKET}/bulk/"], caption=False, lane="bulk")
                    )
                if with_variants:
                    variants = {"prompt": "a watercolor", "steps": 1, "size": 128}
                    messages.append(
                        PromptMessage(prompt=prompt, images=[f"s3://{INPUT_BUCKET}/variants/"], variants=variants)
                    )
                with ThreadPoolExecutor(len(messages)) as senders:  # overlapping batches share the account's quota
                    sent = [
                        senders.submit(
                            start_batches,
                            message,
                            f"annotate-chaos-{n}",
                            settings.ingest,
                            starter,
                            storage.store_for,
                            ledger=ledger,
                        )
                        for n, message in enumerate(messages)
                    ]
                    for done in sent:
                        done.result()
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
        # as a failed row)
        injected=dict(injector.injected) | ({"Lambda concurrency quota": throttled} if throttled else {}),
        retried=injector.retried + throttled,
        failed=[row for row in rows if row["status"] == "failed"],
        hung_source=hung_source,
        most_in_flight=lambda_service.most_in_flight,
        run_s=run_s,
        busy_s=lambda_service.busy_s,
        lambda_concurrency=faults.lambda_concurrency,
        handed_back=handed_back,
        most_fargate_vcpus=injector.most_fargate_vcpus,
    )


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
