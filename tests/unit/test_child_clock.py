"""An Express child's clock (tools/local/step_functions.py): what the child would have spent on AWS."""

from __future__ import annotations

import pytest

from tools.local import step_functions
from tools.local.step_functions import ChildClock, ChildClocks


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """This machine's clock, moved by the test."""
    moment = [100.0]
    monkeypatch.setattr(step_functions.time, "monotonic", lambda: moment[0])
    return moment


def test_the_clock_stops_while_the_child_only_waits_for_an_environment_here(now: list[float]) -> None:
    clock = ChildClock()
    now[0] += 2  # the child's states: counted
    with clock.queued():
        now[0] += 30  # every invocation of it queued behind other children's: not counted
        assert clock.seconds() == 2
    with clock.running():
        now[0] += 5  # its step runs: counted
        with clock.queued():
            now[0] += 4  # another of its images waits while one runs: counted, as AWS's would have run on
    now[0] += 1  # a retry's wait: counted
    assert clock.seconds() == 12


def test_an_invocation_finds_its_child_s_clock_by_batch_and_image_and_none_once_the_child_ended() -> None:
    clocks = ChildClocks()
    child = {"batch_id": "b-1", "group": {"group_id": "g-0", "images": [{"image_id": "i-1"}, {"image_id": "i-2"}]}}
    detect = {"batch_id": "b-1", "image": {"image_id": "i-2"}}
    with clocks.started(child) as clock:
        assert clocks.of(detect) is clock
        assert clocks.of({"task": detect, "failures": {}}) is clock  # a later step's payload
        assert clocks.of({"batch_id": "b-1", "outcomes": [{"image": {"image_id": "i-1"}}]}) is clock  # the table's
        assert clocks.of({"batch_id": "b-2", "image": {"image_id": "i-2"}}) is None  # another batch's
    assert clocks.of(detect) is None
