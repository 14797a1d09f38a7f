"""`annotate models push` uploads where the template reads from, and the uploaded models load from S3."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from typer.testing import CliRunner

from shared import storage
from shared.classification import load_classifier
from shared.cli import app
from shared.model_sources import resolve_model_file
from shared.models_push import MODEL_LOCATIONS
from shared.settings import Settings
from tests.gguf_factory import write_tiny_llama
from tests.unit.test_workflow_definition import template

pytestmark = pytest.mark.slow


def test_the_push_locations_are_the_template_defaults() -> None:
    parameters = template()["Parameters"]
    assert {name: parameters[name]["Default"] for name in MODEL_LOCATIONS} == MODEL_LOCATIONS


def test_pushed_tiny_models_load_from_the_models_bucket(
    tiny_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = write_tiny_llama(tmp_path / "tiny.gguf")  # the packaged Gemma is 253 MB: too slow for moto
    monkeypatch.setenv("ANNOTATE_CAPTION_MODEL", str(gguf))
    with mock_aws():
        storage._s3_store.cache_clear()
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="models-bucket")

        result = CliRunner().invoke(app, ["models", "push", "--bucket", "models-bucket", "--profile", "tiny"])

        assert result.exit_code == 0, result.output
        assert f"CaptionModel: {gguf} -> s3://models-bucket/models/caption.gguf (1 files" in result.output
        deployed = tiny_settings.model_copy(
            update={"classifier_model": "s3://models-bucket/models/convnext-tiny-224/", "model_cache_dir": tmp_path}
        )
        assert len(load_classifier(deployed).labels) == 1000
        assert resolve_model_file("s3://models-bucket/models/caption.gguf", deployed).read_bytes()[:4] == b"GGUF"
    storage._s3_store.cache_clear()
