"""`annotate bench-detectors`: the detectors a user may pick, side by side in one run, on the full-size
architectures (random weights: no hub here), each exported and run as Detect runs Grounding DINO (OpenVINO, fp32,
2 threads).

Per detector: its export held to its own torch (the scores that pick the decoder's queries, relative to the
largest, and the decoded outputs where both pick the same queries); a fresh process's seconds to its first answer
(imports, the graph compiled, the prompt encoded: a cold start) and its peak memory (VmHWM); the warm median of an
image at the size a 12 MP phone photo is detected at (Grounding DINO's family: 800x1066 of the 800 px exports;
OmDet-Turbo: its one 640x640). The published accuracy is each checkpoint's authors' (accuracy cannot be measured
here); annotate cost prices a million photos with each (bench/cost.md).
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
    family: str  # "grounding-dino" (Detect's export and runtime) or "omdet-turbo" (its graph, benched only)
    coco_ap: float | None  # zero-shot COCO val2017 box AP, as published
    lvis_minival_ap: float | None  # zero-shot LVIS minival box AP, as published
    published: str  # where the figures are
    measured_as: str | None = None  # another candidate whose architecture (and so seconds) this one has


CANDIDATES = {
    "Grounding DINO tiny (the default)": Candidate(
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

GROUNDING_DINO_RUN = """
import sys, time
started = time.perf_counter()
import numpy as np
from PIL import Image
from pathlib import Path
from shared.models.grounding_onnx import load_onnx_detector
from shared.settings import DetectionSettings
settings = DetectionSettings.model_validate_json(sys.argv[1])
detector = load_onnx_detector(Path(sys.argv[2]), settings)
height, width, repeats = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8))
phrases = sys.argv[6].split("|")
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

OMDET_RUN = """
import sys, time
started = time.perf_counter()
import numpy as np
from pathlib import Path
from shared.models.onnx_runtime import exported_session
graph, repeats = Path(sys.argv[1]), int(sys.argv[3])
feeds = dict(np.load(sys.argv[2]))
session = exported_session(graph, "openvino", int(sys.argv[4]), graph.with_name("omdet-turbo.weights"))
session.run(None, feeds)
first = time.perf_counter() - started
runs = []
for _ in range(repeats):
    again = time.perf_counter()
    session.run(None, feeds)
    runs.append(time.perf_counter() - again)
peak = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024
print(first, *runs, peak)
"""


def _timed_process(command: list[str]) -> dict[str, float]:
    output = [
        float(value) for value in subprocess.run(command, capture_output=True, text=True, check=True).stdout.split()
    ]
    return {
        "first_answer_s": round(output[0], 2),
        "warm_s": round(statistics.median(output[1:-1]), 3),
        "peak_rss_mb": round(output[-1]),
    }


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


def grounding_dino_row(candidate: Candidate, settings: DetectionSettings, repeats: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForZeroShotObjectDetection

    from shared.models.grounding_onnx import load_onnx_detector
    from shared.models.sources import resolve_model_dir
    from tools.models.detector_export import exported_detector_dir

    settings = settings.model_copy(update={"detector_model": candidate.built})
    folder = exported_detector_dir(settings)
    command = [sys.executable, "-c", GROUNDING_DINO_RUN, settings.model_dump_json(), str(folder)]
    timed = _timed_process([*command, *map(str, PHOTO_SIZE), str(repeats), "|".join(PHRASES)])
    detector = load_onnx_detector(folder, settings.model_copy(update={"detector_runtime": "openvino"}))
    image = _noise(PHOTO_SIZE)
    pixels, pixel_mask = detector.image_inputs(image)
    outputs = detector.forward(image, PHRASES)
    text = detector.text_inputs(". ".join(PHRASES) + ".")
    model = AutoModelForZeroShotObjectDetection.from_pretrained(resolve_model_dir(candidate.built, settings)).eval()
    with torch.inference_mode():
        reference = model(
            pixel_values=torch.from_numpy(pixels),
            pixel_mask=torch.from_numpy(pixel_mask),
            **{name: torch.from_numpy(text[name]) for name in ("input_ids", "token_type_ids", "attention_mask")},
        )
    tokens = text["input_ids"].shape[1]
    agreement = _relative_agreement(
        outputs["selection_scores"],
        reference.enc_outputs_class.max(-1).values.numpy(),
        [
            (outputs["logits"][..., :tokens], reference.logits[..., :tokens].numpy()),
            (outputs["pred_boxes"], reference.pred_boxes.numpy()),
        ],
        model.config.num_queries,
    )
    return {"size": f"{PHOTO_SIZE[0]}x{PHOTO_SIZE[1]}", "architecture": type(model).__name__, **timed, **agreement}


def omdet_turbo_row(candidate: Candidate, settings: DetectionSettings, repeats: int) -> dict[str, Any]:
    import torch

    from shared.models.onnx_runtime import exported_session
    from shared.models.sources import resolve_model_dir
    from tools.models.omdet_export import (
        INPUT_NAMES,
        encoded_prompt,
        export_omdet_turbo,
        image_size,
        load_omdet_turbo,
        torch_outputs,
    )

    model_dir = resolve_model_dir(candidate.built, settings)
    model = load_omdet_turbo(model_dir)
    size = image_size(model)
    generator = torch.Generator().manual_seed(0)
    vocabulary = model.config.text_config.vocab_size
    # a class name of 3 tokens each (with CLIP's start and end), the task sentence naming them all
    class_ids = torch.randint(1, vocabulary - 1, (len(PHRASES), 5), generator=generator)
    task_ids = torch.randint(1, vocabulary - 1, (1, 3 + 3 * len(PHRASES)), generator=generator)
    pixels = torch.from_numpy(np.asarray(_noise(size), np.float32).transpose(2, 0, 1)[None] / 255)
    prompt = encoded_prompt(model, class_ids, task_ids)
    feeds = {name: tensor.numpy() for name, tensor in zip(INPUT_NAMES, (pixels, *prompt), strict=True)}
    with tempfile.TemporaryDirectory(prefix="annotate-bench-detectors-") as folder:
        graph = export_omdet_turbo(model_dir, Path(folder))
        np.savez(Path(folder) / "feeds.npz", **feeds)
        command = [sys.executable, "-c", OMDET_RUN, str(graph), str(Path(folder) / "feeds.npz")]
        timed = _timed_process([*command, str(repeats), str(settings.torch_threads)])
        session = exported_session(graph, "openvino", settings.torch_threads, graph.with_name("omdet-turbo.weights"))
        logits, boxes, selection = session.run(None, feeds)
    ref_logits, ref_boxes, ref_selection = torch_outputs(model, pixels, *prompt)
    agreement = _relative_agreement(
        selection, ref_selection, [(logits, ref_logits), (boxes, ref_boxes)], model.config.num_queries
    )
    return {"size": f"{size[0]}x{size[1]}", "architecture": type(model).__name__, **timed, **agreement}


def _noise(size: ImageSize) -> Any:
    """The sample photo at exactly ``size`` (a random model ties fewer scores on a photo than on noise)."""
    from PIL import Image

    return Image.open(SAMPLE).convert("RGB").resize((size[1], size[0]))


def run_detectors_bench(repeats: int) -> dict[str, Any]:
    from shared.settings import Profile, Settings
    from tools.models.tiny_models import build_model

    settings = Settings(profile=Profile.TINY, detection_short_side=800, detector_compiled_cache=False).detection
    settings = settings.model_copy(update={"detector_runtime": "openvino", "detector_load_all_sizes": False})
    rows: dict[str, Any] = {}
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
        build_model(candidate.built, settings)
        row = (grounding_dino_row if candidate.family == "grounding-dino" else omdet_turbo_row)(
            candidate, settings, repeats
        )
        rows[name] = {**row, **published}
    return {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "threads": settings.torch_threads or os.cpu_count(),
        "repeats": repeats,
        "runtime": "openvino",
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
    return "\n".join(lines) + "\n"


def write_report(repeats: int, out_dir: Path) -> str:
    report = run_detectors_bench(repeats)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "detectors.json").write_text(json.dumps(report, indent=2) + "\n")
    markdown = markdown_report(report)
    (out_dir / "detectors.md").write_text(markdown)
    return markdown
