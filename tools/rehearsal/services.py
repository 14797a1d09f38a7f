"""The deployed stack's compute, run in this process: Lambda (invocations and SQS polling) and AWS Batch jobs.

Each function runs its real handler with settings read from exactly its deployed environment variables, its
deployed memory and timeout in the context, and as its deployed role in the call log; a Batch job's container
likewise with its deployed job definition's environment and SubmitJob's overrides, as its job role, placed on the
deployed job queue's compute environments and retried by the deployed job definition's retry strategy
(tools/local/batch_jobs.py). What Lambda and Batch set besides (AWS_REGION, AWS_DEFAULT_REGION) is the stack's
region, in this process's environment for the whole rehearsal. There is one settings override per process, so
invocations take turns.
"""

from __future__ import annotations

import importlib
import itertools
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from shared.settings import get_settings, settings_from_environment, use_settings
from tools.local.batch_jobs import ComputeEnvironment, JobQueue, RetryStrategy, TaskStopped
from tools.local.step_functions import LambdaServiceError, container_environment, services_in_process
from tools.rehearsal.aws_requests import RequestLog, acting_as, current_principal
from tools.rehearsal.iam import Request
from tools.rehearsal.stack import DeployedFunction, DeployedStack


@dataclass(frozen=True)
class LambdaContext:
    """The parts of Lambda's context object that handlers and Powertools read."""

    function_name: str
    invoked_function_arn: str
    memory_limit_in_mb: int
    deadline: float
    aws_request_id: str
    function_version: str = "$LATEST"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.deadline - time.monotonic()) * 1000))


@dataclass(frozen=True)
class Poll:
    response: dict[str, Any]
    queue_url: str
    failed_receipts: list[str]  # back on the queue once their visibility timeout passes


@contextmanager
def settings_of(variables: dict[str, str]) -> Iterator[None]:
    """Exactly ``variables`` as the settings' environment, as a fresh process would read them; none of this
    machine's ANNOTATE_* leak in. ``os.environ`` itself is left alone: changing it while other threads run
    native code (torch, OpenSSL) can crash the process."""
    before = get_settings()
    use_settings(settings_from_environment(variables))
    try:
        yield
    finally:
        use_settings(before)


# An act holding a function's invocations ends within this, or they go on without it
HELD_AT_MOST_S = 120


class InProcessServices:
    def __init__(self, stack: DeployedStack, log: RequestLog) -> None:
        self.stack = stack
        self.log = log
        self.problems: list[str] = []
        self._turn = threading.RLock()
        self._state_machine = stack.state_machine
        self.bulk_tasks = 0  # bulk containers run, the stopped ones included
        self.interrupt_next_bulk_task = False  # the next bulk task is stopped after one image (a Spot interruption)
        self.environments_used: set[str] = set()  # the kinds of compute environment (FARGATE_SPOT, FARGATE) jobs ran on
        self.task_networks: list[dict[str, Any]] = []  # each job's network: its environment's and its definition's
        self._throttled: dict[tuple[str, str], int] = {}  # (function, image file name) -> invocations left to refuse
        self._held: dict[str, threading.Event] = {}  # function (logical id) -> set when its invocations may go on
        self._waiting: Counter[str] = Counter()  # function (logical id) -> its invocations held now
        self._waiting_lock = threading.Lock()

    def throttle(self, function: str, image_name: str, invocations: int) -> None:
        """Refuse the state machine's next ``invocations`` of ``function`` (logical id) for the image of that file
        name, as Lambda refuses an invocation past the account's concurrency (TooManyRequestsException)."""
        self._throttled[(function, image_name)] = invocations

    @contextmanager
    def holding(self, function: str) -> Iterator[None]:
        """The state machine's invocations of ``function`` (logical id) wait while this is open (each at most
        HELD_AT_MOST_S), as a slow function's would: what an act does meanwhile happens while they run."""
        released = self._held.setdefault(function, threading.Event())
        released.clear()
        try:
            yield
        finally:
            released.set()
            del self._held[function]

    def wait_until_held(self, function: str, timeout_s: float = 30.0) -> None:
        """Return once an invocation of ``function`` (logical id, inside ``holding``) is held.

        Raises:
            TimeoutError: none arrived within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while not self._waiting[function]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no invocation of {function} arrived within {timeout_s:g} s")
            time.sleep(0.02)

    def invoke(self, function: DeployedFunction, event: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """(response, whether it is an error payload), as the Invoke API returns them."""
        with self._turn:
            return self._run(function, event)

    def _invoked(self, function: str, qualifier: str | None, payload: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """An Invoke call: the state machine's, or a function's own (the API writing a recorded call's rows), which
        the call log records as its role. The calling function holds the turn and waits for this answer, from
        another thread (the API's work runs in a thread pool): it runs without taking the turn again."""
        if current_principal() in self.stack.functions:
            return self._run(self.stack.function_by_arn(function), payload)
        return self.invoked_by_state_machine(function, qualifier, payload)

    def _run(self, function: DeployedFunction, event: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        with settings_of(function.environment), acting_as(function.logical_id):
            handler = getattr(importlib.import_module(function.code.module), function.code.function)
            started = time.monotonic()
            context = LambdaContext(
                function_name=function.name,
                invoked_function_arn=function.arn,
                memory_limit_in_mb=function.memory_mb,
                deadline=started + function.timeout_s,
                aws_request_id=str(uuid.uuid4()),
            )
            try:
                response, failed = handler(event, context), False
            except Exception as error:  # a handler's exception is the invocation's error, as in Lambda
                response, failed = (
                    {
                        "errorType": type(error).__name__,
                        "errorMessage": str(error),
                        "stackTrace": traceback.format_tb(error.__traceback__),
                    },
                    True,
                )
            seconds = time.monotonic() - started
            if seconds > function.timeout_s:
                self.problems.append(
                    f"{function.logical_id} ran {seconds:.0f} s, over its timeout {function.timeout_s} s"
                )
            return response, failed

    def invoked_by_state_machine(self, function: str, qualifier: str | None, payload: dict[str, Any]):
        """An invocation as the state machine's Lambda task makes it, as its role."""
        deployed = self.stack.function_by_arn(function)
        arn = function if function.startswith("arn:") else deployed.arn
        if qualifier and not arn.endswith(f":{qualifier}"):
            arn += f":{qualifier}"
        self.log.add(Request(self._state_machine, "lambda:InvokeFunction", arn), arn.split(":")[3])
        image = (payload.get("image") or payload.get("task", {}).get("image") or {}).get("source_uri", "")
        refusal = (deployed.logical_id, image.rsplit("/", 1)[-1])
        if (held := self._held.get(deployed.logical_id)) is not None:
            with self._waiting_lock:
                self._waiting[deployed.logical_id] += 1
            try:
                held.wait(timeout=HELD_AT_MOST_S)
            finally:
                with self._waiting_lock:
                    self._waiting[deployed.logical_id] -= 1
        with self._turn:
            if self._throttled.get(refusal):
                self._throttled[refusal] -= 1
                raise LambdaServiceError("TooManyRequestsException", "Rate Exceeded. (the rehearsal's account)")
        return self.invoke(deployed, payload)

    def _run_job(self, parameters: dict[str, Any], job_id: str) -> None:
        """SubmitJob .sync as Step Functions makes it (as the state machine's role), then the job on the deployed
        queue's compute environments, its container as the job role, with the deployed job definition's environment
        and SubmitJob's overrides, retried as the deployed definition's retry strategy says."""
        import boto3

        batch = boto3.client("batch", region_name=self.stack.region)
        queue_arn = str(parameters.get("jobQueue") or parameters.get("JobQueue"))
        definition_arn = str(parameters.get("jobDefinition") or parameters.get("JobDefinition"))
        region, account = self.stack.region, self.log.account
        sync_rule = f"arn:aws:events:{region}:{account}:rule/StepFunctionsGetEventsForBatchJobsRule"
        for request in (
            Request(self._state_machine, "batch:SubmitJob", queue_arn),
            Request(self._state_machine, "batch:SubmitJob", definition_arn),
            *(
                Request(self._state_machine, f"events:{a}", sync_rule)
                for a in ("PutTargets", "PutRule", "DescribeRule")
            ),
            Request(self._state_machine, "batch:DescribeJobs", "*"),
        ):
            self.log.add(request, region)
        [definition] = batch.describe_job_definitions(jobDefinitions=[definition_arn])["jobDefinitions"]
        container = definition["containerProperties"]
        variables = {item["name"]: item["value"] for item in container.get("environment", [])}
        variables |= container_environment(parameters)
        job_role = self.stack.logical_id_of_role(container["jobRoleArn"])
        queue = self._job_queue(batch, queue_arn, definition)
        vcpus = next(float(r["value"]) for r in container["resourceRequirements"] if r["type"] == "VCPU")

        def run_container(environment: str) -> None:
            self.environments_used.add(environment)
            with self._turn, settings_of(variables), acting_as(job_role):
                if "ANNOTATE_BULK_JOB" in variables:
                    self._run_bulk_task()
                    return
                from shared.pipeline.variants_task import main

                if main() != 0:
                    raise TaskStopped("Essential container in task exited", 1, "the Variants container's log says why")

        queue.run("bulk" if "ANNOTATE_BULK_JOB" in variables else "variants", vcpus, run_container)

    def _job_queue(self, batch: Any, queue_arn: str, definition: dict[str, Any]) -> JobQueue:
        """The deployed queue as Batch runs it: its compute environments in their order, each of its deployed
        maxvCpus, whose networks must exist (a job's task fails to start on a subnet or security group that does
        not: AWS Batch API reference, ComputeResource); the job definition's own retry strategy."""
        import boto3

        [described] = batch.describe_job_queues(jobQueues=[queue_arn])["jobQueues"]
        order = sorted(described["computeEnvironmentOrder"], key=lambda entry: entry["order"])
        arns = [entry["computeEnvironment"] for entry in order]
        environments = batch.describe_compute_environments(computeEnvironments=arns)["computeEnvironments"]
        by_arn = {environment["computeEnvironmentArn"]: environment for environment in environments}
        ec2 = boto3.client("ec2", region_name=self.stack.region)
        placed: list[ComputeEnvironment] = []
        for arn in arns:
            resources = by_arn[arn]["computeResources"]
            network = {
                "Subnets": resources["subnets"],
                "SecurityGroups": resources["securityGroupIds"],
                "AssignPublicIp": definition["containerProperties"]["networkConfiguration"]["assignPublicIp"],
            }
            try:
                ec2.describe_subnets(SubnetIds=network["Subnets"])
                ec2.describe_security_groups(GroupIds=network["SecurityGroups"])
            except ec2.exceptions.ClientError as error:
                self.problems.append(f"a compute environment names a network that does not exist: {error}")
            self.task_networks.append(network)
            placed.append(ComputeEnvironment(resources["type"], float(resources["maxvCpus"])))
        kind = "bulk" if definition["jobDefinitionName"].endswith("-bulk") else "variants"
        return JobQueue(
            environments=placed, strategies={kind: RetryStrategy.of_api(definition.get("retryStrategy", {}))}
        )

    def _run_bulk_task(self) -> None:
        """The bulk container's work, as its entrypoint does it; where an act asks, the task is stopped after one
        image, as a Spot interruption stops it (SIGTERM between two images), and the workflow runs the job again."""
        from shared.models.cache import forget_loaded_models
        from shared.models.sources import forget_model_files
        from shared.pipeline.bulk import run_task

        if not self.bulk_tasks:  # a task starts on a machine of its own: it reads the models, as its role
            forget_loaded_models()
            forget_model_files()
        self.bulk_tasks += 1
        asked = itertools.count()
        interrupted, self.interrupt_next_bulk_task = self.interrupt_next_bulk_task, False
        exit_code = run_task(stopping=lambda: interrupted and next(asked) >= 1)
        if exit_code != 0:
            raise TaskStopped("Essential container in task exited", exit_code, "the bulk container's log says why")

    @contextmanager
    def serving(self) -> Iterator[None]:
        """Inside: the stack's state machine invokes its functions and runs its tasks here, and its queues wait
        for :meth:`poll`: moto would otherwise invoke a queue's function itself as each message arrives, one
        message at a time, outside the function's role."""
        from tools.aws.moto_internals import sqs_backends

        queues = sqs_backends[self.log.account][self.stack.region].queues.values()
        mappings = {queue: queue.lambda_event_source_mappings for queue in queues}
        try:
            for queue in mappings:
                queue.lambda_event_source_mappings = {}
            with services_in_process(self._invoked, self._run_job), self._distributed_map_calls():
                yield
        finally:
            for queue, mapping in mappings.items():
                queue.lambda_event_source_mappings = mapping

    @contextmanager
    def _distributed_map_calls(self) -> Iterator[None]:
        """The Distributed Map's own requests, made as the state machine's role: reading the groups manifest
        (ItemReader) and writing the map run's results (ResultWriter) are moto's real S3 calls, recorded as any
        other; starting and following each child execution happen inside moto and are logged here as Step
        Functions makes them."""
        from unittest import mock

        from tools.aws.moto_internals import ItemReader, ResultWriter

        machine_arn, region = self.stack.state_machine_arn, self.stack.region
        read_items, write_results = ItemReader._eval_body, ResultWriter._eval_body

        def read_as_the_state_machine(reader: Any, env: Any) -> None:
            with acting_as(self._state_machine):
                read_items(reader, env)
            children = env.stack[-1] if env.stack and isinstance(env.stack[-1], list) else []
            execution = machine_arn.replace(":stateMachine:", ":execution:")
            for _ in children:
                child = f"{execution}/{uuid.uuid4()}"
                for action, resource in (("states:StartExecution", machine_arn), ("states:DescribeExecution", child)):
                    self.log.add(Request(self._state_machine, action, resource), region)

        def write_as_the_state_machine(writer: Any, env: Any) -> None:
            with acting_as(self._state_machine):
                write_results(writer, env)

        with (
            mock.patch.object(ItemReader, "_eval_body", read_as_the_state_machine),
            mock.patch.object(ResultWriter, "_eval_body", write_as_the_state_machine),
        ):
            yield

    def poll(self, queue_arn: str, function: DeployedFunction) -> Poll | None:
        """One poll of an SQS event source, as Lambda makes it with the function's role: receive up to the
        mapping's batch size, invoke, delete what the response does not report as failed. None: queue empty."""
        import boto3

        sqs = boto3.client("sqs", region_name=self.stack.region)
        lambda_client = boto3.client("lambda", region_name=self.stack.region)
        [mapping] = [
            m
            for m in lambda_client.list_event_source_mappings(FunctionName=function.name)["EventSourceMappings"]
            if m["EventSourceArn"] == queue_arn
        ]
        if mapping["State"] != "Enabled":  # Lambda does not poll a disabled mapping
            return None
        queue_url = sqs.get_queue_url(QueueName=queue_arn.rsplit(":", 1)[-1])["QueueUrl"]
        messages: list[dict[str, Any]] = []
        with acting_as(function.logical_id):
            while len(messages) < mapping["BatchSize"]:
                received = sqs.receive_message(
                    QueueUrl=queue_url,
                    MaxNumberOfMessages=min(10, mapping["BatchSize"] - len(messages)),
                    AttributeNames=["All"],
                    MessageAttributeNames=["All"],
                ).get("Messages", [])
                if not received:
                    break
                messages += received
        if not messages:
            return None
        records = [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": m.get("Attributes", {}),
                "messageAttributes": {},
                "md5OfBody": m["MD5OfBody"],
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": self.stack.region,
            }
            for m in messages
        ]
        response, crashed = self.invoke(function, {"Records": records})
        failures = (
            {m["MessageId"] for m in messages}
            if crashed
            else {item["itemIdentifier"] for item in response.get("batchItemFailures", [])}
        )
        done = [m for m in messages if m["MessageId"] not in failures]
        with acting_as(function.logical_id):
            if done:
                sqs.delete_message_batch(
                    QueueUrl=queue_url,
                    Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(done)],
                )
        failed = [m["ReceiptHandle"] for m in messages if m["MessageId"] in failures]
        return Poll(response, queue_url, failed)
