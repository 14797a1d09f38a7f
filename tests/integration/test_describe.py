"""Classify (ConvNeXt) and Tag (open_clip) on tiny real models: batching, filters, caching, fallbacks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from shared.contracts import AnnotationRequest, Box, BoxEmbeddings, DescribeInput, Detection, ImageRef, ImageTask
from shared.errors import ModelUnavailable
from shared.models.classification import LABELS_FILE, TORCHSCRIPT_FILE, allowed_class_ids, load_classifier
from shared.models.sources import resolve_model_dir
from shared.models.tagging import load_tagger
from shared.pipeline import steps
from shared.pipeline.dependencies import Dependencies, Step, build_dependencies
from shared.settings import Settings
from tests.conftest import SAMPLES
from tools.models.describe_export import exported_classifier_dir
from tools.models.tiny_models import imagenet_labels

pytestmark = pytest.mark.slow
CAT = Image.open(SAMPLES / "chelsea-the-cat.jpg").convert("RGB")
DOG_BREEDS = set(imagenet_labels()[151:269])
CATS = set(imagenet_labels()[281:286])


def describe_input(boxes: list[tuple[str, Box]], **request: object) -> DescribeInput:
    task = ImageTask(
        batch_id="b-" + "0" * 20,
        request=AnnotationRequest(prompt="dog. cat.", **request),
        image=ImageRef(image_id="0" * 16, source_uri=str(SAMPLES / "chelsea-the-cat.jpg")),
        results_uri="/unused",
    )
    return DescribeInput(task=task, detections=[Detection(label=label, score=0.9, box=box) for label, box in boxes])


def deps(settings: Settings, step: Step) -> Dependencies:
    return build_dependencies(step, settings)


BOXES = [("cat", Box(x0=0, y0=0, x1=200, y1=150)), ("dog", Box(x0=100, y0=50, x1=400, y1=300))]


def test_all_boxes_of_an_image_are_classified_in_one_forward(tiny_settings: Settings) -> None:
    classifier = load_classifier(tiny_settings.describe)
    calls = []
    original = classifier.forward
    classifier.forward = lambda crops: calls.append(len(crops)) or original(crops)
    try:
        output = steps.classify(describe_input(BOXES * 3, top_k=2), deps(tiny_settings, Step.CLASSIFY))
    finally:
        classifier.forward = original
    assert calls == [6]
    assert all(len(box.top_k) == 2 for box in output.classes)


def test_a_filtered_label_is_scored_only_against_its_classes(tiny_settings: Settings) -> None:
    output = steps.classify(
        describe_input([*BOXES, ("hamster", BOXES[0][1])], top_k=5), deps(tiny_settings, Step.CLASSIFY)
    )
    cat, dog, hamster = output.classes
    assert {c.label for c in cat.top_k} <= CATS
    assert {c.label for c in dog.top_k} <= DOG_BREEDS
    assert len(hamster.top_k) == 5  # no filter for hamster: any ImageNet class
    assert sum(c.score for c in cat.top_k) == pytest.approx(1.0, abs=0.01)  # 5 cat classes hold all the mass


def test_class_filters_take_names_and_id_ranges_and_reject_unknown_ones() -> None:
    labels = ["a", "b", "c", "d"]
    assert allowed_class_ids(["1-2", "d"], labels) == [1, 2, 3]
    with pytest.raises(ModelUnavailable, match="not a class"):
        allowed_class_ids(["zebra"], labels)
    with pytest.raises(ModelUnavailable, match="outside"):
        allowed_class_ids(["3-9"], labels)


def test_a_traced_torchscript_classifier_with_a_label_list_loads(tiny_settings: Settings, tmp_path: Path) -> None:
    from transformers import ConvNextForImageClassification

    hf_model = ConvNextForImageClassification.from_pretrained(
        resolve_model_dir("tiny:convnext", tiny_settings.model_files)
    )

    class LogitsOnly(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = hf_model.eval()

        def forward(self, pixels: torch.Tensor) -> torch.Tensor:
            return self.model(pixel_values=pixels).logits

    torch.jit.trace(LogitsOnly(), torch.rand(1, 3, 224, 224)).save(str(tmp_path / TORCHSCRIPT_FILE))
    (tmp_path / LABELS_FILE).write_text("\n".join(imagenet_labels()))
    settings = tiny_settings.model_copy(update={"classifier_model": str(tmp_path)})
    exported_classifier_dir(settings.describe)  # as `annotate models export` does

    output = steps.classify(describe_input(BOXES), deps(settings, Step.CLASSIFY))

    assert {c.label for c in output.classes[0].top_k} <= CATS


def test_a_torchscript_folder_without_labels_is_refused(tiny_settings: Settings, tmp_path: Path) -> None:
    (tmp_path / TORCHSCRIPT_FILE).write_bytes(b"")
    with pytest.raises(ModelUnavailable, match="class names"):
        exported_classifier_dir(tiny_settings.model_copy(update={"classifier_model": str(tmp_path)}).describe)


def test_tags_use_the_request_vocabularies(tiny_settings: Settings) -> None:
    output = steps.tag(
        describe_input(BOXES, attributes={"size": ["small", "large"], "mood": ["calm"]}), deps(tiny_settings, Step.TAG)
    )
    assert len(output.tags) == len(BOXES)
    for box in output.tags:
        assert [(a.name, a.value in {"small", "large"}) for a in box.attributes] == [("size", True), ("mood", False)]
        assert box.attributes[1].value == "calm" and box.attributes[1].score == 1.0


def test_boxes_asked_for_keep_each_crop_s_embedding_and_the_same_tags(tiny_settings: Settings, tmp_path: Path) -> None:
    boxes = [("cat", Box(x0=500, y0=400, x1=600, y1=500)), *BOXES]  # the first box has no crop

    def task(embeddings: str) -> DescribeInput:
        described = describe_input(boxes, embeddings=embeddings)
        return described.model_copy(update={"task": described.task.model_copy(update={"results_uri": str(tmp_path)})})

    tag = deps(tiny_settings, Step.TAG)
    image_only, with_boxes = steps.tag(task("image"), tag), steps.tag(task("boxes"), tag)

    assert with_boxes.tags == image_only.tags and with_boxes.embedding == image_only.embedding
    assert image_only.box_embeddings_uri is None and with_boxes.box_embeddings_uri is not None
    document = BoxEmbeddings.model_validate_json(Path(with_boxes.box_embeddings_uri).read_bytes())
    assert document.model == "tiny:clip" and document.vectors[0] is None
    # each vector is the CLIP image tower's on the box's crop, unit length (the tags were scored with it)
    crops = steps.box_crops(task("boxes"), tag)[1:]
    expected = load_tagger(tiny_settings.describe).embed_images(crops)  # type: ignore[arg-type]
    assert np.array_equal(np.array(document.vectors[1:], np.float32), expected)
    assert np.linalg.norm(expected, axis=1) == pytest.approx([1, 1], abs=1e-6)


def test_choices_that_may_hold_together_are_each_weighed_on_their_own_not_shared_out(tiny_settings: Settings) -> None:
    tagger = load_tagger(tiny_settings)
    options = ["a cat", "a sofa", "a window", "a plant", "a rug", "a lamp"]
    one = {"one": options}
    # WHEN six options are scored for a control of one choice and for one of several
    single = tagger.choose(CAT, one)["one"]
    several = tagger.choose(CAT, {"several": options}, independent={"several"})["several"]
    # THEN one shares one probability among them; several give each option its own, against a photo of anything
    assert sum(single) == pytest.approx(1.0, abs=1e-3)
    assert all(0.0 < p < 1.0 for p in several) and sum(several) != pytest.approx(1.0, abs=0.05)
    # AND an option's own probability does not change with the others offered beside it
    assert tagger.choose(CAT, {"s": options[:2]}, independent={"s"})["s"] == several[:2]


def test_text_embeddings_are_computed_once_per_vocabulary_and_label(tiny_settings: Settings) -> None:
    tagger = load_tagger(tiny_settings.describe)
    vocabularies = {"texture": ["smooth", "fluffy", "wiry"]}
    before = tagger.text_encodings
    tagger.tag([CAT], ["cat"], vocabularies)
    tagger.tag([CAT.rotate(90)], ["cat"], vocabularies)  # a second image, the same vocabulary
    assert tagger.text_encodings == before + 1
    tagger.tag([CAT], ["dog"], vocabularies)  # the label is part of the prompt: a new embedding
    assert tagger.text_encodings == before + 2


def test_the_tagger_falls_back_to_the_next_model_and_says_why(tiny_settings: Settings, tmp_path: Path) -> None:
    settings = tiny_settings.model_copy(update={"tagger_models": [str(tmp_path / "missing"), "tiny:clip"]})
    tagger = load_tagger(settings.describe)
    assert tagger.name == "tiny:clip"
    assert len(tagger.passed_over) == 1 and "does not exist" in tagger.passed_over[0]


def test_no_loadable_tagger_is_an_error_naming_each_model(tiny_settings: Settings, tmp_path: Path) -> None:
    settings = tiny_settings.model_copy(update={"tagger_models": [str(tmp_path / "a"), str(tmp_path / "b")]})
    with pytest.raises(ModelUnavailable, match=r"a: .* \| .*b: "):
        load_tagger(settings.describe)


def test_boxes_that_cannot_be_cropped_are_skipped_with_a_reason(tiny_settings: Settings) -> None:
    boxes = [("cat", Box(x0=500, y0=400, x1=600, y1=500)), BOXES[0]]
    classified = steps.classify(describe_input(boxes), deps(tiny_settings, Step.CLASSIFY))
    tagged = steps.tag(describe_input(boxes), deps(tiny_settings, Step.TAG))
    assert "outside the image" in (classified.classes[0].skipped or "")
    assert "outside the image" in (tagged.tags[0].skipped or "")
    assert classified.classes[1].top_k and tagged.tags[1].attributes
