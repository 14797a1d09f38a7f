"""Run the real workflow definition on this machine, with no AWS account.

moto's Step Functions interpreter (LocalStack's) executes ``state_machine/pipeline.asl.json`` as AWS would;
its Lambda invocations are dispatched here to the real handlers in ``functions/``, in this process. As in
Lambda, each function serves one invocation at a time.

The interpreter's service calls are served here through tools/local/step_functions.py, which holds every patch of
moto's interpreter.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from unittest import mock

from shared.contracts import BatchInput, BatchSummary, SummarizeInput
from shared.observability import logger, metrics
from shared.pipeline.dependencies import Step, dependencies_of
from shared.settings import get_settings
from shared.storage import layout
from shared.storage.objects import split_s3
from tools.local.batch_jobs import JobQueue, stack_job_queue
from tools.local.containers import BULK_TASK_AT_A_TIME, InvocationGate, InvocationListener, run_job_container
from tools.local.step_functions import (
    CHILD_CLOCKS,
    ChildClock,
    FunctionTimedOut,
    LambdaServiceError,
    services_in_process,
    status_change_event,
)
from tools.local.workflow import (
    EVENT_FUNCTIONS,
    FUNCTION_PLACEHOLDERS,
    for_moto,
    step_timeouts,
    substitute,
    without_function_timeouts,
)

if TYPE_CHECKING:
    from tools.aws.moto_internals import DefaultConfig

T = TypeVar("T")
REGION = "us-east-1"
ACCOUNT = "123456789012"
FUNCTION_PREFIX = "annotate-"
# Locally the Batch jobs (Variants, the bulk lane's) run in this process (tools/local/batch_jobs.py), so their
# placeholders only need to be well formed.
LOCAL_FARGATE = {
    "FargateJobQueueArn": f"arn:aws:batch:{REGION}:{ACCOUNT}:job-queue/annotate-local",
    "VariantsJobDefinitionArn": f"arn:aws:batch:{REGION}:{ACCOUNT}:job-definition/annotate-variants:1",
    "BulkJobDefinitionArn": f"arn:aws:batch:{REGION}:{ACCOUNT}:job-definition/annotate-bulk:1",
}
# Locally, moto's S3 holds what the workflow itself reads and writes (the groups manifest its ItemReader reads, the
# ResultWriter's manifest); everything else stays in the local results folder.
LOCAL_BUCKET = "annotate-local-workflow"
MOTO_CONFIG: DefaultConfig = {"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}


@dataclass(frozen=True)
class LocalContext:
    """The parts of Lambda's context object that handlers and Powertools read."""

    function_name: str
    aws_request_id: str
    memory_limit_in_mb: int = 3008
    function_version: str = "$LATEST"

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{FUNCTION_PREFIX}{self.function_name}"

    @staticmethod
    def get_remaining_time_in_millis() -> int:
        return 900_000


@dataclass(frozen=True)
class ExecutionResult:
    execution_arn: str
    status: str  # SUCCEEDED, FAILED, TIMED_OUT or ABORTED
    summary: BatchSummary | None
    error: str | None


def _error_payload(error: BaseException, error_type: str | None = None) -> dict[str, Any]:
    return {
        "errorType": error_type or type(error).__name__,
        "errorMessage": str(error),
        "stackTrace": traceback.format_tb(error.__traceback__),
    }


class HandlerDispatcher:
    """Stands in for the Lambda service: runs ``functions/<name>/app.handler`` in this process, one invocation at a
    time per function; with ``timeouts``, ends an invocation that ran past the function's timeout with Lambda's
    timeout error (the timeout is the workflow's TimeoutSeconds for the step, which the function's equals: a test
    holds them)."""

    def __init__(
        self,
        listener: InvocationListener | None = None,
        gate: InvocationGate | None = None,
        timeouts: bool = False,
        stopping: threading.Event | None = None,
        concurrency: int | None = None,
        reserved: dict[str, int] | None = None,
    ) -> None:
        self.listener = listener
        self.gate = gate
        self._locks = {name: threading.Lock() for name in (*FUNCTION_PLACEHOLDERS.values(), *EVENT_FUNCTIONS)}
        self._timeouts = step_timeouts() if timeouts else {}
        self.stopping = stopping or threading.Event()
        self.concurrency = concurrency
        self.reserved = reserved or {}
        self.in_flight = self.most_in_flight = self.throttled = 0
        self._in_flight_of: Counter[str] = Counter()  # by pool: a reserved function's own, or "" (the rest)
        self.busy_s = 0.0  # the functions' time, summed over every invocation
        self._counting = threading.Lock()

    def invoke(self, function: str, payload: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """(response payload, whether it is an error payload), as the Lambda Invoke API returns them."""
        name = function.rsplit(":function:", 1)[-1].split(":", 1)[0].removeprefix(FUNCTION_PREFIX)
        if self.stopping.is_set():
            threading.Event().wait()  # the run is stopping: no invocation starts; the process ends without it
        pool = self._admit(name)
        try:
            if self.gate:
                self.gate(name, payload)  # may refuse the invocation: LambdaServiceError reaches the caller
            response, error = self._run(name, payload)
        except FunctionTimedOut as timed_out:  # Lambda ended it at the function's timeout: its work is lost
            response, error = _error_payload(timed_out, "Sandbox.Timedout"), timed_out
        finally:
            self._leave(pool)
        if self.listener:
            self.listener(name, payload, error)
        return response, error is not None

    def run_as(self, name: str, call: Callable[[], T]) -> T:
        """``call`` run as one invocation of ``name`` (a function the workflow does not invoke: Ingest, as its queue's
        poller invokes it), counted against the account's concurrency and refused past it as any other."""
        pool = self._admit(name)
        try:
            return call()
        finally:
            self._leave(pool)

    def _admit(self, name: str) -> str:
        """Count the invocation in flight, or refuse it as Lambda does past the account's concurrency: Lambda "scales
        up the number of execution environments to handle these requests until your account reaches its concurrency
        quota" (Lambda developer guide, Lambda scaling behavior), and past it Invoke fails with
        TooManyRequestsException, reason ConcurrentInvocationLimitExceeded (Lambda API reference). A function with
        reserved concurrency draws on its own ("No other function can use that concurrency", Configuring reserved
        concurrency); the others share what is left. Here each invocation waits for its function's one environment,
        so one counts from the Invoke call, as it would run on AWS, not from when the function takes it. Returns the
        pool it was counted in."""
        pool = name if name in self.reserved else ""
        limit = self.reserved.get(name)
        if limit is None and self.concurrency is not None:
            limit = self.concurrency - sum(self.reserved.values())
        with self._counting:
            if limit is not None and self._in_flight_of[pool] >= limit:
                self.throttled += 1
                which = f"reserved for {name}" if pool else "unreserved"
                raise LambdaServiceError(
                    "TooManyRequestsException", f"Rate Exceeded: the concurrency of {limit} {which} is in use"
                )
            self._in_flight_of[pool] += 1
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        return pool

    def _leave(self, pool: str) -> None:
        with self._counting:
            self.in_flight -= 1
            self._in_flight_of[pool] -= 1

    def drain(self, seconds: float) -> bool:
        """Once ``stopping`` is set: wait for the invocations under way (and a bulk task's image) to end, and keep
        every function from starting another. False when some were still running after ``seconds``."""
        deadline = time.monotonic() + seconds
        held = [*self._locks.values(), BULK_TASK_AT_A_TIME]
        return all(lock.acquire(timeout=max(0.0, deadline - time.monotonic())) for lock in held)

    def _run(self, name: str, payload: dict[str, Any]) -> tuple[dict[str, Any], BaseException | None]:
        handler = importlib.import_module(f"functions.{name}.app").handler
        clock = CHILD_CLOCKS.of(payload) or ChildClock()  # an Express child's, which its queueing here does not move
        with clock.queued():
            self._locks[name].acquire()
        try:
            started = time.monotonic()
            with clock.running():
                response = handler(payload, LocalContext(function_name=name, aws_request_id=str(uuid.uuid4())))
        except Exception as caught:  # a handler's exception is the task's error, as in Lambda
            return _error_payload(caught), caught
        finally:
            self._locks[name].release()
            metrics.clear_metrics()  # disabled locally (see local_workflow), so nothing else clears them
            with self._counting:
                self.busy_s += time.monotonic() - started
        if time.monotonic() - started > self._timeouts.get(name, float("inf")):
            raise FunctionTimedOut(self._timeouts[name])
        return response, None


def create_idempotency_table(name: str, region: str = REGION) -> None:
    """Inside ``mock_aws``: the table ingest's claims are kept in (shared/pipeline/claims.py), as template.yaml makes
    it."""
    import boto3

    boto3.client("dynamodb", region_name=region).create_table(
        TableName=name,
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )


def local_definition() -> str:
    """The definition as the local runner creates it: placeholders filled with local values; the children run as
    Standard executions, marked for the Express limit unless the request asks for variants (see
    :func:`~tools.local.workflow.for_moto`); no Lambda Task has TimeoutSeconds, since here each function is one
    environment that a Task may wait for: with ``aws_limits``, the dispatcher times each invocation from its start
    instead, as Lambda does."""
    return without_function_timeouts(
        for_moto(
            substitute(
                {
                    placeholder: f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{FUNCTION_PREFIX}{name}"
                    for placeholder, name in FUNCTION_PLACEHOLDERS.items()
                }
                | LOCAL_FARGATE
                | {
                    "ResultsBucket": LOCAL_BUCKET,
                    "Partition": "aws",
                    "GroupExecutionType": "EXPRESS",
                    "VariantsResource": "arn:aws:states:::batch:submitJob.sync",
                }
            ),
            variants_run_standard=True,
        )
    )


@contextmanager
def _interpreter_quiet(stopping: threading.Event) -> Iterator[None]:
    """moto's interpreter logs what it does not apply (ToleratedFailurePercentage) and each optional path a state
    finds absent (NoSuchJsonPathError) as warnings and errors, on runs that succeed; how an execution ended is in
    its status and error, which the runner reports. A stopped run's execution goes on in its thread against moto's
    backends, reset once the run is left, until the process ends: it stays quiet."""
    interpreter = logging.getLogger("moto.stepfunctions.parser")
    level = interpreter.level
    interpreter.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        if not stopping.is_set():
            interpreter.setLevel(level)


# How long a stopping run waits for the invocations under way (a default-profile Detect takes seconds to tens).
DRAIN_SECONDS = 300


@contextmanager
def local_workflow(
    listener: InvocationListener | None = None,
    gate: InvocationGate | None = None,
    aws_limits: bool = False,
    stopping: threading.Event | None = None,
    dispatcher: HandlerDispatcher | None = None,
    job_queue: JobQueue | None = None,
) -> Iterator[Callable[..., ExecutionResult]]:
    """Inside: a function that runs one batch through the workflow and waits for it to end. ``aws_limits``: hold
    each function to its timeout and each child (but those of a request with variants) to the Express limit, as
    AWS does (`annotate chaos`). Off for `annotate run`: here every function is one environment on this machine's
    cores, which a batch's images queue for, and a real model may be slower here than on Lambda.

    ``dispatcher``: a Lambda service of the caller's (an account's quota, as `annotate chaos` plays it), instead of
    one made from ``listener``, ``gate``, ``aws_limits`` and ``stopping``; ``job_queue``: the stack's Batch job queue
    of the caller's (its compute environments' vCPUs), instead of one of the settings' Fargate vCPUs.

    Once ``stopping`` is set (Ctrl-C), no invocation starts; the batch under way ends ABORTED when those under
    way have ended, and the process must then end (os._exit: the workflow's threads wait for invocations that
    never come, and native libraries' threads abort an ordinary interpreter exit)."""
    import boto3
    from moto import mock_aws

    dispatcher = dispatcher or HandlerDispatcher(listener, gate, timeouts=aws_limits, stopping=stopping)
    queue = job_queue or stack_job_queue(
        get_settings().fargate_vcpus, gate=dispatcher.gate, stopping=dispatcher.stopping
    )
    with (
        _interpreter_quiet(dispatcher.stopping),
        mock_aws(config=MOTO_CONFIG),
        services_in_process(
            lambda function, _, payload: _mirroring_hand_backs(dispatcher.invoke(function, payload), payload),
            partial(run_job_container, queue, dispatcher.gate, dispatcher.listener, dispatcher.stopping),
            express_limit=aws_limits,
        ),
        # Locally the measurements are in the image rows; EMF is for CloudWatch and would flood the terminal. The
        # functions' clients resolve the region as in Lambda, from the environment: moto's region here.
        mock.patch.dict(os.environ, {"POWERTOOLS_METRICS_DISABLED": "true", "AWS_DEFAULT_REGION": REGION}),
    ):
        client = boto3.client("stepfunctions", region_name=REGION)
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=LOCAL_BUCKET)
        machine_arn = client.create_state_machine(
            name="annotate-local",
            definition=local_definition(),
            roleArn=f"arn:aws:iam::{ACCOUNT}:role/annotate-local",
        )["stateMachineArn"]

        def run(batch: BatchInput, name: str | None = None) -> ExecutionResult:
            # The ItemReader reads S3: the groups manifest ingest wrote (and the bulk lane's, the bulk manifest)
            _to_moto_s3(batch, layout.round_groups, *([layout.bulk_manifest] if batch.lane == "bulk" else []))
            execution_arn = client.start_execution(
                stateMachineArn=machine_arn,
                name=name or f"{batch.batch_id}-{uuid.uuid4().hex[:8]}",  # unnamed executions collide in moto
                input=batch.model_dump_json(),
            )["executionArn"]
            return _wait(client, execution_arn, dispatcher)

        yield run


def _to_moto_s3(batch: BatchInput, *manifests: Callable[[BatchInput], str]) -> None:
    """Copies each of ``batch``'s ``manifests`` (layout's functions of a batch) from the store in force to moto's S3,
    where the workflow's ItemReader reads it."""
    import boto3

    s3 = boto3.client("s3", region_name=REGION)
    in_moto = batch.model_copy(update={"results_uri": f"s3://{LOCAL_BUCKET}"})
    for manifest in manifests:
        local, (_, key) = manifest(batch), split_s3(manifest(in_moto))
        body = dependencies_of(Step.SUMMARIZE_BATCH).store_for(local).read_bytes(local)
        s3.put_object(Bucket=LOCAL_BUCKET, Key=key, Body=body)


def _mirroring_hand_backs(answer: tuple[dict[str, Any], bool], payload: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """A function's answer, after copying the next round's manifest to moto's S3 when it is SummarizeBatch's and
    hands groups back."""
    response, failed = answer
    if not failed and isinstance(response, dict) and response.get("handed_back"):
        ended = SummarizeInput.model_validate(payload)
        batch = BatchInput.model_validate(ended.model_dump(include=set(BatchInput.model_fields)))
        _to_moto_s3(batch.model_copy(update={"round": response["handed_back"]["round"]}), layout.round_groups)
    return answer


def _wait(client: Any, execution_arn: str, dispatcher: HandlerDispatcher) -> ExecutionResult:
    pause = 0.02
    while (execution := client.describe_execution(executionArn=execution_arn))["status"] == "RUNNING":
        if dispatcher.stopping.is_set():
            drained = dispatcher.drain(DRAIN_SECONDS)
            reason = "stopped (Ctrl-C or SIGTERM)" + ("" if drained else "; some invocations had not ended")
            return ExecutionResult(execution_arn=execution_arn, status="ABORTED", summary=None, error=reason)
        time.sleep(pause)
        pause = min(pause * 1.5, 0.5)  # each poll is a request through moto, which competes for the GIL
    status = execution["status"]
    if status in ENDED_WITHOUT_SUMMARY:
        _execution_ended(execution, dispatcher)
    summary = BatchSummary.model_validate_json(execution["output"]) if status == "SUCCEEDED" else None
    error = None if summary else f"{execution.get('error', status)}: {_one_line(execution.get('cause', ''))}"
    logger.info("execution ended", extra={"execution_arn": execution_arn, "status": status})
    return ExecutionResult(execution_arn=execution_arn, status=status, summary=summary, error=error)


# The statuses template.yaml's ExecutionEndedRule sends on to BatchEnded
ENDED_WITHOUT_SUMMARY = ("TIMED_OUT", "FAILED", "ABORTED")


def _execution_ended(execution: dict[str, Any], dispatcher: HandlerDispatcher) -> None:
    """What EventBridge does on the execution's end (template.yaml, ExecutionEndedRule): its status change, as Step
    Functions sends it, to BatchEnded, which writes the failure rows of the groups it left unfinished."""
    event = status_change_event(execution)
    response, failed = dispatcher.invoke("batch_ended", event)
    if failed:  # a warning: the run's own account says what is left unannotated, and why (a full disk, say)
        logger.warning("BatchEnded failed", extra={"execution": execution["name"], "error": response})


def _one_line(cause: str) -> str:
    """An execution's cause as a person reads it: a Lambda error payload's type and message, not its stack."""
    try:
        payload = json.loads(cause)
    except ValueError:
        payload = None
    if isinstance(payload, dict) and "errorMessage" in payload:
        cause = f"{payload.get('errorType', 'Error')}: {payload['errorMessage']}"
    lines = cause.strip().splitlines()
    return lines[0][:500] if lines else ""


class LocalStarter:
    """Runs each started batch to its end through the local workflow, keeping the results in order and a record
    of each run in ``data_dir/runs/`` (what ``annotate status`` reads)."""

    def __init__(
        self,
        run: Callable[..., ExecutionResult],
        data_dir: Path,
        delivery: str,
        stopping: threading.Event | None = None,
    ) -> None:
        self._run = run
        self._stopping = stopping or threading.Event()
        self._data_dir = data_dir
        self._delivery = delivery
        self.results: list[tuple[BatchInput, ExecutionResult]] = []
        self._started: set[str] = set()

    def start(self, batch: BatchInput, name: str) -> str:
        from tools.results.status import RunRecord, now, record_run

        self._started.add(name)
        record = RunRecord(
            execution_name=name,
            batch_id=batch.batch_id,
            delivery=self._delivery,
            images=batch.images,
            started_at=now(),
            pid=os.getpid(),
        )
        record_run(self._data_dir, record)
        if self._stopping.is_set():  # a batch after Ctrl-C: recorded, so that status counts its images as left
            result = ExecutionResult(
                execution_arn=name, status="ABORTED", summary=None, error="stopped before it started"
            )
        else:
            result = self._run(batch, name)
        ended = {"status": result.status, "ended_at": now(), "error": result.error}
        record_run(self._data_dir, record.model_copy(update=ended))
        self.results.append((batch, result))
        return result.execution_arn

    def exists(self, name: str) -> bool:
        return name in self._started
