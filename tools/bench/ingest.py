"""How long ingest takes to plan a large prefix, and in how much memory: on moto's S3, side by side with what
planning used to cost (a HEAD per object). Written to ``bench/ingest.json`` and ``bench/ingest.md``."""

from __future__ import annotations

import json
import statistics
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shared.contracts import BatchInput, PromptMessage
from shared.settings import Settings
from tools.aws.sam_template import load_template

BUCKET = "bench-ingest-input"
REGION = "us-east-1"


class _NoWorkflow:
    """Starts nothing: the bench measures planning and writing the manifests, not the executions."""

    def __init__(self) -> None:
        self.started: list[BatchInput] = []

    def start(self, batch: BatchInput, name: str) -> str:
        self.started.append(batch)
        return name

    def exists(self, name: str) -> bool:
        return False


def run_ingest_bench(objects: int, out_dir: Path, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    import boto3
    from moto import mock_aws

    from shared.pipeline.ingest import start_batches
    from shared.storage.objects import S3Store
    from tools.aws.moto_internals import s3_backends

    with mock_aws():
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        s3.create_bucket(Bucket=f"{BUCKET}-results")
        progress(f"putting {objects:,} objects into moto's S3")
        backend = s3_backends["123456789012"]["aws"]
        for index in range(objects):  # through the backend: the client's 2 ms per put would dominate the setup
            backend.put_object(BUCKET, f"incoming/{index:07d}.jpg", f"image {index}".encode())
        requests: Counter[str] = Counter()
        s3.meta.events.register("before-call.s3.*", lambda model, **_: requests.update([model.name]))
        store = S3Store(s3)
        settings = Settings(results_uri=f"s3://{BUCKET}-results").ingest
        message = PromptMessage(prompt="dog. cat.", images=[f"s3://{BUCKET}/incoming/"])

        progress("planning as ingest does (the listing's ETags)")
        started = time.perf_counter()
        starter = _NoWorkflow()
        start_batches(message, "bench", settings, starter, lambda uri: store)
        planned_s = time.perf_counter() - started
        planned_requests = dict(requests)
        progress("planning again, tracing memory (slower: tracemalloc)")
        tracemalloc.start()
        start_batches(message, "bench", settings, _NoWorkflow(), lambda uri: store)
        peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()

        progress("the way it was: a HEAD per listed object")
        requests.clear()
        started = time.perf_counter()
        for uri in store.list_uris(f"s3://{BUCKET}/incoming/"):
            store.fingerprint(uri)
        head_s = time.perf_counter() - started
        head_requests = dict(requests)
        head_latency = _head_latency(store, objects)
    report = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "objects": objects,
        "executions_started": len(starter.started),
        "groups": sum(batch.groups for batch in starter.started),
        "execution_input_bytes": max(len(batch.model_dump_json()) for batch in starter.started),
        "planning": {"seconds": round(planned_s, 2), "requests": planned_requests, "peak_python_mb": round(peak_mb, 1)},
        "head_per_object": {"seconds": round(head_s, 2), "requests": head_requests},
        "moto_head_median_ms": head_latency,
        "ingest_timeout_s": load_template()["Resources"]["IngestFunction"]["Properties"]["Timeout"],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "ingest.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "ingest.md").write_text(markdown_report(report))
    return report


def _head_latency(store: Any, objects: int) -> float:
    """moto answers a HEAD in about a millisecond; S3 takes tens (the reason the old way timed out in AWS)."""
    times = []
    for index in range(min(objects, 200)):
        started = time.perf_counter()
        store.fingerprint(f"s3://{BUCKET}/incoming/{index:07d}.jpg")
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1000, 2)


def markdown_report(report: dict[str, Any]) -> str:
    planning, heads = report["planning"], report["head_per_object"]
    return (
        f"Measured {report['measured_at']} on moto's S3: ingest planning a prefix of {report['objects']:,} objects "
        f"into {report['executions_started']} execution of {report['groups']:,} groups (its input, "
        f"{report['execution_input_bytes']:,} bytes, and its groups manifest written; nothing started).\n\n"
        "| way | seconds | requests | peak Python MB |\n|---|---:|---|---:|\n"
        f"| listing's ETags (now) | {planning['seconds']} | {planning['requests']} | {planning['peak_python_mb']} |\n"
        f"| a HEAD per object (before) | {heads['seconds']} | {heads['requests']} | |\n\n"
        f"A HEAD took {report['moto_head_median_ms']} ms (median) on moto; on S3 it takes tens of milliseconds, so the "
        f"old way's {report['objects']:,} HEADs would take minutes against the ingest function's "
        f"{report['ingest_timeout_s']} s timeout.\n"
    )
