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
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from tools.local import workflow
from tools.local.workflow import EXPRESS_CHILDREN, EXPRESS_UNLESS_VARIANTS


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


class FargateRefused(Exception):
    """ECS did not start a task (over the account's Fargate vCPUs, or no Spot capacity): under ``runTask.sync`` the
    Task fails with ``error``, ``AmazonECS.Unknown`` for both (the Step Functions ECS integration page)."""

    def __init__(self, reason: str, error: str = "AmazonECS.Unknown") -> None:
        super().__init__(reason)
        self.error = error


@contextmanager
def aws_task_errors() -> Iterator[None]:
    """Inside: a Lambda Task failed by the Lambda service fails with ``Lambda.<exception name>``, as on AWS."""
    from botocore.exceptions import ClientError
    from moto.stepfunctions.parser.asl.component.common.error_name.custom_error_name import CustomErrorName
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import FailureEvent
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.state_task_lambda import StateTaskLambda

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


@contextmanager
def express_children_limited() -> Iterator[None]:
    """Inside: each child of a Distributed Map whose processor carries :data:`EXPRESS_CHILDREN` ends after
    ``tools.local.workflow.EXPRESS_LIMIT_S``, as an Express execution does; a Standard child (a stack with variants)
    runs on."""
    from moto.stepfunctions.parser.asl.component.common.timeouts.timeout import TimeoutSeconds
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.iteration.itemprocessor import (
        distributed_item_processor_worker as worker,
    )

    eval_job = worker.DistributedItemProcessorWorker._eval_job

    def within_the_limit(self: Any, env: Any, job: Any) -> None:
        marker = getattr(job.job_program.comment, "comment", None)
        variants = isinstance(job.job_input, dict) and (job.job_input.get("request") or {}).get("variants")
        if marker == EXPRESS_CHILDREN or (marker == EXPRESS_UNLESS_VARIANTS and not variants):
            # one request per map run: every job of the shared program agrees
            job.job_program.timeout_seconds = TimeoutSeconds(timeout_seconds=int(workflow.EXPRESS_LIMIT_S))
        eval_job(self, env, job)

    with mock.patch.object(worker.DistributedItemProcessorWorker, "_eval_job", within_the_limit):
        yield
