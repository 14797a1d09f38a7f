"""The faults `annotate chaos` injects where the code meets AWS, and the account it plays (tools/local/chaos.py runs
them): what each fault is, at which rate, and the one place that draws them."""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from shared.pipeline.dependencies import ANNOTATION_MODEL_STEPS
from tools.local.batch_jobs import SPOT, NoCapacity, TaskStopped
from tools.local.step_functions import FunctionTimedOut, LambdaServiceError
from tools.local.workflow import step_timeouts

INPUT_BUCKET, RESULTS_BUCKET = "chaos-input", "chaos-results"
BUCKETS = (INPUT_BUCKET, RESULTS_BUCKET)
MODEL_STEPS = frozenset(step.value for step in ANNOTATION_MODEL_STEPS)
# Hand-backs as the template deploys them (HandBacks), but the parent's first wait (HandBackWaitSeconds, 60 on AWS)
# shortened so that a run takes minutes; the queues' visibility timeout (1,800 s on AWS), within which Lambda's poller
# retries a throttled Ingest before the message counts another receive, shortened in the same ratio
HAND_BACKS, HAND_BACK_WAIT_S = 5, 5
TIME_SCALE = HAND_BACK_WAIT_S / 60
VISIBILITY_S = 1800 * TIME_SCALE
# Lambda keeps this much of an account's concurrency unreserved: "You can reserve up to the Unreserved account
# concurrency value that is shown, minus 100" (Lambda developer guide, Configuring reserved concurrency)
UNRESERVED_KEPT = 100
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
    message_interval_s: float = 0.0  # the messages arrive this far apart, the later ones while the first batches run
    snapstart_reinit_s: float = 0.0  # each model function re-initialises for this long from its first invocation
    batches: int = 1  # the images are sent as this many messages at once, whose batches overlap
    bulk_images: int = 0  # images of a bulk-lane message sent with them, its jobs run as Fargate (Spot) tasks
    fargate_vcpus: int | None = None  # the Spot compute environment's vCPUs (None: the template's FargateVcpus)
    spot_shortage_s: float = 0.0  # Fargate Spot has no capacity for this long from the first Spot task
    function_memory_mb: int | None = None  # the account's largest function memory (None: Lambda's 10,240 MB)

    def reservations(self) -> dict[str, int]:
        """The functions' reserved concurrency as the template deploys it, where the quota leaves 100 unreserved
        besides (none on a new account's quota of 10, nor without a quota)."""
        from tools.aws.sam_template import load_template

        parameters = load_template()["Parameters"]
        reserved = {
            name: int(parameters[parameter]["Default"])
            for name, parameter in (
                ("ingest", "IngestReservedConcurrency"),
                ("gather", "GatherReservedConcurrency"),
                ("api", "ApiReservedConcurrency"),
            )
        }
        fits = (
            self.lambda_concurrency is not None and self.lambda_concurrency - sum(reserved.values()) >= UNRESERVED_KEPT
        )
        return reserved if fits else {}

    def account(self) -> str:
        quota = f"{self.lambda_concurrency:,}" if self.lambda_concurrency else "no quota"
        line = f"account: Lambda concurrency {quota}"
        if reserved := self.reservations():
            line += " (reserved: " + ", ".join(f"{name} {n}" for name, n in reserved.items()) + ")"
        elif self.lambda_concurrency:
            line += " (too small to reserve any: Ingest competes with the batches)"
        if self.snapstart_reinit_s:
            line += f", SnapStart versions inactive (re-initialising for {self.snapstart_reinit_s:g} s)"
        if self.fargate_vcpus:
            line += f", Fargate Spot {self.fargate_vcpus} vCPUs"
        if self.spot_shortage_s:
            line += f", no Fargate Spot capacity for {self.spot_shortage_s:g} s"
        if self.function_memory_mb:
            deployed = " ".join(f"{name}={value}" for name, value in SMALL_MEMORY_PARAMETERS.items())
            line += f", functions at most {self.function_memory_mb:,} MB (deployed with {deployed})"
        if self.batches > 1 or self.bulk_images:
            bulk = f" and a bulk one of {self.bulk_images} images" if self.bulk_images else ""
            apart = f" {self.message_interval_s:g} s apart" if self.message_interval_s else " at once"
            line += f", {self.batches} batches{apart}{bulk}, sharing its quotas"
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
        """Before the Lambda service runs ``function`` (or Batch places a job, or a Variants container starts): refuse
        it, let its one hang begin, or stop the one task."""
        if function == "batch:place":
            self._place(payload)
            return
        if function == "batch:ended":
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

    def _place(self, placing: dict[str, Any]) -> None:
        """Batch placing a job in a compute environment: Fargate Spot without capacity for ``spot_shortage_s`` from
        the first Spot placement, when the queue tries the next environment (on-demand)."""
        if placing["environment"] != SPOT or not self.faults.spot_shortage_s:
            return
        with self._lock:
            since = time.monotonic() - self._first_invoked.setdefault("fargate spot", time.monotonic())
        fault = self._draw(
            "batch:spot", [("Fargate Spot: no capacity", 1.0 if since < self.faults.spot_shortage_s else 0)]
        )
        if fault:
            raise NoCapacity("Fargate Spot has no capacity (annotate chaos)")

    def _stop_once(self, key: str) -> None:
        with self._lock:
            stopped = self._draw(key, [("Fargate Spot task reclaimed", 0.0 if self._task_stopped else 1.0)])
            self._task_stopped |= stopped is not None
        if stopped:  # as ECS says it of a reclaimed Spot task (ECS Developer Guide, task state change events)
            raise TaskStopped("Your Spot Task was interrupted.", reason="injected by annotate chaos")

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
