"""Grounding DINO exported to ONNX gives torch's outputs, and the project's post-processing agrees with
transformers' where it is meant to."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from shared.detector_geometry import iou, resized_size
from shared.errors import ModelUnavailable, RequestRejected
from shared.models.detection import best_phrases, phrase_spans, pixel_boxes
from shared.models.grounding_onnx import (
    WEIGHTS_FILE,
    OnnxGroundingDino,
    export_dir,
    export_file_name,
    load_detector,
    load_onnx_detector,
    phrase_masks,
)
from shared.models.onnx_runtime import openvino_graph_file
from shared.settings import Settings
from tests.conftest import SAMPLES
from tools.models.detector_export import (
    deformable_attention,
    encoder_output_proposals,
    export_grounding_dino,
    exported_detector_dir,
    keep_queries,
)
from tools.models.detector_export import phrase_masks as torch_phrase_masks
from tools.models.tiny_models import build_model
from tools.models.torch_models import load_torch_detector

pytestmark = pytest.mark.slow

PROMPTS = {
    1: ["cat"],
    3: ["traffic light", "hamster", "t-shirt"],
    8: ["dog", "cat", "hamster", "traffic light", "t-shirt", "golden retriever", "bird", "remote control"],
}
# Before the query selection, relative to the largest score: float32 sums in another order, through Swin and six
# encoder layers, differ by 7.6e-5 (ONNX Runtime) and 1.1e-4 (OpenVINO) on the full-size model's scores of 50.
TOLERANCE = 1e-4
DECODED_TOLERANCE = 1e-3  # after it: six decoder layers on, full-size logits differ by about 1.2e-4


@pytest.fixture(scope="module")
def cat() -> Image.Image:
    return Image.open(SAMPLES / "chelsea-the-cat.jpg").convert("RGB")


@pytest.fixture(scope="module")
def onnx_settings(tiny_settings: Settings) -> Settings:
    return tiny_settings.model_copy(update={"torch_threads": 2})


@pytest.fixture(scope="module")
def exported(onnx_settings: Settings) -> OnnxGroundingDino:
    detector = load_detector(onnx_settings.detection)
    assert isinstance(detector, OnnxGroundingDino)
    return detector


@pytest.fixture(scope="module", params=["onnxruntime", "openvino"])
def each_runtime(request: pytest.FixtureRequest, onnx_settings: Settings) -> OnnxGroundingDino:
    """The same export on each runtime the detector can run it on."""
    detector = load_detector(onnx_settings.detection.model_copy(update={"detector_runtime": request.param}))
    assert isinstance(detector, OnnxGroundingDino) and detector.runtime == request.param
    return detector


def torch_model(source: str, settings: Settings) -> Any:
    from transformers import AutoModelForZeroShotObjectDetection

    return AutoModelForZeroShotObjectDetection.from_pretrained(build_model(source, settings.model_files)).eval()


def both_runtimes(detector: OnnxGroundingDino, model: Any, image: Image.Image, phrases: list[str]) -> dict:
    """The export's and torch's outputs on the same padded image and tokenized prompt."""
    import torch

    pixels, pixel_mask = detector.image_inputs(image)
    prompt = ". ".join(phrases) + "."
    text = detector.text_inputs(prompt)
    logits, boxes, selection = detector.session((pixels.shape[2], pixels.shape[3])).run(
        None, {"pixel_values": pixels, "pixel_mask": pixel_mask, **detector.encoded_text(prompt)}
    )
    tokens = text["input_ids"].shape[1]  # past the prompt, both pad with -inf
    # torch's outputs for the same model, pixels and prompt are computed once for every runtime compared with them
    key = (id(model), hashlib.sha256(pixels.tobytes() + pixel_mask.tobytes()).hexdigest(), prompt)
    if key not in _TORCH_OUTPUTS:
        with torch.inference_mode():
            reference = model(
                pixel_values=torch.from_numpy(pixels),
                pixel_mask=torch.from_numpy(pixel_mask),
                **{name: torch.from_numpy(text[name]) for name in ("input_ids", "token_type_ids", "attention_mask")},
            )
        _TORCH_OUTPUTS[key] = (
            reference.logits[0, :, :tokens].numpy(),
            reference.pred_boxes[0].numpy(),
            reference.enc_outputs_class[0].max(-1).values.numpy(),
        )
    return {
        "onnx": (logits[0, :, :tokens], boxes[0], selection[0]),
        "torch": _TORCH_OUTPUTS[key],
        "queries": model.config.num_queries,
    }


_TORCH_OUTPUTS: dict[tuple[int, str, str], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def assert_equal_outputs(outputs: dict) -> bool:
    """Selection scores (every encoder position, before the top-k) within the tolerance; then the top-k picks
    the same queries in the same order, or differs only where the positions it ranks differently are tied
    within the tolerance (each query's place matters: it pairs with a learned query embedding), in which case
    the two runtimes legitimately decode different queries; otherwise the decoded logits and boxes agree. Returns
    whether the decoded outputs were compared (not after a tie): a caller that runs several cases holds at least one
    to the decoded outputs."""
    logits, boxes, selection = outputs["onnx"]
    ref_logits, ref_boxes, ref_selection = outputs["torch"]
    tolerance = TOLERANCE * max(1.0, float(np.abs(ref_selection).max()))
    assert np.abs(selection - ref_selection).max() < tolerance
    k = outputs["queries"]
    picked, ref_picked = np.argsort(-selection, kind="stable")[:k], np.argsort(-ref_selection, kind="stable")[:k]
    if (picked != ref_picked).any():
        ranked_apart = picked != ref_picked
        ties = np.abs(ref_selection[picked[ranked_apart]] - ref_selection[ref_picked[ranked_apart]])
        assert (ties < tolerance).all(), "not a tie: a fault"
        return False
    assert np.abs(logits - ref_logits).max() < DECODED_TOLERANCE
    assert np.abs(boxes - ref_boxes).max() < DECODED_TOLERANCE
    return True


def test_the_export_gives_torchs_outputs_for_prompts_of_any_length(
    each_runtime: OnnxGroundingDino, onnx_settings: Settings, cat: Image.Image
) -> None:
    # GIVEN the tiny Grounding DINO exported once, traced with a 2-phrase example prompt
    model, compared = torch_model("tiny:grounding-dino", onnx_settings), {}
    for count, phrases in PROMPTS.items():
        # WHEN the export (on each runtime) and torch run on the same image and a prompt of each length
        # THEN they agree before the query selection and after it
        compared[count] = assert_equal_outputs(both_runtimes(each_runtime, model, cat, phrases))
    assert any(compared.values()), f"every prompt's queries tied: no decoded output was compared ({compared})"


def test_every_exported_size_gives_torchs_outputs(
    each_runtime: OnnxGroundingDino, onnx_settings: Settings, cat: Image.Image
) -> None:
    model = torch_model("tiny:grounding-dino", onnx_settings)
    compared = []
    assert len(each_runtime.manifest.sizes) >= 2
    for height, width in each_runtime.manifest.sizes:
        # GIVEN an image a little narrower (or shorter) than one exported size, which pads the rest
        image = cat.resize((width - 16, height) if width > height else (width, height - 16))
        assert each_runtime.image_inputs(image)[0].shape[2:] == (height, width)
        # THEN that size's graph gives torch's outputs, on each runtime
        compared.append(assert_equal_outputs(both_runtimes(each_runtime, model, image, PROMPTS[3])))
    assert any(compared), "every size's queries tied: no decoded output was compared"


def test_the_full_size_export_gives_torchs_outputs(
    tiny_settings: Settings, cat: Image.Image, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # GIVEN the full-size architecture (random weights), exported at one size: the cat photo's at short side 512
    source = "random:grounding-dino-tiny"
    size = resized_size(cat.height, cat.width, 512, 853)
    folder = tmp_path_factory.mktemp("full-size-export")
    export_grounding_dino(build_model(source, tiny_settings.model_files), folder, [size], 512)
    model = torch_model(source, tiny_settings)
    compared = []
    for runtime in ("onnxruntime", "openvino"):
        update = {"detection_short_side": 512, "detector_runtime": runtime}
        detector = load_onnx_detector(folder, tiny_settings.detection.model_copy(update=update))
        for phrases in (PROMPTS[1], PROMPTS[8]):
            # THEN on each runtime, the shortest and the longest prompt's outputs match torch's
            compared.append(assert_equal_outputs(both_runtimes(detector, model, cat, phrases)))
    assert any(compared), "every case's queries tied: no decoded output was compared"


def test_fewer_queries_decode_the_encoders_best_proposals_as_torch_does_with_as_few(
    onnx_settings: Settings, cat: Image.Image
) -> None:
    # GIVEN the tiny model (30 queries) exported to keep 10, its setting's default left at 900
    settings = onnx_settings.detection.model_copy(update={"detector_max_queries": 10})
    detector = load_onnx_detector(exported_detector_dir(settings), settings)
    # WHEN it runs, THEN it decodes 10 queries, as torch does with its decoder cut to the same 10
    model = torch_model("tiny:grounding-dino", onnx_settings)
    keep_queries(model, 10)
    compared = []
    for phrases in (PROMPTS[1], PROMPTS[3], PROMPTS[8]):
        outputs = both_runtimes(detector, model, cat, phrases)
        assert outputs["onnx"][0].shape[0] == outputs["torch"][0].shape[0] == 10
        compared.append(assert_equal_outputs(outputs))
    assert any(compared), "every prompt's queries tied: no decoded output was compared"
    # AND the full count's export is refused for it
    with pytest.raises(ModelUnavailable, match=r"\(800, False, 900\), not \(800, False, 10\)"):
        load_onnx_detector(export_dir(onnx_settings.detection), settings)


def test_onnx_and_torch_detectors_find_the_same_boxes(
    exported: OnnxGroundingDino, onnx_settings: Settings, cat: Image.Image
) -> None:
    # GIVEN an image the size of an export, so that neither runtime pads it
    height, width = exported.manifest.sizes[0]
    image = cat.resize((width, height))
    torch_detector = load_torch_detector(onnx_settings.detection)
    found = 0
    for phrases in PROMPTS.values():
        # WHEN both detectors detect (each with its own pre-processing: Pillow here, torchvision there)
        onnx_boxes = exported.detect(image, phrases, 0.3, 0.25)
        torch_boxes = torch_detector.detect(image, phrases, 0.3, 0.25)
        # THEN they find the same boxes, with the same labels
        assert [d.label for d in onnx_boxes] == [d.label for d in torch_boxes]
        for ours, theirs in zip(onnx_boxes, torch_boxes, strict=True):
            assert iou(ours.box, theirs.box) >= 0.99
            assert abs(ours.score - theirs.score) < 1e-3
        found += len(onnx_boxes)
    assert found, "no prompt found a box: nothing was compared"


def test_images_are_resized_as_the_model_cards_processor_resizes_them(exported: OnnxGroundingDino) -> None:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(exported.manifest.source)
    for width, height in [(451, 300), (4032, 3024), (3024, 4032), (1920, 1080), (640, 640), (1800, 600), (99, 1000)]:
        pixels = processor.image_processor(images=Image.new("RGB", (width, height)), return_tensors="np")
        expected = tuple(pixels["pixel_values"].shape[2:])
        assert resized_size(height, width, 800, 1333) == expected


def test_pillow_preprocessing_is_within_one_grey_level_of_the_processors(
    exported: OnnxGroundingDino, cat: Image.Image
) -> None:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(exported.manifest.source)
    expected = processor.image_processor(images=cat, return_tensors="np")["pixel_values"][0]
    pixels, mask = exported.image_inputs(cat)
    height, width = expected.shape[1:]
    assert mask[0, :height, :width].all() and mask.sum() == height * width
    std = np.asarray(exported.manifest.image_std, np.float32)[:, None, None]
    assert np.abs((pixels[0, :, :height, :width] - expected) * std).max() <= 1.5 / 255


def test_phrase_masks_are_the_models_own(exported: OnnxGroundingDino) -> None:
    import torch

    for phrases in PROMPTS.values():
        ids = exported.text_inputs(". ".join(phrases) + ".")["input_ids"]
        mask, positions = phrase_masks(ids, exported.manifest.special_token_ids)
        ref_mask, ref_positions = torch_phrase_masks(torch.from_numpy(ids), torch.tensor([101, 102, 1012, 1029]))
        assert (mask == ref_mask.numpy()).all() and (positions == ref_positions.numpy()).all()


def test_the_exports_proposals_are_the_models_own_for_padded_images() -> None:
    import torch
    from transformers.models.grounding_dino.modeling_grounding_dino import GroundingDinoModel

    class Projections(torch.nn.Module):
        enc_output = enc_output_norm = torch.nn.Identity()

    levels = [(100, 150), (50, 75), (25, 38), (13, 19)]  # an 800x1200 input's feature maps
    encoded = torch.randn(1, sum(height * width for height, width in levels), 4)
    for valid_height, valid_width in [(800, 1200), (800, 1000), (600, 1200), (517, 933), (40, 1200)]:
        # GIVEN an image padded to 800x1200, its mask brought to each level as the backbone brings it
        pixel_mask = torch.zeros(1, 1, 800, 1200)
        pixel_mask[..., :valid_height, :valid_width] = 1
        padding = torch.cat(
            [~torch.nn.functional.interpolate(pixel_mask, size=size)[0].bool().flatten(1) for size in levels], 1
        )
        # WHEN the export's proposals (centres looked up in a table) and the model's (divided) are made
        ours = encoder_output_proposals(Projections(), encoded, padding, levels)
        theirs = GroundingDinoModel.generate_encoder_output_proposals(Projections(), encoded, padding, levels)
        # THEN they are the same bits: the same proposals are kept, whichever runtime divides
        assert all(torch.equal(mine, its) for mine, its in zip(ours, theirs, strict=True))


def test_the_exports_deformable_attention_is_the_models_own() -> None:
    import torch
    from transformers.models.grounding_dino.modeling_grounding_dino import MultiScaleDeformableAttention

    # GIVEN an 800x1200 input's four feature levels, 8 heads of 32 and 4 points per level
    levels = [(100, 150), (50, 75), (25, 38), (13, 19)]
    value = torch.randn(1, sum(height * width for height, width in levels), 8, 32)
    locations = torch.rand(1, 900, 8, 4, 4, 2) * 1.2 - 0.1  # some outside the map, where samples are zeros
    weights = torch.randn(1, 900, 8, 16).softmax(-1).view(1, 900, 8, 4, 4)
    # WHEN the export's (a sum per level) and the model's (one sum over the stacked levels) attend
    arguments = (value, None, levels, None, locations, weights, 64)
    ours = deformable_attention(None, *arguments)
    theirs = MultiScaleDeformableAttention().forward(*arguments)
    # THEN they differ by float rounding only
    assert (ours - theirs).abs().max() < 1e-6


def test_a_checkpoint_without_its_export_is_refused_with_what_to_do(onnx_settings: Settings, tmp_path) -> None:
    # GIVEN a copy of the tiny checkpoint in a folder of its own, never exported (at a short side of 640)
    checkpoint = shutil.copytree(build_model("tiny:grounding-dino", onnx_settings.model_files), tmp_path / "gd")
    settings = onnx_settings.detection.model_copy(
        update={"detector_model": str(checkpoint), "detection_short_side": 640}
    )
    # THEN Detect does not export it (a function never does): it says how to
    with pytest.raises(ModelUnavailable, match="annotate models export"):
        load_detector(settings)
    # AND an export folder loaded at another short side than its own is refused
    with pytest.raises(ModelUnavailable, match=r"\(800, False, 900\), not \(640, False, 900\)"):
        load_onnx_detector(export_dir(onnx_settings.detection), settings)


def test_an_export_in_memory_files_runs_on_each_runtime_as_from_disk(
    each_runtime: OnnxGroundingDino, onnx_settings: Settings, cat: Image.Image, tmp_path
) -> None:
    import os

    # GIVEN the export as a function reads an s3:// one: its weights in a memory file, linked from the folder
    folder = shutil.copytree(each_runtime.folder, tmp_path / "export", ignore=shutil.ignore_patterns(WEIGHTS_FILE))
    memory_file = os.memfd_create(WEIGHTS_FILE)
    os.write(memory_file, (each_runtime.folder / WEIGHTS_FILE).read_bytes())
    (folder / WEIGHTS_FILE).symlink_to(f"/proc/self/fd/{memory_file}")
    # WHEN the runtime loads it, handed the mapped bytes rather than a path it cannot open
    settings = onnx_settings.detection.model_copy(update={"detector_runtime": each_runtime.runtime})
    in_memory = load_onnx_detector(folder, settings)
    # THEN it gives the outputs of the export on disk, exactly
    on_disk = each_runtime.forward(cat, ["cat", "remote control"])
    assert on_disk and set(in_memory.forward(cat, ["cat", "remote control"])) == set(on_disk)
    for name, expected in on_disk.items():
        np.testing.assert_array_equal(in_memory.forward(cat, ["cat", "remote control"])[name], expected)
    os.close(memory_file)


def test_a_size_loads_on_the_first_image_that_needs_it_unless_every_size_loads_at_start(
    exported: OnnxGroundingDino, onnx_settings: Settings, cat: Image.Image
) -> None:
    # GIVEN the export, loaded as a process outside Lambda loads it
    lazy = load_onnx_detector(exported.folder, onnx_settings.detection)
    # THEN no size is loaded until an image needs one, and then only the size that image runs at
    assert lazy.loaded_sizes == []
    lazy.detect(cat, ["cat"], 0.3, 0.25)
    assert lazy.loaded_sizes == [lazy.image_inputs(cat)[0].shape[2:]]
    # AND loaded as Lambda loads it before its snapshot, every size is loaded at once
    eager = onnx_settings.detection.model_copy(update={"detector_load_all_sizes": True})
    assert sorted(load_onnx_detector(exported.folder, eager).loaded_sizes) == sorted(exported.manifest.sizes)


def test_openvino_loads_a_size_it_compiled_before_from_its_cache_with_the_same_outputs(
    exported: OnnxGroundingDino, onnx_settings: Settings, cat: Image.Image, tmp_path
) -> None:
    settings = onnx_settings.detection.model_copy(update={"detector_runtime": "openvino"})
    size = exported.image_inputs(cat)[0].shape[2:]
    cache = tmp_path / "compiled"
    # GIVEN the export compiled without a cache, and with an empty one
    uncached = load_onnx_detector(exported.folder, settings.model_copy(update={"detector_compiled_cache": False}))
    assert uncached.compiled_cache is None
    first = load_onnx_detector(exported.folder, settings)
    first.compiled_cache = cache
    # WHEN a size is compiled with the cache, THEN the cache keeps it, and a later detector loads it from there
    assert not first.session(size).loaded_from_cache and any(cache.iterdir())
    later = load_onnx_detector(exported.folder, settings)
    later.compiled_cache = cache
    assert later.session(size).loaded_from_cache
    # AND what it loaded gives the outputs of a compile, exactly
    compiled = uncached.forward(cat, ["cat", "remote control"])
    assert compiled and set(later.forward(cat, ["cat", "remote control"])) == set(compiled)
    for name, expected in compiled.items():
        np.testing.assert_array_equal(later.forward(cat, ["cat", "remote control"])[name], expected)
    # AND an export of the same graph with other weights (a re-export of a retrained model) is compiled anew
    retrained = shutil.copytree(exported.folder, tmp_path / "retrained")
    weights = np.fromfile(retrained / WEIGHTS_FILE, np.uint8)
    graph = openvino_graph_file(retrained / export_file_name(size)).read_text()
    constants = re.findall(r'element_type="f32" shape="[^"]*" offset="(\d+)" size="(\d+)"', graph)
    offset, length = max(((int(offset), int(length)) for offset, length in constants), key=lambda c: c[1])
    weights[offset : offset + length] = (weights[offset : offset + length].view(np.float32) * 1.5).view(np.uint8)
    weights.tofile(retrained / WEIGHTS_FILE)
    other = load_onnx_detector(retrained, settings)
    other.compiled_cache = cache
    assert not other.session(size).loaded_from_cache


def test_a_compiled_cache_that_cannot_be_made_is_done_without(
    exported: OnnxGroundingDino, onnx_settings: Settings, cat: Image.Image, tmp_path
) -> None:
    settings = onnx_settings.detection.model_copy(update={"detector_runtime": "openvino"})
    # GIVEN a cache folder that cannot be made (a file is where its parent should be)
    (tmp_path / "file").write_text("")
    detector = load_onnx_detector(exported.folder, settings)
    detector.compiled_cache = tmp_path / "file" / "compiled"
    # WHEN it detects, THEN it compiles without the cache and finds what it finds without one
    found = detector.detect(cat, ["cat"], 0.3, 0.25)
    assert not detector.session(detector.image_inputs(cat)[0].shape[2:]).loaded_from_cache
    uncached = load_onnx_detector(exported.folder, settings.model_copy(update={"detector_compiled_cache": False}))
    assert found == uncached.detect(cat, ["cat"], 0.3, 0.25)


def test_an_input_of_another_size_is_refused(each_runtime: OnnxGroundingDino, cat: Image.Image) -> None:
    pixels, mask = each_runtime.image_inputs(cat)
    text = each_runtime.encoded_text("cat.")
    other = each_runtime.manifest.sizes[-1]
    assert other != pixels.shape[2:]
    with pytest.raises(Exception, match=r"(?i)invalid dimensions|shape"):
        each_runtime.session(other).run(None, {"pixel_values": pixels, "pixel_mask": mask, **text})


def test_post_processing_agrees_with_transformers_where_it_is_meant_to(
    exported: OnnxGroundingDino, onnx_settings: Settings, cat: Image.Image
) -> None:
    """transformers' `post_process_grounded_object_detection` scores a box by its best token anywhere in the
    prompt and labels it with every token above `text_threshold`; the project scores each phrase by its best
    token and labels the box with the best phrase. Where they differ, by design:
    - the best token is a period, [CLS] or [SEP]: transformers scores the box by it, the project by its phrases;
    - tokens above the text threshold come from several phrases, or from part of one ("traffic" alone):
      transformers joins them into one label, the project names the one phrase holding the best token."""
    import torch
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(exported.manifest.source)
    model = torch_model("tiny:grounding-dino", onnx_settings)
    phrases = PROMPTS[3]
    inputs = processor(images=cat, text=". ".join(phrases) + ".", return_tensors="pt")
    with torch.inference_mode():
        outputs = model(**inputs)
    text_threshold = 0.5
    theirs = processor.post_process_grounded_object_detection(
        outputs, inputs["input_ids"], threshold=0.0, text_threshold=text_threshold, target_sizes=[cat.size[::-1]]
    )[0]
    spans = phrase_spans(phrases, exported.token_count)
    labels, scores = best_phrases(outputs.logits[0].numpy(), spans)
    boxes = pixel_boxes(outputs.pred_boxes[0].numpy().astype(np.float64), *cat.size)
    token_probs = outputs.logits[0].sigmoid().numpy()
    phrase_of_token = {t: p for p, (start, end) in enumerate(spans) for t in range(start, end)}
    cases = {"same score": 0, "best token outside the phrases": 0, "same label": 0, "joined or partial label": 0}
    for query in range(len(scores)):
        best_token = int(token_probs[query].argmax())
        # Boxes: the same corners (the project also clamps them to the image).
        their_box = theirs["boxes"][query].numpy().clip(0, [cat.width, cat.height] * 2)
        assert np.abs(boxes[query] - their_box).max() < 1e-3
        if best_token in phrase_of_token:
            # The best token is a phrase's: same score, and the box is that phrase's.
            cases["same score"] += 1
            assert abs(scores[query] - float(theirs["scores"][query])) < 1e-6
            assert labels[query] == phrase_of_token[best_token]
        else:
            # A period, [CLS] or [SEP] scores highest: transformers' score is higher than any phrase's.
            cases["best token outside the phrases"] += 1
            assert scores[query] <= float(theirs["scores"][query])
        start, end = spans[labels[query]]
        above = [t for t in np.nonzero(token_probs[query] > text_threshold)[0] if t > 0]
        if above == list(range(start, end)):
            # Exactly the phrase's tokens are above the text threshold: the same label.
            cases["same label"] += 1
            assert theirs["text_labels"][query] == processor.tokenizer.decode(inputs["input_ids"][0, start:end])
        else:
            cases["joined or partial label"] += 1
            assert theirs["text_labels"][query] == processor.tokenizer.decode(inputs["input_ids"][0, above])
    assert cases["same score"] > 0, cases


def test_a_prompt_longer_than_the_detector_reads_is_refused_by_name(
    exported: OnnxGroundingDino, cat: Image.Image
) -> None:
    # GIVEN 150 one-token phrases: 302 tokens with their periods, [CLS] and [SEP], over Grounding DINO's 256
    phrases = [f"word{index}" if index % 2 else "cat" for index in range(150)]
    with pytest.raises(RequestRejected, match="Grounding DINO reads at most 256"):
        exported.detect(cat, phrases, 0.3, 0.25)


def test_the_text_encoder_runs_once_for_the_images_of_one_prompt(
    each_runtime: OnnxGroundingDino, onnx_settings: Settings, cat: Image.Image, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a detector that counts its text encoder's runs
    settings = onnx_settings.detection.model_copy(update={"detector_runtime": each_runtime.runtime})
    detector = load_onnx_detector(each_runtime.folder, settings)
    encoder = detector.text_session()
    runs: list[object] = []
    monkeypatch.setattr(encoder, "run", lambda *args: runs.append(args) or type(encoder).run(encoder, *args))
    # WHEN it detects in images of two sizes with one prompt, then with another
    tall = cat.transpose(Image.Transpose.ROTATE_90)
    found = [detector.detect(image, ["cat", "remote control"], 0.0, 0.0) for image in (cat, tall, cat)]
    detector.detect(cat, ["dog"], 0.0, 0.0)
    # THEN the text was encoded once per prompt
    assert len(runs) == 2
    # AND the encoding kept for the prompt finds what encoding it anew finds
    assert (
        found[2]
        == found[0]
        == load_onnx_detector(each_runtime.folder, settings).detect(cat, ["cat", "remote control"], 0.0, 0.0)
    )


def test_openvino_lets_go_of_the_weights_it_read_while_compiling_unless_they_are_in_memory_files(
    exported: OnnxGroundingDino, onnx_settings: Settings, cat: Image.Image, tmp_path
) -> None:
    import os

    settings = onnx_settings.detection.model_copy(update={"detector_runtime": "openvino"})
    # GIVEN the export on disk, and a copy whose weights are in a memory file (as Lambda reads an s3:// export)
    folder = shutil.copytree(exported.folder, tmp_path / "export", ignore=shutil.ignore_patterns(WEIGHTS_FILE))
    memory_file = os.memfd_create(WEIGHTS_FILE)
    os.write(memory_file, (exported.folder / WEIGHTS_FILE).read_bytes())
    (folder / WEIGHTS_FILE).symlink_to(f"/proc/self/fd/{memory_file}")
    # WHEN OpenVINO has compiled a size of each (into its own layout of the weights) and detected with it
    for export in (exported.folder, folder):
        load_onnx_detector(export, settings).detect(cat, ["cat"], 0.3, 0.25)
    # THEN little of the file on disk stays in the process's memory, as the file holds it
    on_disk = (exported.folder / WEIGHTS_FILE).resolve()
    assert mapped_resident_kb(on_disk) < 0.25 * on_disk.stat().st_size / 1024
    # AND the memory file's pages stay counted: they are in memory whatever the mapping does
    in_memory = (folder / WEIGHTS_FILE).resolve()
    assert mapped_resident_kb(in_memory) > 0.75 * on_disk.stat().st_size / 1024
    os.close(memory_file)


def mapped_resident_kb(path: Path) -> int:
    """How much of the file's mappings in this process is in memory (/proc/self/smaps)."""
    resident, in_file = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            in_file = line.endswith(f" {path}")
        elif in_file and fields[0] == "Rss:":
            resident += int(fields[1])
    return resident
