"""Which deployments publish a new version of the SnapStart functions, as aws-sam-translator (the transform
CloudFormation and the SAM CLI run) decides it: the version's logical id is a hash of what it sees."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tools.rehearsal.stack import MOTO_CONFIG, TEMPLATE_PATH, Deployment, transform

VERSIONED = ("DetectFunction", "ClassifyFunction", "TagFunction", "SegmentFunction", "CaptionFunction", "ApiFunction")


def _packaged(template: dict[str, Any], changed_layer: str | None) -> dict[str, Any]:
    """What `sam package` uploads: every local path replaced by its S3 object, named by its content's hash, so a
    changed layer (``changed_layer``) has another key."""
    packaged = copy.deepcopy(template)
    for logical_id, resource in packaged["Resources"].items():
        properties = resource.get("Properties", {})
        digest = "b2" if logical_id == changed_layer else "a1"
        for key in ("CodeUri", "ContentUri", "DefinitionUri"):
            if key in properties:
                properties[key] = f"s3://artifacts/{logical_id}-{digest}"
    return packaged


def _transformed(template_file: Path, changed_layer: str | None = None) -> dict[str, Any]:
    from moto import mock_aws
    from samtranslator.yaml_helper import yaml_parse

    deployment = Deployment("annotate", "eu-central-1", template_file=template_file)
    with mock_aws(config=MOTO_CONFIG):
        import boto3

        iam = boto3.client("iam", region_name=deployment.region)
        return transform(_packaged(yaml_parse(template_file.read_text()), changed_layer), deployment, iam)


def _versions(template_file: Path, changed_layer: str | None = None) -> dict[str, str]:
    """Each function's version resource (logical id) once transformed."""
    resources = _transformed(template_file, changed_layer)["Resources"]
    return {
        resource["Properties"]["FunctionName"]["Ref"]: logical_id
        for logical_id, resource in resources.items()
        if resource["Type"] == "AWS::Lambda::Version"
    }


def _described_layers(template_file: Path) -> dict[str, set[str]]:
    """The layers (template logical ids) each function's version description names: a new layer version there
    replaces the version, as a changed description does."""
    resources = _transformed(template_file)["Resources"]
    layers = {
        logical_id: source
        for logical_id, resource in resources.items()
        for source in ("SharedLayer", "OpenVinoLayer", "OnnxLayer", "LlamaCppLayer", "ArrowLayer", "ApiLayer")
        if resource["Type"] == "AWS::Lambda::LayerVersion" and logical_id.startswith(source)
    }
    return {
        resource["Properties"]["FunctionName"]["Ref"]: {
            source for layer, source in layers.items() if layer in json.dumps(resource["Properties"]["Description"])
        }
        for resource in resources.values()
        if resource["Type"] == "AWS::Lambda::Version"
    }


@pytest.fixture(scope="module")
def as_deployed() -> dict[str, str]:
    return _versions(TEMPLATE_PATH)


@pytest.mark.parametrize("layer", ["SharedLayer", "OpenVinoLayer", "OnnxLayer", "LlamaCppLayer", "ApiLayer"])
def test_a_new_layer_publishes_a_new_version_of_each_function_that_uses_it(
    as_deployed: dict[str, str], layer: str
) -> None:
    # GIVEN the stack as deployed, WHEN only the layer's content changes (shared/ is in SharedLayer)
    after = _versions(TEMPLATE_PATH, changed_layer=layer)
    # THEN each SnapStart function on that layer gets a new version (its alias moves), and no other one does
    from tools.aws.sam_template import layer_ids, load_template

    resources = load_template()["Resources"]
    on_layer = {f for f in VERSIONED if layer in layer_ids(resources[f]["Properties"]["Layers"])}
    assert on_layer
    described = _described_layers(TEMPLATE_PATH)  # a layer chosen by a condition, which SAM does not hash
    assert {f for f in VERSIONED if after[f] != as_deployed[f] or layer in described[f]} == on_layer
    assert set(as_deployed) == set(VERSIONED)


def test_without_every_property_hashed_a_new_layer_would_leave_the_old_version(tmp_path: Path) -> None:
    # GIVEN the template as it was: versions hashed from code, environment and memory only
    text = TEMPLATE_PATH.read_text().replace("      AutoPublishAliasAllProperties: true\n", "")
    old = tmp_path / "template.yaml"
    old.write_text(text)
    # WHEN the shared layer changes, THEN no SnapStart function gets a new version: they would keep the old code
    before, after = _versions(old), _versions(old, changed_layer="SharedLayer")
    assert all(after[f] == before[f] for f in VERSIONED)


SNAPSTART = {"EnableSnapStart": "true", "EnableApi": "true"}


def test_a_models_only_update_publishes_a_new_version_of_each_model_function() -> None:
    from tools.rehearsal.aws_behaviours import versions_replaced

    # GIVEN the stack deployed with SnapStart, WHEN only ModelsRevision changes (new models were pushed)
    replaced = versions_replaced(_transformed(TEMPLATE_PATH), SNAPSTART, SNAPSTART | {"ModelsRevision": "2"})
    # THEN each model function's version is replaced, and Lambda publishes it (its configuration changed)
    assert sorted(replaced) == sorted(VERSIONED)


def test_a_reserved_concurrency_update_alone_replaces_no_version() -> None:
    from tools.rehearsal.aws_behaviours import versions_replaced

    # Reserved concurrency is the function's, whatever version runs: no version to publish, none to fail
    assert versions_replaced(_transformed(TEMPLATE_PATH), SNAPSTART, SNAPSTART | {"ApiReservedConcurrency": "5"}) == []


def test_without_the_revision_in_the_configuration_a_models_only_update_fails_as_publishversion_does(
    tmp_path: Path,
) -> None:
    from tools.rehearsal.aws_behaviours import PublishFailed, versions_replaced

    # GIVEN the template as it was: ModelsRevision only in each version's description
    text = TEMPLATE_PATH.read_text()
    line = "        ANNOTATE_MODELS_REVISION: !Ref ModelsRevision\n"
    assert line in text
    old = tmp_path / "template.yaml"
    old.write_text(text.replace(line, ""))
    # WHEN only ModelsRevision changes THEN the update fails, naming the function whose version Lambda would not publish
    with pytest.raises(PublishFailed, match="PublishVersion of DetectFunction failed: A version for this Lambda"):
        versions_replaced(_transformed(old), SNAPSTART, SNAPSTART | {"ModelsRevision": "2"})
