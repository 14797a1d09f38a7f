"""`annotate bench-photo`: the photos people drop, a phone's 12 MP JPEG, through the Lambda lane's steps as they run
there, each stage's seconds apart from the models'.

Each step of the Lambda lane is its own function, so each reads and decodes the image again (Detect, Classify, Tag
and WriteResult: four decodes of 12 MP), and WriteResult draws the boxes and encodes the annotated picture. The
bench times each step whole and, side by side in the same alternation, the stages that are not models: the read,
the decode, the orientation (EXIF) and RGB conversion, the drawing, and the picture's encoding as PNG (what
WriteResult writes), JPEG and WebP. Each size (the sample as it is, and as a phone stores it) runs on the same
models: the full-size architectures with random weights, and the tiny packaged caption GGUF.
"""

from __future__ import annotations

import hashlib
import io
import json
import statistics
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from PIL import Image, ImageOps

from tools.bench.models import FULL_SIZE_RANDOM, _timed

PHONE_PORTRAIT = (3000, 4000)  # 12 MP, as it is shown
PHONE_QUALITY = 90
SENSOR_GRAIN = 8.0  # standard deviation, in 8-bit levels
EXIF_ORIENTATION, ROTATE_90_CLOCKWISE_TO_SHOW = 0x0112, 6
ENCODINGS: dict[str, dict[str, Any]] = {
    "png": {"format": "PNG", "optimize": False},  # WriteResult's picture
    "jpeg q90": {"format": "JPEG", "quality": 90},
    "webp q80": {"format": "WEBP", "quality": 80, "method": 4},
}


def phone_photo(sample: Path, folder: Path) -> Path:
    """``sample`` as a phone stores a portrait photo: 12 MP, the sensor's landscape pixels (4000x3000) with EXIF
    orientation 6 (turn 90 degrees clockwise to show), JPEG at quality 90. The sample is enlarged, with a sensor's
    grain added (an enlarged picture alone is smoother than a photo, and its JPEG a fifth of a phone's 3-5 MB)."""
    import numpy as np

    with Image.open(sample) as opened:
        upright = ImageOps.fit(opened.convert("RGB"), PHONE_PORTRAIT, Image.Resampling.LANCZOS)
    grain = np.random.default_rng(0).normal(0, SENSOR_GRAIN, (*PHONE_PORTRAIT[::-1], 3))
    upright = Image.fromarray(np.clip(np.asarray(upright, np.float32) + grain, 0, 255).astype(np.uint8))
    stored = upright.transpose(Image.Transpose.ROTATE_90)  # what orientation 6 turns back
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = ROTATE_90_CLOCKWISE_TO_SHOW
    path = folder / f"{sample.stem}-12mp.jpg"
    stored.save(path, "JPEG", quality=PHONE_QUALITY, exif=exif)
    return path


def _stages(path: Path, settings: Any, results: str) -> dict[str, float]:
    """One run of ``path``: each step whole, as the Lambda lane runs it, and the stages that are not models."""
    from shared.contracts import AnnotationRequest, DescribeInput, Description, ImageRef, ImageState, ImageTask
    from shared.pipeline import steps
    from shared.pipeline.dependencies import Step, build_dependencies
    from shared.storage.objects import local_uri, store_for
    from shared.storage.render import draw_detections

    uri = local_uri(path)
    task = ImageTask(
        batch_id="b-" + "0" * 20,
        request=AnnotationRequest(prompt="dog. cat.", caption=True),
        image=ImageRef(image_id=hashlib.sha256(uri.encode()).hexdigest()[:16], source_uri=uri),
        results_uri=results,
    )
    steps_used = (Step.DETECT, Step.CLASSIFY, Step.TAG, Step.CAPTION, Step.WRITE_RESULT)
    deps = {step: build_dependencies(step, settings) for step in steps_used}  # loaded once a process, then cached
    times: dict[str, float] = {}
    outputs: dict[str, Any] = {}
    times["read"] = _timed(lambda: outputs.update(data=store_for(uri).read_bytes(uri)))
    times["source MB"] = len(outputs["data"]) / 1e6
    opened = Image.open(io.BytesIO(outputs["data"]))
    times["decode"] = _timed(opened.load)
    times["orient and RGB"] = _timed(lambda: outputs.update(upright=ImageOps.exif_transpose(opened).convert("RGB")))
    upright = outputs["upright"]
    times["Detect step"] = _timed(lambda: outputs.update(detection=steps.detect(task, deps[Step.DETECT])))
    detection = outputs["detection"]
    described = DescribeInput(task=task, detections=detection.detections)
    times["Classify step"] = _timed(lambda: outputs.update(classify=steps.classify(described, deps[Step.CLASSIFY])))
    times["Tag step"] = _timed(lambda: outputs.update(tag=steps.tag(described, deps[Step.TAG])))
    state = ImageState(
        task=task, detection=detection, description=Description(classify=outputs["classify"], tag=outputs["tag"])
    )
    times["Caption step"] = _timed(lambda: outputs.update(caption=steps.caption(state, deps[Step.CAPTION])))
    state = state.model_copy(update={"caption": outputs["caption"]})
    times["WriteResult step"] = _timed(lambda: steps.write_result_document(state, deps[Step.WRITE_RESULT]))
    detections, _ = steps.describe_detections(detection.detections, state.description)
    times["draw and encode png (WriteResult's picture)"] = _timed(lambda: draw_detections(upright, detections))
    for name, options in ENCODINGS.items():
        buffer = io.BytesIO()
        times[f"encode {name}"] = _timed(partial(upright.save, buffer, **options))
        times[f"{name} MB"] = len(buffer.getvalue()) / 1e6
    times["boxes"] = len(detection.detections)
    return times


def run_photo_bench(samples: list[Path], repeats: int, out_dir: Path, progress: Callable[[str], None]) -> dict:
    """Each sample as it is and as a phone's 12 MP photo, ``repeats`` alternating runs each; medians."""
    from shared.settings import Profile, Settings
    from tools.models.tiny_models import build_named_models

    settings = Settings(profile=Profile.TINY, max_detections=8, detector_load_all_sizes=True, **FULL_SIZE_RANDOM)
    progress("building the models (once per machine: random weights, ONNX exports)")
    build_named_models(settings, variants=False)
    report: dict[str, Any] = {"samples": [str(path) for path in samples], "repeats": repeats, "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="annotate-photo-") as folder:
        photos = {"sample": samples, "12 MP phone photo": [phone_photo(path, Path(folder)) for path in samples]}
        results = Path(folder, "results").as_uri()
        runs: dict[str, list[dict[str, float]]] = {size: [] for size in photos}
        _stages(samples[0], settings, results)  # every model loaded and warm
        for repeat in range(repeats):
            for size, paths in photos.items():  # the sizes alternate: the machine is noisy
                for path in paths:
                    progress(f"{size}: {path.name} ({repeat + 1}/{repeats})")
                    runs[size].append(_stages(path, settings, results))
        for size, measured in runs.items():
            with Image.open(photos[size][0]) as first:
                shown = ImageOps.exif_transpose(first).size
            medians = {name: statistics.median(run[name] for run in measured) for name in measured[0]}
            report["sizes"][size] = {"width_height": list(shown), "median": medians}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "photo.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "photo.md").write_text(markdown_report(report))
    return report


MODEL_STEPS = ("Detect step", "Classify step", "Tag step", "Caption step")


def markdown_report(report: dict[str, Any]) -> str:
    """Each stage's median seconds, per size, side by side."""
    sizes = report["sizes"]
    names = list(next(iter(sizes.values()))["median"])
    header = "| stage | " + " | ".join(f"{size} ({'x'.join(map(str, s['width_height']))})" for size, s in sizes.items())
    lines = [header + " |", "|---|" + "---:|" * len(sizes)]
    for name in names:
        unit = "" if name.endswith("MB") or name == "boxes" else " s"
        cells = [f"{s['median'][name]:.3f}{unit}" if unit else f"{s['median'][name]:g}" for s in sizes.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
