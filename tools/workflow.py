"""The workflow definition and its placeholders, shared by the deployed stack and the local runner."""

from __future__ import annotations

import re
from pathlib import Path

DEFINITION_PATH = Path(__file__).resolve().parent.parent / "state_machine" / "pipeline.asl.json"
_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")

# ASL placeholder -> the function folder (functions/<name>/app.py) whose handler serves it.
FUNCTION_PLACEHOLDERS = {
    "DetectFunctionArn": "detect",
    "ClassifyFunctionArn": "classify",
    "TagFunctionArn": "tag",
    "CaptionFunctionArn": "caption",
    "WriteResultFunctionArn": "write_result",
    "WriteTableFunctionArn": "write_table",
}


# The placeholders of the Variants state (ECS RunTask on Fargate).
FARGATE_PLACEHOLDERS = (
    "VariantsClusterArn",
    "VariantsTaskDefinitionArn",
    "VariantsSubnetA",
    "VariantsSubnetB",
    "VariantsSecurityGroup",
)


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
