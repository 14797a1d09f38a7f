"""`annotate bench-api`: the synchronous API against the same work in-process, side by side in one run.

A fresh `annotate serve` (its own process, the models' files already built and cached on this machine) answers
one 800 px image; this process runs the same image through the same code in-process, and through Grounding DINO's
model card recipe (detection alone). Runs alternate and medians are reported, since the machine is noisy:
- the first answer, timed from the server's process start (what a new environment without a snapshot pays);
- warm answers over HTTP (detect, classify, tag; and with the caption) against the same in-process;
- chat's time to the first token through HTTP, streamed;
- the server's peak memory (VmHWM), which sizes the API function's memory and its snapshot's bill.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

from shared.pipeline.dependencies import build_dependencies
from shared.serving.calls import AnnotationOptions, Source, annotate_one, image_source
from shared.settings import Settings
from tools.bench.models import BenchOptions, bench_settings, model_card_detect

CHAT = {"messages": [{"role": "user", "content": "Name three cat breeds."}], "max_tokens": 16, "stream": True}


def _environment(settings: Settings) -> dict[str, str]:
    """``settings`` as the server's environment (ANNOTATE_*), as a deployment would set them."""
    values = settings.model_dump(mode="json", exclude={"api_key", "profile", "data_dir"})
    return {f"ANNOTATE_{k.upper()}": v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}


def _peak_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], 3)


def _chat_ttft(client: httpx.Client) -> float:
    """Seconds to the first event carrying text; the stream is read to its end, so the next call finds the model
    free."""
    started, first = time.perf_counter(), None
    with client.stream("POST", "/v1/chat/completions", json=CHAT) as response:
        for line in response.iter_lines():
            if first is None and line.startswith("data: ") and '"content"' in line:
                first = time.perf_counter() - started
    if first is None:
        raise RuntimeError("the chat stream carried no text")
    return first


RUNTIMES = ("openvino", "onnxruntime")  # annotate serve's default on x86; the API function's (its 250 MB)


def _serve(settings: Settings, port: int) -> tuple[subprocess.Popen[bytes], float]:
    """A fresh `annotate serve` on ``settings``; returns it and the moment it was started."""
    command = [
        str(Path(sys.executable).parent / "annotate"),
        "serve",
        "--port",
        str(port),
        "--profile",
        "tiny",
        "--data-dir",
        tempfile.mkdtemp(prefix="bench-api-"),  # nothing is recorded: a place for the server, not the report
    ]
    started = time.perf_counter()
    return subprocess.Popen(command, env=os.environ | _environment(settings), stdout=subprocess.DEVNULL), started


def _wait_for(client: httpx.Client, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 300
    while True:
        try:
            if client.get("/health").status_code == 200:
                return
        except httpx.TransportError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("annotate serve did not start") from None
            time.sleep(0.05)


def _measure(settings: Settings, image: Path, repeats: int, card: tuple[Any, Any], port: int) -> dict[str, Any]:
    """One runtime: the server's first answer from its start, then alternating warm runs of each side."""
    picture = Image.open(image).convert("RGB")
    data = image.read_bytes()
    body = {"prompt": "dog. cat.", "caption": False, "image": base64.b64encode(data).decode()}
    models = functools.partial(build_dependencies, settings=settings)
    source: Source = image_source(data, settings)
    options = AnnotationOptions(prompt="dog. cat.", caption=False)
    with_caption = options.model_copy(update={"caption": True})
    timings: dict[str, list[float]] = {
        name: []
        for name in (
            "http",
            "in_process",
            "steps_in_process",
            "http_with_caption",
            "in_process_with_caption",
            "model_card_detect",
            "chat_ttft_http",
        )
    }
    server, started = _serve(settings, port)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as client:
            _wait_for(client, server)
            client.post("/v1/annotations", json=body).raise_for_status()
            first_answer_s = time.perf_counter() - started
            # warm both sides (lazy initialisation is not what is measured)
            annotate_one(source, with_caption, settings, models, lambda _: None)
            client.post("/v1/annotations", json=body | {"caption": True}).raise_for_status()
            model_card_detect(*card, picture)
            for _ in range(repeats):
                t = time.perf_counter()
                client.post("/v1/annotations", json=body).raise_for_status()
                timings["http"].append(time.perf_counter() - t)
                t = time.perf_counter()
                result = annotate_one(source, options, settings, models, lambda _: None)
                timings["in_process"].append(time.perf_counter() - t)
                steps_ms = (result.detect_ms or 0) + (result.classify_ms or 0) + (result.tag_ms or 0)
                timings["steps_in_process"].append(steps_ms / 1000)
                t = time.perf_counter()
                client.post("/v1/annotations", json=body | {"caption": True}).raise_for_status()
                timings["http_with_caption"].append(time.perf_counter() - t)
                t = time.perf_counter()
                annotate_one(source, with_caption, settings, models, lambda _: None)
                timings["in_process_with_caption"].append(time.perf_counter() - t)
                t = time.perf_counter()
                model_card_detect(*card, picture)
                timings["model_card_detect"].append(time.perf_counter() - t)
                timings["chat_ttft_http"].append(_chat_ttft(client))
            server_peak_mb = _peak_mb(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=60)
    medians = {name: _median(values) for name, values in timings.items()}
    warm = medians["http"]
    return {
        "medians_s": medians,
        "p95_s": {"http": _p95(timings["http"]), "http_with_caption": _p95(timings["http_with_caption"])},
        "first_answer_from_process_start_s": round(first_answer_s, 3),
        "ratios": {
            "http_over_in_process": round(warm / medians["in_process"], 3),
            "http_over_steps_in_process": round(warm / medians["steps_in_process"], 3),
            "first_answer_less_warm_s": round(first_answer_s - warm, 3),
            "model_card_detect_over_http_answer": round(medians["model_card_detect"] / warm, 3),
        },
        "server_peak_rss_mb": round(server_peak_mb, 1),
    }


def run_api_bench(image: Path, repeats: int, out_dir: Path, port: int = 8097) -> dict[str, Any]:
    """Measure each runtime and write ``api.json`` and ``api.md`` under ``out_dir``."""
    from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

    from shared.models.sources import resolve_model_dir
    from tools.models.tiny_models import build_named_models

    # As `annotate serve` runs: each size loaded when an image needs it (from the compiled cache)
    settings = bench_settings(BenchOptions(images=[image], models="random")).model_copy(
        update={"detector_load_all_sizes": False}
    )
    build_named_models(settings, variants=False)
    detector_dir = resolve_model_dir(settings.detector_model, settings.model_files)
    card = (
        AutoProcessor.from_pretrained(detector_dir),
        AutoModelForZeroShotObjectDetection.from_pretrained(detector_dir),
    )
    report = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "image": f"{image.name} at {settings.detection_short_side} px",
        "detector": settings.detector_model,
        "repeats": repeats,
        "runtimes": {
            runtime: _measure(settings.model_copy(update={"detector_runtime": runtime}), image, repeats, card, port)
            for runtime in RUNTIMES
        },
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "api.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "api.md").write_text(markdown_report(report))
    return report


def _rows(measured: dict[str, Any]) -> list[tuple[str, str]]:
    medians, ratios, p95 = measured["medians_s"], measured["ratios"], measured["p95_s"]
    return [
        ("warm answer over HTTP: detect, classify, tag", f"{medians['http']:.2f} s (p95 {p95['http']:.2f})"),
        ("the same in-process", f"{medians['in_process']:.2f} s: HTTP {ratios['http_over_in_process']:.2f}x"),
        (
            "the steps' own time in-process",
            f"{medians['steps_in_process']:.2f} s: HTTP {ratios['http_over_steps_in_process']:.2f}x",
        ),
        (
            "warm answer over HTTP with the caption",
            f"{medians['http_with_caption']:.2f} s (p95 {p95['http_with_caption']:.2f})",
        ),
        ("the same in-process", f"{medians['in_process_with_caption']:.2f} s"),
        (
            "model card's recipe (torch), detection alone",
            f"{medians['model_card_detect']:.2f} s: {ratios['model_card_detect_over_http_answer']:.2f}x an answer",
        ),
        ("chat's first token over HTTP, streamed", f"{medians['chat_ttft_http']:.3f} s"),
        (
            "first answer from the server's process start",
            f"{measured['first_answer_from_process_start_s']:.2f} s: {ratios['first_answer_less_warm_s']:+.2f} s",
        ),
        ("the server's peak memory (VmHWM)", f"{measured['server_peak_rss_mb']:.0f} MB"),
    ]


def markdown_report(report: dict[str, Any]) -> str:
    runtimes = list(report["runtimes"])
    columns = [_rows(report["runtimes"][runtime]) for runtime in runtimes]
    lines = [
        f"Measured {report['measured_at']} on {report['cores']} cores: {report['image']}, {report['detector']} "
        f"(Detect on each runtime); medians of {report['repeats']} alternating runs.",
        "",
        "| | " + " | ".join(f"Detect on {runtime}" for runtime in runtimes) + " |",
        "|---|" + "---|" * len(runtimes),
        *(
            f"| {what} | " + " | ".join(column[index][1] for column in columns) + " |"
            for index, (what, _) in enumerate(columns[0])
        ),
    ]
    return "\n".join(lines) + "\n"
