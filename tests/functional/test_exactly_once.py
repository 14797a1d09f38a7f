"""The exactly-once checker's short profile: Ingest, the gatherer, their claims, the manifests, SummarizeBatch and
BatchEnded over moto, with AWS's orders and faults drawn by seed, hold every image to one execution and one row; and
the checker finds each defect planted in them (a fix of the fourth review's taken back)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from typer.testing import CliRunner

from tools.cli import app
from tools.local.exactly_once import DAY, Stack, Step, play


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
    # WHEN the steps seed 36 of 30 shrank to are played: Ingest dies after its StartExecution, before it marked its
    # claims, and the next pass finds the dead pass's claim
    steps = [Step("drop", name="drop-1"), Step("ingest", dies_at=6), Step("drop", name="drop-3")]
    # THEN the image is started twice
    assert play(steps, Stack.from_template()) == (
        "at the end: started twice: ['incoming/drop-1.jpg']; never: []; folders started: []"
    )


def test_it_finds_an_execution_that_timed_out_without_its_rows_when_no_rule_sends_its_end_to_batch_ended() -> None:
    # GIVEN a stack whose rules send no execution's end to BatchEnded (template.yaml without ExecutionEndedRule)
    stack = replace(Stack.from_template(), ended_statuses=frozenset())
    # WHEN a drop is started and its execution runs past the workflow's TimeoutSeconds (48 h), where Step Functions
    # ends it and runs none of its states (the checker's search found it at seed 3 of 20, through a prompt)
    steps = [Step("drop", name="drop-1"), Step("ingest"), Step("time", seconds=2 * DAY + 60)]
    # THEN its image has no row, where with the rule BatchEnded writes its failure row
    assert play(steps, stack) == (
        "at the end: batch b-59c9d8d594ed611a5b06: images with no row: ['s3://once-input/incoming/drop-1.jpg']; "
        "with more than one: []"
    )
    assert play(steps, Stack.from_template()) is None


def test_it_finds_a_message_expired_unseen_when_the_queue_keeps_sqs_s_default_4_days_and_no_alarm_watches_it() -> None:
    # GIVEN the ingest queue as SQS makes it by default: 4 days' retention, and no alarm on its oldest message
    default = {"IngestQueue": 345_600, "PromptsQueue": 345_600}
    stack = replace(Stack.from_template(), retention_s=default, age_alarm_s={})
    # WHEN the steps seed 2 of 20 shrank to are played: a drop waits five days (Ingest throttled, or its queue off)
    steps = [Step("drop", name="drop-1"), Step("time", seconds=5 * DAY)]
    # THEN its event expired, unseen, and the image never started; the stack's 14 days and alarm keep it
    assert play(steps, stack) == ("at the end: started twice: []; never: ['incoming/drop-1.jpg']; folders started: []")
    assert play(steps, Stack.from_template()) is None


def test_it_finds_an_event_delivered_again_days_later_started_twice_when_claims_are_kept_only_4_days(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tools.local import drop_stack

    # WHEN the steps seed 33 of 30 shrank to are played: a drop is started, EventBridge delivers its event again
    # within the day it retries, and the copy waits in the queue five days before a pass takes it
    steps = [
        Step("drop", name="drop-1"),
        Step("ingest"),
        Step("drop", name="drop-4"),
        Step("again", name="drop-1"),
        Step("time", seconds=5 * DAY),
    ]
    # THEN claims kept longer than any copy can wait (a day of retries and 14 days in the queue) skip the copy
    assert play(steps, Stack.from_template()) is None
    # AND claims kept SQS's default 4 days have expired: the copy starts the image again
    monkeypatch.setitem(drop_stack.ACCOUNT, "idempotency_expiry_s", 4 * DAY)
    assert play(steps, Stack.from_template()) == (
        "at the end: started twice: ['incoming/drop-1.jpg']; never: []; folders started: []"
    )


def test_it_finds_a_redelivered_prompt_regrouped_under_new_settings_when_its_manifest_is_written_again() -> None:
    from shared.storage.objects import S3Store

    def overwrite(self: S3Store, uri: str, data: bytes, content_type: str = "application/octet-stream") -> bool:
        self.write_bytes(uri, data, content_type)
        return True

    # WHEN the steps seed 54 of 30 shrank to are played: Ingest dies after starting a prompt's execution (the poller
    # keeps the message), the stack is deployed again with groups of one, and the message is delivered again
    steps = [Step("prompt", name="p3", images=3), Step("prompts", dies_at=14), Step("deploy")]
    # THEN with the manifests written once, the second delivery starts the batch as it was planned
    assert play(steps, Stack.from_template()) is None
    # AND written again, the running execution's SummarizeBatch reads groups its Map never ran: an image has two rows
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(S3Store, "write_once", overwrite)
        broken = play(steps, Stack.from_template())
    assert broken is not None and "with more than one: ['s3://once-input/prompted/p3/2.jpg']" in broken, broken


def test_a_console_folder_dropped_beside_an_image_starts_nothing_and_loses_nothing() -> None:
    steps = [Step("folder", name="summer"), Step("drop", name="cat"), Step("ingest")]
    assert play(steps, Stack.from_template()) is None


def test_a_long_run_prints_no_cloudwatch_metric_json_among_its_report(capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a step whose functions add more than Powertools' 100 values of one metric (it prints them then)
    from shared.observability import MetricUnit, metrics
    from tools.local.exactly_once import _quiet

    with _quiet():
        for _ in range(150):
            metrics.add_metric(name="ImagesPlanned", unit=MetricUnit.Count, value=1)
    # THEN nothing of CloudWatch's JSON reaches the terminal
    assert '"_aws"' not in capsys.readouterr().out
