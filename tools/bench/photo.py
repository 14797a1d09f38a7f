"""`annotate bench-photo`: the photos people drop, a phone's 12 MP JPEG, through the pipeline's steps as each lane
runs them, each stage's seconds apart from the models'.

Each step of the Lambda lane is its own function, so each reads and decodes the image again (Detect, Classify, Tag
and WriteResult: four decodes), and WriteResult draws the boxes and encodes the annotated picture; one process (the
bulk lane, the API, local mode) decodes it once for all its steps. The bench times each step whole, the image whole
in one process, and, side by side in the same alternation, the stages that are not models: the read, the decode,
the orientation (EXIF) and RGB conversion, the detector's resize, the drawing, and the picture's encoding in each
PictureFormat. Each size (the sample as it is, and as a phone stores it) runs on the same models: the full-size
architectures with random weights, and the tiny packaged caption GGUF.
"""

from __future__ import annotations

import hashlib
import io
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image, ImageOps

from tools.bench.models import FULL_SIZE_RANDOM, _timed

if TYPE_CHECKING:
    from tools.bench.cost_inputs import BenchSeconds, BulkSeconds, Prices

PHONE_PORTRAIT = (3000, 4000)  # 12 MP, as it is shown
PHONE_QUALITY = 90
SENSOR_GRAIN = 8.0  # standard deviation, in 8-bit levels
EXIF_ORIENTATION, ROTATE_90_CLOCKWISE_TO_SHOW = 0x0112, 6
PHOTO = "12 MP phone photo"
STEP_ROWS = {
    "detect": "Detect step",
    "classify": "Classify step",
    "tag": "Tag step",
    "segment": "Segment step",
    "caption": "Caption step",
}
WRITE_RESULT = "WriteResult step (PictureFormat=jpeg, as deployed)"
ONE_PROCESS = "one process: the bulk lane, the API, local (one decode)"
DRAWN = "draw and encode the picture (jpeg)"
# What a one-process image spends outside the models: one read and decode, the detector's resize, the picture. The
# resize of the crops Classify and Tag describe is each model's own preprocessing, left in its step (what a photo
# adds to those steps is about that resize: docs/performance.md).
NOT_A_MODEL_STAGES = ("read", "decode", "orient and RGB", "detector's resize and normalize", DRAWN)
NOT_A_MODEL = "not a model, one process"
NOT_A_MODEL_SHARE = "not a model, share of one process"
# Per stage, the median of (the photo's seconds - its sample's) over the runs of each sample in each repeat: a
# difference of medians would carry the machine's drift between the runs (it came out negative for one process).
ADDED = "the photo adds (median of pairs)"


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
    """One run of ``path``: each step whole, as the Lambda lane runs it; the whole image in one process, as the bulk
    lane, the API and local mode run it; and the stages that are not models."""
    from shared.contracts import AnnotationRequest, DescribeInput, DescribeOutput, ImageRef, ImageState, ImageTask
    from shared.contracts import PictureFormat as Format
    from shared.models.grounding_onnx import OnnxGroundingDino
    from shared.pipeline import steps
    from shared.pipeline.dependencies import DEFAULT_MODEL_STEPS, Step, build_dependencies
    from shared.pipeline.one_image import annotate_image
    from shared.storage.objects import local_uri, store_for
    from shared.storage.render import draw_detections, encode_picture

    uri = local_uri(path)
    task = ImageTask(
        batch_id="b-" + "0" * 20,
        request=AnnotationRequest(prompt="dog. cat.", caption=True),
        image=ImageRef(image_id=hashlib.sha256(uri.encode()).hexdigest()[:16], source_uri=uri),
        results_uri=results,
    )
    steps_used = (*DEFAULT_MODEL_STEPS, Step.SEGMENT, Step.WRITE_RESULT)
    deps = {step: build_dependencies(step, settings) for step in steps_used}  # loaded once a process, then cached
    detector = deps[Step.DETECT].detector
    assert isinstance(detector, OnnxGroundingDino)
    times: dict[str, float] = {}
    outputs: dict[str, Any] = {}
    times["read"] = _timed(lambda: outputs.update(data=store_for(uri).read_bytes(uri)))
    times["source MB"] = len(outputs["data"]) / 1e6
    opened = Image.open(io.BytesIO(outputs["data"]))
    times["decode"] = _timed(opened.load)
    times["orient and RGB"] = _timed(lambda: outputs.update(upright=ImageOps.exif_transpose(opened).convert("RGB")))
    upright = outputs["upright"]
    times["detector's resize and normalize"] = _timed(partial(detector.image_inputs, upright))
    times["Detect step"] = _timed(lambda: outputs.update(detection=steps.detect(task, deps[Step.DETECT])))
    detection = outputs["detection"]
    described = DescribeInput(task=task, detections=detection.detections)
    times["Classify step"] = _timed(lambda: outputs.update(classify=steps.classify(described, deps[Step.CLASSIFY])))
    times["Tag step"] = _timed(lambda: outputs.update(tag=steps.tag(described, deps[Step.TAG])))
    # masks, where a request asks: the image encoded once, each box's mask at the photo's size and its RLE
    times["Segment step"] = _timed(lambda: steps.segment(described, deps[Step.SEGMENT]))
    state = ImageState(
        task=task, detection=detection, description=DescribeOutput(classify=outputs["classify"], tag=outputs["tag"])
    )
    times["Caption step"] = _timed(lambda: outputs.update(caption=steps.caption(state, deps[Step.CAPTION])))
    state = state.model_copy(update={"caption": outputs["caption"]})
    times[WRITE_RESULT] = _timed(lambda: steps.write_result_document(state, deps[Step.WRITE_RESULT]))
    as_png = replace(deps[Step.WRITE_RESULT], picture_format=Format.PNG)
    times["WriteResult step, PictureFormat=png"] = _timed(lambda: steps.write_result_document(state, as_png))
    times[ONE_PROCESS] = _timed(lambda: annotate_image(task, deps.__getitem__))
    detections, _ = steps.merged_detections(detection.detections, state.description)
    times[DRAWN] = _timed(lambda: draw_detections(upright, detections))
    for picture_format in Format:
        started = time.perf_counter()
        encoded = encode_picture(upright, picture_format)
        times[f"encode {picture_format}"] = time.perf_counter() - started
        times[f"{picture_format} MB"] = len(encoded) / 1e6
    times[NOT_A_MODEL] = sum(times[stage] for stage in NOT_A_MODEL_STAGES)
    times[NOT_A_MODEL_SHARE] = times[NOT_A_MODEL] / times[ONE_PROCESS]
    times["boxes"] = len(detection.detections)
    return times


def run_photo_bench(samples: list[Path], repeats: int, out_dir: Path, progress: Callable[[str], None]) -> dict:
    """Each sample as it is and as a phone's 12 MP photo, ``repeats`` alternating runs each; medians."""
    from shared.settings import Profile, Settings
    from tools.models.tiny_models import build_named_models

    settings = Settings(profile=Profile.TINY, max_detections=8, detector_load_all_sizes=True, **FULL_SIZE_RANDOM)
    progress("building the models (once per machine: random weights, ONNX exports)")
    build_named_models(settings, variants=False, masks=True)
    report: dict[str, Any] = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "samples": [str(path) for path in samples],
        "repeats": repeats,
        "sizes": {},
    }
    with tempfile.TemporaryDirectory(prefix="annotate-photo-") as folder:
        photos = {"sample": samples, PHOTO: [phone_photo(path, Path(folder)) for path in samples]}
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
        pairs = list(zip(runs["sample"], runs[PHOTO], strict=True))  # the same sample, in the same repeat
        report[ADDED] = {
            name: statistics.median(photo[name] - sample[name] for sample, photo in pairs) for name in runs[PHOTO][0]
        }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "photo.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "photo.md").write_text(markdown_report(report))
    return report


def markdown_report(report: dict[str, Any]) -> str:
    """Each stage's median seconds, per size, side by side, and what the photo adds to it."""
    sizes = report["sizes"]
    names = list(next(iter(sizes.values()))["median"])
    header = "| stage | " + " | ".join(f"{size} ({'x'.join(map(str, s['width_height']))})" for size, s in sizes.items())
    lines = [header + f" | {ADDED} |", "|---|" + "---:|" * (len(sizes) + 1)]
    for name in names:
        cells = [_cell(name, s["median"][name]) for s in sizes.values()] + [_cell(name, report[ADDED][name])]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(name: str, value: float) -> str:
    if "share" in name:
        return f"{value:.0%}"
    return f"{value:g}" if name.endswith("MB") or name == "boxes" else f"{value:.3f} s"


def at_photo_size(
    bench: BenchSeconds, bulk: BulkSeconds | None, photo: dict[str, Any], store_pictures: bool | None = None
) -> tuple[BenchSeconds, BulkSeconds | None]:
    """``bench`` and ``bulk`` as a phone's 12 MP photo would have them measured: each step's seconds plus what
    bench-photo measured the photo adding to its sample's, side by side in one run (the models see the same input
    size either way: what the photo adds is its decode, the detector's resize and the picture); WriteResult's own
    seconds as measured at the photo's size; the whole image in one process (the always-on task, the bulk worker)
    plus what the photo adds there, decoded once. Where pictures are not stored (``store_pictures``; None:
    StorePictures as deployed), the picture's drawing and encoding is taken out of what the photo adds, and
    WriteResult, which then reads no image, takes its seconds at the sample's size (which still drew the sample's
    picture: an upper bound)."""
    from tools.bench.cost_inputs import deployment

    added, phone = photo[ADDED], photo["sizes"][PHOTO]["median"]
    stored = deployment().stores_pictures if store_pictures is None else store_pictures
    in_one_process = added[ONE_PROCESS] - (0.0 if stored else added[DRAWN])
    write_result = phone[WRITE_RESULT] if stored else photo["sizes"]["sample"]["median"][WRITE_RESULT]
    sized = bench
    for step, row in STEP_ROWS.items():
        if step in bench.steps and row in added:  # a report from before a step was timed at a photo's size: as it is
            sized = sized.with_step(step, pipeline_median_s=bench.steps[step].pipeline_median_s + added[row])
    sized = sized.model_copy(
        update={
            "write_result_s": write_result,
            "one_process_s": bench.one_process_s + in_one_process,
            "measured_at_size": f"a {PHOTO}'s ({photo['measured_at'][:10]}, annotate bench-photo)",
        }
    )
    if bulk is None:
        return sized, None
    worker = round(bulk.worker_s + in_one_process, 3)
    return sized, bulk.model_copy(update={"worker_s": worker, "added_by_photo_s": round(in_one_process, 3)})


PHOTO_LINE = (
    "The cost goals at the seconds of the images the bench runs (0.1 MP samples) and of the photos people drop (12 MP,"
    " as a phone stores them), side by side: every figure above is at the photo's."
)


def sizes_table(
    bench: BenchSeconds, bulk: BulkSeconds, photo: dict[str, Any], prices: Prices
) -> tuple[str, dict[str, dict[str, float]]]:
    """The figures the cost goals are judged by, at the bench's images' seconds and at a 12 MP photo's, side by side:
    the markdown table and its figures by size."""
    from tools.bench.cost_inputs import SCENARIOS
    from tools.bench.cost_lanes import bulk_lane, fargate_month, lambda_compute_per_image
    from tools.bench.cost_months import gathered_month

    steady = SCENARIOS[1]
    sized = {"the bench's images": (bench, bulk), PHOTO: at_photo_size(bench, bulk, photo)}
    figures: dict[str, dict[str, float]] = {}
    for size, (priced, priced_bulk) in sized.items():
        assert priced_bulk is not None
        dial, always_on = gathered_month(priced, priced_bulk, prices, steady, 15), fargate_month(priced, prices, steady)
        figures[size] = {
            "bulk worker, seconds an image": priced_bulk.worker_s,
            "Lambda lane, compute per 1,000 images": lambda_compute_per_image(priced, prices) * 1000,
            "a million images, bulk lane on Fargate Spot": bulk_lane(1_000_000, priced, priced_bulk, prices).total,
            f"{steady.name}, dial at 15 min, a month": dial.total,
            f"{steady.name}, Fargate always-on, a month": always_on,
            "dial at 15 min over always-on": dial.total / always_on,
        }
    lines = ["| figure | " + " | ".join(sized) + " |", "|---|" + "---:|" * len(sized)]
    for name in figures[PHOTO]:
        cells = [
            f"{row[name]:.2f}" if "seconds" in name or "over" in name else f"${row[name]:,.2f}"
            for row in figures.values()
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n", figures
