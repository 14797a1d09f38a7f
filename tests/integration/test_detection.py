from __future__ import annotations

import pytest
from PIL import Image

from shared.contracts import Detection
from shared.errors import ModelUnavailable
from shared.models.grounding_onnx import load_detector
from shared.models.sources import resolve_model_dir
from shared.settings import Settings
from tests.conftest import SAMPLES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cat() -> Image.Image:
    return Image.open(SAMPLES / "chelsea-the-cat.jpg").convert("RGB")


def test_tiny_detector_returns_boxes_inside_the_image_labelled_with_prompt_phrases(
    tiny_settings: Settings, cat: Image.Image
) -> None:
    detections = load_detector(tiny_settings.detection).detect(
        cat, ["dog", "cat"], box_threshold=0.3, text_threshold=0.25
    )
    assert detections and all(isinstance(d, Detection) for d in detections)
    assert {d.label for d in detections} <= {"dog", "cat"}
    for detection in detections:
        box = detection.box
        assert 0 <= box.x0 < box.x1 <= cat.width and 0 <= box.y0 < box.y1 <= cat.height
        assert detection.score >= 0.3
    assert [d.score for d in detections] == sorted((d.score for d in detections), reverse=True)


def test_detection_is_bounded_and_thresholded(tiny_settings: Settings, cat: Image.Image) -> None:
    few = load_detector(tiny_settings.detection.model_copy(update={"max_detections": 3}))
    assert len(few.detect(cat, ["dog", "cat"], 0.0, 0.0)) == 3
    assert load_detector(tiny_settings.detection).detect(cat, ["dog"], box_threshold=1.0, text_threshold=1.0) == []


def test_multi_word_phrases_keep_their_label(tiny_settings: Settings, cat: Image.Image) -> None:
    phrases = ["golden retriever", "tabby cat", "hamster"]
    detections = load_detector(tiny_settings.detection).detect(cat, phrases, 0.0, 0.0)
    # at thresholds of 0 every query box is kept: each is labelled with a whole phrase, never a word of one, and
    # the two-word phrases are among them (the tiny model's 20 boxes carry all three)
    labels = {d.label for d in detections}
    assert detections and labels <= set(phrases) and {"golden retriever", "tabby cat"} & labels


def test_the_detector_is_loaded_once_per_process(tiny_settings: Settings) -> None:
    assert load_detector(tiny_settings.detection) is load_detector(tiny_settings.detection)


def test_an_unreachable_hub_model_says_what_to_do(tmp_path) -> None:
    settings = Settings(hf_offline=True, model_cache_dir=tmp_path, detector_model="IDEA-Research/not-cached-here")
    with pytest.raises(ModelUnavailable, match="--profile tiny"):
        resolve_model_dir(settings.detector_model, settings.model_files)


def test_a_missing_local_folder_is_reported(tmp_path) -> None:
    with pytest.raises(ModelUnavailable, match="does not exist"):
        resolve_model_dir(str(tmp_path / "absent"), Settings().model_files)
