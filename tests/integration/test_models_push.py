"""`annotate models push --stack` uploads where the stack's outputs say, and the uploaded models load from S3."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from typer.testing import CliRunner

from shared.models.classification import load_classifier
from shared.models.sources import resolve_model_file
from shared.settings import Settings
from shared.storage import objects as storage
from tests.gguf_factory import write_tiny_llama
from tests.unit.test_workflow_definition import template
from tools.cli import app
from tools.models.push import MODEL_OUTPUTS

pytestmark = pytest.mark.slow
REGION = "eu-central-1"


def test_the_stack_outputs_a_location_for_every_model_a_push_uploads() -> None:
    assert set(template()["Outputs"]) >= set(MODEL_OUTPUTS)


def _stack_with_model_outputs(prefix: str) -> None:
    outputs = {
        "ClassifierModelUri": {"Value": f"s3://models-bucket/{prefix}convnext/"},
        "CaptionModelUri": {"Value": f"s3://models-bucket/{prefix}captions/model.gguf"},
    }
    body = {"Resources": {"Models": {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": "models-bucket"}}}}
    boto3.client("cloudformation", region_name=REGION).create_stack(
        StackName="annotate", TemplateBody=json.dumps(body | {"Outputs": outputs})
    )


def test_pushed_tiny_models_land_where_the_stack_reads_them_and_load(
    tiny_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = write_tiny_llama(tmp_path / "tiny.gguf")  # the packaged Gemma is 253 MB: too slow for moto
    monkeypatch.setenv("ANNOTATE_CAPTION_MODEL", str(gguf))
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        storage.refresh_clients()
        # GIVEN a stack deployed with its own model parameters (folders that are not the defaults)
        _stack_with_model_outputs("team/")

        # WHEN the models are pushed to it by name
        result = CliRunner().invoke(app, ["models", "push", "--stack", "annotate", "--profile", "tiny"])

        # THEN each went where the stack's outputs say, and loads from there
        assert result.exit_code == 0, result.output
        assert f"CaptionModelUri: {gguf} -> s3://models-bucket/team/captions/model.gguf (1 files" in result.output
        deployed = tiny_settings.model_copy(
            update={"classifier_model": "s3://models-bucket/team/convnext/", "model_cache_dir": tmp_path}
        )
        assert len(load_classifier(deployed.describe).labels) == 1000
        assert (
            resolve_model_file("s3://models-bucket/team/captions/model.gguf", deployed.model_files).read_bytes()[:4]
            == b"GGUF"
        )
    storage.refresh_clients()


def test_a_stack_that_does_not_exist_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        result = CliRunner().invoke(app, ["models", "push", "--stack", "nothing-here"])
    assert result.exit_code != 0
    assert "stack 'nothing-here'" in result.output
