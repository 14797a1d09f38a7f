"""What AWS does that moto does not, on the local workflow: faults at the Lambda service and S3, a step that hangs,
the Express limit. Real tiny models, the real definition on moto's interpreter."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from pydantic import TypeAdapter
from typer.testing import CliRunner

from shared.contracts import ImageGroup, PromptMessage
from shared.pipeline.ingest import start_batches
from shared.settings import Settings, use_settings
from shared.storage import layout
from shared.storage.objects import store_for
from tests.conftest import SAMPLES
from tools.cli import app
from tools.local import workflow
from tools.local.chaos import run_chaos
from tools.local.chaos_faults import Faults
from tools.local.runner import LocalStarter, local_workflow
from tools.local.step_functions import LambdaServiceError
from tools.local.workflow import DEFINITION_PATH, all_states
from tools.results.query import run_local_query

pytestmark = pytest.mark.slow


def test_under_faults_every_image_ends_as_one_row_and_only_the_hung_one_failed(tiny_settings: Settings) -> None:
    # GIVEN 24 images, throttles, SnapStart and service errors at the Lambda service, S3 SlowDown and 500s, and
    # WriteResult hanging once past its timeout (15 s) for the third image; then 2 images with variants, whose first
    # Fargate task stops
    faults = Faults(
        throttle=0.08,
        snapstart_not_ready=0.03,
        service_error=0.02,
        s3_slowdown=0.05,
        s3_internal_error=0.02,
        hang_step="write_result",
        hang_image=2,
        seed=11,
    )

    # WHEN they are annotated through the local workflow
    report = run_chaos(24, faults)

    # THEN every image has exactly one row
    assert (report.images, report.rows, report.lost, report.duplicated) == (26, 26, 0, 0), report.line
    # AND faults of each kind were injected, and every one but the hang was tried again (the reclaimed Spot task by
    # Batch, as its job definition's retry strategy says)
    kinds = {"Lambda TooManyRequestsException", "S3 SlowDown", "write_result hung past its timeout"}
    assert kinds | {"Fargate Spot task reclaimed"} <= set(report.injected), report.injected
    assert report.retried == sum(report.injected.values()) - 1, report.line
    # AND only the hung image is recorded as failed, saying that it timed out; its group-mates succeeded
    [failed] = report.failed
    assert failed["source_uri"].endswith("/00002.jpg")
    assert failed["failed_step"] == "write_result" and "timed out after 15" in failed["error"]
    assert report.line == f"26 images, 26 rows, 0 lost, {sum(report.injected.values())} faults injected, " + (
        f"{report.retried} retried, 1 recorded as failed"
    )


def test_annotate_chaos_prints_its_rates_and_ends_with_the_account(
    tiny_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tools.cli.common import out

    monkeypatch.setattr(out, "width", 40)  # narrower than its lines: a program reading the output gets each whole
    result = CliRunner().invoke(
        app, ["chaos", "--images", "4", "--hang", "none", "--variants-images", "0", "--throttle", "0.3"]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    account = "account: Lambda concurrency no quota; a hand-back waits 5 s"
    assert lines[0] == account
    assert lines[1].startswith("faults: Lambda throttle 30%")
    assert lines[-1].startswith("4 images, 4 rows, 0 lost, ") and lines[-1].endswith(", 0 recorded as failed")


def test_a_group_over_the_express_limit_fails_as_a_whole_and_its_images_become_failure_rows(
    tmp_path: Path, tiny_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN groups of two, an Express limit of 8 s, and one image whose Detect takes 12 s (within its own timeout)
    monkeypatch.setattr(workflow, "EXPRESS_LIMIT_S", 8)
    update = {"data_dir": tmp_path / "data", "images_per_group": 2, "hand_backs": 0}  # as locally: no hand-back
    settings = use_settings(tiny_settings.model_copy(update=update))
    slow = str(SAMPLES / "chelsea-the-cat.jpg")  # in the first group, with chelsea-rotated-exif.jpg

    def gate(function: str, payload: dict[str, Any]) -> None:
        if function == "detect" and payload["image"]["source_uri"] == slow:
            time.sleep(12)

    # WHEN the three samples are annotated with the limit in force
    with local_workflow(gate=gate, aws_limits=True) as run:
        starter = LocalStarter(run, settings.data_dir, "express-limit")
        message = PromptMessage(prompt="cat.", images=[str(SAMPLES)], caption=False)
        start_batches(message, "express-limit", settings.ingest, starter, store_for)

    # THEN the slow image's group ended unfinished: both its images are failure rows saying so; the other group's
    # image succeeded
    rows = run_local_query("SELECT source_uri, status, error FROM images ORDER BY source_uri", settings.data_dir)
    by_source = {Path(row["source_uri"]).name: row for row in rows.to_pylist()}
    assert len(by_source) == 3
    for name in ("chelsea-the-cat.jpg", "chelsea-rotated-exif.jpg"):
        assert by_source[name]["status"] == "failed" and "did not finish" in by_source[name]["error"], by_source
    assert by_source["coffee.webp"]["status"] == "succeeded"


def test_children_queued_here_for_one_environment_are_held_to_the_limit_by_their_own_time_not_the_queue_s(
    tmp_path: Path, tiny_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN six images, each its own group (all six children at once), an Express limit of 5 s, no hand-back, and a
    # Detect that takes 1.5 s: here the six queue for Detect's one environment (9 s), on AWS each has its own
    import functions.detect.app as detect_app

    monkeypatch.setattr(workflow, "EXPRESS_LIMIT_S", 5)
    folder = tmp_path / "images"
    folder.mkdir()
    for copy in range(6):
        image = Image.open(SAMPLES / "chelsea-the-cat.jpg").rotate(copy)  # six images, six names
        image.save(folder / f"cat-{copy}.jpg")
    update = {"data_dir": tmp_path / "data", "images_per_group": 1, "group_concurrency": 6, "hand_backs": 0}
    settings = use_settings(tiny_settings.model_copy(update=update))
    handler = detect_app.handler

    def slow_detect(event: Any, context: Any) -> Any:
        time.sleep(1.5)
        return handler(event, context)

    monkeypatch.setattr(detect_app, "handler", slow_detect)
    # WHEN they are annotated with the limit in force
    with local_workflow(aws_limits=True) as run:
        starter = LocalStarter(run, settings.data_dir, "queued-here")
        start_batches(
            PromptMessage(prompt="cat.", images=[str(folder)], caption=False),
            "queued-here",
            settings.ingest,
            starter,
            store_for,
        )
    # THEN no child ran out of time: each one's 1.5 s Detect and its other steps are within 5 s, whatever it waited
    rows = run_local_query("SELECT status, error FROM images", settings.data_dir).to_pylist()
    assert len(rows) == 6 and all(row["status"] == "succeeded" for row in rows), rows


def caption_tries_in_a_child() -> int:
    """Caption's first try and its retries of a throttle, as the workflow's definition says."""
    [caption] = [state for name, state in all_states(json.loads(DEFINITION_PATH.read_text())) if name == "Caption"]
    [throttles] = [r for r in caption["Retry"] if "Lambda.TooManyRequestsException" in r["ErrorEquals"]]
    return 1 + int(throttles["MaxAttempts"])


@pytest.mark.parametrize("refusals", ["past one round", "past every round"])
def test_a_step_the_lambda_service_refuses_past_a_childs_retries_hands_its_group_back_to_the_next_round(
    tmp_path: Path, tiny_settings: Settings, refusals: str
) -> None:
    # GIVEN a Lambda service that throttles Caption for one child's every try (or for ever), and one hand-back
    settings = use_settings(
        tiny_settings.model_copy(update={"data_dir": tmp_path / "data", "hand_backs": 1, "hand_back_wait_s": 1})
    )
    refusing = caption_tries_in_a_child() if refusals == "past one round" else 2 * caption_tries_in_a_child()
    refused: list[str] = []

    def gate(function: str, payload: dict[str, Any]) -> None:
        if function == "caption" and len(refused) < refusing:
            refused.append(function)
            raise LambdaServiceError("TooManyRequestsException", "Rate Exceeded.")

    # WHEN an image is annotated with a caption
    with local_workflow(gate=gate) as run:
        starter = LocalStarter(run, settings.data_dir, "throttled")
        message = PromptMessage(prompt="cat.", images=[str(SAMPLES / "chelsea-the-cat.jpg")])
        start_batches(message, "throttled", settings.ingest, starter, store_for)

    # THEN the group ran again in round 1, after the first round's retries ran out: once the service answers, the
    # image is annotated and captioned; if it never does, its one row says that its group did not finish in either
    [(batch, result)] = starter.results
    assert result.summary is not None and result.summary.handed_back is None, result
    handed = layout.groups_manifest(batch.results_uri, batch.batch_id, 1)
    [group] = TypeAdapter(list[ImageGroup]).validate_json(store_for(handed).read_bytes(handed))
    query = "SELECT source_uri, status, failed_step, error, caption FROM images"
    [row] = run_local_query(query, settings.data_dir).to_pylist()
    assert [image.source_uri for image in group.images] == [row["source_uri"]]
    if refusals == "past one round":
        assert row["status"] == "succeeded" and row["caption"], row
    else:
        assert row["failed_step"] == "group" and "did not finish" in row["error"], row
        assert "in each of 2 rounds" in row["error"], row
    assert len(refused) == refusing


def test_on_a_new_accounts_concurrency_of_10_a_100_image_batch_loses_no_image_to_a_throttle(
    tiny_settings: Settings,
) -> None:
    # GIVEN an account whose Lambda concurrency is 10 (a new one's), the template's defaults, no other fault
    quiet = Faults(
        throttle=0, snapstart_not_ready=0, service_error=0, s3_slowdown=0, s3_internal_error=0, hang_step=None
    )
    faults = Faults(**{**quiet.__dict__, "variants_images": 0, "lambda_concurrency": 10})

    # WHEN 100 images are annotated (without captions: the point is the fan-out, not the LLM's seconds)
    report = run_chaos(100, faults, caption=False)

    # THEN no invocation went past the quota, so none was throttled, and every image has its row
    assert report.most_in_flight <= 10 and "Lambda concurrency quota" not in report.injected, report.line
    assert (report.images, report.rows, report.lost, report.duplicated, len(report.failed)) == (100, 100, 0, 0, 0)


def test_a_new_accounts_quotas_overlapping_batches_and_inactive_snapstart_versions_lose_no_image(
    tiny_settings: Settings,
) -> None:
    # GIVEN a Lambda concurrency of 2 that three batches planned within it share (each runs one image at a time,
    # Classify and Tag side by side), model functions whose SnapStart versions re-initialise for 6 s, and a bulk
    # batch on 6 Fargate vCPUs whose first Spot task finds no capacity; no other fault
    quiet = Faults(
        throttle=0, snapstart_not_ready=0, service_error=0, s3_slowdown=0, s3_internal_error=0, hang_step=None
    )
    # (three: two overlapped so little once, on a fresh machine, that none was throttled); 2 images with variants
    # whose Variants tasks (4 vCPUs each) the same 6 vCPUs hold one at a time; functions of at most 3,008 MB
    account = {"lambda_concurrency": 2, "batches": 3, "snapstart_reinit_s": 6.0}
    account |= {"bulk_images": 4, "fargate_vcpus": 6, "spot_shortage_s": 1.0, "function_memory_mb": 3008}
    faults = Faults(**{**quiet.__dict__, "variants_images": 2, **account})
    assert faults.functions_over_memory() == []  # deployed as such an account needs (SMALL_MEMORY_PARAMETERS)

    # WHEN 24 images are annotated as three messages, 4 as a bulk one and 2 with variants, sent at once: five Ingest
    # invocations for an account of 2, none reserved (Lambda keeps 100 unreserved)
    assert faults.reservations() == {}
    report = run_chaos(24, faults, caption=False)

    # THEN the batches met the quota, the re-initialisation and the Spot shortage, and waited each out; Ingest was
    # throttled too, and its messages came back until it took them: every image has one row, none failed, no message
    # was dead-lettered, and no more ran at once than the account has
    expected = {
        "Lambda concurrency quota",
        "Lambda SnapStartNotReadyException (re-initialising)",
        "Fargate Spot: no capacity",
    }
    assert expected <= set(report.injected), report.injected
    assert report.ingest_throttled >= 1 and report.dead_lettered == 0, report
    assert (report.images, report.rows, report.lost, report.duplicated, len(report.failed)) == (30, 30, 0, 0, 0)
    assert report.most_in_flight <= 2 and report.most_fargate_vcpus <= 6, report.line
    # AND the jobs the Spot shortage met ran on on-demand Fargate, the queue's second compute environment
    assert report.on_demand_jobs >= 1, report
