"""`annotate bench-lambda-detect`: Detect as Lambda runs it without SnapStart, on each runtime.

A fresh process as a new Lambda environment of the batch lane: the export read into memory files (as from its
s3:// prefix, since /tmp holds 512 MB), the first image's size compiled when the image comes
(``detector_load_all_sizes`` off, no compiled cache), then the image detected with the longest prompt Grounding DINO
takes (up to 256 tokens), at 800 px on the largest export (800x1333). It reports the seconds to the first answer,
a warm answer's seconds, and the process's peak memory (VmHWM), which the function's memory must hold: the
template's DetectMemorySize against the new accounts' 3,008 MB quota. The S3 read itself is not timed here.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shared.settings import Profile, Settings

RUNTIMES = ("openvino", "onnxruntime")
LONG_PROMPT_WORDS = ["red", "sports", "car", "small", "brown", "dog", "striped", "cat", "wooden", "chair"]
NEW_ACCOUNT_MEMORY_MB = 3008

SCRIPT = """
import sys, time
started = time.perf_counter()
from pathlib import Path
from PIL import Image
from shared.models.grounding_onnx import load_onnx_detector
from shared.models.sources import in_memory_files
from shared.settings import Settings
settings = Settings.model_validate_json(sys.argv[1]).detection
export, links = Path(sys.argv[2]), Path(sys.argv[3])
files = {p.relative_to(export).as_posix(): p.read_bytes for p in sorted(export.rglob("*")) if p.is_file()}
detector = load_onnx_detector(in_memory_files(links, files), settings)
image = Image.open(sys.argv[4]).convert("RGB")
phrases = sys.argv[5].split("|")
boxes = detector.detect(image, phrases, 0.35, 0.25)
first = time.perf_counter() - started
again = time.perf_counter()
detector.detect(image, phrases, 0.35, 0.25)
warm = time.perf_counter() - again
peak = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024
print(first, warm, peak)
"""


def long_prompt(detector: Any, limit: int = 250) -> list[str]:
    """Phrases of three words whose tokens come to at most ``limit`` (Grounding DINO takes 256)."""
    phrases: list[str] = []
    index = 0
    while True:
        words = [LONG_PROMPT_WORDS[(index + k) % len(LONG_PROMPT_WORDS)] for k in range(3)]
        candidate = [*phrases, f"{' '.join(words)} {index}"]
        if detector.token_count(" . ".join(candidate) + " .") > limit:
            return phrases
        phrases, index = candidate, index + 1


def measure(image: Path, runs: int = 3) -> dict[str, Any]:
    """Each runtime's median first answer and warm answer, and the highest peak, over ``runs`` fresh processes."""
    import tempfile

    from shared.models.grounding_onnx import export_dir, load_detector
    from tools.bench.models import FULL_SIZE_RANDOM
    from tools.models.tiny_models import build_named_models

    base = Settings(
        profile=Profile.TINY,  # as annotate bench: the full-size models, with random weights, built here
        detection_short_side=800,
        detector_load_all_sizes=False,
        detector_compiled_cache=False,
        **FULL_SIZE_RANDOM,
    )
    build_named_models(base)
    detector: Any = load_detector(base.detection)  # the exported detector (its tokenizer counts the prompt)
    phrases = long_prompt(detector)
    report: dict[str, Any] = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "image": image.name,
        "prompt_tokens": detector.token_count(" . ".join(phrases) + " ."),
        "runtimes": {},
    }
    for runtime in RUNTIMES:
        settings = base.model_copy(update={"detector_runtime": runtime})
        results = []
        for _ in range(runs):
            with tempfile.TemporaryDirectory(prefix="annotate-lambda-detect-") as links:
                command = [
                    sys.executable,
                    "-c",
                    SCRIPT,
                    settings.model_dump_json(),
                    str(export_dir(settings.detection)),
                    links,
                    str(image),
                    "|".join(phrases),
                ]
                output = subprocess.run(command, capture_output=True, text=True, check=True).stdout.split()
                results.append((float(output[0]), float(output[1]), float(output[2])))
        report["runtimes"][runtime] = {
            "first_answer_s": round(statistics.median(r[0] for r in results), 2),
            "warm_answer_s": round(statistics.median(r[1] for r in results), 2),
            "peak_rss_mb": round(max(r[2] for r in results)),
            "fits_new_account_quota": max(r[2] for r in results) < NEW_ACCOUNT_MEMORY_MB,
        }
    return report


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"Measured {report['measured_at']} on 2 cores: Detect in a fresh process as a Lambda environment without "
        f"SnapStart (export in memory files, the first image's size compiled on demand, no compiled cache), "
        f"{report['image']} at 800 px (800x1333), a {report['prompt_tokens']}-token prompt; medians of 3 processes, "
        "the highest peak.",
        "",
        "| runtime | first answer s | warm answer s | peak RSS MB | under 3,008 MB |",
        "|---|---:|---:|---:|---|",
    ]
    for runtime, row in report["runtimes"].items():
        fits = "yes" if row["fits_new_account_quota"] else "no"
        lines.append(
            f"| {runtime} | {row['first_answer_s']:.2f} | {row['warm_answer_s']:.2f} | {row['peak_rss_mb']} | {fits} |"
        )
    return "\n".join(lines) + "\n"


def write_report(image: Path, out_dir: Path) -> str:
    report = measure(image)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "lambda-detect.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    (out_dir / "lambda-detect.md").write_text(text)
    return text
