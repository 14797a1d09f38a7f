"""The exactly-once checker's short profile: Ingest, the gatherer and their claims over moto, with AWS's orders and
faults drawn by seed, hold every image to one execution; and the checker finds a defect planted in the claims."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tools.cli import app
from tools.local.exactly_once import Stack, Step, check_exactly_once, play


def test_the_short_profile_finds_every_image_started_exactly_once() -> None:
    result = CliRunner().invoke(app, ["exactly-once", "--runs", "24", "--steps", "20", "--seed", "1"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "exactly once: 24 runs, 480 steps, 0 broken"


def test_it_finds_a_pass_that_died_after_starting_started_again_once_its_claims_forget_the_execution(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN claims that no longer find the execution a dead pass named
    from shared.pipeline.ingest import StepFunctionsStarter

    monkeypatch.setattr(StepFunctionsStarter, "exists", lambda self, name: False)
    # WHEN the checker runs the seeds that reach it
    broken: list[str] = []
    report = check_exactly_once(runs=1, steps_per_run=20, seed=9, say=broken.append)
    # THEN it says which image started twice, with its seed and the fewest steps that do it
    assert report.line == "exactly once: 1 runs, 20 steps, 1 broken"
    [said] = broken
    assert said.startswith("seed 9: broken at the end: started twice: ['incoming/drop-3.jpg']"), said
    assert "the fewest steps: drop drop-1; drop drop-3; ingest  dies_at=9" in said


def test_a_console_folder_dropped_beside_an_image_starts_nothing_and_loses_nothing() -> None:
    steps = [Step("folder", name="summer"), Step("drop", name="cat"), Step("ingest")]
    assert play(steps, Stack.from_template()) is None
