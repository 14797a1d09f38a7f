"""`annotate bench-detectors`: the detectors a user may pick (``detector_model``), side by side in one run, on
the full-size architectures (random weights: no hub here), each exported and loaded as Detect loads it
(``load_detector``: OpenVINO, fp32, 2 threads).

Per detector: its export held to its own torch (the scores that pick the decoder's queries, relative to the
largest, and the decoded outputs where both pick the same queries); a fresh process's seconds to its first answer
(imports, the graph compiled, the prompt encoded: a cold start) and its peak memory (VmHWM); the warm median of a
photo at the size Detect sees a 12 MP phone photo (1066x800: Grounding DINO's family pads nothing at its 800x1066
export; OmDet-Turbo resizes it to its one 640x640), its resize and post-processing included. The published
accuracy is each checkpoint's authors' (accuracy cannot be measured here); annotate cost prices a million photos
with each (bench/cost.md).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from shared.detector_geometry import ImageSize
from shared.settings import DetectionSettings

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "chelsea-the-cat.jpg"
PHOTO_SIZE: ImageSize = (800, 1066)  # a 4:3 phone photo at Detect's 800 px (bench-flops profiles the same)
PHRASES = ["dog", "cat", "hamster", "traffic light", "t-shirt"]
TOLERANCE = 1e-4  # relative to the largest score, as Detect's export is held to torch (tests/integration)


@dataclass(frozen=True)
class Candidate:
    """A detector a user may pick: its checkpoint, the architecture built here, and its published accuracy."""

    checkpoint: str
    built: str  # the full-size architecture with random weights (tools/models/tiny_models.py)
    family: str  # "grounding-dino" (MM Grounding DINO and LLMDet load into its export) or "omdet-turbo"
    coco_ap: float | None  # zero-shot COCO val2017 box AP, as published
    lvis_minival_ap: float | None  # zero-shot LVIS minival box AP, as published
    published: str  # where the figures are
    measured_as: str | None = None  # another candidate whose architecture (and so seconds) this one has


DEFAULT = "Grounding DINO tiny (the default)"
CANDIDATES = {
    DEFAULT: Candidate(
        "IDEA-Research/grounding-dino-tiny",
        "random:grounding-dino-tiny",
        "grounding-dino",
        48.4,
        28.8,
        "mmdetection configs/mm_grounding_dino/README.md, GDINO-T (O365,GoldG,Cap4M)",
    ),
    "MM Grounding DINO tiny": Candidate(
        "openmmlab-community/mm_grounding_dino_tiny_o365v1_goldg_grit_v3det",
        "random:mm-grounding-dino-tiny",
        "grounding-dino",
        50.4,
        41.4,
        "mmdetection configs/mm_grounding_dino/README.md, MM-GDINO-T (O365,GoldG,GRIT,V3Det)",
    ),
    "LLMDet tiny": Candidate(
        "iSEE-Laboratory/llmdet_tiny",
        "random:mm-grounding-dino-tiny",
        "grounding-dino",
        None,
        44.7,
        "iSEE-Laboratory/LLMDet README, LLMDet Swin-T",
        measured_as="MM Grounding DINO tiny",
    ),
    "OmDet-Turbo tiny": Candidate(
        "omlab/omdet-turbo-swin-tiny-hf",
        "random:omdet-turbo-tiny",
        "omdet-turbo",
        42.5,
        30.3,
        "om-ai-lab/OmDet README, OmDet-Turbo-Tiny (O365,GoldG); its LVIS split is not named there",
    ),
}

DETECT_RUN = """
import sys, time
started = time.perf_counter()
from PIL import Image
from shared.models.grounding_onnx import load_detector
from shared.settings import DetectionSettings
detector = load_detector(DetectionSettings.model_validate_json(sys.argv[1]))
image, repeats, phrases = Image.open(sys.argv[2]).convert("RGB"), int(sys.argv[3]), sys.argv[4].split("|")
detector.forward(image, phrases)
first = time.perf_counter() - started
runs = []
for _ in range(repeats):
    again = time.perf_counter()
    detector.forward(image, phrases)
    runs.append(time.perf_counter() - again)
peak = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024
print(first, *runs, peak)
"""


def _relative_agreement(
    selection: np.ndarray, reference: np.ndarray, decoded: list[tuple[np.ndarray, np.ndarray]], queries: int
) -> dict[str, Any]:
    """How far an export's outputs are from its torch's: the selection scores' largest difference relative to
    their largest magnitude; whether the top-k picks the same queries, and if not, whether every query it ranks
    differently is tied within the tolerance with torch's (two runtimes then legitimately decode different queries);
    the decoded outputs' largest difference where both pick the same queries."""
    selection, reference = selection.ravel(), reference.ravel()
    scale = max(1.0, float(np.abs(reference).max()))
    picked = np.argsort(-selection, kind="stable")[:queries]
    ref_picked = np.argsort(-reference, kind="stable")[:queries]
    apart = picked != ref_picked
    return {
        "selection_relative": float(np.abs(selection - reference).max()) / scale,
        "same_queries": not apart.any(),
        "only_ties_apart": bool(
            (np.abs(reference[picked[apart]] - reference[ref_picked[apart]]) < TOLERANCE * scale).all()
        ),
        "decoded_max": None if apart.any() else max(float(np.abs(a - b).max()) for a, b in decoded),
    }


def timed_detect(settings: DetectionSettings, photo: Path, repeats: int) -> dict[str, float]:
    """Detect as the pipeline loads it (``load_detector``), in a fresh process: its first answer on ``photo``, the
    warm median of ``repeats`` more (the prompt's text encoded once, as for a batch's images), its peak memory."""
    command = [
        sys.executable,
        "-c",
        DETECT_RUN,
        settings.model_dump_json(),
        str(photo),
        str(repeats),
        "|".join(PHRASES),
    ]
    output = [float(v) for v in subprocess.run(command, capture_output=True, text=True, check=True).stdout.split()]
    warm = output[1:-1]
    return {
        "first_answer_s": round(output[0], 2),
        "warm_s": round(statistics.median(warm), 3),
        "warm_spread_s": round(max(warm) - min(warm), 3),  # a difference within it is not one
        "peak_rss_mb": round(output[-1]),
    }


def grounding_dino_agreement(settings: DetectionSettings, photo: Any) -> dict[str, Any]:
    """The export's outputs on ``photo`` against its torch's, on the same padded pixels and tokens."""
    import torch
    from transformers import AutoModelForZeroShotObjectDetection

    from shared.models.grounding_onnx import load_onnx_detector
    from shared.models.sources import resolve_model_dir
    from tools.models.detector_export import exported_detector_dir

    detector = load_onnx_detector(exported_detector_dir(settings), settings)
    pixels, pixel_mask = detector.image_inputs(photo)
    outputs = detector.forward(photo, PHRASES)
    text = detector.text_inputs(". ".join(PHRASES) + ".")
    model = AutoModelForZeroShotObjectDetection.from_pretrained(resolve_model_dir(settings.detector_model, settings))
    with torch.inference_mode():
        reference = model.eval()(
            pixel_values=torch.from_numpy(pixels),
            pixel_mask=torch.from_numpy(pixel_mask),
            **{name: torch.from_numpy(text[name]) for name in ("input_ids", "token_type_ids", "attention_mask")},
        )
    tokens = text["input_ids"].shape[1]
    return {
        "size": "x".join(map(str, pixels.shape[2:])),
        "architecture": type(model).__name__,
        **_relative_agreement(
            outputs["selection_scores"],
            reference.enc_outputs_class.max(-1).values.numpy(),
            [
                (outputs["logits"][..., :tokens], reference.logits[..., :tokens].numpy()),
                (outputs["pred_boxes"], reference.pred_boxes.numpy()),
            ],
            model.config.num_queries,
        ),
    }


def omdet_turbo_agreement(settings: DetectionSettings, photo: Any) -> dict[str, Any]:
    """The export (its text graph, then its image graph) against transformers' processor and torch on the same
    photo and phrases, the same pixels."""
    import torch
    from transformers import AutoProcessor

    from shared.models.grounding_onnx import load_detector
    from shared.models.omdet_onnx import OnnxOmDetTurbo
    from shared.models.sources import resolve_model_dir
    from tools.models.omdet_export import load_omdet_turbo, torch_outputs

    detector = load_detector(settings)
    assert isinstance(detector, OnnxOmDetTurbo)
    model_dir = resolve_model_dir(settings.detector_model, settings)
    model, processor = load_omdet_turbo(model_dir), AutoProcessor.from_pretrained(model_dir)
    inputs = processor(images=photo, text=PHRASES, return_tensors="pt")
    # the processor's pixels (Pillow's resize is within a grey level of them: tests/integration), Detect's prompt
    feeds = {"pixel_values": inputs["pixel_values"].numpy(), **detector.encoded_prompt(PHRASES)}
    logits, boxes, selection = detector.image_session.run(None, feeds)
    with torch.inference_mode():
        prompt = model.get_language_embedding(
            inputs["classes_input_ids"],
            inputs["classes_attention_mask"],
            inputs["tasks_input_ids"],
            inputs["tasks_attention_mask"],
            inputs["classes_structure"],
        )
    ref_logits, ref_boxes, ref_selection = torch_outputs(model, inputs["pixel_values"], *prompt)
    return {
        "size": "x".join(map(str, detector.manifest.size)),
        "architecture": type(model).__name__,
        **_relative_agreement(
            selection, ref_selection, [(logits, ref_logits), (boxes, ref_boxes)], model.config.num_queries
        ),
    }


def two_at_once(settings: DetectionSettings, photo: Any, repeats: int) -> dict[str, Any]:
    """Detect's throughput two ways on this CPU's cores, side by side: one photo at a time on every core (how the
    pipeline compiles it: ``openvino_options``), and two photos at once, each on one core (two OpenVINO streams of
    one thread, one inference request each); and whether both give the same bits."""
    import threading

    import openvino

    from shared.models.grounding_onnx import export_file_name, load_onnx_detector
    from shared.models.onnx_runtime import mapped_file, openvino_graph_file, openvino_options
    from tools.bench.flops import median_seconds
    from tools.models.detector_export import exported_detector_dir

    folder = exported_detector_dir(settings)
    detector = load_onnx_detector(folder, settings)
    pixels, pixel_mask = detector.image_inputs(photo)
    feeds = {"pixel_values": pixels, "pixel_mask": pixel_mask, **detector.encoded_text(". ".join(PHRASES) + ".")}
    graph = openvino_graph_file(folder / export_file_name((pixels.shape[2], pixels.shape[3])))
    core, cores = openvino.Core(), os.cpu_count() or 1

    def compiled(options: dict[str, Any]) -> Any:
        weights = openvino.Tensor(mapped_file(folder / "grounding-dino.weights"), shared_memory=True)
        return core.compile_model(core.read_model(graph.read_bytes(), weights), "CPU", options)

    one_at_a_time = compiled(openvino_options(settings.torch_threads))
    streams = compiled(
        {
            "INFERENCE_PRECISION_HINT": "f32",
            "NUM_STREAMS": cores,
            "INFERENCE_NUM_THREADS": cores,
            "PERFORMANCE_HINT": "THROUGHPUT",
        }
    )
    requests = [streams.create_infer_request() for _ in range(cores)]

    def all_at_once() -> None:
        threads = [threading.Thread(target=request.infer, args=(feeds,)) for request in requests]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    single = one_at_a_time.create_infer_request()
    alone = median_seconds(lambda: single.infer(feeds), repeats)
    together = median_seconds(all_at_once, repeats) / cores
    first = [single.get_tensor(output).data.copy() for output in one_at_a_time.outputs]
    same = all(
        np.array_equal(a, request.get_tensor(output).data, equal_nan=True)
        for request in requests
        for a, output in zip(first, streams.outputs, strict=True)
    )
    return {
        "size": "x".join(map(str, pixels.shape[2:])),
        "one_at_a_time_s": round(alone, 3),
        "at_once_s_per_image": round(together, 3),
        "images_at_once": cores,
        "same_bits": same,
    }


def _photo(size: ImageSize) -> Any:
    """The sample photo at exactly ``size`` (a random model ties fewer scores on a photo than on noise)."""
    from PIL import Image

    return Image.open(SAMPLE).convert("RGB").resize((size[1], size[0]))


def run_detectors_bench(repeats: int) -> dict[str, Any]:
    from shared.settings import Profile, Settings
    from tools.models.detector_export import exported_detector_dir
    from tools.models.tiny_models import build_model

    base = Settings(profile=Profile.TINY, detection_short_side=800, detector_compiled_cache=False).detection
    base = base.model_copy(update={"detector_runtime": "openvino", "detector_load_all_sizes": False})
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="annotate-bench-detectors-") as folder:
        photo_file = Path(folder) / "photo.png"
        photo = _photo(PHOTO_SIZE)
        photo.save(photo_file)
        for name, candidate in CANDIDATES.items():
            published = {
                "checkpoint": candidate.checkpoint,
                "coco_ap": candidate.coco_ap,
                "lvis_minival_ap": candidate.lvis_minival_ap,
                "published": candidate.published,
            }
            if candidate.measured_as:
                rows[name] = {**rows[candidate.measured_as], **published, "measured_as": candidate.measured_as}
                continue
            settings = base.model_copy(update={"detector_model": candidate.built})
            build_model(candidate.built, settings)
            exported_detector_dir(settings)
            agreement = (grounding_dino_agreement if candidate.family == "grounding-dino" else omdet_turbo_agreement)(
                settings, photo
            )
            rows[name] = {**timed_detect(settings, photo_file, repeats), **agreement, **published}
        default = base.model_copy(update={"detector_model": CANDIDATES[DEFAULT].built})
        streams = two_at_once(default, photo, repeats)
    return {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "threads": base.torch_threads or os.cpu_count(),
        "two_at_once": streams,
        "repeats": repeats,
        "runtime": "openvino",
        "photo": f"{SAMPLE.name} at {PHOTO_SIZE[1]}x{PHOTO_SIZE[0]}",
        "detectors": rows,
    }


def markdown_report(report: dict[str, Any]) -> str:
    lines = [
        f"Measured {report['measured_at'][:10]} on {report['threads']} threads, OpenVINO fp32, the full-size "
        f"architectures with random weights; warm: the median of {report['repeats']} runs of one image, a fresh "
        "process's first answer and peak memory. Equal to torch: the query-picking scores' largest difference "
        "relative to the largest score (held under 1e-4), and the decoded outputs' where both pick the same queries.",
        "",
        "| detector | checkpoint | architecture | size | warm s | first answer s | peak RSS MB | equal to torch |",
        "|---|---|---|---|---:|---:|---:|---|",
    ]
    for name, row in report["detectors"].items():
        if row["decoded_max"] is not None:
            decoded = f", decoded {row['decoded_max']:.1e}"
        else:
            decoded = ", other queries picked where tied" if row["only_ties_apart"] else ", DIFFERENT QUERIES PICKED"
        equal = f"{row['selection_relative']:.1e}{decoded}"
        architecture = row["architecture"] + (f" (as {row['measured_as']})" if row.get("measured_as") else "")
        lines.append(
            f"| {name} | {row['checkpoint']} | {architecture} | {row['size']} | {row['warm_s']:.2f} | "
            f"{row['first_answer_s']:.1f} | {row['peak_rss_mb']} | {equal} |"
        )
    at_once = report["two_at_once"]
    alone, together, cores = at_once["one_at_a_time_s"], at_once["at_once_s_per_image"], at_once["images_at_once"]
    lines += [
        "",
        f"Detect's throughput on {cores} cores, side by side in the same run (the default, {at_once['size']}): one "
        f"photo at a time on every core, as the pipeline runs it, **{alone:.2f} s** a photo; {cores} photos at once, "
        f"one core each (OpenVINO streams), **{together:.2f} s** a photo ({alone / together:.2f}x the photos an "
        "hour); the outputs " + ("are the same bits." if at_once["same_bits"] else "DIFFER."),
    ]
    return "\n".join(lines) + "\n"


def write_report(repeats: int, out_dir: Path) -> str:
    report = run_detectors_bench(repeats)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "detectors.json").write_text(json.dumps(report, indent=2) + "\n")
    markdown = markdown_report(report)
    (out_dir / "detectors.md").write_text(markdown)
    return markdown
