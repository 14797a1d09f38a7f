"""Run the real workflow definition on this machine, with no AWS account.

moto's Step Functions interpreter (LocalStack's) executes ``state_machine/pipeline.asl.json`` as AWS would;
its Lambda invocations are dispatched here to the real handlers in ``functions/``, in this process. As in
Lambda, each function serves one invocation at a time.
"""

from __future__ import annotations

import importlib
import json
import os
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from unittest import mock

from shared.contracts import BatchManifest, BatchSummary
from shared.observability import logger, metrics
from shared.workflow import FUNCTION_PLACEHOLDERS, substitute

if TYPE_CHECKING:
    from moto.core.config import DefaultConfig

REGION = "us-east-1"
ACCOUNT = "123456789012"
FUNCTION_PREFIX = "annotate-"
MOTO_CONFIG: DefaultConfig = {"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}

# (function name, payload, error or None), after each invocation: the CLI's progress display listens.
InvocationListener = Callable[[str, dict[str, Any], BaseException | None], None]


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


class HandlerDispatcher:
    """Stands in for the Lambda service: runs ``functions/<name>/app.handler`` in this process."""

    def __init__(self, listener: InvocationListener | None = None) -> None:
        self._listener = listener
        self._locks = {name: threading.Lock() for name in FUNCTION_PLACEHOLDERS.values()}

    def invoke(self, function: str, payload: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """(response payload, whether it is an error payload), as the Lambda Invoke API returns them."""
        name = function.rsplit(":function:", 1)[-1].split(":", 1)[0].removeprefix(FUNCTION_PREFIX)
        handler = importlib.import_module(f"functions.{name}.app").handler
        error: BaseException | None = None
        with self._locks[name]:
            try:
                response = handler(payload, LocalContext(function_name=name, aws_request_id=str(uuid.uuid4())))
            except Exception as caught:  # a handler's exception is the task's error, as in Lambda
                error = caught
                response = {
                    "errorType": type(caught).__name__,
                    "errorMessage": str(caught),
                    "stackTrace": traceback.format_tb(caught.__traceback__),
                }
            metrics.clear_metrics()  # disabled locally (see local_workflow), so nothing else clears them
        if self._listener:
            self._listener(name, payload, error)
        return response, error is not None


@contextmanager
def local_workflow(
    listener: InvocationListener | None = None,
) -> Iterator[Callable[[BatchManifest], ExecutionResult]]:
    """Inside: a function that runs one batch through the workflow and waits for it to end."""
    import boto3
    from moto import mock_aws
    from moto.awslambda_simple.models import LambdaSimpleBackend

    dispatcher = HandlerDispatcher(listener)

    def invoke(backend: Any, function_name: str, qualifier: Any, body: Any, headers: Any, response_headers: Any):
        response, failed = dispatcher.invoke(function_name, json.loads(body or "{}"))
        if failed:
            response_headers["x-amz-function-error"] = "Unhandled"
        return json.dumps(response).encode()

    definition = substitute(
        {
            placeholder: f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{FUNCTION_PREFIX}{name}"
            for placeholder, name in FUNCTION_PLACEHOLDERS.items()
        }
    )
    with (
        mock_aws(config=MOTO_CONFIG),
        mock.patch.object(LambdaSimpleBackend, "invoke", invoke),
        # Locally the measurements are in the image rows; EMF is for CloudWatch and would flood the terminal.
        mock.patch.dict(os.environ, {"POWERTOOLS_METRICS_DISABLED": "true"}),
    ):
        client = boto3.client("stepfunctions", region_name=REGION)
        machine_arn = client.create_state_machine(
            name="annotate-local",
            definition=definition,
            roleArn=f"arn:aws:iam::{ACCOUNT}:role/annotate-local",
        )["stateMachineArn"]

        def run(manifest: BatchManifest) -> ExecutionResult:
            execution_arn = client.start_execution(
                stateMachineArn=machine_arn,
                name=f"{manifest.batch_id}-{uuid.uuid4().hex[:8]}",  # unnamed executions collide in moto
                input=manifest.model_dump_json(),
            )["executionArn"]
            return _wait(client, execution_arn)

        yield run


def _wait(client: Any, execution_arn: str) -> ExecutionResult:
    while (execution := client.describe_execution(executionArn=execution_arn))["status"] == "RUNNING":
        time.sleep(0.05)
    status = execution["status"]
    summary = BatchSummary.model_validate_json(execution["output"]) if status == "SUCCEEDED" else None
    error = None if summary else f"{execution.get('error', status)}: {execution.get('cause', '')}"
    logger.info("execution ended", extra={"execution_arn": execution_arn, "status": status})
    return ExecutionResult(execution_arn=execution_arn, status=status, summary=summary, error=error)


class LocalStarter:
    """Runs each started batch to its end through the local workflow, keeping the results in order."""

    def __init__(self, run: Callable[[BatchManifest], ExecutionResult]) -> None:
        self._run = run
        self.results: list[tuple[BatchManifest, ExecutionResult]] = []

    def start(self, manifest: BatchManifest, name: str) -> str:
        result = self._run(manifest)
        self.results.append((manifest, result))
        return result.execution_arn
