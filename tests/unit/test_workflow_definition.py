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
    BatchInput,
    BatchSummary,
    Box,
    BoxAttributes,
    BoxClasses,
    BranchFailure,
    BulkJobRef,
    CaptionOutput,
    ClassifyOutput,
    DescribeInput,
    Detection,
    DetectOutput,
    FailedStep,
    GroupSummary,
    GroupTask,
    HandBack,
    ImageGroup,
    ImageOutcome,
    ImageRef,
    ImageState,
    ImageTask,
    SegmentOutput,
    StepFailure,
    SummarizeInput,
    TagOutput,
    WriteGroupTableInput,
)
from shared.storage import layout
from tools.aws.sam_template import load_template
from tools.local.workflow import (
    DEFINITION_PATH,
    EXPRESS_LIMIT_S,
    FARGATE_PLACEHOLDERS,
    FUNCTION_PLACEHOLDERS,
    STACK_PLACEHOLDERS,
    placeholders,
    substitute,
    worst_case_s,
)


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
    assert placeholders() == set(FUNCTION_PLACEHOLDERS) | set(FARGATE_PLACEHOLDERS) | set(STACK_PLACEHOLDERS)
    for name in FUNCTION_PLACEHOLDERS.values():
        assert (DEFINITION_PATH.parent.parent / "functions" / name / "app.py").is_file()


def test_every_task_has_retry_and_catch() -> None:
    tasks = {name: state for name, state in STATES.items() if state["Type"] == "Task"}
    assert tasks
    for name, state in tasks.items():
        assert state.get("Retry") and state.get("Catch"), name
        assert "States.ALL" not in {e for r in state["Retry"] for e in r["ErrorEquals"]}, f"{name} retries all"


def test_summarize_batch_retries_a_throttle_the_code_does_not_name_transient() -> None:
    # A DynamoDB throttle or an S3 SlowDown past botocore's retries reaches a function as botocore's ClientError;
    # SummarizeBatch writes the same whenever it runs, so it may run again
    retried = {e for r in STATES["SummarizeBatch"]["Retry"] for e in r["ErrorEquals"]}
    assert TRANSIENT | {"ClientError"} <= retried


# Step Functions' names for a Lambda invocation that failed before or around the function (the developer guide's
# "Handle Lambda service exceptions", ClientExecutionTimeoutException among them), and SnapStart's:
# "SnapStartNotReadyException ... Wait until the function version reaches the Active state, and then invoke it
# again" and SnapStartTimeoutException (Lambda's "Troubleshooting SnapStart errors"). TransientError is the code's
# own (S3 throttling, 5xx).
TRANSIENT = {
    "Lambda.TooManyRequestsException",
    "Lambda.ServiceException",
    "Lambda.AWSLambdaException",
    "Lambda.SdkClientException",
    "Lambda.ClientExecutionTimeoutException",
    "TransientError",
}
SNAPSTART = {"Lambda.SnapStartNotReadyException", "Lambda.SnapStartTimeoutException"}
LAMBDA_TASKS = {name: s for name, s in STATES.items() if s["Type"] == "Task" and "FunctionArn}" in s["Resource"]}


def test_every_lambda_task_retries_throttles_and_service_errors_and_each_model_step_snapstarts() -> None:
    snapstart_functions = {
        "DetectFunctionArn",
        "ClassifyFunctionArn",
        "TagFunctionArn",
        "SegmentFunctionArn",
        "CaptionFunctionArn",
    }
    assert len(LAMBDA_TASKS) == len(FUNCTION_PLACEHOLDERS)
    for name, state in LAMBDA_TASKS.items():
        retried = {error for retrier in state["Retry"] for error in retrier["ErrorEquals"]}
        assert retried >= TRANSIENT, name
        assert (retried >= SNAPSTART) is (state["Resource"][2:-1] in snapstart_functions), name


def test_a_group_fits_in_an_express_execution_at_its_worst() -> None:
    # GIVEN every task timing out or exhausting its retries along the slowest path of a child (no variants)
    child = STATES["AnnotateGroups"]["ItemProcessor"]
    worst = worst_case_s(child, skip=frozenset({"Variants"}))
    # THEN the child still ends within the Express limit, with time to spare for the transitions themselves
    assert worst <= EXPRESS_LIMIT_S - 30, worst
    # and a task without a timeout would make it unbounded
    untimed = json.loads(json.dumps(child))
    del untimed["States"]["AnnotateImages"]["ItemProcessor"]["States"]["Caption"]["TimeoutSeconds"]
    assert worst_case_s(untimed, skip=frozenset({"Variants"})) == float("inf")


def test_each_lambda_task_stops_waiting_when_its_function_would_time_out() -> None:
    resources = template()["Resources"]
    default = template()["Globals"]["Function"]["Timeout"]
    for name, state in LAMBDA_TASKS.items():
        function = state["Resource"][2:-1].removesuffix("Arn")
        assert resources[function]["Properties"].get("Timeout", default) == state["TimeoutSeconds"], name


def test_a_group_is_no_larger_than_an_inline_map_runs_at_once() -> None:
    # "In this mode, the Map state supports up to 40 concurrent iterations" (Using Map state in Inline mode)
    assert template()["Parameters"]["ImagesPerGroup"]["MaxValue"] <= 40
    assert "MaxConcurrency" not in STATES["AnnotateImages"]


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
BATCH = BatchInput(
    batch_id="b-" + "1" * 20,
    request=REQUEST,
    results_uri="s3://out",
    planned_at="2026-11-30T12:00:00Z",
    images=1,
    groups=1,
    group_concurrency=4,
)
GROUP = ImageGroup(group_id="g-000000", images=[IMAGE])
TASK = ImageTask(batch_id=BATCH.batch_id, request=REQUEST, image=IMAGE, results_uri="s3://out")
DETECTION = DetectOutput(
    width=64, height=48, detections=[Detection(label="dog", score=0.9, box=Box(x0=1, y0=2, x1=30, y1=40))], ms=9.5
)
FAILURE = StepFailure(Error="ImageRejected", Cause="file is empty")
CAPTION = CaptionOutput(
    caption="A dog.", model="m", ttft_ms=1, tokens_per_s=1, prompt_tokens=1, completion_tokens=1, peak_rss_mb=1
)
SUMMARY = BatchSummary(
    batch_id=BATCH.batch_id,
    images=1,
    succeeded=1,
    failed=0,
    groups=1,
    unfinished=0,
    unfinished_groups=[],
    summary_uri="s3://out/s",
)
OUTCOME = ImageOutcome(image=IMAGE, status="succeeded", result_uri="s3://out/results/x.json")

# Every Task and Pass state: (the model its input must satisfy, an output it may return). Where the output lands
# is checked by validating the whole image state afterwards.
CONTRACTS: dict[str, tuple[type[BaseModel] | None, BaseModel | dict[str, Any]]] = {
    "Detect": (ImageTask, DETECTION),
    "Classify": (DescribeInput, ClassifyOutput(classes=[BoxClasses()], ms=1.0)),
    "Tag": (DescribeInput, TagOutput(tags=[BoxAttributes()], ms=1.0)),
    "ClassifyFailed": (BranchFailure, BranchFailure(failure=FAILURE)),
    "NothingToClassify": (None, {}),  # its Result (null) is checked on its own
    "TagFailed": (BranchFailure, BranchFailure(failure=FAILURE)),
    "Segment": (DescribeInput, SegmentOutput(masks_uri="s3://out/results/b/x.masks.json", masks=1, ms=1.0)),
    "SegmentFailed": (BranchFailure, BranchFailure(failure=FAILURE)),
    "NothingToSegment": (None, {}),  # its Result (null) is checked on its own
    "Caption": (ImageState, CAPTION),
    # Batch SubmitJob (.sync): its job is checked in the test; its result is Batch's description of the job
    "Variants": (None, {"JobId": "6f7e", "JobName": "annotate-variants", "Status": "SUCCEEDED"}),
    "WriteResult": (ImageState, OUTCOME),
    "RecordWriteFailure": (ImageOutcome, ImageOutcome(image=IMAGE, status="failed", write_failure=FAILURE)),
    "WriteGroupTable": (
        WriteGroupTableInput,
        GroupSummary(
            batch_id="b", group_id="g-000000", succeeded=1, failed=0, images_table_uri="x", detections_table_uri="y"
        ),
    ),
    "SummarizeBatch": (SummarizeInput, SUMMARY),
    "HandBackGroups": (None, BATCH),  # the batch's input, in its next round: checked in its test
    "BatchDone": (None, {}),
    # Batch SubmitJob (.sync) of a bulk job: its job is checked in the bulk lane's test; its result is discarded
    "RunBulkJob": (None, {"JobId": "5e4d", "JobName": "annotate-bulk", "Status": "SUCCEEDED"}),
}
BATCH_STATES = {"WriteGroupTable", "SummarizeBatch", "HandBackGroups", "BatchDone", "RunBulkJob"}


def group_task() -> dict[str, Any]:
    """A child workflow's input, as the Distributed Map's ItemSelector makes it from the batch and a group."""
    made = evaluate(
        STATES["AnnotateGroups"]["ItemSelector"], dumped(BATCH), {"Map": {"Item": {"Value": dumped(GROUP)}}}
    )
    assert GroupTask.model_validate(made).group == GROUP
    return made


def full_state() -> dict[str, Any]:
    """An image state as WriteResult sees it after every step ran."""
    items = evaluate(
        STATES["AnnotateImages"]["ItemSelector"], group_task(), {"Map": {"Item": {"Value": dumped(IMAGE)}}}
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
            variants_task={"job_id": "6f7e"},
        )
    )


def test_every_task_and_pass_state_has_a_contract() -> None:
    assert {name for name, state in STATES.items() if state["Type"] in {"Task", "Pass"}} == set(CONTRACTS)


@pytest.mark.parametrize(
    "name",
    [
        name
        for name in CONTRACTS
        if name not in BATCH_STATES | {"ClassifyFailed", "TagFailed", "SegmentFailed", "NothingToClassify"}
        and name != "NothingToSegment"
    ],
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
        [environment] = given["ContainerOverrides"]["Environment"]
        assert ImageTask.model_validate_json(environment["Value"]) == TASK
    after = state_output(state, document, output if isinstance(output, dict) else dumped(output))
    if state.get("End"):
        TypeAdapter(type(output)).validate_python(after)  # the iteration's output
    else:
        ImageState.model_validate(after)


@pytest.mark.parametrize("name", ["Classify", "Tag", "Segment"])
def test_a_failed_describe_branch_becomes_a_branch_failure(name: str) -> None:
    catch = STATES[name]["Catch"][-1]
    caught = write_path(state_input(STATES[name], full_state()), catch["ResultPath"], dumped(FAILURE))
    failed = STATES[catch["Next"]]
    assert BranchFailure.model_validate(state_input(failed, caught)) == BranchFailure(failure=FAILURE)


def test_the_describe_results_are_selected_by_name_into_the_image_state() -> None:
    describe = STATES["Describe"]
    segmented = SegmentOutput(masks_uri="s3://out/results/b/x.masks.json", masks=1, ms=1.0)
    results = [
        dumped(ClassifyOutput(classes=[BoxClasses()], ms=1.0)),
        dumped(BranchFailure(failure=FAILURE)),
        dumped(segmented),
    ]
    after = ImageState.model_validate(state_output(describe, full_state(), results))
    assert after.description is not None and after.description.tag == BranchFailure(failure=FAILURE)
    assert after.description.segment == segmented


def test_an_image_without_boxes_is_described_for_its_embedding_without_classify() -> None:
    # GIVEN an image Detect found no box in, for a request that asks for embeddings (the default)
    no_boxes = write_path(full_state(), "$.detection.detections", [])
    wanted = STATES["DescribeWanted"]["Choices"]
    # THEN the image is described (the first rule needs a box, the second the request's embeddings) ...
    assert wanted[0]["Variable"] == "$.detection.detections[0]" and no_boxes["detection"]["detections"] == []
    assert no_boxes["task"]["request"]["embeddings"] == "image" and wanted[1]["Next"] == "Describe"
    # ... and Classify's branch ends at once with no result, which the image state takes as nothing classified
    branch = STATES["Describe"]["Branches"][0]
    assert branch["StartAt"] == "ClassifyWanted" and STATES["ClassifyWanted"]["Default"] == "NothingToClassify"
    nothing = STATES["NothingToClassify"]
    results = [nothing["Result"], dumped(TagOutput(tags=[], ms=1.0)), STATES["NothingToSegment"]["Result"]]
    after = ImageState.model_validate(state_output(STATES["Describe"], no_boxes, results))
    assert after.description is not None and after.description.classify is None


def test_every_catch_of_an_image_step_records_its_failure_under_a_failed_step() -> None:
    keys = {
        catch["ResultPath"].removeprefix("$.failures.")
        for state in STATES.values()
        for catch in state.get("Catch", [])
        if catch.get("ResultPath", "").startswith("$.failures.")
    }
    # Classify, Tag and Segment fail as branches, WriteResult into write_failure, a group in SummarizeBatch's rows
    branches = {FailedStep.CLASSIFY, FailedStep.TAG, FailedStep.SEGMENT}
    assert keys == set(FailedStep) - branches - {FailedStep.WRITE_RESULT, FailedStep.GROUP}
    for key in keys:
        ImageState.model_validate(write_path(full_state(), f"$.failures.{key}", dumped(FAILURE)))


def manifest_key(document: dict[str, Any], state: str = "AnnotateGroups") -> str:
    """The key the Map ``state``'s ItemReader reads in the state ``document``."""
    reader = STATES[state]["ItemReader"]["Parameters"]
    key_format, paths = re.fullmatch(r"States\.Format\('(.+?)', (.+)\)", reader["Key.$"]).groups()
    for path in paths.split(", "):
        key_format = key_format.replace("{}", str(read_path(document, path, {})), 1)
    return f"s3://{reader['Bucket']}/{key_format}"


def test_the_distributed_map_reads_the_groups_manifest_that_ingest_writes() -> None:
    assert manifest_key(dumped(BATCH)) == layout.groups_manifest("s3://${ResultsBucket}", BATCH.batch_id)
    assert STATES["AnnotateGroups"]["MaxConcurrencyPath"].removeprefix("$.") in BatchInput.model_fields


@pytest.mark.parametrize("lane", ["lambda", "bulk"])
def test_the_batch_runs_in_the_lane_ingest_chose(lane: str) -> None:
    batch = dumped(BATCH.model_copy(update={"lane": lane}))
    assert next_state("ChooseLane", batch) == {"lambda": "AnnotateGroups", "bulk": "AnnotateGroupsInBulk"}[lane]


def test_the_bulk_lane_runs_each_job_of_the_bulk_manifest_as_a_batch_job_on_the_stack_s_queue() -> None:
    bulk = STATES["AnnotateGroupsInBulk"]
    for round in (0, 2):  # ingest's jobs, and those of groups handed back
        in_bucket = BATCH.model_copy(update={"results_uri": "s3://${ResultsBucket}", "round": round})
        assert manifest_key(dumped(in_bucket), "AnnotateGroupsInBulk") == layout.bulk_manifest(in_bucket)
    assert bulk["ToleratedFailurePercentage"] == 100  # one failed job of two must not stop the other
    assert bulk["MaxConcurrencyPath"].removeprefix("$.") in BatchInput.model_fields
    assert bulk["ItemProcessor"]["ProcessorConfig"]["ExecutionType"] == "STANDARD"  # Express cannot wait (.sync)
    job = BulkJobRef(job_uri=layout.bulk_job(BATCH.results_uri, BATCH.batch_id, 0))
    given = evaluate(bulk["ItemSelector"], dumped(BATCH), {"Map": {"Item": {"Value": dumped(job)}}})
    run = STATES["RunBulkJob"]
    parameters = state_input(run, given)
    [environment] = parameters["ContainerOverrides"]["Environment"]
    assert (environment["Name"], environment["Value"]) == ("ANNOTATE_BULK_JOB", job.job_uri)
    assert run["Resource"].endswith(":batch:submitJob.sync")
    assert (parameters["JobQueue"], parameters["JobDefinition"]) == ("${FargateJobQueueArn}", "${BulkJobDefinitionArn}")
    # a job that failed past Batch's own retries ends its child, and its groups are handed back
    assert [c["Next"] for c in run["Catch"]] == ["BulkJobFailed"]
    assert "States.TaskFailed" not in {e for r in run["Retry"] for e in r["ErrorEquals"]}  # Batch retries the job


def test_the_fargate_jobs_wait_in_one_queue_spot_first_and_a_reclaimed_spot_task_runs_again() -> None:
    from tools.local.batch_jobs import RetryStrategy, TaskStopped

    resources = template()["Resources"]
    # GIVEN the stack's job queue: Fargate Spot's compute environment first, on-demand Fargate's after it
    order = sorted(resources["FargateJobQueue"]["Properties"]["ComputeEnvironmentOrder"], key=lambda e: e["Order"])
    kinds = [resources[e["ComputeEnvironment"]["Ref"]]["Properties"]["ComputeResources"]["Type"] for e in order]
    assert kinds == ["FARGATE_SPOT", "FARGATE"]
    for name in ("Variants", "RunBulkJob"):
        assert STATES[name]["Parameters"]["JobQueue"] == "${FargateJobQueueArn}"
        # SubmitJob's throttles are retried with backoff and jitter; nothing else is
        [retrier] = STATES[name]["Retry"]
        assert "Batch.TooManyRequestsException" in retrier["ErrorEquals"] and retrier["JitterStrategy"] == "FULL"
    # WHEN a job's Spot task is reclaimed, as ECS says it; or the bulk worker ends between two images on SIGTERM
    reclaimed = TaskStopped("Your Spot Task was interrupted.", exit_code=None)
    stopped = TaskStopped("Essential container in task exited", exit_code=143)
    failed = TaskStopped("Essential container in task exited", exit_code=1)
    bulk, variants = (RetryStrategy.of(resources[n]) for n in ("BulkJobDefinition", "VariantsJobDefinition"))
    # THEN Batch runs it again; a job that failed otherwise is not retried
    assert bulk.attempts >= 2 and bulk.retries(reclaimed) and bulk.retries(stopped) and not bulk.retries(failed)
    assert variants.attempts >= 2 and variants.retries(reclaimed) and not variants.retries(failed)


def test_a_group_is_annotated_image_by_image_and_written_as_one_table_file() -> None:
    images = STATES["AnnotateImages"]
    assert TypeAdapter(list[ImageRef]).validate_python(read_path(group_task(), images["ItemsPath"], {})) == [IMAGE]
    document = write_path(group_task(), images["ResultPath"], [dumped(OUTCOME)])
    WriteGroupTableInput.model_validate(state_input(STATES["WriteGroupTable"], document))


@pytest.mark.parametrize("failed", [False, True])
def test_the_batch_is_summarized_whether_or_not_the_map_failed(failed: bool) -> None:
    groups = STATES["AnnotateGroups"]
    path, result = (groups["Catch"][0]["ResultPath"], dumped(FAILURE)) if failed else (groups["ResultPath"], {})
    document = write_path(dumped(BATCH), path, result)
    assert (SummarizeInput.model_validate(state_input(STATES["SummarizeBatch"], document)).error is not None) is failed
    ended = write_path(document, STATES["SummarizeBatch"]["ResultPath"], dumped(SUMMARY))
    assert next_state("BatchEnded", ended) == ("BatchFailed" if failed else "BatchDone")
    if not failed:
        assert BatchSummary.model_validate(read_path(ended, STATES["BatchDone"]["OutputPath"], {})) == SUMMARY


def next_state(choice: str, document: dict[str, Any]) -> str:
    """Where the Choice state ``choice`` goes from ``document`` (the IsPresent, IsNull and StringEquals rules it
    uses)."""
    for rule in STATES[choice]["Choices"]:
        try:
            value, present = read_path(document, rule["Variable"], {}), True
        except KeyError:
            value, present = None, False
        if "IsPresent" in rule and present is rule["IsPresent"]:
            return str(rule["Next"])
        if "IsNull" in rule and present and (value is None) is rule["IsNull"]:
            return str(rule["Next"])
        if "StringEquals" in rule and present and value == rule["StringEquals"]:
            return str(rule["Next"])
    return str(STATES[choice]["Default"])


@pytest.mark.parametrize("lane", ["lambda", "bulk"])
@pytest.mark.parametrize("failed", [False, True])
def test_groups_handed_back_run_again_in_the_next_round_after_the_summary_s_wait(failed: bool, lane: str) -> None:
    # GIVEN a round whose Map ended (failed or not) and whose summary hands two groups back to round 1
    groups = STATES["AnnotateGroups" if lane == "lambda" else "AnnotateGroupsInBulk"]
    path, result = (groups["Catch"][0]["ResultPath"], dumped(FAILURE)) if failed else (groups["ResultPath"], {})
    batch = BATCH.model_copy(update={"hand_backs": 3, "lane": lane})
    document = write_path(dumped(batch), path, result)
    handed_back = SUMMARY.model_copy(update={"handed_back": HandBack(round=1, groups=2, wait_seconds=90)})
    ended = write_path(document, STATES["SummarizeBatch"]["ResultPath"], dumped(handed_back))
    # THEN the parent waits the summary's seconds, then runs its lane again on round 1's manifest, with the
    # batch's input as it was, but for its round (the earlier round's error and summary gone)
    assert next_state("BatchEnded", ended) == "WaitForCapacity"
    wait = STATES["WaitForCapacity"]
    assert read_path(ended, wait["SecondsPath"], {}) == 90 and wait["Next"] == "HandBackGroups"
    again = BatchInput.model_validate(state_input(STATES["HandBackGroups"], ended))
    assert again == batch.model_copy(update={"round": 1})
    assert STATES["HandBackGroups"]["Next"] == "ChooseLane"
    in_bucket = again.model_copy(update={"results_uri": "s3://${ResultsBucket}"})
    if lane == "lambda":
        assert next_state("ChooseLane", dumped(again)) == "AnnotateGroups"
        assert manifest_key(dumped(again)) == layout.round_groups(in_bucket)
    else:
        assert next_state("ChooseLane", dumped(again)) == "AnnotateGroupsInBulk"
        assert manifest_key(dumped(again), "AnnotateGroupsInBulk") == layout.bulk_manifest(in_bucket)


CHILD = STATES["AnnotateGroups"]["ItemProcessor"]["States"]


def test_a_step_the_lambda_service_keeps_refusing_hands_its_group_back_instead_of_failing_its_image() -> None:
    # every Lambda step of a child: what it retries for the Lambda service (throttles, SnapStart, service errors)
    # and outlasts its retries fails the child (Fail HandedBack), whose group SummarizeBatch then hands back; any
    # other error is the image's (States.ALL, last)
    child_states = states({"States": CHILD})
    for name, state in child_states.items():
        if state["Type"] != "Task" or "FunctionArn}" not in state["Resource"] or name == "WriteGroupTable":
            continue
        first, *_, last = state["Catch"]
        retried = {error for retrier in state["Retry"] for error in retrier["ErrorEquals"]}
        assert set(first["ErrorEquals"]) == retried and last["ErrorEquals"] == ["States.ALL"], name
        handed = child_states[first["Next"]]
        assert handed["Type"] == "Fail" and handed["Error"] == "HandedBack", name
    # a branch's hand-back leaves Describe as a hand-back, not as the image's failure
    first = STATES["Describe"]["Catch"][0]
    assert first["ErrorEquals"] == ["HandedBack"] and STATES[first["Next"]]["Error"] == "HandedBack"
    assert STATES["AnnotateGroups"]["ToleratedFailurePercentage"] == 100  # a failed child stops no other


def test_no_state_spells_out_the_image_task_field_by_field() -> None:
    task_fields = set(ImageTask.model_fields)
    made = {key.removesuffix(".$") for key in STATES["AnnotateImages"]["ItemSelector"]["task"]}
    assert made == task_fields  # where the task is made from the group, once
    for name, state in STATES.items():
        named = {key.removesuffix(".$") for key in state.get("Parameters", {})} & task_fields
        if name not in {"WriteGroupTable", "HandBackGroups"}:  # the batch's own fields, not an image's
            assert len(named) <= 1, f"{name} lists {sorted(named)} one by one: pass $.task instead"


def test_no_arn_names_a_partition_of_its_own() -> None:
    # GovCloud and China are partitions of their own ("aws-us-gov", "aws-cn"): every ARN takes the stack's
    from tools.aws.sam_template import TEMPLATE_PATH

    for path in (TEMPLATE_PATH, *sorted((TEMPLATE_PATH.parent / "state_machine").glob("*.json"))):
        assert "arn:aws:" not in path.read_text(), path
