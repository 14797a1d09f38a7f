"""AWS Batch as the local runner, `annotate chaos` and the rehearsal play it: the stack's job queue over its compute
environments (Fargate Spot, then on-demand Fargate), each holding at most its maxvCpus of jobs, a job RUNNABLE until
one has room, and each job definition's retry strategy, all as template.yaml declares them.

What Batch does, and where its user guide says so:
- "RUNNABLE: The job is in the queue and has no outstanding dependencies ... ready to run ... waiting for compute
  resources" ("Job states"): a job waits while the environments' vCPUs are in use, whoever uses them.
- "Compute environments are tried in ascending order ... for job placement" (API reference, ComputeEnvironmentOrder):
  Spot first; on-demand when Spot's is full or has no capacity.
- "If evaluateOnExit is specified, but none of the retry strategies match, then the job is retried", up to
  ``attempts`` ("Automated job retries"); each entry's patterns may end with ``*``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

SPOT, ON_DEMAND = "FARGATE_SPOT", "FARGATE"


class TaskStopped(Exception):
    """The job's Fargate task stopped before its container ended well: ``status_reason`` as ECS says it (a Spot
    reclaim: "Your Spot Task was interrupted."), ``exit_code`` as the container left (None: it had not)."""

    def __init__(self, status_reason: str, exit_code: int | None = None, reason: str = "") -> None:
        super().__init__(status_reason)
        self.status_reason, self.exit_code, self.reason = status_reason, exit_code, reason


class NoCapacity(Exception):
    """The compute environment cannot place the job now (Fargate Spot without capacity): the next one is tried."""


class JobFailed(Exception):
    """The job ended FAILED, past its retry strategy: its last attempt's status reason, exit code and container
    reason, as DescribeJobs says them."""

    def __init__(self, status_reason: str, exit_code: int | None = None, reason: str = "", attempts: int = 1) -> None:
        super().__init__(f"{status_reason}: {reason} (exit code {exit_code}, attempt {attempts})")
        self.status_reason, self.exit_code, self.reason = status_reason, exit_code, reason


@dataclass(frozen=True)
class ExitCondition:
    action: str  # RETRY or EXIT
    on_status_reason: str = "*"
    on_reason: str = "*"
    on_exit_code: str = "*"

    def matches(self, stopped: TaskStopped) -> bool:
        code = "" if stopped.exit_code is None else str(stopped.exit_code)
        return (
            fnmatchcase(stopped.status_reason, self.on_status_reason)
            and fnmatchcase(stopped.reason, self.on_reason)
            and fnmatchcase(code, self.on_exit_code)
        )


@dataclass(frozen=True)
class RetryStrategy:
    attempts: int = 1
    evaluate_on_exit: tuple[ExitCondition, ...] = ()

    def retries(self, stopped: TaskStopped) -> bool:
        """Whether an attempt that ended so is run again (attempts left aside): the first condition that matches
        says, and none matching retries."""
        for condition in self.evaluate_on_exit:
            if condition.matches(stopped):
                return condition.action.upper() == "RETRY"
        return True

    @staticmethod
    def of_api(strategy: dict[str, Any]) -> RetryStrategy:
        """A retry strategy as the Batch API describes it (DescribeJobDefinitions: attempts, evaluateOnExit)."""
        return RetryStrategy(
            attempts=int(strategy.get("attempts", 1)),
            evaluate_on_exit=tuple(
                ExitCondition(
                    action=entry["action"],
                    on_status_reason=entry.get("onStatusReason", "*"),
                    on_reason=entry.get("onReason", "*"),
                    on_exit_code=entry.get("onExitCode", "*"),
                )
                for entry in strategy.get("evaluateOnExit", [])
            ),
        )

    @staticmethod
    def of(job_definition: dict[str, Any]) -> RetryStrategy:
        """A job definition's, as template.yaml writes it (CloudFormation's property names: Attempts, ...)."""
        declared = job_definition.get("Properties", {}).get("RetryStrategy", {})
        return RetryStrategy.of_api(_api_case(declared))


def _api_case(value: Any) -> Any:
    """CloudFormation's property names (EvaluateOnExit) as Batch's API spells them (evaluateOnExit)."""
    if isinstance(value, dict):
        return {key[:1].lower() + key[1:]: _api_case(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_api_case(item) for item in value]
    return value


def template_retry_strategies() -> dict[str, RetryStrategy]:
    """The bulk and Variants job definitions' retry strategies, by kind ("bulk", "variants")."""
    from tools.aws.sam_template import load_template

    resources = load_template()["Resources"]
    return {
        "bulk": RetryStrategy.of(resources["BulkJobDefinition"]),
        "variants": RetryStrategy.of(resources["VariantsJobDefinition"]),
    }


def template_on_demand_vcpus() -> int:
    """The on-demand environment's maxvCpus as the template deploys it by default (FargateOnDemandVcpus)."""
    from tools.aws.sam_template import load_template

    return int(load_template()["Parameters"]["FargateOnDemandVcpus"]["Default"])


@dataclass
class ComputeEnvironment:
    kind: str  # FARGATE_SPOT or FARGATE
    max_vcpus: float
    in_use: float = 0.0


# Asked before a job is placed in an environment ("batch:place", {"environment": kind, "vcpus": n}): may raise
# NoCapacity, as Fargate Spot without capacity does; and after an attempt ends ("batch:ended", {...}).
PlacementGate = Callable[[str, dict[str, Any]], None]


@dataclass
class JobQueue:
    """One job queue over its environments, in order; ``run`` plays one job to its end."""

    environments: list[ComputeEnvironment]
    strategies: dict[str, RetryStrategy]
    gate: PlacementGate | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    poll_s: float = 0.05
    attempts_run: int = 0
    placed: dict[str, int] = field(default_factory=dict)  # attempts by the kind of environment they ran in
    most_vcpus: dict[str, float] = field(default_factory=dict)
    _room: threading.Condition = field(default_factory=threading.Condition)

    def run(self, kind: str, vcpus: float, container: Callable[[str], None]) -> str:
        """Runs the ``kind`` job's ``container`` (given the environment's kind) in the first environment with room,
        again while its retry strategy says so; returns the kind of the environment its last attempt ran in.

        Raises:
            JobFailed: its last attempt failed, past its retry strategy.
        """
        strategy = self.strategies.get(kind, RetryStrategy())
        for attempt in range(1, strategy.attempts + 1):
            environment = self._place(vcpus)
            try:
                self.attempts_run += 1
                container(environment.kind)
                return environment.kind
            except TaskStopped as stopped:
                ended = stopped
            except Exception as error:  # the container's non-zero exit
                ended = TaskStopped("Essential container in task exited", 1, f"{type(error).__name__}: {error}")
            finally:
                self._release(environment, vcpus)
            if self.gate:
                self.gate("batch:ended", {"kind": kind, "attempt": attempt, "reason": ended.status_reason})
            if not strategy.retries(ended):
                break
        raise JobFailed(ended.status_reason, ended.exit_code, ended.reason, attempt)

    def _place(self, vcpus: float) -> ComputeEnvironment:
        """The first environment, in order, with ``vcpus`` free and capacity; RUNNABLE (waiting) until there is."""
        with self._room:
            while True:
                for environment in self.environments:
                    if environment.in_use + vcpus > environment.max_vcpus:
                        continue
                    try:
                        if self.gate:
                            self.gate("batch:place", {"environment": environment.kind, "vcpus": vcpus})
                    except NoCapacity:
                        continue
                    environment.in_use += vcpus
                    self.placed[environment.kind] = self.placed.get(environment.kind, 0) + 1
                    self.most_vcpus[environment.kind] = max(
                        self.most_vcpus.get(environment.kind, 0.0), environment.in_use
                    )
                    return environment
                if self.stopping.is_set():
                    raise JobFailed("the run is stopping: the job was never placed")
                self._room.wait(timeout=self.poll_s)

    def _release(self, environment: ComputeEnvironment, vcpus: float) -> None:
        with self._room:
            environment.in_use -= vcpus
            self._room.notify_all()


def stack_job_queue(
    spot_vcpus: float,
    on_demand_vcpus: float | None = None,
    gate: PlacementGate | None = None,
    stopping: threading.Event | None = None,
) -> JobQueue:
    """The stack's queue: Spot's environment of ``spot_vcpus``, then on-demand's of ``on_demand_vcpus`` (the
    template's default if None), with the template's retry strategies."""
    on_demand = template_on_demand_vcpus() if on_demand_vcpus is None else on_demand_vcpus
    return JobQueue(
        environments=[ComputeEnvironment(SPOT, spot_vcpus), ComputeEnvironment(ON_DEMAND, on_demand)],
        strategies=template_retry_strategies(),
        gate=gate,
        stopping=stopping or threading.Event(),
    )
