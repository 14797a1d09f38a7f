"""Reading template.yaml: its short-form intrinsics (!Ref, !Sub, ...) become their long forms."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter

from shared.settings import Settings

TEMPLATE_PATH = Path(__file__).resolve().parents[2] / "template.yaml"


# libyaml's parser where PyYAML has it (its wheels do): a local run reads the template as it starts, in a quarter
# of pure Python's time
class _CloudFormationLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    pass


def _intrinsic(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    return {suffix if suffix == "Ref" else f"Fn::{suffix}": value}


_CloudFormationLoader.add_multi_constructor("!", _intrinsic)


def load_template(path: Path = TEMPLATE_PATH) -> dict[str, Any]:
    """The template as a dict: ``!Ref X`` reads as ``{"Ref": "X"}``, ``!Sub s`` as ``{"Fn::Sub": s}``."""
    return yaml.load(path.read_text(), Loader=_CloudFormationLoader)  # a (C)SafeLoader subclass


def functions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: r for name, r in template["Resources"].items() if r["Type"] == "AWS::Serverless::Function"}


def by_default(template: dict[str, Any], value: Any, overrides: dict[str, str] | None = None) -> Any:
    """``value`` as a deployment with every parameter at its default (or as ``overrides`` gives it) has it:
    parameter Refs and ``Fn::If`` on the template's conditions resolved (other intrinsics are left as they are)."""
    parameters = {
        name: (overrides or {}).get(name, declared.get("Default"))
        for name, declared in template.get("Parameters", {}).items()
    }

    def resolve(item: Any) -> Any:
        if isinstance(item, list):
            return [resolve(element) for element in item]
        if not isinstance(item, dict):
            return item
        if set(item) == {"Ref"} and item["Ref"] in parameters:
            return parameters[item["Ref"]]
        if set(item) == {"Fn::If"}:
            condition, when_true, when_false = item["Fn::If"]
            return resolve(when_true if holds(template["Conditions"][condition]) else when_false)
        return {key: resolve(element) for key, element in item.items()}

    def holds(condition: Any) -> bool:
        [(function, arguments)] = condition.items()
        if function == "Fn::Equals":
            left, right = (resolve(argument) for argument in arguments)
            return str(left) == str(right)
        if function == "Fn::Not":
            return not holds(arguments[0])
        if function in ("Condition", "Fn::Condition"):  # !Condition in a condition reads as Fn::Condition
            return holds(template["Conditions"][arguments])
        combine = {"Fn::And": all, "Fn::Or": any}[function]
        return combine(holds(argument) for argument in arguments)

    return resolve(value)


def deployed_memory_mb(template: dict[str, Any], overrides: dict[str, str] | None = None) -> dict[str, int]:
    """Each function a deployment with ``overrides`` creates (its Condition holding), and its memory in MB."""
    defaults = template.get("Globals", {}).get("Function", {})
    memory = {}
    for name, resource in functions(template).items():
        condition = resource.get("Condition")
        if condition and not by_default(template, {"Fn::If": [condition, True, False]}, overrides):
            continue
        properties = by_default(template, defaults | resource["Properties"], overrides)
        memory[name] = int(properties.get("MemorySize", 128))  # Lambda's default
    return memory


def layer_ids(layers: Any) -> list[str]:
    """The logical ids a function's ``Layers`` name, in either branch of an ``Fn::If``."""
    if isinstance(layers, list):
        return [layer for item in layers for layer in layer_ids(item)]
    if isinstance(layers, dict):
        return [layers["Ref"]] if "Ref" in layers else layer_ids(list(layers.values()))
    return []


def bulk_task_settings(template: dict[str, Any]) -> dict[str, Any]:
    """The settings of how models run (``detector_runtime``, ..., ``detector_compiled_cache``) that the bulk
    job's container sets, typed as the settings type them."""
    container = template["Resources"]["BulkJobDefinition"]["Properties"]["ContainerProperties"]
    environment = {item["Name"].removeprefix("ANNOTATE_").lower(): item["Value"] for item in container["Environment"]}
    return {
        name: TypeAdapter(Settings.model_fields[name].annotation).validate_python(value)
        for name, value in environment.items()
        if name.endswith("_runtime") or name == "detector_compiled_cache"
    }
