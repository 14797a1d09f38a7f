"""The workflow definition and its placeholders, shared by the deployed stack and the local runner."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DEFINITION_PATH = Path(__file__).resolve().parent.parent / "state_machine" / "pipeline.asl.json"
_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")

# ASL placeholder -> the function folder (functions/<name>/app.py) whose handler serves it.
FUNCTION_PLACEHOLDERS = {
    "DetectFunctionArn": "detect",
    "ClassifyFunctionArn": "classify",
    "TagFunctionArn": "tag",
    "CaptionFunctionArn": "caption",
    "WriteResultFunctionArn": "write_result",
    "WriteGroupTableFunctionArn": "write_group_table",
    "SummarizeBatchFunctionArn": "summarize_batch",
}


# The placeholders of the Variants state (ECS RunTask on Fargate).
FARGATE_PLACEHOLDERS = (
    "VariantsClusterArn",
    "VariantsTaskDefinitionArn",
    "VariantsSubnetA",
    "VariantsSubnetB",
    "VariantsSecurityGroup",
)


# The stack's own: the bucket the Distributed Map reads its groups from and writes its run's manifest to, whether the
# children run as Express or (with variants, whose Fargate task needs .sync) Standard executions, and the Variants
# task's integration (.sync only where it can run).
STACK_PLACEHOLDERS = ("ResultsBucket", "GroupExecutionType", "VariantsResource")


def placeholders(definition: str | None = None) -> set[str]:
    text = definition if definition is not None else DEFINITION_PATH.read_text()
    return set(_PLACEHOLDER.findall(text))


def substitute(substitutions: dict[str, str], definition: str | None = None) -> str:
    """The definition with every ``${Name}`` replaced, as CloudFormation's DefinitionSubstitutions does."""
    text = definition if definition is not None else DEFINITION_PATH.read_text()
    missing = placeholders(text) - substitutions.keys()
    if missing:
        raise ValueError(f"no value for placeholders {sorted(missing)}")
    return _PLACEHOLDER.sub(lambda match: substitutions[match.group(1)], text)


def for_moto(definition: str) -> str:
    """``definition`` as moto's interpreter accepts it: its parser rejects Express children and an integer
    ToleratedFailurePercentage, so children run as Standard executions and the percentage becomes a float (which
    moto then ignores: a failed child does not fail the Map there). AWS gets the file as it is."""
    document = json.loads(definition)
    for _, state in all_states(document):
        if "ToleratedFailurePercentage" in state:
            state["ToleratedFailurePercentage"] = float(state["ToleratedFailurePercentage"])
        processor = state.get("ItemProcessor", {}).get("ProcessorConfig", {})
        if processor.get("ExecutionType") == "EXPRESS":
            processor["ExecutionType"] = "STANDARD"
    return json.dumps(document)


def all_states(definition: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every state of ``definition`` with its name, those of Map processors and Parallel branches included."""
    for name, state in definition.get("States", {}).items():
        yield name, state
        for nested in [state.get("ItemProcessor") or {}, *state.get("Branches", [])]:
            yield from all_states(nested)
