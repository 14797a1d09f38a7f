"""`annotate bench-bulk`: the bulk worker's throughput against the same images one at a time, side by side.

The worker (shared/bulk.run_job: the next image read ahead, one table write per group) and the Lambda lane's way (each
image through the one-image path on its own, nothing overlapped) run the same images with the same models
(full-size architectures with random weights, captions on), alternating, in this process, each lane on the runtimes
it is deployed with (the bulk task's container sets its own: template.yaml); images per hour on this machine's cores
is what a Fargate task of as many vCPUs would do, less its start and model load.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from shared.contracts import MAX_PHRASES, MAX_PROMPT_CHARS, AnnotationRequest, BulkJob, ImageGroup, ImageTask
from shared.observability import metrics
from shared.pipeline.batches import image_ref
from shared.pipeline.dependencies import build_dependencies
from shared.pipeline.one_image import annotate_image
from shared.settings import Settings
from shared.storage.objects import LocalStore
from tools.aws.sam_template import bulk_task_settings, load_template
from tools.bench.lambda_detect import LONG_PROMPT_WORDS
from tools.bench.models import BenchOptions, bench_settings


def run_bulk_bench(
    images: list[Path], copies: int, repeats: int, out_dir: Path, models: Literal["random", "tiny"] = "random"
) -> dict[str, Any]:
    """Measure and write ``bulk.json`` and ``bulk.md`` under ``out_dir`` (``models``: as annotate bench's)."""
    import functools

    from shared.pipeline.bulk import run_job
    from tools.models.tiny_models import build_named_models

    settings = bench_settings(BenchOptions(images=images, models=models))
    build_named_models(settings, variants=False)
    task = bulk_task_settings(load_template())
    task_settings = settings.model_copy(update=task)
    task_runtimes = {name: value for name, value in task.items() if name.endswith("_runtime")}
    dependencies = functools.partial(build_dependencies, settings=settings)
    task_dependencies = functools.partial(build_dependencies, settings=task_settings)
    work = Path(tempfile.mkdtemp(prefix="bench-bulk-"))
    store, refs = LocalStore(), []
    for copy in range(copies):  # distinct files, so that no image is skipped as done
        for image in images:
            path = work / "in" / f"{copy}-{image.name}"
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(image, path)
            refs.append(image_ref(str(path), store.fingerprint(str(path))))
    request = AnnotationRequest(prompt="dog. cat.")
    groups = [ImageGroup(group_id=f"g-{n:06d}", images=refs[n * 10 : n * 10 + 10]) for n in range(-(-len(refs) // 10))]

    def one_at_a_time(root: Path) -> None:
        for ref in refs:
            annotate_image(
                ImageTask(batch_id="b-" + "1" * 20, request=request, image=ref, results_uri=str(root)), dependencies
            )

    def job(root: Path, request: AnnotationRequest = request) -> BulkJob:
        return BulkJob(
            batch_id="b-" + "2" * 20,
            request=request,
            results_uri=str(root),
            planned_at=datetime.now(UTC),
            groups=groups,
        )

    def worker(root: Path) -> None:
        run_job(job(root), task_dependencies)

    one_at_a_time(work / "warm")  # lazy initialisation is not what is measured; the task's own models too:
    warm_task = ImageTask(batch_id="b-" + "3" * 20, request=request, image=refs[0], results_uri=str(work / "warm"))
    annotate_image(warm_task, task_dependencies)
    seconds: dict[str, list[float]] = {"one_at_a_time": [], "worker": []}
    for repeat in range(repeats):
        for side, run in sorted({"one_at_a_time": one_at_a_time, "worker": worker}.items(), reverse=repeat % 2 == 1):
            root = work / f"{side}-{repeat}"
            started = time.perf_counter()
            run(root)
            seconds[side].append(time.perf_counter() - started)
            metrics.clear_metrics()  # the steps' measurements, which no handler emits here
    longest = AnnotationRequest(prompt=longest_prompt())
    task_peak_mb = _task_peak_mb(task_settings, job(work / "task", longest), work / "task.json")
    from_s3_mb = _task_peak_from_s3_mb(task_settings, job(work / "task-s3", longest), work / "task-s3.json")
    shutil.rmtree(work, ignore_errors=True)
    per_image = {side: statistics.median(values) / len(refs) for side, values in seconds.items()}
    report = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "models": models,
        "images": len(refs),
        "repeats": repeats,
        "seconds_per_image": {side: round(value, 3) for side, value in per_image.items()},
        "images_per_hour": {side: round(3600 / value) for side, value in per_image.items()},
        "worker_over_one_at_a_time": round(per_image["one_at_a_time"] / per_image["worker"], 3),
        "task_peak_rss_mb": round(task_peak_mb),
        "task_peak_rss_models_from_s3_mb": round(from_s3_mb),
        "runtimes": {
            "one_at_a_time": {name: getattr(settings, name) for name in task_runtimes},
            "worker": task_runtimes,
        },
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bulk.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "bulk.md").write_text(markdown_report(report))
    return report


MODELS = {"random": "full-size random weights", "tiny": "tiny models"}


def longest_prompt() -> str:
    """As many phrases as a request may name, as long as its characters allow: the most text Detect, Tag and
    Caption are given."""
    length = MAX_PROMPT_CHARS // MAX_PHRASES - len(". ")
    words = itertools.cycle(LONG_PROMPT_WORDS)
    phrases = [
        f"{' '.join(next(words) for _ in range(3))[: length - len(f' {index}')].strip()} {index}"
        for index in range(MAX_PHRASES)
    ]
    return ". ".join(phrases) + "."


# Where the task's models are pushed for its peak with models read from S3, as the task definition names them
MODELS_BUCKET = "bench-models"
MODEL_KEYS = {
    "DetectorModelUri": ("detector_model", "detector/"),
    "ClassifierModelUri": ("classifier_model", "classifier/"),
    "TaggerModelUri": ("tagger_models", "tagger/"),
    "CaptionModelUri": ("caption_model", "caption.gguf"),
}


def _task_peak_from_s3_mb(settings: Settings, job: BulkJob, job_file: Path) -> float:
    """:func:`_task_peak_mb` with the models read from S3, as the deployed task reads them (the task definition's
    ``s3://`` model locations): pushed to moto's S3, served on 127.0.0.1 for the task's process."""
    from unittest import mock

    import boto3
    from moto.server import ThreadedMotoServer

    from shared.storage import objects as storage
    from tools.models.push import push_models

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    environment = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    targets = {output: f"s3://{MODELS_BUCKET}/{key}" for output, (_, key) in MODEL_KEYS.items()}
    try:
        with mock.patch.dict(os.environ, environment):
            storage.refresh_clients()
            try:
                boto3.client("s3").create_bucket(Bucket=MODELS_BUCKET)
                push_models(settings, targets)
            finally:
                storage.refresh_clients()  # none kept pointing at the server
        in_s3: dict[str, Any] = {name: targets[output] for output, (name, _) in MODEL_KEYS.items()}
        in_s3["tagger_models"] = [in_s3["tagger_models"]]  # a list of models to try
        return _task_peak_mb(settings.model_copy(update=in_s3), job, job_file, environment)
    finally:
        server.stop()


def _task_peak_mb(settings: Settings, job: BulkJob, job_file: Path, environment: dict[str, str] | None = None) -> float:
    """The peak memory (VmHWM) of the worker as its container runs it: a fresh process that loads the models, with
    every size of Detect compiled (as for a job whose images come in every shape), and runs ``job`` (the
    longest prompt); ``environment`` added to the process's."""
    job_file.write_text(job.model_dump_json())
    task = settings.model_copy(update={"detector_load_all_sizes": True, "bulk_job": str(job_file)})
    script = (
        "import sys\n"
        "from shared.settings import Settings, use_settings\n"
        "use_settings(Settings.model_validate_json(sys.argv[1]))\n"
        "from shared.pipeline.bulk import run_task\n"
        "assert run_task(lambda: False) == 0\n"
        "print(int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]) / 1024)\n"
    )
    command = [sys.executable, "-c", script, task.model_dump_json()]
    finished = subprocess.run(command, env=os.environ | (environment or {}), capture_output=True, text=True, check=True)
    return float(finished.stdout.split()[-1])


def markdown_report(report: dict[str, Any]) -> str:
    per_image, per_hour = report["seconds_per_image"], report["images_per_hour"]

    def runtimes(side: str) -> str:  # each lane's, as deployed: the Lambda functions' and the bulk task's
        chosen = report.get("runtimes", {}).get(side, {})
        return ", ".join(f"{name}={value}" for name, value in sorted(chosen.items())) or "the same runtimes"

    return (
        "\n".join(
            [
                f"Measured {report['measured_at']} on {report['cores']} cores: {report['images']} images (captions on, "
                f"{MODELS[report.get('models', 'random')]}), medians of {report['repeats']} alternating runs.",
                "",
                "| | seconds per image | images per hour |",
                "|---|---:|---:|",
                f"| one at a time (the Lambda lane's per-image path; {runtimes('one_at_a_time')}) | "
                f"{per_image['one_at_a_time']:.2f} | "
                f"{per_hour['one_at_a_time']:,} |",
                f"| the bulk worker (read-ahead, a table write per group; {runtimes('worker')}) | "
                f"{per_image['worker']:.2f} | "
                f"{per_hour['worker']:,} |",
                "",
                f"The worker does {report['worker_over_one_at_a_time']:.2f}x the images of one at a time. As its "
                f"container runs it (a fresh process: models loaded, every size of Detect compiled, the job "
                f"annotated) its peak memory is {report['task_peak_rss_mb']:,} MB (VmHWM) with the models on disk, "
                f"{report.get('task_peak_rss_models_from_s3_mb', 0):,} MB with them read from S3 as the deployed "
                "task reads them, which a bulk task's memory (BulkMemory) must hold.",
            ]
        )
        + "\n"
    )
