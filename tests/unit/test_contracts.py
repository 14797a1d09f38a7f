from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from shared.contracts import (
    MAX_PHRASES,
    MAX_PROMPT_CHARS,
    AnnotationRequest,
    Box,
    PromptMessage,
    StepFailure,
    split_phrases,
)


def test_phrases_are_split_on_periods_lowercased_and_deduplicated() -> None:
    assert split_phrases(" Dog.  cat . hamster. DOG. ") == ["dog", "cat", "hamster"]


def test_a_prompt_without_periods_is_one_phrase() -> None:
    assert AnnotationRequest(prompt="golden retriever").phrases == ["golden retriever"]


@pytest.mark.parametrize(
    ("prompt", "reason"),
    [
        (" . . ", "names nothing to detect"),
        ("x" * (MAX_PROMPT_CHARS + 1), "at most"),
        (". ".join(f"thing{i}" for i in range(MAX_PHRASES + 1)), "phrases"),
        ("dog.\x00cat", "control characters"),
        ("a" * 65, "over 64 characters"),
    ],
)
def test_bad_prompts_are_rejected_with_the_reason(prompt: str, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        AnnotationRequest(prompt=prompt)


def test_thresholds_are_bounded() -> None:
    with pytest.raises(ValidationError):
        AnnotationRequest(prompt="dog.", box_threshold=1.5)


def test_a_message_needs_at_least_one_image_and_no_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="at least 1"):
        PromptMessage(prompt="dog.", images=[])
    with pytest.raises(ValidationError, match="Extra inputs"):
        PromptMessage.model_validate({"prompt": "dog.", "images": ["a.jpg"], "colour": "red"})


def test_the_message_request_carries_the_options_without_the_images() -> None:
    message = PromptMessage(prompt="dog.", images=["a.jpg"], box_threshold=0.5)
    assert message.request() == AnnotationRequest(prompt="dog.", box_threshold=0.5)


def test_box_corners_must_be_ordered() -> None:
    assert Box(x0=1, y0=2, x1=3, y1=4).area == 4
    with pytest.raises(ValidationError, match="out of order"):
        Box(x0=5, y0=0, x1=1, y1=1)


def test_a_lambda_error_cause_becomes_a_readable_reason() -> None:
    cause = json.dumps({"errorType": "ImageRejected", "errorMessage": "file is empty", "stackTrace": []})
    assert StepFailure(Error="ImageRejected", Cause=cause).reason == "ImageRejected: file is empty"
    assert StepFailure(Error="States.Timeout", Cause="").reason == "States.Timeout"
    assert StepFailure(Error="States.Runtime", Cause="boom").reason == "States.Runtime: boom"


def test_requests_default_to_color_and_pattern_vocabularies() -> None:
    assert set(AnnotationRequest(prompt="dog.").attributes) == {"color", "pattern"}


@pytest.mark.parametrize(
    ("attributes", "reason"),
    [
        ({"color": []}, "empty vocabulary"),
        ({"color": [f"c{i}" for i in range(33)]}, "at most 32"),
        ({f"a{i}": ["x"] for i in range(9)}, "at most 8"),
        ({"Color!": ["red"]}, "lower-case"),
        ({"color": ["x" * 41]}, "printable characters"),
        ({"color": ["red", "red"]}, "repeats"),
    ],
)
def test_bad_vocabularies_are_rejected_before_any_model_runs(attributes: dict, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        AnnotationRequest(prompt="dog.", attributes=attributes)


def test_with_variants_a_request_is_measured_as_ecs_receives_it_and_the_largest_fits_its_overrides() -> None:
    from shared.contracts import MAX_ATTRIBUTE_VALUES, ImageRef, ImageTask, VariantsRequest

    variants = VariantsRequest(prompt="a watercolor")
    # GIVEN attribute values of quotes, each one escaped in the override's JSON (States.JsonToString, then RunTask)
    values = [f"{index:02d}" + '"' * 38 for index in range(MAX_ATTRIBUTE_VALUES)]
    # WHEN a request with variants grows by a vocabulary at a time THEN it is refused once its escaped size is over,
    # though unescaped (as the check measured it before) the refused one was still under the cap
    admitted = None
    for count in range(1, 9):
        attributes = {f"v{n}": values for n in range(count)}
        try:
            admitted = AnnotationRequest(prompt="cat.", attributes=attributes, variants=variants)
        except ValidationError as error:
            assert "as ECS receives it" in str(error)
            unchecked = AnnotationRequest(prompt="cat.", attributes=attributes).model_copy(
                update={"variants": variants}
            )
            assert len(unchecked.model_dump_json()) < 6_000
            break
    else:
        raise AssertionError("no request was refused")
    assert admitted is not None
    # AND the largest admitted, in an image task with the longest key S3 allows, fits ECS's 8,192 characters
    image = ImageRef(image_id="0" * 16, source_uri=f"s3://{'b' * 63}/{'k' * 1024}")
    task = ImageTask(
        batch_id="b-" + "0" * 20, request=admitted, image=image, results_uri=f"s3://{'r' * 63}/{'p' * 200}"
    )
    overrides = {
        "containerOverrides": [
            {"name": "variants", "environment": [{"name": "ANNOTATE_VARIANT_JOB", "value": task.model_dump_json()}]}
        ]
    }
    assert len(json.dumps(overrides, separators=(",", ":"), ensure_ascii=False)) <= 8_192


def test_an_image_s_embedding_takes_a_small_part_of_the_state_s_256_kib() -> None:
    import numpy as np

    from shared.contracts import ImageEmbedding, TagOutput, float32_values

    # the largest CLIP the defaults name has 768 values; a ViT-L's 1,024, float32 values dumped as Tag writes them
    vector = np.random.default_rng(0).normal(size=1024).astype(np.float32)
    vector /= np.linalg.norm(vector)
    output = TagOutput(
        tags=[],
        ms=1.0,
        embedding=ImageEmbedding(model="timm/vit_large", revision="0" * 16, vector=float32_values(vector)),
    )
    dumped = output.model_dump_json().encode()
    assert len(dumped) < 14 * 1024 < 256 * 1024
    # AND the vector survives the state's JSON exactly, as float32
    again = TagOutput.model_validate_json(dumped).embedding
    assert again is not None and np.array_equal(np.array(again.vector, dtype=np.float32), vector)


def test_a_vector_s_values_are_written_short_and_read_back_as_the_same_float32s() -> None:
    import numpy as np

    from shared.contracts import float32_values

    rng = np.random.default_rng(1)
    for scale in (1e-8, 1e-3, 1.0, 1e5):
        values = (rng.normal(size=100_000) * scale).astype(np.float32)
        written = float32_values(values)
        assert np.array_equal(np.array(written, np.float32), values)
        assert max(len(repr(value)) for value in written) <= 15  # sign, 9 digits, point, exponent
