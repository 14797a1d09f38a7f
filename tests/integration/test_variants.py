"""Variants with stable-diffusion.cpp on a random-weight SDXS-style model, and the Fargate entrypoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from pydantic import ValidationError

from shared.contracts import AnnotationRequest, ImageRef, ImageTask, PromptMessage
from shared.models.variants import load_generator
from shared.pipeline.dependencies import Dependencies, Step, build_dependencies
from shared.pipeline.variants_task import run_variant_job
from shared.settings import Settings
from shared.storage import layout
from tests.conftest import REPO, SAMPLES

pytestmark = pytest.mark.slow


def job(results: Path, **variants: object) -> ImageTask:
    """An image task whose request asks for variants: the Variants container's job."""
    request = {"prompt": "a watercolor painting of a cat", "size": 128, "steps": 1, **variants}
    return ImageTask(
        batch_id="b-" + "0" * 20,
        request=AnnotationRequest(prompt="cat.", variants=request),
        image=ImageRef(image_id="0123456789abcdef", source_uri=str(SAMPLES / "chelsea-the-cat.jpg")),
        results_uri=str(results),
    )


@pytest.fixture(scope="module")
def variants_settings(tiny_settings: Settings) -> Settings:
    from tools.models.tiny_models import build_named_models

    build_named_models(tiny_settings, variants=True)
    return tiny_settings


@pytest.fixture(scope="module")
def generating(variants_settings: Settings) -> Dependencies:
    return build_dependencies(Step.VARIANTS, variants_settings)


@pytest.mark.parametrize(
    ("variants", "reason"),
    [
        ({"prompt": "x", "count": 1000}, "less than or equal to 4"),
        ({"prompt": "x", "steps": 500}, "less than or equal to 50"),
        ({"prompt": "x", "size": 10000}, "10000 px is outside 128 to 768 px"),
        ({"prompt": "x", "size": 200}, "not a multiple of 64"),
        ({"prompt": "x" * 301}, "at most 300 characters"),
        ({"prompt": ""}, "at least 1 character"),
    ],
)
def test_out_of_bounds_variant_requests_are_refused_before_any_model_loads(variants: dict, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        PromptMessage(prompt="cat.", images=["a.jpg"], variants=variants)


def test_img2img_variants_are_written_with_their_seeds_and_are_reproducible(
    generating: Dependencies, tmp_path: Path
) -> None:
    first = run_variant_job(job(tmp_path / "a", count=2), generating)
    again = run_variant_job(job(tmp_path / "b", count=2), generating)

    assert [v.seed for v in first.images] == [first.images[0].seed, first.images[0].seed + 1]
    assert [v.seed for v in again.images] == [v.seed for v in first.images]  # derived from the image: stable
    for one, other in zip(first.images, again.images, strict=True):
        assert Image.open(one.uri).size == (128, 128)
        assert Path(one.uri).read_bytes() == Path(other.uri).read_bytes()
    task = job(tmp_path / "a", count=2)
    document_uri = layout.variants_document(task.results_uri, task.batch_id, task.image.image_id)
    assert json.loads(Path(document_uri).read_text())["images"][0]["uri"] == first.images[0].uri


def test_an_explicit_seed_is_used_and_txt2img_needs_no_image(generating: Dependencies, tmp_path: Path) -> None:
    text_only = job(tmp_path, mode="txt2img", seed=1234)
    text_only = text_only.model_copy(update={"image": text_only.image.model_copy(update={"source_uri": "/missing"})})
    output = run_variant_job(text_only, generating)
    assert output.mode == "txt2img" and [v.seed for v in output.images] == [1234]


def test_the_generator_is_loaded_once_per_process(variants_settings: Settings) -> None:
    assert load_generator(variants_settings.variants) is load_generator(variants_settings.variants)


def run_entrypoint(job_json: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "ANNOTATE_PROFILE": "tiny", "ANNOTATE_VARIANT_JOB": job_json}
    return subprocess.run(
        [sys.executable, "-m", "shared.pipeline.variants_task"],
        capture_output=True,
        text=True,
        env=environment,
        cwd=REPO,
        check=False,
        timeout=300,
    )


def test_the_container_entrypoint_runs_its_job_and_exits_zero(variants_settings: Settings, tmp_path: Path) -> None:
    result = run_entrypoint(job(tmp_path).model_dump_json(), tmp_path)
    assert result.returncode == 0, result.stderr
    task = job(tmp_path)
    assert Image.open(layout.variant_picture(task.results_uri, task.batch_id, task.image.image_id, 0)).size == (
        128,
        128,
    )


def test_the_container_entrypoint_exits_non_zero_with_the_reason_in_its_log(tmp_path: Path) -> None:
    malformed = job(tmp_path).model_dump(mode="json")
    malformed["request"]["variants"]["count"] = 1000
    result = run_entrypoint(json.dumps(malformed), tmp_path)
    assert result.returncode == 1
    [failure] = [json.loads(line) for line in result.stderr.splitlines() if '"variants failed"' in line]
    assert "malformed job" in failure["reason"] and "request.variants.count" in failure["reason"]
