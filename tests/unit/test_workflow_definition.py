"""The ASL, the template and the contracts must agree: placeholders, function names, and every state's input and
output against its model."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pydantic import BaseModel, TypeAdapter

from shared.contracts import (
    AnnotationRequest,
    BatchManifest,
    BatchSummary,
    Box,
    BoxAttributes,
    BoxClasses,
    BranchFailure,
    CaptionOutput,
    ClassifyOutput,
    DescribeInput,
    Detection,
    DetectOutput,
    FailedStep,
    ImageOutcome,
    ImageRef,
    ImageState,
    ImageTask,
    StepFailure,
    TagOutput,
    WriteTableInput,
)
from tools.sam_template import load_template
from tools.workflow import DEFINITION_PATH, FARGATE_PLACEHOLDERS, FUNCTION_PLACEHOLDERS, placeholders, substitute


def template() -> dict[str, Any]:
    return load_template()


def states(definition: dict[str, Any]) -> dict[str, Any]:
    found = dict(definition["States"])
    for state in definition["States"].values():
        if "ItemProcessor" in state:
            found |= states(state["ItemProcessor"])
        for branch in state.get("Branches", []):
            found |= states(branch)
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


# --- Each state against its model -------------------------------------------------------------------------------
# A small evaluator of the ASL that the definition uses (JSONPath paths, Parameters, ResultSelector, ResultPath,
# States.JsonToString): enough to feed every state a full per-image state and check what goes in and comes out.

_STEP = re.compile(r"\.(\w+)|\[(\d+)\]")


def read_path(document: Any, path: str, context: dict[str, Any]) -> Any:
    root, rest = (context, path[2:]) if path.startswith("$$") else (document, path[1:])
    for key, index in _STEP.findall(rest):
        root = root[key] if key else root[int(index)]
    return root


def evaluate(template_: Any, document: Any, context: dict[str, Any]) -> Any:
    if isinstance(template_, list):
        return [evaluate(item, document, context) for item in template_]
    if not isinstance(template_, dict):
        return template_
    result = {}
    for key, value in template_.items():
        if not key.endswith(".$"):
            result[key] = evaluate(value, document, context)
        elif value.startswith("States.JsonToString("):
            result[key[:-2]] = json.dumps(read_path(document, value.removeprefix("States.JsonToString(")[:-1], context))
        else:
            result[key[:-2]] = read_path(document, value, context)
    return result


def write_path(document: dict[str, Any], path: str | None, value: Any) -> dict[str, Any]:
    if path is None:
        return document
    copy = json.loads(json.dumps(document))
    keys = path.removeprefix("$.").split(".")
    target = copy
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    target[keys[-1]] = value
    return copy


def state_input(state: dict[str, Any], document: Any, context: dict[str, Any] | None = None) -> Any:
    effective = read_path(document, state.get("InputPath", "$"), {})
    return evaluate(state["Parameters"], effective, context or {}) if "Parameters" in state else effective


def state_output(state: dict[str, Any], document: Any, result: Any) -> Any:
    if "ResultSelector" in state:
        result = evaluate(state["ResultSelector"], result, {})
    return write_path(document, state.get("ResultPath", "$.__whole__"), result) if "ResultPath" in state else result


def dumped(model: BaseModel) -> Any:
    return json.loads(model.model_dump_json())


REQUEST = AnnotationRequest(prompt="dog. cat.", variants={"prompt": "a watercolor"})
IMAGE = ImageRef(image_id="0123456789abcdef", source_uri="s3://in/dog.jpg")
MANIFEST = BatchManifest(batch_id="b-" + "1" * 20, request=REQUEST, images=[IMAGE], results_uri="s3://out")
TASK = ImageTask(batch_id=MANIFEST.batch_id, request=REQUEST, image=IMAGE, results_uri="s3://out")
DETECTION = DetectOutput(
    width=64, height=48, detections=[Detection(label="dog", score=0.9, box=Box(x0=1, y0=2, x1=30, y1=40))], ms=9.5
)
FAILURE = StepFailure(Error="ImageRejected", Cause="file is empty")
CAPTION = CaptionOutput(
    caption="A dog.", model="m", ttft_ms=1, tokens_per_s=1, prompt_tokens=1, completion_tokens=1, peak_rss_mb=1
)
OUTCOME = ImageOutcome(image=IMAGE, status="succeeded", result_uri="s3://out/results/x.json")

# Every Task and Pass state: (the model its input must satisfy, an output it may return). Where the output lands
# is checked by validating the whole image state afterwards.
CONTRACTS: dict[str, tuple[type[BaseModel] | None, BaseModel | dict[str, Any]]] = {
    "Detect": (ImageTask, DETECTION),
    "Classify": (DescribeInput, ClassifyOutput(classes=[BoxClasses()], ms=1.0)),
    "Tag": (DescribeInput, TagOutput(tags=[BoxAttributes()], ms=1.0)),
    "ClassifyFailed": (BranchFailure, BranchFailure(failure=FAILURE)),
    "TagFailed": (BranchFailure, BranchFailure(failure=FAILURE)),
    "Caption": (ImageState, CAPTION),
    # ECS RunTask (.sync): its job is checked in the test; its result is ECS's description of the stopped task
    "Variants": (None, {"TaskArn": "arn:aws:ecs:us-east-1:1:task/c/2", "Containers": [{"ExitCode": 0}]}),
    "WriteResult": (ImageState, OUTCOME),
    "RecordWriteFailure": (ImageOutcome, ImageOutcome(image=IMAGE, status="failed", write_failure=FAILURE)),
    "WriteTable": (
        WriteTableInput,
        BatchSummary(batch_id="b", succeeded=1, failed=0, images_table_uri="x", detections_table_uri="y"),
    ),
}


def full_state() -> dict[str, Any]:
    """An image state as WriteResult sees it after every step ran."""
    items = evaluate(
        STATES["AnnotateImages"]["ItemSelector"], dumped(MANIFEST), {"Map": {"Item": {"Value": dumped(IMAGE)}}}
    )
    assert ImageState.model_validate(items) == ImageState(task=TASK)
    return dumped(
        ImageState(
            task=TASK,
            detection=DETECTION,
            description={
                "classify": ClassifyOutput(classes=[BoxClasses()], ms=1.0),
                "tag": BranchFailure(failure=FAILURE),
            },
            caption=CAPTION,
            variants_task={"task_arn": "arn:aws:ecs:us-east-1:1:task/c/1"},
        )
    )


def test_every_task_and_pass_state_has_a_contract() -> None:
    assert {name for name, state in STATES.items() if state["Type"] in {"Task", "Pass"}} == set(CONTRACTS)


@pytest.mark.parametrize(
    "name", [name for name in CONTRACTS if name not in {"WriteTable", "ClassifyFailed", "TagFailed"}]
)
def test_each_image_state_takes_its_model_and_leaves_a_valid_image_state(name: str) -> None:
    state, (input_model, output) = STATES[name], CONTRACTS[name]
    document = (
        full_state() if name != "RecordWriteFailure" else write_path(full_state(), "$.write_failure", dumped(FAILURE))
    )
    given = state_input(state, document)
    if input_model is not None:
        input_model.model_validate(given)
    if name == "Variants":
        [environment] = given["Overrides"]["ContainerOverrides"][0]["Environment"]
        assert ImageTask.model_validate_json(environment["Value"]) == TASK
    after = state_output(state, document, output if isinstance(output, dict) else dumped(output))
    if state.get("End"):
        TypeAdapter(type(output)).validate_python(after)  # the iteration's output
    else:
        ImageState.model_validate(after)


@pytest.mark.parametrize("name", ["Classify", "Tag"])
def test_a_failed_describe_branch_becomes_a_branch_failure(name: str) -> None:
    [catch] = STATES[name]["Catch"]
    caught = write_path(state_input(STATES[name], full_state()), catch["ResultPath"], dumped(FAILURE))
    failed = STATES[catch["Next"]]
    assert BranchFailure.model_validate(state_input(failed, caught)) == BranchFailure(failure=FAILURE)


def test_the_describe_results_are_selected_by_name_into_the_image_state() -> None:
    describe = STATES["Describe"]
    results = [dumped(ClassifyOutput(classes=[BoxClasses()], ms=1.0)), dumped(BranchFailure(failure=FAILURE))]
    after = ImageState.model_validate(state_output(describe, full_state(), results))
    assert after.description is not None and after.description.tag == BranchFailure(failure=FAILURE)


def test_every_catch_of_an_image_step_records_its_failure_under_a_failed_step() -> None:
    keys = {
        catch["ResultPath"].removeprefix("$.failures.")
        for state in STATES.values()
        for catch in state.get("Catch", [])
        if catch["ResultPath"].startswith("$.failures.")
    }
    assert keys == set(FailedStep) - {FailedStep.CLASSIFY, FailedStep.TAG, FailedStep.WRITE_RESULT}
    for key in keys:
        ImageState.model_validate(write_path(full_state(), f"$.failures.{key}", dumped(FAILURE)))


def test_the_batch_states_take_the_manifest_and_the_outcomes() -> None:
    annotate = STATES["AnnotateImages"]
    assert annotate["ItemsPath"].removeprefix("$.") in BatchManifest.model_fields
    document = write_path(dumped(MANIFEST), annotate["ResultPath"], [dumped(OUTCOME)])
    WriteTableInput.model_validate(state_input(STATES["WriteTable"], document))


def test_no_state_spells_out_the_image_task_field_by_field() -> None:
    task_fields = set(ImageTask.model_fields)
    made = {key.removesuffix(".$") for key in STATES["AnnotateImages"]["ItemSelector"]["task"]}
    assert made == task_fields  # where the task is made from the manifest, once
    for name, state in STATES.items():
        named = {key.removesuffix(".$") for key in state.get("Parameters", {})} & task_fields
        if name != "WriteTable":  # the batch's own fields, not an image's
            assert len(named) <= 1, f"{name} lists {sorted(named)} one by one: pass $.task instead"
