"""Image variants with stable-diffusion.cpp: img2img from the image (or txt2img), reproducible by seed."""

from __future__ import annotations

import hashlib
import io
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageOps

from shared.contracts import Variant, VariantJob, VariantsOutput
from shared.images import load_image
from shared.model_sources import resolve_model_dir, resolve_model_file
from shared.observability import logger
from shared.settings import Settings
from shared.storage import RESULTS_PREFIX, join_uri, store_for


def variant_uris(job: VariantJob) -> tuple[str, list[str]]:
    """Where the job's result document and variant pictures go: beside the image's own result."""
    base = join_uri(job.results_uri, RESULTS_PREFIX, job.batch_id, job.image.image_id)
    return f"{base}.variants.json", [f"{base}.variant-{index}.png" for index in range(job.variants.count)]


def first_seed(job: VariantJob) -> int:
    """The request's seed, or one derived from the image, so that the same job gives the same pictures."""
    if job.variants.seed is not None:
        return job.variants.seed
    return int(hashlib.sha256(job.image.image_id.encode()).hexdigest()[:7], 16)


@dataclass
class SdGenerator:
    engine: Any
    model_name: str
    _lock: threading.Lock

    def generate(self, job: VariantJob, init_image: Image.Image | None) -> list[tuple[Image.Image, int, float]]:
        """(picture, seed, seconds) per variant."""
        request = job.variants
        produced = []
        with self._lock:
            for index in range(request.count):
                seed = first_seed(job) + index
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
                    seed=seed,
                )
                produced.append((picture.convert("RGB"), seed, round(time.perf_counter() - started, 3)))
        return produced


_loaded: dict[tuple[str, str, int], SdGenerator] = {}
_load_lock = threading.Lock()


def _tiny_vae(folder: Path) -> Path | None:
    config = folder / "vae" / "config.json"
    if config.is_file() and json.loads(config.read_text()).get("_class_name") == "AutoencoderTiny":
        return folder / "vae" / "diffusion_pytorch_model.safetensors"
    return None


def load_generator(settings: Settings) -> SdGenerator:
    """The stable-diffusion.cpp engine the settings name, loaded once per process."""
    key = (settings.variants_model, settings.variants_taesd, settings.variants_threads)
    with _load_lock:
        if key not in _loaded:
            from stable_diffusion_cpp import StableDiffusion

            folder = resolve_model_dir(settings.variants_model, settings)
            taesd = (
                resolve_model_file(settings.variants_taesd, settings) if settings.variants_taesd else _tiny_vae(folder)
            )
            started = time.perf_counter()
            engine = StableDiffusion(
                model_path=str(folder),
                taesd_path=str(taesd or ""),
                n_threads=settings.variants_threads or -1,
                vae_decode_only=False,  # img2img encodes the source image
                verbose=False,
            )
            _loaded[key] = SdGenerator(engine, settings.variants_model, threading.Lock())
            logger.info(
                "generator loaded",
                extra={"model": settings.variants_model, "seconds": round(time.perf_counter() - started, 2)},
            )
        return _loaded[key]


def run_variant_job(job: VariantJob, settings: Settings, generator: SdGenerator | None = None) -> VariantsOutput:
    """Generate the job's variants, write them and their result document; returns the document."""
    init_image = None
    if job.variants.mode == "img2img":
        source = load_image(job.image.source_uri, settings).pixels
        size = job.variants.size
        init_image = ImageOps.fit(source, (size, size), method=Image.Resampling.LANCZOS)
    generator = generator or load_generator(settings)
    document_uri, picture_uris = variant_uris(job)
    variants = []
    for (picture, seed, seconds), uri in zip(generator.generate(job, init_image), picture_uris, strict=True):
        buffer = io.BytesIO()
        picture.save(buffer, format="PNG")
        store_for(uri).write_bytes(uri, buffer.getvalue(), "image/png")
        variants.append(Variant(uri=uri, seed=seed, seconds=seconds))
    output = VariantsOutput(model=generator.model_name, mode=job.variants.mode, images=variants)
    store_for(document_uri).write_bytes(document_uri, output.model_dump_json(indent=2).encode(), "application/json")
    logger.info("variants written", extra={"image_id": job.image.image_id, "count": len(variants)})
    return output
