"""What Step Functions does that moto's interpreter does not, for the local runner and the rehearsal alike.

- A Lambda Task whose Invoke call the Lambda service refuses fails with the service's exception name behind
  ``Lambda.``: a transient error "such as ClientExecutionTimeoutException, ServiceException, AWSLambdaException, or
  SdkClientException", and at the maximum number of invocations "the error is Lambda.TooManyRequestsException" (Step
  Functions developer guide, Handle Lambda service exceptions; SnapStart's SnapStartNotReadyException and
  SnapStartTimeoutException likewise). moto names them all
  ``Exception``, which no Retry of the workflow matches.
- An Express execution ends after five minutes, its maximum duration (Step Functions developer guide, Choosing
  workflow type). A Distributed Map's Express child that runs longer times out as a whole; the states it had not
  reached never run. moto runs every child as a Standard one (its parser refuses Express children), without limit.
  Here the five minutes are counted on the child's own clock (:class:`ChildClock`), not this machine's: on AWS each
  invocation has an environment of its own, where here it may queue for its function's one.

And where the interpreter's service calls are served in this process (:func:`services_in_process`): its Lambda
invocations by the caller's handlers, its AWS Batch jobs by the caller's job runner (tools/local/batch_jobs.py: the
stack's job queue), as a job that failed past its retry strategy fails a Task on AWS. Every patch of moto's interpreter
is in this module.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any
from unittest import mock

from tools.local import workflow
from tools.local.batch_jobs import JobFailed
from tools.local.workflow import EXPRESS_CHILDREN, EXPRESS_UNLESS_VARIANTS


def status_change_event(described: dict[str, Any]) -> dict[str, Any]:
    """The event Step Functions sends EventBridge on a Standard execution's status change ("Step Functions Execution
    Status Change", Step Functions developer guide, "Automating Step Functions event delivery with EventBridge"), for
    an execution as DescribeExecution describes it."""
    arn = str(described["executionArn"])
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Step Functions Execution Status Change",
        "source": "aws.states",
        "account": arn.split(":")[4],
        "region": arn.split(":")[3],
        "resources": [arn],
        "detail": {
            "executionArn": arn,
            "stateMachineArn": described["stateMachineArn"],
            "name": described["name"],
            "status": described["status"],
            "input": described.get("input"),
            "inputDetails": {"included": True},
            "error": described.get("error"),
            "cause": described.get("cause"),
        },
    }


class FunctionTimedOut(Exception):
    """Lambda ended an invocation at the function's timeout: the Invoke call answers with a function error."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"Task timed out after {seconds:.2f} seconds")


class LambdaServiceError(Exception):
    """The Lambda service refused an Invoke call (a throttle, a SnapStart version not ready, a service fault): the
    function did not run."""

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message or code

    def as_client_error(self) -> Exception:
        from botocore.exceptions import ClientError

        return ClientError({"Error": {"Code": self.code, "Message": self.message}}, "Invoke")


@contextmanager
def aws_task_errors() -> Iterator[None]:
    """Inside: a Lambda Task failed by the Lambda service fails with ``Lambda.<exception name>``, as on AWS."""
    from botocore.exceptions import ClientError

    from tools.aws.moto_internals import CustomErrorName, FailureEvent, StateTaskLambda

    from_error = StateTaskLambda._from_error

    def named_as_aws_names_it(task: Any, env: Any, ex: Exception) -> Any:  # moto passes ``ex`` by keyword
        event = from_error(task, env, ex=ex)
        if not isinstance(ex, ClientError):
            return event
        name = f"Lambda.{ex.response['Error']['Code']}"
        recorded: dict[str, Any] = dict(event.event_details or {})
        details: Any = {kind: {**value, "error": name} for kind, value in recorded.items()}
        return FailureEvent(
            env=env, error_name=CustomErrorName(name), event_type=event.event_type, event_details=details
        )

    with mock.patch.object(StateTaskLambda, "_from_error", named_as_aws_names_it):
        yield


class ChildClock:
    """The time an Express child would have spent on AWS: its time here, less the spans in which none of its
    invocations ran and one waited for its function's environment. Locally each function has one environment, which
    every child's invocations queue for; on AWS each would have had its own. The child's steps, its retries' waits
    and a function that runs long all count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._queued = self._running = 0
        self._paused_s = 0.0
        self._paused_since: float | None = None

    def queued(self) -> AbstractContextManager[None]:
        """Inside: one of the child's invocations waits for its function's environment."""
        return self._counted(queued=1)

    def running(self) -> AbstractContextManager[None]:
        """Inside: one of the child's invocations runs."""
        return self._counted(running=1)

    @contextmanager
    def _counted(self, queued: int = 0, running: int = 0) -> Iterator[None]:
        self._count(queued, running)
        try:
            yield
        finally:
            self._count(-queued, -running)

    def _count(self, queued: int, running: int) -> None:
        with self._lock:
            now = time.monotonic()
            self._queued += queued
            self._running += running
            paused = self._queued > 0 and self._running == 0
            if paused and self._paused_since is None:
                self._paused_since = now
            elif not paused and self._paused_since is not None:
                self._paused_s += now - self._paused_since
                self._paused_since = None

    def seconds(self) -> float:
        with self._lock:
            now = time.monotonic()
            pausing = now - self._paused_since if self._paused_since is not None else 0.0
            return now - self._started - self._paused_s - pausing


class ChildClocks:
    """Each running Express child's clock, found from an invocation's payload by the batch and image it names."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_image: dict[tuple[str, str], ChildClock] = {}

    @contextmanager
    def started(self, child_input: dict[str, Any]) -> Iterator[ChildClock]:
        """A clock for the child of ``child_input`` (its batch and group), for as long as it runs."""
        batch = str(child_input.get("batch_id"))
        keys = [(batch, str(image.get("image_id"))) for image in (child_input.get("group") or {}).get("images", [])]
        clock = ChildClock()
        with self._lock:
            self._by_image |= dict.fromkeys(keys, clock)
        try:
            yield clock
        finally:
            with self._lock:
                for key in keys:
                    if self._by_image.get(key) is clock:
                        del self._by_image[key]

    def of(self, payload: dict[str, Any]) -> ChildClock | None:
        """The clock of the child an invocation belongs to, by the batch and image it names: a per-image step's own
        (its payload, or its ``task``) or the group table's first outcome's; None outside an Express child."""
        task = payload["task"] if isinstance(payload.get("task"), dict) else payload
        outcomes = payload.get("outcomes") if isinstance(payload.get("outcomes"), list) else []
        image = task.get("image") or (outcomes[0].get("image") if outcomes else None) or {}
        batch = task.get("batch_id")
        with self._lock:
            return self._by_image.get((str(batch), str(image.get("image_id"))))


CHILD_CLOCKS = ChildClocks()


@contextmanager
def express_children_limited() -> Iterator[None]:
    """Inside: each child of a Distributed Map whose processor carries :data:`EXPRESS_CHILDREN` ends once its
    :class:`ChildClock` passes ``tools.local.workflow.EXPRESS_LIMIT_S``, as an Express execution ends at its limit; a
    Standard child (a stack with variants) runs on."""
    from tools.aws.moto_internals import TMP_THREADS, EvalComponent, Program
    from tools.aws.moto_internals import distributed_item_processor_worker as worker

    eval_job, eval_program = worker.DistributedItemProcessorWorker._eval_job, Program.eval
    markers: dict[int, str] = {}  # the processor's marker, by the id of a child's environment

    def marked(self: Any, env: Any, job: Any) -> None:
        marker = getattr(job.job_program.comment, "comment", None)
        if marker in (EXPRESS_CHILDREN, EXPRESS_UNLESS_VARIANTS):
            markers[id(env)] = marker
        try:
            eval_job(self, env, job)
        finally:
            markers.pop(id(env), None)

    def on_the_child_s_clock(program: Any, env: Any) -> None:
        """moto's Program.eval, its wall-clock join on the program's thread replaced by an Express child's clock."""
        marker = markers.get(id(env))
        child_input = env.states.get_input()  # the child's input, its ItemSelector applied
        child_input = child_input if isinstance(child_input, dict) else {}
        variants = (child_input.get("request") or {}).get("variants")
        if marker is None or (marker == EXPRESS_UNLESS_VARIANTS and variants):
            eval_program(program, env)
            return
        env.next_state_name = program.start_at.start_at_name
        running = threading.Thread(target=EvalComponent.eval, args=(program, env), daemon=True)
        TMP_THREADS.append(running)
        with CHILD_CLOCKS.started(child_input) as clock:
            running.start()
            while running.is_alive():
                left = workflow.EXPRESS_LIMIT_S - clock.seconds()
                if left <= 0:
                    env.set_timed_out()
                    return
                running.join(timeout=min(1.0, left))

    with (
        mock.patch.object(worker.DistributedItemProcessorWorker, "_eval_job", marked),
        mock.patch.object(Program, "eval", on_the_child_s_clock),
    ):
        yield


# Runs one AWS Batch job to its end from SubmitJob's parameters and the job's id; raises when it ends FAILED.
JobRunner = Callable[[dict[str, Any], str], None]


# Serves one Lambda invocation: (function name or ARN, qualifier, payload) -> (response, whether an error).
Invoker = Callable[[str, str | None, dict[str, Any]], tuple[dict[str, Any], bool]]


def container_environment(submit_job_parameters: dict[str, Any]) -> dict[str, str]:
    """The environment SubmitJob's container overrides set (moto keeps the keys' case as written, and adds its own
    MANAGED_BY_AWS in lower case)."""
    overrides = submit_job_parameters.get("containerOverrides") or submit_job_parameters.get("ContainerOverrides") or {}
    return {
        (item.get("name") or item.get("Name")): (item.get("value") or item.get("Value"))
        for item in (overrides.get("environment") or overrides.get("Environment") or [])
    }


def _task_failed(service: Any, env: Any, cause: str, error: str = "States.TaskFailed") -> Exception:
    """States.TaskFailed with ``cause``, as a job that ended FAILED gives under ``submitJob.sync`` (its description
    as the cause); moto would otherwise report States.Runtime, which States.ALL cannot catch."""
    from tools.aws.moto_internals import (
        CustomErrorName,
        EventDetails,
        FailureEvent,
        FailureEventException,
        HistoryEventType,
        StatesErrorName,
        StatesErrorNameType,
        TaskFailedEventDetails,
    )

    details = TaskFailedEventDetails(
        error=error,
        cause=cause,
        resource=service._get_sfn_resource(),
        resourceType=service._get_sfn_resource_type(),
    )
    event = FailureEvent(
        env=env,
        error_name=(
            StatesErrorName(typ=StatesErrorNameType.StatesTaskFailed)
            if error == "States.TaskFailed"
            else CustomErrorName(error)
        ),
        event_type=HistoryEventType.TaskFailed,
        event_details=EventDetails(taskFailedEventDetails=details),  # type: ignore[typeddict-item]
    )
    return FailureEventException(failure_event=event)


@contextmanager
def services_in_process(invoke: Invoker, run_job: JobRunner, express_limit: bool = True) -> Iterator[None]:
    """Inside an active ``mock_aws``: the interpreter's Lambda invocations and AWS Batch jobs (.sync) run here, a
    Lambda service error fails a Task as on AWS, and (``express_limit``) Express children end at the Express limit."""
    from tools.aws.moto_internals import LambdaSimpleBackend, StateTaskServiceBatch, lambda_eval_utils

    def lambda_invoke(backend: Any, function: str, qualifier: Any, body: Any, headers: Any, response_headers: Any):
        response, failed = invoke(function, qualifier, json.loads(body or "{}"))
        if failed:
            response_headers["x-amz-function-error"] = "Unhandled"
        return json.dumps(response).encode()

    # The interpreter's Lambda tasks, straight to ``invoke``: through a botocore client and moto's HTTP routing
    # each invocation cost tens of milliseconds of the GIL, which a thousand-image run spends ten times over.
    def interpreter_invoke(parameters: dict[str, Any], region: str, state_credentials: Any) -> dict[str, Any]:
        function, qualifier = str(parameters["FunctionName"]), parameters.get("Qualifier")
        if function.startswith("arn:") and function.count(":") == 7:  # an alias or version ARN
            function, qualifier = function.rsplit(":", 1)
        payload = parameters.get("Payload") or b"{}"
        try:
            response, failed = invoke(
                function, qualifier, json.loads(payload) if isinstance(payload, str | bytes) else payload
            )
        except LambdaServiceError as refused:  # the Invoke call itself failed, as botocore raises it
            raise refused.as_client_error() from refused
        return {"StatusCode": 200, "Payload": response} | ({"FunctionError": "Unhandled"} if failed else {})

    # moto calls this with keywords: the parameter names are its own.
    def submit_job(
        service: Any, env: Any, resource_runtime_part: Any, normalised_parameters: dict, state_credentials: Any
    ) -> None:
        job_id = str(uuid.uuid4())
        name = normalised_parameters.get("jobName") or normalised_parameters.get("JobName") or "job"
        try:
            run_job(normalised_parameters, job_id)
        except JobFailed as failed:  # the job ended FAILED: its description (DescribeJobs') is the Task's cause
            attempt = {"Container": {"ExitCode": failed.exit_code, "Reason": failed.reason}}
            description = {
                "JobId": job_id,
                "JobName": name,
                "Status": "FAILED",
                "StatusReason": failed.status_reason,
                "Attempts": [attempt],
            }
            raise _task_failed(service, env, json.dumps(description)) from failed
        env.stack.append({"JobId": job_id, "JobName": name, "Status": "SUCCEEDED"})

    def described_job(service: Any, env: Any, *args: Any, **kwargs: Any) -> Callable[[], dict]:
        job = env.stack.pop()
        return lambda: job

    with (
        aws_task_errors(),
        express_children_limited() if express_limit else nullcontext(),
        mock.patch.object(LambdaSimpleBackend, "invoke", lambda_invoke),
        mock.patch.object(lambda_eval_utils, "_invoke_lambda_function", interpreter_invoke),
        mock.patch.object(StateTaskServiceBatch, "_eval_service_task", submit_job),
        mock.patch.object(StateTaskServiceBatch, "_build_sync_resolver", described_job),
    ):
        yield
