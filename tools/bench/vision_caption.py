"""The caption that sees the image against the text-only one, side by side on the same image and facts: the
vision-language model (SmolVLM-256M-Instruct's architecture with random weights, Q8_0, built here: its compute is the
real one's) and the text model the bench's caption step runs. Cold start (a fresh process: import and load, the
projector included), time to the first token (for the vision model, the image's encoding and the prompt), tokens a
second after it, the caption's seconds, and peak memory."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from PIL import Image

from shared.contracts import AnnotationRequest
from shared.settings import Settings

VISION_MODEL = "random:smolvlm-256m/model.gguf"
VISION_PROJECTOR = "random:smolvlm-256m/mmproj.gguf"

_COLD_START = (
    "import sys, time\n"
    "started = time.perf_counter()\n"
    "from shared.models.captioning import load_captioner\n"
    "from shared.settings import Settings\n"
    "load_captioner(Settings.model_validate_json(sys.argv[1]).caption)\n"
    "seconds = time.perf_counter() - started\n"
    "status = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]\n"
    "print(seconds, int(status) / 1024)\n"
)


def vision_settings(settings: Settings) -> Settings:
    """``settings`` captioning with the full-size vision-language model built here."""
    return settings.model_copy(
        update={"caption_vision": True, "caption_vision_model": VISION_MODEL, "caption_vision_mmproj": VISION_PROJECTOR}
    )


def _cold_start(settings: Settings, runs: int) -> dict[str, float]:
    command = [sys.executable, "-c", _COLD_START, settings.model_dump_json()]
    measured = [subprocess.run(command, capture_output=True, text=True, check=True).stdout.split() for _ in range(runs)]
    return {
        "cold_start_s": round(statistics.median(float(seconds) for seconds, _ in measured), 2),
        "cold_peak_rss_mb": round(max(float(peak) for _, peak in measured)),
    }


def _caption_side(settings: Settings, image: Image.Image | None, facts: dict[str, Any], repeats: int) -> dict:
    from shared.models.captioning import load_captioner

    captioner = load_captioner(settings.caption)
    captioner.caption(facts, image)  # warm: the first call's lazy initialisation is not what is measured
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        output = captioner.caption(facts, image)
        runs.append((time.perf_counter() - started, output))
    return {
        "caption_median_s": round(statistics.median(seconds for seconds, _ in runs), 3),
        "ttft_median_ms": round(statistics.median(output.ttft_ms for _, output in runs), 1),
        "tokens_per_s_median": round(statistics.median(output.tokens_per_s for _, output in runs), 1),
        "prompt_tokens": runs[-1][1].prompt_tokens,
        "completion_tokens": runs[-1][1].completion_tokens,
        "peak_rss_mb": round(max(output.peak_rss_mb for _, output in runs)),
    }


def vision_caption_seconds(settings: Settings, image_path: Path, repeats: int) -> dict[str, Any]:
    """Both captions of one image, each measured as the caption step runs it."""
    from shared.models.captioning import image_facts
    from tools.models.tiny_models import build_vision_captioner

    seeing = vision_settings(settings)
    build_vision_captioner(seeing)
    image = Image.open(image_path).convert("RGB")
    facts = image_facts(AnnotationRequest(prompt="dog. cat."), image.width, image.height, [])
    text_only = _caption_side(settings, None, facts, repeats) | _cold_start(settings, 3)
    vision = _caption_side(seeing, image, facts, repeats) | _cold_start(seeing, 3)
    return {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "threads": settings.caption_threads or "llama-cpp-python's default (half the cores)",
        "text_model": settings.caption_model,
        "vision_model": VISION_MODEL,
        "text_only": text_only,
        "vision": vision,
        "vision_over_text": round(vision["caption_median_s"] / text_only["caption_median_s"], 2),
    }
