"""ONNX Runtime serves the same numbers as torch on the same weights (Classify and the Tag image tower)."""

from __future__ import annotations

import pytest
import torch

from shared.classification import load_classifier
from shared.settings import Settings
from shared.tagging import load_tagger
from tests.integration.test_describe import CAT

pytestmark = pytest.mark.slow


def both(settings: Settings) -> tuple[Settings, Settings]:
    return (
        settings.model_copy(update={"describe_runtime": "torch"}),
        settings.model_copy(update={"describe_runtime": "onnx"}),
    )


def test_the_onnx_classifier_matches_torch(tiny_settings: Settings) -> None:
    torch_side, onnx_side = (load_classifier(s.description) for s in both(tiny_settings))
    pixels = torch_side.preprocess([CAT, CAT.rotate(90), CAT.crop((0, 0, 120, 80))])
    with torch.inference_mode():
        expected = torch_side.forward(pixels)
    assert torch.allclose(onnx_side.forward(pixels), expected, atol=1e-4, rtol=1e-4)
    labels = ["cat", "dog", "hamster"]
    crops = [CAT, CAT.rotate(90), CAT.crop((0, 0, 120, 80))]
    assert [[c.label for c in r] for r in onnx_side.classify(crops, labels, 3)] == [
        [c.label for c in r] for r in torch_side.classify(crops, labels, 3)
    ]


def test_the_onnx_clip_image_tower_matches_torch(tiny_settings: Settings) -> None:
    torch_side, onnx_side = (load_tagger(s.description) for s in both(tiny_settings))
    pixels = torch.stack([torch_side.preprocess(CAT), torch_side.preprocess(CAT.rotate(90))])
    with torch.inference_mode():
        expected = torch_side.model.encode_image(pixels)
    assert onnx_side.encode_image is not None and torch_side.encode_image is None
    assert torch.allclose(onnx_side.encode_image(pixels), expected, atol=1e-4, rtol=1e-3)
    vocabularies = {"color": ["red", "brown", "white"]}
    assert [[a.value for a in r] for r in onnx_side.tag([CAT], ["cat"], vocabularies)] == [
        [a.value for a in r] for r in torch_side.tag([CAT], ["cat"], vocabularies)
    ]
