"""The workflow definition and its placeholders, as the local runner, the rehearsal and the tests read them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DEFINITION_PATH = Path(__file__).resolve().parents[2] / "state_machine" / "pipeline.asl.json"
_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")

# ASL placeholder -> the function folder (functions/<name>/app.py) whose handler serves it.
FUNCTION_PLACEHOLDERS = {
    "DetectFunctionArn": "detect",
    "ClassifyFunctionArn": "classify",
    "TagFunctionArn": "tag",
    "SegmentFunctionArn": "segment",
    "CaptionFunctionArn": "caption",
    "WriteResultFunctionArn": "write_result",
    "WriteGroupTableFunctionArn": "write_group_table",
    "SummarizeBatchFunctionArn": "summarize_batch",
}

# The function folders EventBridge invokes on the workflow's behalf (template.yaml's rules): BatchEnded, on an
# execution that timed out, failed or was stopped.
EVENT_FUNCTIONS = ("batch_ended",)


# The placeholders of the Fargate states (AWS Batch SubmitJob): the stack's job queue, and the Variants step's and
# the bulk lane's job definitions.
FARGATE_PLACEHOLDERS = ("FargateJobQueueArn", "VariantsJobDefinitionArn", "BulkJobDefinitionArn")


# The stack's own: the bucket the Distributed Map reads its groups from and writes its run's manifest to, whether the
# children run as Express or (with variants, whose Batch job needs .sync) Standard executions, the Variants job's
# integration (.sync only where it can run), and the partition of the service integrations' ARNs.
STACK_PLACEHOLDERS = ("ResultsBucket", "GroupExecutionType", "VariantsResource", "Partition")


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


# The markers for_moto leaves on a Distributed Map's processor whose children AWS runs as Express
# executions: always, or (the local runner, which serves both kinds of stack) unless the request asks for variants.
EXPRESS_CHILDREN = "express children, run as Standard ones by moto"
EXPRESS_UNLESS_VARIANTS = "express children unless the request asks for variants, run as Standard ones by moto"


def for_moto(definition: str, variants_run_standard: bool = False) -> str:
    """``definition`` as moto's interpreter accepts it: its parser rejects Express children and an integer
    ToleratedFailurePercentage, so children run as Standard executions, marked so that tools.local.step_functions holds
    them to the Express limit (``variants_run_standard``: not those of a request with variants, as the local runner
    serves both kinds of stack), and the percentage becomes a float (which moto then ignores: a failed child does
    not fail the Map there). AWS gets the file as it is."""
    document = json.loads(definition)
    for _, state in all_states(document):
        if "ToleratedFailurePercentage" in state:
            state["ToleratedFailurePercentage"] = float(state["ToleratedFailurePercentage"])
        processor = state.get("ItemProcessor", {})
        if processor.get("ProcessorConfig", {}).get("ExecutionType") == "EXPRESS":
            processor["ProcessorConfig"]["ExecutionType"] = "STANDARD"
            processor["Comment"] = EXPRESS_UNLESS_VARIANTS if variants_run_standard else EXPRESS_CHILDREN
    return json.dumps(document)


def all_states(definition: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every state of ``definition`` with its name, those of Map processors and Parallel branches included."""
    for name, state in definition.get("States", {}).items():
        yield name, state
        for nested in [state.get("ItemProcessor") or {}, *state.get("Branches", [])]:
            yield from all_states(nested)


def step_timeouts(definition: str | None = None) -> dict[str, int]:
    """Each function folder's TimeoutSeconds in the workflow (a test keeps each function's own timeout equal)."""
    document = json.loads(definition if definition is not None else DEFINITION_PATH.read_text())
    by_placeholder = {
        state["Resource"][2:-1]: state["TimeoutSeconds"]
        for _, state in all_states(document)
        if state.get("Type") == "Task" and state.get("Resource", "")[2:-1] in FUNCTION_PLACEHOLDERS
    }
    return {FUNCTION_PLACEHOLDERS[placeholder]: seconds for placeholder, seconds in by_placeholder.items()}


def without_function_timeouts(definition: str) -> str:
    """``definition`` (substituted) with no Lambda Task's TimeoutSeconds: for a runner whose functions time
    themselves, from when each invocation starts, as Lambda does."""
    document = json.loads(definition)
    for _, state in all_states(document):
        if state.get("Type") == "Task" and ":function:" in state.get("Resource", ""):
            state.pop("TimeoutSeconds", None)
    return json.dumps(document)


# An Express execution lasts at most five minutes (Step Functions developer guide, Choosing workflow type, its
# maximum duration): a group's child execution ends there, with every image still in it unwritten.
EXPRESS_LIMIT_S = 300


def retry_wait_s(retrier: dict[str, Any]) -> float:
    """The longest a retrier waits in all: before retry n, IntervalSeconds x BackoffRate^(n-1), capped at
    MaxDelaySeconds (jitter only shortens it), for MaxAttempts retries (the defaults are AWS's: 1 s, 2.0, 3)."""
    interval, rate = retrier.get("IntervalSeconds", 1), retrier.get("BackoffRate", 2.0)
    cap = retrier.get("MaxDelaySeconds", float("inf"))
    return float(sum(min(interval * rate**n, cap) for n in range(retrier.get("MaxAttempts", 3))))


def worst_case_s(definition: dict[str, Any], skip: frozenset[str] = frozenset()) -> float:
    """The longest ``definition`` (a workflow or a Map's processor) can run through its Task states' time-outs and
    retries, along its slowest path: each Task for its TimeoutSeconds once (a time-out is caught, not retried) and
    each of its retriers' full waits, a retried error counting as immediate (a throttle or a service error fails
    the invocation before the function runs). Parallel branches and an inline Map's iterations run side by side.
    States in ``skip`` are taken as unreachable (Variants, which an Express stack never runs)."""
    states = definition["States"]
    memo: dict[str, float] = {}

    def own_time(state: dict[str, Any]) -> float:
        if state["Type"] == "Task":
            if "TimeoutSeconds" not in state:
                return float("inf")
            return state["TimeoutSeconds"] + sum(retry_wait_s(r) for r in state.get("Retry", []))
        if state["Type"] == "Parallel":
            return max(worst_case_s(branch, skip) for branch in state["Branches"])
        processor = state.get("ItemProcessor", {})
        if state["Type"] == "Map" and processor.get("ProcessorConfig", {}).get("Mode") != "DISTRIBUTED":
            return worst_case_s(processor, skip)
        return 0.0

    def from_state(name: str) -> float:
        if name not in memo:
            state = states[name]
            following = [state.get("Next"), state.get("Default")]
            following += [c["Next"] for c in state.get("Catch", []) + state.get("Choices", [])]
            memo[name] = own_time(state) + max([from_state(n) for n in following if n and n not in skip] or [0.0])
        return memo[name]

    return from_state(definition["StartAt"])
