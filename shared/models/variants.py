"""Image variants with stable-diffusion.cpp: img2img from the image (or txt2img), reproducible by seed."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from PIL import Image

from shared.contracts import VariantsRequest
from shared.models.cache import cached_per_settings
from shared.models.sources import resolve_model_dir, resolve_model_file
from shared.observability import logger
from shared.settings import VariantsSettings


class Generator(Protocol):
    model_name: str

    def render(
        self, request: VariantsRequest, init_image: Image.Image | None, seed: int
    ) -> list[tuple[Image.Image, int, float]]: ...


@dataclass
class SdGenerator:
    engine: Any
    model_name: str
    _lock: threading.Lock

    def render(
        self, request: VariantsRequest, init_image: Image.Image | None, seed: int
    ) -> list[tuple[Image.Image, int, float]]:
        """(picture, seed, seconds) for each of the request's variants, seeded from ``seed`` on."""
        produced = []
        with self._lock:
            for index in range(request.count):
                started = time.perf_counter()
                [picture] = self.engine.generate_image(
                    prompt=request.prompt,
                    negative_prompt=request.negative_prompt,
                    init_image=init_image,
                    strength=request.strength,
                    width=request.size,
                    height=request.size,
                    sample_steps=request.steps,
                    cfg_scale=request.cfg_scale,
                    seed=seed + index,
                )
                produced.append((picture.convert("RGB"), seed + index, round(time.perf_counter() - started, 3)))
        return produced


def _tiny_vae(folder: Path) -> Path | None:
    config = folder / "vae" / "config.json"
    if config.is_file() and json.loads(config.read_text()).get("_class_name") == "AutoencoderTiny":
        return folder / "vae" / "diffusion_pytorch_model.safetensors"
    return None


@cached_per_settings
def load_generator(settings: VariantsSettings) -> SdGenerator:
    """The stable-diffusion.cpp engine the settings name, loaded once per process."""
    from stable_diffusion_cpp import StableDiffusion

    folder = resolve_model_dir(settings.variants_model, settings)
    taesd = resolve_model_file(settings.variants_taesd, settings) if settings.variants_taesd else _tiny_vae(folder)
    started = time.perf_counter()
    engine = StableDiffusion(
        model_path=str(folder),
        taesd_path=str(taesd or ""),
        n_threads=settings.variants_threads or -1,
        vae_decode_only=False,  # img2img encodes the source image
        verbose=False,
    )
    logger.info(
        "generator loaded", extra={"model": settings.variants_model, "seconds": round(time.perf_counter() - started, 2)}
    )
    return SdGenerator(engine, settings.variants_model, threading.Lock())
