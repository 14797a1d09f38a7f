"""The detectors a user may pick instead of Grounding DINO tiny: MM Grounding DINO (the architecture LLMDet's
checkpoints load into) through Detect's own export, and OmDet-Turbo through its own (shared/models/omdet_onnx.py).
Each gives its own torch's outputs on both runtimes, and OmDet-Turbo's boxes are transformers' own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shared.detector_geometry import resized_size
from shared.models.grounding_onnx import OnnxGroundingDino, load_detector, load_onnx_detector
from shared.models.omdet_onnx import OMDET_GRAPH, OMDET_WEIGHTS, OnnxOmDetTurbo
from shared.models.onnx_runtime import exported_session
from shared.settings import Settings
from tests.conftest import SAMPLES
from tests.integration.test_detector_onnx import PROMPTS, assert_equal_outputs, both_runtimes, torch_model
from tools.models.detector_export import export_grounding_dino, exported_detector_dir
from tools.models.omdet_export import (
    INPUT_NAMES,
    encoded_prompt,
    image_size,
    load_omdet_turbo,
    torch_outputs,
)
from tools.models.tiny_models import build_model

pytestmark = pytest.mark.slow

RUNTIMES = ("onnxruntime", "openvino")
TOLERANCE = 1e-4  # relative to the largest score, as Grounding DINO's export is held


@pytest.fixture(scope="module")
def cat() -> Image.Image:
    return Image.open(SAMPLES / "chelsea-the-cat.jpg").convert("RGB")


MM_SHORT_SIDE = 256


@pytest.fixture(scope="module")
def mm_export(tiny_settings: Settings, cat: Image.Image, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny MM Grounding DINO (transformers' MMGroundingDinoForObjectDetection), exported by Detect's export."""
    folder = tmp_path_factory.mktemp("mm-grounding-dino")
    size = resized_size(cat.height, cat.width, MM_SHORT_SIDE, MM_SHORT_SIDE * 1333 // 800)
    export_grounding_dino(
        build_model("tiny:mm-grounding-dino", tiny_settings.model_files), folder, [size], MM_SHORT_SIDE
    )
    return folder


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_mm_grounding_dino_exports_through_detects_own_export_with_its_torchs_outputs(
    runtime: str, mm_export: Path, tiny_settings: Settings, cat: Image.Image
) -> None:
    # GIVEN the tiny MM Grounding DINO's export on each runtime
    update = {"detection_short_side": MM_SHORT_SIDE, "detector_runtime": runtime}
    detector = load_onnx_detector(mm_export, tiny_settings.detection.model_copy(update=update))
    assert isinstance(detector, OnnxGroundingDino)
    model = torch_model("tiny:mm-grounding-dino", tiny_settings)
    assert type(model).__name__ == "MMGroundingDinoForObjectDetection"
    # WHEN the export and torch run on the same image and prompts of 1, 3 and 8 phrases
    compared = [assert_equal_outputs(both_runtimes(detector, model, cat, phrases)) for phrases in PROMPTS.values()]
    # THEN they agree before the query selection and, where it picks the same queries, after it
    assert any(compared), "every prompt's queries tied: no decoded output was compared"


@pytest.fixture(scope="module")
def omdet_export(tiny_settings: Settings) -> tuple[Path, Path]:
    """A tiny OmDet-Turbo and its image graph, exported as Detect exports the model it is named."""
    settings = tiny_settings.detection.model_copy(update={"detector_model": "tiny:omdet-turbo"})
    return build_model("tiny:omdet-turbo", settings), exported_detector_dir(settings) / OMDET_GRAPH


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_omdet_turbo_exports_with_its_torchs_outputs_for_prompts_of_any_length(
    runtime: str, omdet_export: tuple[Path, Path], cat: Image.Image
) -> None:
    import torch

    # GIVEN a tiny OmDet-Turbo exported once, traced with a 2-class prompt
    model_dir, graph = omdet_export
    model = load_omdet_turbo(model_dir)
    session = exported_session(graph, runtime, 2, graph.with_name(OMDET_WEIGHTS))  # type: ignore[arg-type]
    height, width = image_size(model)
    pixels = torch.from_numpy(np.asarray(cat.resize((width, height)), np.float32).transpose(2, 0, 1)[None] / 255)
    generator = torch.Generator().manual_seed(0)
    compared = []
    for classes, task_tokens in ((1, 5), (3, 12), (8, 30)):
        # WHEN the export and torch run on the same image and a prompt of that many classes and task tokens
        class_ids = torch.randint(1, 1000, (classes, 6), generator=generator)
        task_ids = torch.randint(1, 1000, (1, task_tokens), generator=generator)
        prompt = encoded_prompt(model, class_ids, task_ids)
        logits, boxes, selection = session.run(
            None, {n: t.numpy() for n, t in zip(INPUT_NAMES, (pixels, *prompt), strict=True)}
        )
        ref_logits, ref_boxes, ref_selection = torch_outputs(model, pixels, *prompt)
        # THEN the scores that pick the decoder's queries agree at every encoder position, and where they pick the
        # same queries, so do the decoded classes and boxes
        tolerance = TOLERANCE * max(1.0, float(np.abs(ref_selection).max()))
        assert np.abs(selection - ref_selection).max() < tolerance
        queries = model.config.num_queries
        picked = np.argsort(-selection[0], kind="stable")[:queries]
        ref_picked = np.argsort(-ref_selection[0], kind="stable")[:queries]
        if (picked == ref_picked).all():
            assert logits.shape == ref_logits.shape == (1, queries, classes)
            assert np.abs(logits - ref_logits).max() < 1e-3 and np.abs(boxes - ref_boxes).max() < 1e-3
            compared.append(classes)
    assert compared, "every prompt's queries tied: no decoded output was compared"


# The longest prompt a request may make: its task sentence is longer than CLIP's 77 tokens, which cuts it
LONGEST = [f"striped wooden chair {index}" for index in range(32)]


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("phrases", [["cat", "remote control", "dog"], LONGEST], ids=["3 phrases", "32 phrases"])
def test_omdet_turbo_without_torch_finds_the_boxes_transformers_finds(
    runtime: str, phrases: list[str], tiny_settings: Settings, cat: Image.Image
) -> None:
    import torch
    from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

    # GIVEN a tiny OmDet-Turbo named as Detect's model: it is exported and loaded as OmDet-Turbo, not Grounding DINO
    settings = tiny_settings.detection.model_copy(
        update={"detector_model": "tiny:omdet-turbo", "detector_runtime": runtime, "max_detections": 300}
    )
    exported_detector_dir(settings)
    detector = load_detector(settings)
    assert isinstance(detector, OnnxOmDetTurbo)
    folder = build_model("tiny:omdet-turbo", settings)
    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForZeroShotObjectDetection.from_pretrained(folder).eval()
    # WHEN both detect in the cat photo: Detect's, and transformers' processor, model and post-processing
    found = detector.detect(cat, phrases, 0.0, 0.0)
    with torch.inference_mode():
        outputs = model(**processor(images=cat, text=phrases, return_tensors="pt"))
    [expected] = processor.post_process_grounded_object_detection(
        outputs, text_labels=phrases, threshold=0.0, nms_threshold=settings.nms_iou, target_sizes=[cat.size[::-1]]
    )
    # THEN the same prompt tokens are read (the task sentence cut where the processor cuts it), the pixels are
    # within a grey level of the processor's
    task = "Detect " + ", ".join(phrases) + "."
    cut = processor.tokenizer(task, truncation=True, max_length=77)["input_ids"]
    assert detector.token_ids(task)[0].tolist() == cut
    pixels = processor(images=cat, text=phrases, return_tensors="np")["pixel_values"]
    assert np.abs(detector.image_inputs(cat) - pixels).max() < 1.5 / 255 / min(detector.manifest.image_std)
    # AND every box transformers finds is found, with its phrase, its score and its corners
    assert len(found) == len(expected["scores"]) > 0
    for detection in found:
        corners = np.asarray([detection.box.x0, detection.box.y0, detection.box.x1, detection.box.y1])
        matches = [
            i
            for i, label in enumerate(expected["text_labels"])
            if label == detection.label
            and abs(float(expected["scores"][i]) - detection.score) < 2e-3
            and np.abs(expected["boxes"][i].numpy() - corners).max() < 1.5
        ]
        assert matches, f"{detection} is not among transformers' boxes"


def test_a_batch_runs_through_the_workflow_with_omdet_turbo_as_detect(tmp_path: Path, tiny_settings: Settings) -> None:
    from typer.testing import CliRunner

    from shared.contracts import ImageResult
    from tools.cli import app

    # GIVEN two photos, and OmDet-Turbo named as Detect's model, as a user names it
    images = tmp_path / "images"
    images.mkdir()
    for name in ("chelsea-the-cat.jpg", "coffee.webp"):
        (images / name).write_bytes((SAMPLES / name).read_bytes())
    # WHEN they run through the local workflow
    result = CliRunner().invoke(
        app,
        ["run", str(images), "--prompt", "dog. cat.", "--profile", "tiny", "--data-dir", str(tmp_path / "data")],
        env={"ANNOTATE_DETECTOR_MODEL": "tiny:omdet-turbo"},
    )
    # THEN each has its result, its boxes labelled with the prompt's phrases and made by OmDet-Turbo
    assert result.exit_code == 0 and "2 succeeded, 0 failed" in result.output, result.output
    results = [ImageResult.model_validate_json(p.read_text()) for p in (tmp_path / "data/results").glob("b-*/*.json")]
    assert len(results) == 2
    for done in results:
        assert done.detections and {d.label for d in done.detections} <= {"dog", "cat"}
        assert done.made_by["detect"].model == "tiny:omdet-turbo"
