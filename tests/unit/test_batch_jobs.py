"""The local stand-ins for AWS's engines, held to what AWS documents: Batch's queue (a job RUNNABLE until its compute
environments have the vCPUs, Spot first, each job definition's retry strategy as the template declares it) and
Lambda's concurrency (a reserved function's own, the rest shared)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tools.local.batch_jobs import (
    ON_DEMAND,
    SPOT,
    ComputeEnvironment,
    JobFailed,
    JobQueue,
    NoCapacity,
    TaskStopped,
    template_retry_strategies,
)
from tools.local.runner import HandlerDispatcher
from tools.local.step_functions import LambdaServiceError


def _queue(spot: float, on_demand: float, gate: Any = None) -> JobQueue:
    environments = [ComputeEnvironment(SPOT, spot), ComputeEnvironment(ON_DEMAND, on_demand)]
    return JobQueue(environments, template_retry_strategies(), gate=gate, poll_s=0.01)


def test_a_job_waits_runnable_until_the_environments_have_its_vcpus_whoever_held_them() -> None:
    # GIVEN a queue of 2 Spot vCPUs and no on-demand, and a 2-vCPU job running
    queue = _queue(spot=2, on_demand=0)
    first_running, first_may_end = threading.Event(), threading.Event()
    ran: list[str] = []

    def first(environment: str) -> None:
        first_running.set()
        first_may_end.wait(5)
        ran.append(f"first on {environment}")

    thread = threading.Thread(target=queue.run, args=("bulk", 2, first))
    thread.start()
    first_running.wait(5)
    # WHEN a second job is submitted, THEN it waits until the first ends, and then runs on Spot
    second = threading.Thread(
        target=queue.run, args=("bulk", 2, lambda environment: ran.append(f"second on {environment}"))
    )
    second.start()
    time.sleep(0.1)
    assert ran == []
    first_may_end.set()
    thread.join(5)
    second.join(5)
    assert ran == ["first on FARGATE_SPOT", "second on FARGATE_SPOT"]


def test_a_job_spot_has_no_capacity_for_is_placed_on_on_demand_fargate() -> None:
    def no_spot(event: str, placing: dict[str, Any]) -> None:
        if event == "batch:place" and placing["environment"] == SPOT:
            raise NoCapacity("no Spot capacity")

    queue = _queue(spot=4, on_demand=4, gate=no_spot)
    assert queue.run("variants", 4, lambda environment: None) == ON_DEMAND


def test_a_reclaimed_spot_task_is_run_again_as_the_template_s_retry_strategy_says_and_a_failure_is_not() -> None:
    queue = _queue(spot=2, on_demand=2)
    tries: list[str] = []

    def reclaimed_once(environment: str) -> None:
        tries.append(environment)
        if len(tries) == 1:  # as ECS says it of a reclaimed Spot task
            raise TaskStopped("Your Spot Task was interrupted.")

    queue.run("bulk", 2, reclaimed_once)
    assert len(tries) == 2

    failures: list[str] = []

    def fails(environment: str) -> None:
        failures.append(environment)
        raise ValueError("the worker's own failure")

    with pytest.raises(JobFailed, match="Essential container in task exited: ValueError"):
        queue.run("bulk", 2, fails)
    assert len(failures) == 1  # EXIT on any other reason: not retried


def test_a_reserved_function_is_admitted_while_the_unreserved_concurrency_is_in_use() -> None:
    # GIVEN an account of 12 invocations, 2 of them reserved for Ingest, and 10 invocations of others in flight
    service = HandlerDispatcher(concurrency=12, reserved={"ingest": 2})
    held = threading.Event()
    started = [threading.Event() for _ in range(10)]

    def hold(index: int) -> None:
        service.run_as("detect", lambda: (started[index].set(), held.wait(5)))

    threads = [threading.Thread(target=hold, args=(n,)) for n in range(10)]
    for thread in threads:
        thread.start()
    for event in started:
        event.wait(5)
    try:
        # THEN another function is throttled, as Lambda throttles past the unreserved concurrency
        with pytest.raises(LambdaServiceError, match="TooManyRequestsException"):
            service.run_as("tag", lambda: None)
        # AND Ingest runs on what is reserved for it: "No other function can use that concurrency"
        assert service.run_as("ingest", lambda: "ran") == "ran"
    finally:
        held.set()
        for thread in threads:
            thread.join(5)
