"""Classify's and Tag's exports on ONNX Runtime (and the classifier's on OpenVINO) give torch's numbers on the same
weights, and their torch-free preprocessing and tokenizer give what the libraries' own do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from shared.models.cache import forget_loaded_models
from shared.models.classification import CLASSIFIER_GRAPH, CLASSIFIER_MANIFEST, ClassifierExport, load_classifier
from shared.models.onnx_runtime import find_export, openvino_graph_file, openvino_session, ort_session, weights_file
from shared.models.tagging import (
    IMAGE_GRAPH,
    TAGGER_MANIFEST,
    TEXT_GRAPH,
    TOKENIZER_FILE,
    ClipExport,
    clip_export_dir,
    load_tagger,
)
from shared.settings import Settings
from tests.integration.test_describe import CAT
from tools.models.tiny_models import build_model
from tools.models.torch_models import load_torch_classifier, load_torch_tagger, weights_revision

pytestmark = pytest.mark.slow

CROPS = [CAT, CAT.rotate(90, expand=True), CAT.crop((0, 0, 120, 80))]


def test_the_onnx_classifier_gives_torchs_logits_and_classes(tiny_settings: Settings) -> None:
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    folder = find_export(tiny_settings.classifier_model, tiny_settings.model_files, CLASSIFIER_MANIFEST)
    export = ClassifierExport.model_validate_json((folder / CLASSIFIER_MANIFEST).read_text())
    checkpoint = build_model(tiny_settings.classifier_model, tiny_settings.model_files)
    model = AutoModelForImageClassification.from_pretrained(checkpoint).eval()
    processor = AutoImageProcessor.from_pretrained(checkpoint)
    # GIVEN the same pixels: the graph gives torch's logits
    pixels = export.preprocess(CROPS)
    with torch.inference_mode():
        expected = model(pixel_values=torch.from_numpy(pixels)).logits.numpy()
    logits = ort_session(folder / CLASSIFIER_GRAPH, 1).run(None, {"pixel_values": pixels})[0]
    assert np.abs(logits - expected).max() < 1e-4
    # AND Pillow's preprocessing is within two grey levels of the processor's (torchvision's resize)
    reference = processor(images=CROPS, return_tensors="np")["pixel_values"]
    std = np.float32(export.image_std)[:, None, None]
    assert np.abs((pixels - reference) * std).max() < 2.5 / 255
    # AND the two runtimes classify the crops alike
    torch_side, onnx_side = load_torch_classifier(tiny_settings.describe), load_classifier(tiny_settings.describe)
    labels = ["cat", "dog", "hamster"]
    assert [[c.label for c in r] for r in onnx_side.classify(CROPS, labels, 3)] == [
        [c.label for c in r] for r in torch_side.classify(CROPS, labels, 3)
    ]


def test_the_classifiers_openvino_form_gives_torchs_logits_and_the_same_scores(
    tiny_settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = find_export(tiny_settings.classifier_model, tiny_settings.model_files, CLASSIFIER_MANIFEST)
    export = ClassifierExport.model_validate_json((folder / CLASSIFIER_MANIFEST).read_text())
    graph = folder / CLASSIFIER_GRAPH
    pixels = export.preprocess(CROPS)
    # GIVEN the export's ONNX graph and its OpenVINO form, which reads the same weights file
    on_onnx = ort_session(graph, 1).run(None, {"pixel_values": pixels})[0]
    # WHEN OpenVINO runs it
    on_openvino = openvino_session(openvino_graph_file(graph), weights_file(graph), 1).run(
        None, {"pixel_values": pixels}
    )[0]
    # THEN the logits are ONNX Runtime's (and so torch's, above) to float rounding
    assert np.abs(on_openvino - on_onnx).max() < 1e-4
    # AND the classifier on classifier_runtime=openvino, loaded afresh, gives the same classes and scores
    settings = tiny_settings.describe
    labels = ["cat", "dog", "hamster"]
    forget_loaded_models()
    openvino_side = load_classifier(settings.model_copy(update={"classifier_runtime": "openvino"}))
    assert openvino_side.classify(CROPS, labels, 3) == load_classifier(settings).classify(CROPS, labels, 3)
    loaded = [json.loads(line) for line in capsys.readouterr().err.splitlines() if '"classifier loaded"' in line]
    assert loaded[0]["runtime"] == "openvino"


def test_an_export_without_its_openvino_form_classifies_on_onnx_runtime_and_says_so(
    tiny_settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a classifier export made before exports had OpenVINO's form
    folder = find_export(tiny_settings.classifier_model, tiny_settings.model_files, CLASSIFIER_MANIFEST)
    older = shutil.copytree(folder, tmp_path / "older-export")
    openvino_graph_file(older / CLASSIFIER_GRAPH).unlink()
    settings = tiny_settings.describe.model_copy(update={"classifier_model": str(older)})
    # WHEN the settings ask for OpenVINO
    classifier = load_classifier(settings.model_copy(update={"classifier_runtime": "openvino"}))
    # THEN it classifies as ONNX Runtime does, and the log says why and what to do
    labels = ["cat", "dog", "hamster"]
    assert classifier.classify(CROPS, labels, 3) == load_classifier(settings).classify(CROPS, labels, 3)
    [warning] = [json.loads(line) for line in capsys.readouterr().err.splitlines() if "no OpenVINO form" in line]
    assert warning["level"] == "WARNING" and "annotate models push" in warning["message"]


def test_the_onnx_clip_towers_give_torchs_features(tiny_settings: Settings) -> None:
    import open_clip

    source = (tiny_settings.tagger_models or [""])[0]
    folder = clip_export_dir(source, tiny_settings.model_files)
    export = ClipExport.model_validate_json((folder / TAGGER_MANIFEST).read_text())
    checkpoint = build_model(source, tiny_settings.model_files)
    model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{checkpoint}")
    model = model.eval()
    tokenizer = open_clip.get_tokenizer(f"local-dir:{checkpoint}")
    # GIVEN open_clip's own preprocessing and tokens: the project's equal them
    pixels = export.preprocess(CROPS)
    assert np.abs(pixels - torch.stack([preprocess(crop) for crop in CROPS]).numpy()).max() < 1e-5
    from tokenizers import Tokenizer

    texts = ["a photo of a brown dog", "a photo of a black-and-white t-shirt", "A Photo of a GOLDEN retriever's hat!"]
    tokens = export.tokens(Tokenizer.from_file(str(folder / TOKENIZER_FILE)), [*texts, "very " * 100 + "long"])
    assert (tokens == tokenizer([*texts, "very " * 100 + "long"]).numpy()).all()
    # THEN both towers give torch's features
    with torch.inference_mode():
        images = model.encode_image(torch.from_numpy(pixels)).numpy()
        text = model.encode_text(torch.from_numpy(tokens)).numpy()
    assert np.abs(ort_session(folder / IMAGE_GRAPH, 1).run(None, {"pixels": pixels})[0] - images).max() < 1e-4
    assert np.abs(ort_session(folder / TEXT_GRAPH, 1).run(None, {"tokens": tokens})[0] - text).max() < 1e-4
    assert export.logit_scale == pytest.approx(float(model.logit_scale.exp()))
    # AND the two runtimes tag alike
    torch_side, onnx_side = load_torch_tagger(tiny_settings.describe), load_tagger(tiny_settings.describe)
    vocabularies = {"color": ["red", "brown", "white"], "pattern": ["striped", "plain"]}
    labels = ["cat", "dog", "cat"]
    ours, theirs = onnx_side.tag(CROPS, labels, vocabularies), torch_side.tag(CROPS, labels, vocabularies)
    assert [[a.value for a in r] for r in ours] == [[a.value for a in r] for r in theirs]
    for mine, other in zip(ours, theirs, strict=True):
        assert all(abs(a.score - b.score) < 1e-3 for a, b in zip(mine, other, strict=True))
    # AND both name the weights' one revision, which other weights under the same name do not share
    assert onnx_side.revision == torch_side.revision == export.revision == weights_revision(model)
    assert len(export.revision) == 16 and int(export.revision, 16) >= 0
    with torch.no_grad():
        next(model.parameters()).add_(1e-3)
    assert weights_revision(model) != export.revision
