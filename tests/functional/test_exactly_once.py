"""The exactly-once checker's short profile: Ingest, the gatherer and their claims over moto, with AWS's orders and
faults drawn by seed, hold every image to one execution; and the checker finds a defect planted in the claims."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tools.cli import app
from tools.local.exactly_once import Stack, Step, play


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
    # WHEN the steps seed 50 of 30 shrank to are played: Ingest held after its StartExecution while 285 s pass and
    # other passes run, then it dies before marking its claims
    steps = [
        Step("drop", name="drop-2"),
        Step("both", name="ingest", dies_at=23, held_at=8, seconds=285, meanwhile=3),
        Step("drop", name="drop-3"),
    ]
    # THEN the image is started twice
    assert play(steps, Stack.from_template()) == (
        "at the end: started twice: ['incoming/drop-2.jpg']; never: []; folders started: []"
    )


def test_it_finds_overlapping_batches_planned_past_the_accounts_invocations_when_they_do_not_share_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN batches that each plan within the whole quota, not within what the others leave
    from shared.pipeline import ingest

    monkeypatch.setattr(ingest, "take_share", lambda ledger, planned, settings: planned)
    # WHEN the steps seed 32 of 20 shrank to are played: a gathered batch runs while Ingest starts another
    steps = [Step("drop", name="drop-5"), Step("drop", name="drop-6"), Step("gather"), Step("drop", name="drop-7")]
    broken = play(steps, Stack.from_template())
    # THEN the second is found taking invocations the first holds
    assert broken is not None and "of lambda-invocations, past 8" in broken, broken


def test_a_console_folder_dropped_beside_an_image_starts_nothing_and_loses_nothing() -> None:
    steps = [Step("folder", name="summer"), Step("drop", name="cat"), Step("ingest")]
    assert play(steps, Stack.from_template()) is None
