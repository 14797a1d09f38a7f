"""The cost arithmetic against a case computed by hand."""

from __future__ import annotations

import copy
import json

import pytest

from tests.conftest import REPO
from tools.bench.cost_inputs import (
    SCENARIOS,
    ApiSeconds,
    BenchSeconds,
    BulkSeconds,
    LambdaDetectSeconds,
    deployment,
    load_prices,
    read_report,
)
from tools.bench.cost_lanes import (
    STATES_PER_BATCH,
    STATES_PER_BULK_BATCH,
    STATES_PER_GROUP,
    STATES_PER_IMAGE,
    bulk_lane,
    dropped_images_per_execution,
    fargate_month,
    orchestration_per_image,
    with_lambda_cold_start,
)
from tools.bench.cost_months import cost_table, gathered_month, lambda_month, orchestration_share, rekognition_month
from tools.local.workflow import DEFINITION_PATH

BENCH_REPORT = {
    "steps": {
        "detect": {"pipeline_median_s": 2.0, "cold_start_s": 4.0},
        "classify": {"pipeline_median_s": 0.5, "cold_start_s": 2.0},
        "tag": {"pipeline_median_s": 0.5, "cold_start_s": 2.0},
        "caption": {"pipeline_median_s": 1.0, "cold_start_s": 1.0},
    },
    "whole_image": {"pipeline_s": 4.0},
}
BULK_REPORT = {"seconds_per_image": {"worker": 4.0}, "cores": 2, "measured_at": "2026-12-01T00:00:00+00:00"}
BENCH, BULK = BenchSeconds.model_validate(BENCH_REPORT), BulkSeconds.model_validate(BULK_REPORT)
PRICES = load_prices()
IDLE, STEADY, BURSTS = SCENARIOS


# The stack's CloudWatch as deployed, at $0.10 a metric a month, idle or not: eight alarms of one metric each, and
# the functions' errors and throttles, two metric math alarms of ten metrics each, every metric billed; 10 custom
# metrics at $0.30 on the days images come
ALARMS, METRICS = (8 + 2 * 10) * 0.10, 10 * 0.30


def test_a_steady_month_on_lambda_matches_the_hand_computation() -> None:
    # 17,000 images a day arrive at 0.197 a second: Ingest's 20 s batching window gathers 3.94, shared by its event
    # source's 5 pollers (MaximumConcurrency): each execution starts one image, in a group of one
    per_execution = max(1.0, 17_000 / 86_400 * 20 / 5)
    assert per_execution == 1.0
    # 510,000 images; per image 6.5 GB x 2 s + 2.9375 GB x (0.5 + 0.5 + 1) s + 1 GB x 0.3 s = 19.175 GB-s, and each
    # image's own WriteGroupTable (1 GB-s) and SummarizeBatch (2 GB-s)
    compute = 510_000 * (19.175 + 1 + 2) * 0.0000166667
    invocations = 5 + 1 + 2  # the five billed functions, WriteGroupTable, Ingest and SummarizeBatch
    requests = 510_000 * invocations * 0.20 / 1e6
    # 10% cold: without SnapStart (the template's default) each cold start of a model function pays its import and
    # model load: Detect 4 s at 6.5 GB, Classify and Tag 2 s and Caption 1 s at 2.9375 GB
    cold = 51_000 * (6.5 * 4 + 2.9375 * (2 + 2 + 1)) * 0.0000166667
    # The parent: 5 states per execution and its child's start; the child: one Express request and one image's 4 s
    # at 64 MB
    parent = 510_000 * (5 + 1) * 0.025 / 1000
    children = 510_000 * (1.00 / 1e6 + 4.0 * 0.0625 * 0.00001667)
    queues = 510_000 * 3 * 0.40 / 1e6
    # three steps read the image and WriteGroupTable its result document; the JSON written (no picture stored:
    # StorePictures=false); and each group's file of each of the four tables and its summary
    storage = 510_000 * (4 * 0.0004 + 1 * 0.005) / 1000 + 510_000 * 5 * 0.005 / 1000
    # each dropped image's claim: written in progress, with its execution, started
    claims = 510_000 * 3 * 0.625 / 1e6
    # the invocations' log lines (1.45 kB each at $0.50 a GB), and X-Ray's traces of 8 traced functions and the
    # workflow: each sees under a request a second, so every request is traced ($5 a million)
    logs = 510_000 * invocations * 1_450 / 1e9 * 0.50
    traces = (510_000 * invocations + 510_000) * 5.0 / 1e6
    expected = compute + requests + cold + parent + children + queues + storage + claims + logs + traces
    assert lambda_month(BENCH, PRICES, STEADY) == pytest.approx(expected + ALARMS + METRICS, rel=1e-9)
    assert orchestration_share(BENCH, PRICES, STEADY) == pytest.approx((parent + children) / expected)


def test_standard_children_pay_a_transition_per_state_and_express_ones_do_not() -> None:
    standard = orchestration_per_image(BENCH, PRICES, express=False)
    assert standard == pytest.approx((5 / 100 + 1 / 10 + 9 + 2 / 10) * 0.025 / 1000)
    assert orchestration_per_image(BENCH, PRICES) < standard / 25


def test_at_a_trickle_an_execution_starts_one_image_and_the_dial_gathers_them_for_less() -> None:
    bench = read_report(BenchSeconds, REPO / "bench" / "bench.json")
    # GIVEN the steady load's drops, one an execution (each of Ingest's pollers gathers under one a window)
    assert dropped_images_per_execution(STEADY) == 1.0
    # THEN orchestration is a fifth of the Lambda option's cost per image, and gathered every 15 minutes the images
    # cost a fraction of it
    assert 0.1 < orchestration_share(bench, PRICES, STEADY) < 0.3
    assert gathered_month(bench, BULK, PRICES, STEADY, 15).total < lambda_month(bench, PRICES, STEADY) / 5


def test_snapstart_trades_init_time_for_restores_and_a_cache_that_costs_when_idle() -> None:
    # As deployed, no function has SnapStart: an idle month costs its alarms alone
    assert lambda_month(BENCH, PRICES, IDLE) == pytest.approx(ALARMS)
    # With EnableSnapStart=true, the four model functions' caches are the idle month's cost too
    cache = (6.5 + 2.9375 * 3) * 30 * 24 * 3600 * 0.0000015046
    assert lambda_month(BENCH, PRICES, IDLE, snapstart=True) == pytest.approx(cache + ALARMS)
    # and each cold start pays a restore instead of import and model load
    deployed = lambda_month(BENCH, PRICES, STEADY)
    restores = 51_000 * (6.5 + 2.9375 * 3) * 0.0001397998
    init = 51_000 * (6.5 * 4 + 2.9375 * (2 + 2 + 1)) * 0.0000166667
    with_snapstart = deployed - init + restores + cache
    assert lambda_month(BENCH, PRICES, STEADY, snapstart=True) == pytest.approx(with_snapstart)
    # AND a Detect that compiles its first size at a cold start (no snapshot, no compiled cache) pays the compile
    compiling = BENCH.with_step("detect", cold_start_compiling_s=6.0)
    extra = 51_000 * 6.5 * (6.0 - 4.0) * 0.0000166667
    assert lambda_month(compiling, PRICES, STEADY) == pytest.approx(deployed + extra)
    assert lambda_month(compiling, PRICES, STEADY, snapstart=True) == pytest.approx(with_snapstart)


def test_fargate_runs_enough_always_on_tasks_for_the_peak_day() -> None:
    hourly = 2 * 0.04048 + 8 * 0.004445 + 0.005  # and its public IPv4 address
    assert fargate_month(BENCH, PRICES, IDLE) == pytest.approx(hourly * 720)  # one task, even idle
    # and its results' S3 requests, as every option writes them: the image and the result check read, the JSON
    # written (no picture: StorePictures=false), five files per group of 40 (four tables and the summary)
    requests = (250_000 * (2 * 0.0004 + 1 * 0.005) + 6_250 * 5 * 0.005) / 1000
    assert fargate_month(BENCH, PRICES, BURSTS) == pytest.approx(2 * hourly * 720 + requests)  # 25,000 > 21,600 a task


def test_rekognition_is_labels_plus_properties_per_image() -> None:
    assert rekognition_month(PRICES, STEADY) == pytest.approx(510 * 1.75)


def test_the_table_has_every_scenario_and_option_and_no_per_image_cost_when_idle() -> None:
    rows = cost_table(BENCH, PRICES)
    assert len(rows) == 12
    assert all(row.per_1000_images_usd is None for row in rows if row.scenario == "idle")


def test_the_states_counted_are_states_of_the_workflow_where_they_are_counted() -> None:
    definition = json.loads(DEFINITION_PATH.read_text())
    parent = definition["States"]
    group = parent["AnnotateGroups"]["ItemProcessor"]["States"]
    image = dict(group["AnnotateImages"]["ItemProcessor"]["States"])
    for state in list(image.values()):
        for branch in state.get("Branches", []):
            image |= branch["States"]
    assert set(STATES_PER_BATCH) <= set(parent) and set(STATES_PER_BULK_BATCH) <= set(parent)
    assert set(STATES_PER_GROUP) <= set(group)
    assert set(STATES_PER_IMAGE) <= set(image)


def test_prices_carry_their_date_and_source() -> None:
    assert PRICES.date and PRICES.source and PRICES.region == "us-east-1"


def test_annotate_cost_writes_the_table_and_the_chart(tmp_path) -> None:
    from typer.testing import CliRunner

    from tools.cli import app

    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(BENCH_REPORT))
    result = CliRunner().invoke(app, ["cost", "--bench", str(bench), "--out-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cost.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((tmp_path / "cost.json").read_text()) == [row.model_dump() for row in cost_table(BENCH, PRICES)]

    bench.write_text("{}")
    result = CliRunner().invoke(app, ["cost", "--bench", str(bench), "--out-dir", str(tmp_path)])
    assert result.exit_code == 2 and "not what annotate bench writes: steps: Field required" in result.output


def test_the_functions_memory_architecture_and_snapstart_are_what_the_template_deploys() -> None:
    from tools.aws.sam_template import load_template
    from tools.bench.cost_inputs import billed_functions

    # GIVEN the template, and a copy whose Detect memory parameter defaults to twice as much, on arm64
    template = load_template()
    changed = copy.deepcopy(template)
    detect = changed["Resources"]["DetectFunction"]["Properties"]
    changed["Parameters"][detect["MemorySize"]["Ref"]]["Default"] *= 2
    detect["Architectures"] = ["arm64"]

    functions = deployment().functions
    # THEN the cost model bills each function as the template deploys it: Detect's memory from its parameter,
    # the architecture from Globals unless the function names its own, SnapStart where EnableSnapStart puts it
    assert billed_functions(template) == functions
    assert billed_functions(changed)["DetectFunction"].memory_mb == 2 * functions["DetectFunction"].memory_mb
    assert billed_functions(changed)["DetectFunction"].arm64 and not functions["DetectFunction"].arm64
    assert billed_functions(changed)["DetectFunction"].gb_second_price(PRICES) == 0.0000133334
    assert not any(function.snapstart for function in functions.values())
    snapstart = billed_functions(template, {"EnableSnapStart": "true"})
    assert {name for name, function in snapstart.items() if function.snapstart} == {
        "DetectFunction",
        "ClassifyFunction",
        "TagFunction",
        "CaptionFunction",
    }


def test_detects_cold_start_without_a_snapshot_is_the_one_measured_as_lambda_runs_it_where_there_is_one() -> None:
    # GIVEN annotate bench-lambda-detect's report: OpenVINO (the template's runtime) answers first in 9 s, warm in 4 s
    measured = LambdaDetectSeconds.model_validate(
        {"runtimes": {"openvino": {"first_answer_s": 9.0, "warm_answer_s": 4.0}}}
    )
    # WHEN the cost model takes it
    bench = with_lambda_cold_start(BENCH, measured)
    # THEN Detect's cold start without a snapshot costs those 5 s instead of the bench's 4 s from disk
    assert bench.steps["detect"].cold_start_without_snapshot_s == 5.0
    assert BENCH.steps["detect"].cold_start_without_snapshot_s is None
    extra = 51_000 * 6.5 * (5.0 - 4.0) * 0.0000166667
    assert lambda_month(bench, PRICES, STEADY) == pytest.approx(lambda_month(BENCH, PRICES, STEADY) + extra)


def test_the_api_idles_free_as_deployed_and_under_the_study_s_39_dollars_with_snapstart() -> None:
    from tools.bench.cost import api_costs

    # GIVEN an API bench's measured seconds and peak
    measured = {"medians_s": {"http": 2.0, "http_with_caption": 3.0}, "server_peak_rss_mb": 3000.0}
    api = ApiSeconds.model_validate({"runtimes": {"onnxruntime": measured}})
    costs = api_costs(api, load_prices())
    # THEN idle costs nothing without SnapStart and its snapshot's cache stays under the study's $39 with it
    assert costs.memory_mb == deployment().api_memory_mb == 5120
    assert costs.idle_month_usd == 0.0 and 0 < costs.idle_month_with_snapstart_usd < 39
    # AND an answer costs its GB-seconds and its request: 5 GB x 2 s x $0.0000166667 + $0.0000002, per 1,000
    assert costs.per_1000_requests_usd == pytest.approx(1000 * (5 * 2.0 * 0.0000166667 + 0.2e-6), abs=1e-3)
    assert costs.per_1000_requests_with_caption_usd > costs.per_1000_requests_usd


def test_a_million_images_in_the_bulk_lane_matches_the_hand_computation() -> None:
    # GIVEN the template's defaults: groups of 40, 100 tasks at once, at most 25 groups a task, 2 vCPUs and 7 GB
    lane = bulk_lane(1_000_000, BENCH, BULK, PRICES)
    # THEN 25,000 groups make 1,000 jobs of 1,000 images; each task starts (60 s) and loads the models (9 s) first
    task_seconds = 1_000 * 69 + 1_000_000 * 4.0
    hourly = 2 * 0.01214398 + 7 * 0.00133315  # Fargate Spot, us-east-1
    assert lane.parts["compute"] == pytest.approx(task_seconds / 3600 * hourly)
    # each task's public IPv4 address for as long as it runs
    assert lane.parts["public IPv4"] == pytest.approx(task_seconds / 3600 * 0.005)
    # the image read and its result checked, its JSON and picture written; five files per group
    assert lane.parts["S3 requests"] == pytest.approx((1e6 * (2 * 0.0004 + 1 * 0.005) + 25_000 * 5 * 0.005) / 1000)
    assert lane.parts["orchestration"] == pytest.approx((5 + 1_000 * 3) * 0.025 / 1000)
    assert lane.parts["Athena"] == pytest.approx(1e6 * 17_000 / 1e12 * 5)
    # AND 10 rounds of 100 tasks, each 69 s and 1,000 images
    assert lane.wall_s == pytest.approx(10 * (69 + 1_000 * 4.0))


def test_a_bulk_job_of_the_default_size_ends_well_within_its_attempt_s_timeout_and_its_child_s_wait() -> None:
    from tools.aws.sam_template import load_template
    from tools.bench.cost_lanes import bulk_jobs, bulk_task_start_s

    # GIVEN the worker's seconds as measured here and a job of the template's default size
    bench = read_report(BenchSeconds, REPO / "bench" / "bench.json")
    seconds_per_image = read_report(BulkSeconds, REPO / "bench" / "bulk.json").worker_s
    _, images_per_job = bulk_jobs(1_000_000)
    job_s = bulk_task_start_s(bench) + images_per_job * seconds_per_image
    # THEN on a CPU half as fast, an attempt still ends before Batch times it out (the job definition's
    # AttemptDurationSeconds: a timed-out attempt is not retried), and every attempt the retry strategy allows ends
    # before Step Functions stops waiting for the job (States.Timeout: its groups are handed back)
    job_definition = load_template()["Resources"]["BulkJobDefinition"]["Properties"]
    attempt_s = job_definition["Timeout"]["AttemptDurationSeconds"]
    assert 2 * job_s < attempt_s
    states = json.loads(DEFINITION_PATH.read_text())["States"]["AnnotateGroupsInBulk"]["ItemProcessor"]["States"]
    assert job_definition["RetryStrategy"]["Attempts"] * attempt_s <= states["RunBulkJob"]["TimeoutSeconds"]


def test_a_bulk_task_compiles_every_size_of_detect_it_meets_where_a_warm_machine_reads_one_from_its_cache() -> None:
    # GIVEN a bench that measured Detect's cold start from the compiled cache (4 s) and compiling every size (15 s)
    compiling = BENCH.with_step("detect", cold_start_all_sizes_s=15.0)
    # WHEN the bulk lane is priced
    lane, without = bulk_lane(1_000_000, compiling, BULK, PRICES), bulk_lane(1_000_000, BENCH, BULK, PRICES)
    # THEN each of its 1,000 tasks pays the 11 s more, since a task starts on empty storage
    hourly = 2 * 0.01214398 + 7 * 0.00133315
    assert lane.parts["compute"] == pytest.approx(without.parts["compute"] + 1_000 * 11 / 3600 * hourly)


def test_on_demand_costs_more_than_spot_and_the_lambda_lane_more_than_both() -> None:
    from tools.bench.cost_lanes import lambda_lane

    spot, on_demand = bulk_lane(10_000, BENCH, BULK, PRICES), bulk_lane(10_000, BENCH, BULK, PRICES, spot=False)
    assert spot.total < on_demand.total < lambda_lane(10_000, BENCH, PRICES).total


def test_the_bulk_lane_plans_as_the_template_deploys_it() -> None:
    from shared.contracts import MAX_IMAGES_PER_GROUP
    from shared.settings import Settings
    from tools.aws.sam_template import load_template

    parameters = load_template()["Parameters"]
    defaults = Settings()
    assert int(parameters["BulkConcurrency"]["Default"]) == defaults.bulk_concurrency
    assert int(parameters["GroupsPerBulkJob"]["Default"]) == defaults.groups_per_bulk_job
    assert int(parameters["BulkImagesPerGroup"]["Default"]) == defaults.bulk_images_per_group
    assert int(parameters["BulkImagesPerGroup"]["MaxValue"]) == MAX_IMAGES_PER_GROUP
    assert int(parameters["BulkFromImages"]["Default"]) == defaults.bulk_from_images


def test_annotate_cost_adds_the_lanes_where_bench_bulk_ran(tmp_path) -> None:
    from typer.testing import CliRunner

    from tools.cli import app

    (tmp_path / "bench.json").write_text(json.dumps(BENCH_REPORT))
    (tmp_path / "bulk.json").write_text(json.dumps(BULK_REPORT))
    result = CliRunner().invoke(app, ["cost", "--bench", str(tmp_path / "bench.json"), "--out-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = (tmp_path / "cost.md").read_text()
    for images in ("10,000", "100,000", "1,000,000"):
        assert report.count(f"| {images} |") == 3  # the Lambda lane, bulk on Spot, bulk on-demand
    assert "The bulk lane's compute" in report and "Spot prices: 2026-11-01" in report
    assert "| steady: 17,000 a day | gathered, 15 min (MaxWaitMinutes=15 EnableBulk=true) |" in report
    assert "| steady: 17,000 a day | gathered, 15 min, no bulk lane (MaxWaitMinutes=15) |" in report
    assert "| steady: 17,000 a day | 15 min | 178 | bulk:" in report


def test_the_dial_at_15_minutes_is_under_half_the_always_on_task_and_5x_below_lambda_as_benched() -> None:
    bench = read_report(BenchSeconds, REPO / "bench" / "bench.json")
    bulk = read_report(BulkSeconds, REPO / "bench" / "bulk.json")
    month = gathered_month(bench, bulk, PRICES, STEADY, 15)
    # 17,000 a day in batches of 178 every 15 minutes: each one bulk task that ends within the next 15 minutes
    assert (month.images_per_batch, month.choice.lane, month.lane.wall_s < 15 * 60) == (178, "bulk", True)
    assert month.total <= fargate_month(bench, PRICES, STEADY) / 2
    assert month.total * 5 <= lambda_month(bench, PRICES, STEADY)


def test_an_idle_month_with_the_dial_on_costs_only_its_looks_and_its_alarms() -> None:
    month = gathered_month(BENCH, BULK, PRICES, IDLE, 15)
    # the dial adds the gatherer's two alarms (its errors and its throttles), and one metric to each function alarm
    assert month.batches == 0 and month.total == pytest.approx(month.gathering + ALARMS + 2 * 0.10)
    assert month.gathering < 1.0


def test_without_the_bulk_lane_the_dial_runs_every_batch_on_lambda() -> None:
    month = gathered_month(BENCH, BULK, PRICES, STEADY, 15, bulk_enabled=False)
    assert (month.choice.lane, month.choice.reason) == ("lambda", "the stack has no bulk lane")
    assert month.total > gathered_month(BENCH, BULK, PRICES, STEADY, 15).total


def _checkout_s_reports() -> tuple[BenchSeconds, BulkSeconds, dict]:
    """The bench, bulk and photo reports as annotate cost reads them from the checkout's bench/."""
    bench = read_report(BenchSeconds, REPO / "bench" / "bench.json")
    lambda_detect = read_report(LambdaDetectSeconds, REPO / "bench" / "lambda-detect.json")
    photo = json.loads((REPO / "bench" / "photo.json").read_text())
    return with_lambda_cold_start(bench, lambda_detect), read_report(BulkSeconds, REPO / "bench" / "bulk.json"), photo


def test_the_stack_s_rule_runs_on_the_figures_annotate_cost_measured_at_a_phone_photo_s_size() -> None:
    from shared.settings import Settings
    from tools.bench.cost_months import gathered_bulk_from_images, gathered_settings
    from tools.bench.photo import at_photo_size

    bench, bulk = at_photo_size(*_checkout_s_reports())
    assert bulk is not None
    measured, deployed = gathered_settings(bench, bulk, 15), Settings()
    assert deployed.bulk_task_start_s == pytest.approx(measured.bulk_task_start_s, abs=1.0)
    assert deployed.bulk_seconds_per_image == pytest.approx(measured.bulk_seconds_per_image, abs=0.01)
    assert deployed.gathered_bulk_from_images == gathered_bulk_from_images(bench, bulk, PRICES)


def test_cost_md_s_million_and_dial_are_the_bench_reports_recomputed_at_the_sample_s_and_a_phone_photo_s_size() -> None:
    from tools.bench.photo import PHOTO, sizes_table

    bench, bulk, photo = _checkout_s_reports()
    table, figures = sizes_table(bench, bulk, photo, PRICES)
    at_bench, at_photo = figures["the bench's images"], figures[PHOTO]
    # the table annotate cost wrote is this one, recomputed from the reports
    assert table in (REPO / "bench" / "cost.md").read_text()
    # a phone's photo costs more seconds than the bench's images, in each lane
    assert at_photo["bulk worker, seconds an image"] > at_bench["bulk worker, seconds an image"]
    assert at_photo["Lambda lane, compute per 1,000 images"] > at_bench["Lambda lane, compute per 1,000 images"]
    million = "a million images, bulk lane on Fargate Spot"
    assert at_photo[million] > at_bench[million]


def test_masks_and_captions_that_see_the_image_are_priced_as_options_by_hand() -> None:
    from tools.bench.cost import masks_line, vision_caption_line

    # GIVEN Segment at 1 s an image, and a caption that sees the image at 3 s against the text-only 1 s
    report = copy.deepcopy(BENCH_REPORT)
    report["steps"]["segment"] = {"pipeline_median_s": 1.0, "cold_start_s": 1.5}
    report["vision_caption"] = {
        "text_only": {"caption_median_s": 1.0, "cold_start_s": 1.0, "cold_peak_rss_mb": 500},
        "vision": {"caption_median_s": 3.0, "cold_start_s": 2.0, "cold_peak_rss_mb": 900},
    }
    bench = BenchSeconds.model_validate(report)
    # THEN masks cost, per 1,000 images in the Lambda lane: 1 s at Segment's 2.9375 GB, an invocation, its document
    # written and read, a masks file for each group of 10
    segment = 1.0 * 2.9375 * 0.0000166667 + 0.20 / 1e6 + (0.005 + 0.0004) / 1000 + 0.005 / 1000 / 10
    assert f"${segment * 1000:.3f} per 1,000" in masks_line(bench, BULK, PRICES)
    # AND the vision caption 2 s more an image at Caption's 3 GB (3008 MB)
    vision = 2.0 * 3008 / 1024 * 0.0000166667 * 1000
    assert f"${vision:+.3f} per 1,000 images in the Lambda lane" in vision_caption_line(bench, BULK, PRICES)
    # AND neither is said where the bench did not measure it
    assert masks_line(BENCH, BULK, PRICES) == vision_caption_line(BENCH, BULK, PRICES) == ""


def test_graviton_is_priced_from_the_arm_list_and_bounded_by_detect_s_flops() -> None:
    from tools.bench.cost import graviton_line
    from tools.bench.cost_lanes import bulk_lane

    # GIVEN Detect's 400 GFLOP at a phone photo's size, 2.0 s on this machine
    flops = {"sizes": [{"size": [800, 1066], "gflop": 400.0, "seconds": 2.0}], "profile": {"size": [800, 1066]}}
    line = graviton_line(BENCH, BULK, PRICES, flops)
    # THEN a 2 vCPU, 7 GB task's hour on ARM is the ARM list's, 20% under x86's: ARM pays under 1.25x the seconds
    arm, x86 = 2 * 0.03238 + 7 * 0.00356, 2 * 0.04048 + 7 * 0.004445
    assert f"a task's hour ${arm:.4f} on demand against ${x86:.4f} on x86 (20% less" in line
    assert f"under {x86 / arm:.2f}x x86's" in line
    # AND at Graviton2's fp32 peak (2 vCPUs x 2.5 GHz x 16 FLOPs), Detect takes at least 400 / 80 = 5 s: the
    # worker 3 s slower an image, which costs more than x86 Spot at this machine's seconds
    assert "take at least 5.0 s on 2 Graviton2 vCPUs" in line
    floor = float(line.split("a million would cost at least $")[1].split(" ")[0])
    assert floor > bulk_lane(1_000_000, BENCH, BULK, PRICES).total
    # AND without the FLOPs report, only the price is said
    assert "Graviton2" not in graviton_line(BENCH, BULK, PRICES, None)


def test_each_detector_is_priced_at_the_bulk_workers_seconds_changed_by_its_own() -> None:
    from tools.bench.cost import detectors_table
    from tools.bench.cost_lanes import bulk_lane

    # GIVEN the default detector at 4.0 s an image, one 1.5 s faster, and one 0.1 s faster within its runs' spread
    published = {"coco_ap": 48.4, "lvis_minival_ap": None, "published": "a paper", "warm_spread_s": 0.05}
    detectors = {
        "measured_at": "2026-12-06T00:00:00+00:00",
        "detectors": {
            "Grounding DINO tiny (the default)": {"checkpoint": "a/default", "warm_s": 4.0, **published},
            "Faster": {"checkpoint": "a/faster", "warm_s": 2.5, **published},
            "Same": {"checkpoint": "a/same", "warm_s": 3.9, **published, "warm_spread_s": 0.2},
        },
    }
    table = detectors_table(BENCH, BULK, PRICES, detectors)
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ")}
    # THEN the default's million is the bulk lane's as it is, one within its spread is priced as the default and
    # says so, and the faster one's is the lane's with the worker 1.5 s quicker an image
    as_it_is = bulk_lane(1_000_000, BENCH, BULK, PRICES).total
    faster = bulk_lane(1_000_000, BENCH, BULK.model_copy(update={"worker_s": BULK.worker_s - 1.5}), PRICES).total
    assert (
        f"| ${as_it_is:.2f} |" in rows["Grounding DINO tiny (the default)"] and f"| ${as_it_is:.2f} |" in rows["Same"]
    )
    assert f"| ${faster:.2f} |" in rows["Faster"] and faster < as_it_is

    # AND the steady load's dial moves with the worker's seconds: less of the always-on task with the faster one
    def dial(row: str) -> float:
        return float(row.split(" | ")[6])

    assert dial(rows["Faster"]) < dial(rows["Grounding DINO tiny (the default)"]) == dial(rows["Same"])
    # AND an accuracy its authors did not publish is said to be so, not shown as a number
    assert "| 48.4 | not published |" in rows["Faster"]
