"""The ASL, the template and the contracts must agree: placeholders, function names, field names."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.contracts import BatchManifest, ImageTask, WriteResultInput, WriteTableInput
from shared.sam_template import load_template
from shared.workflow import DEFINITION_PATH, FARGATE_PLACEHOLDERS, FUNCTION_PLACEHOLDERS, placeholders, substitute


def template() -> dict[str, Any]:
    return load_template()


def states(definition: dict[str, Any]) -> dict[str, Any]:
    found = dict(definition["States"])
    for state in definition["States"].values():
        if "ItemProcessor" in state:
            found |= states(state["ItemProcessor"])
    return found


DEFINITION = json.loads(DEFINITION_PATH.read_text())
STATES = states(DEFINITION)


def test_every_placeholder_is_substituted_by_the_template() -> None:
    machine = next(r for r in template()["Resources"].values() if r["Type"] == "AWS::Serverless::StateMachine")
    substitutions = machine["Properties"]["DefinitionSubstitutions"]
    assert placeholders() == set(substitutions)
    assert "${" not in substitute({name: "x" for name in substitutions})


def test_every_function_placeholder_has_a_handler_folder() -> None:
    assert placeholders() == set(FUNCTION_PLACEHOLDERS) | set(FARGATE_PLACEHOLDERS)
    for name in FUNCTION_PLACEHOLDERS.values():
        assert (DEFINITION_PATH.parent.parent / "functions" / name / "app.py").is_file()


def test_every_task_has_retry_and_catch() -> None:
    tasks = {name: state for name, state in STATES.items() if state["Type"] == "Task"}
    assert tasks
    for name, state in tasks.items():
        assert state.get("Retry") and state.get("Catch"), name
        assert "States.ALL" not in {e for r in state["Retry"] for e in r["ErrorEquals"]}, f"{name} retries all"


def test_unfilled_placeholders_are_refused() -> None:
    with pytest.raises(ValueError, match="DetectFunctionArn"):
        substitute({})


@pytest.mark.parametrize(
    ("state", "model"),
    [("Detect", ImageTask), ("WriteTable", WriteTableInput)],
)
def test_task_parameters_name_the_fields_of_their_input_model(state: str, model: type) -> None:
    names = {key.removesuffix(".$") for key in STATES[state]["Parameters"]}
    assert names == set(model.model_fields)


def test_map_items_carry_the_manifest_fields_the_image_steps_read() -> None:
    item = {key.removesuffix(".$") for key in STATES["AnnotateImages"]["ItemSelector"]}
    assert item <= set(WriteResultInput.model_fields)
    assert set(ImageTask.model_fields) <= item
    assert STATES["AnnotateImages"]["ItemsPath"].removeprefix("$.") in BatchManifest.model_fields
