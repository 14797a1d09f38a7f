"""`annotate cost`'s report: what the pipeline costs per 1,000 images and per month, from measured seconds and
prices, as the tables and lines of bench/cost.md and its chart.

Inputs (tools/bench/cost_inputs.py): a bench report (seconds per step and cold starts, measured here on 2 cores: a
Lambda function with 3,538 MB or more has at least 2 vCPUs, so the figures are conservative for the memory sizes
used), the prices in ``tools/bench/data/aws_prices.json``, and the stack as ``template.yaml`` deploys it by default.
The arithmetic is in tools/bench/cost_lanes.py (each lane) and tools/bench/cost_months.py (each scenario's month).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.bench.cost_inputs import (
    SCENARIOS,
    SECONDS_PER_MONTH,
    ApiSeconds,
    BenchSeconds,
    BulkSeconds,
    Prices,
    Scenario,
    deployment,
)
from tools.bench.cost_lanes import (
    LOG_BYTES_PER_INVOCATION,
    STATES_PER_HAND_BACK,
    TASK_START_S,
    bulk_jobs,
    bulk_lane,
    bulk_model_load_s,
    dropped_images_per_execution,
    fargate_month,
    lambda_lane,
    lambda_month_parts,
    orchestration_per_image,
)
from tools.bench.cost_months import (
    CUSTOM_METRICS,
    DIALS_MINUTES,
    GATHER_LOOK_S,
    GATHER_PER_IMAGE_S,
    CostRow,
    gathered_month,
    lambda_month,
    monitoring_month,
    orchestration_share,
)

BATCH_SIZES = (10_000, 100_000, 1_000_000)
DIAL_MINUTES = 15  # the dial the cost goal is set at


def lanes_table(bench: BenchSeconds, bulk: BulkSeconds, prices: Prices) -> str:
    """Each lane for 10,000, 100,000 and 1,000,000 images: cost by part, wall time and what limits it."""

    def duration(seconds: float) -> str:
        return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min"

    lines = [
        "| images | lane | compute | public IPv4 | S3 requests | orchestration | Athena | total | per 1,000 "
        "| wall time | limited by |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for images in BATCH_SIZES:
        for lane in (
            lambda_lane(images, bench, prices),
            bulk_lane(images, bench, bulk, prices),
            bulk_lane(images, bench, bulk, prices, spot=False),
        ):
            costs = " | ".join(f"${value:,.2f}" for value in lane.parts.values())
            lines.append(
                f"| {images:,} | {lane.lane} | {costs} | ${lane.total:,.2f} | ${lane.total / images * 1000:.3f} | "
                f"{duration(lane.wall_s)} | {lane.limited_by} |"
            )
    return "\n".join(lines) + "\n"


def _photo_added(bulk: BulkSeconds) -> str:
    added = bulk.added_by_photo_s
    return "" if added is None else f"; {added:.2f} s of it what a 12 MP photo adds, annotate bench-photo"


def bulk_line(bench: BenchSeconds, bulk: BulkSeconds, prices: Prices) -> str:
    """The bulk lane's compute per 1,000 images against the Lambda lane's, and the figures behind it."""
    images, deployed = 1_000_000, deployment()
    spot, on_demand = bulk_lane(images, bench, bulk, prices), bulk_lane(images, bench, bulk, prices, spot=False)
    lam = lambda_lane(images, bench, prices)
    _, per_job = bulk_jobs(images)
    per_1000 = {name: lane.parts["compute"] / images * 1000 for name, lane in (("spot", spot), ("od", on_demand))}
    lambda_per_1000 = lam.parts["compute"] / images * 1000
    return (
        f"The bulk lane's compute (EnableBulk=true; a {deployed.bulk_vcpus:g} vCPU, {deployed.bulk_memory_gb:g} GB "
        "task): "
        f"${per_1000['spot']:.3f} per 1,000 images on Fargate Spot, ${per_1000['od']:.3f} on-demand, against "
        f"${lambda_per_1000:.3f} in the Lambda lane ({lambda_per_1000 / per_1000['spot']:.0f}x); from "
        f"{bulk.worker_s:.2f} s an image (annotate bench-bulk, {bulk.cores} cores, "
        f"{bulk.measured_at[:10]}{_photo_added(bulk)}), and each task's start ({TASK_START_S:.0f} s, estimated) "
        f"and model load ({bulk_model_load_s(bench):.1f} s, measured, every size of Detect compiled) over its "
        f"{per_job} images. "
        f"A million images: ${spot.total:.2f} all told on Spot. Spot prices: {prices.fargate_spot.date} "
        f"({prices.fargate_spot.source})."
    )


def masks_line(bench: BenchSeconds, bulk: BulkSeconds, prices: Prices) -> str:
    """What masks add per 1,000 images where a request asks for them: Segment's seconds at its function's memory,
    its invocation, its document written and read back, and each group's masks file in the Lambda lane; its seconds
    on the bulk task in the bulk lane (Spot)."""
    if "segment" not in bench.steps:
        return ""
    seconds, deployed = bench.steps["segment"].pipeline_median_s, deployment()
    lam, s3 = prices.lambda_, prices.s3
    on_lambda = (
        seconds * deployed.segment_memory_gb * lam.x86_gb_second
        + lam.per_million_requests / 1e6
        + (s3.put_per_1000 + s3.get_per_1000) / 1000
        + s3.put_per_1000 / 1000 / deployed.images_per_group
    ) * 1000
    on_spot = seconds / 3600 * prices.fargate_spot.hourly(deployed.bulk_vcpus, deployed.bulk_memory_gb) * 1000
    share = bench.masks_added if bench.masks_added is not None else seconds / bench.one_process_s
    return (
        f"Masks (a request's masks: true; Segment {seconds:.2f} s an image, {100 * share:.0f}% more than the image's "
        "other steps in the same run, its cold start "
        f"{bench.steps['segment'].cold_start_s:.1f} s): ${on_lambda:.3f} per 1,000 "
        f"images more in the Lambda lane (Segment at {deployed.segment_memory_gb:g} GB, its invocation, its document "
        f"written and read, a masks file a group), ${on_spot:.4f} in the bulk lane on Spot (its seconds on the task; "
        "its documents and files as the Lambda lane's)."
    )


def vision_caption_line(bench: BenchSeconds, bulk: BulkSeconds, prices: Prices) -> str:
    """What captioning with the vision-language model (CaptionVision=true) adds per 1,000 images, over the
    text-only caption it replaces: its extra seconds at the Caption function's memory in the Lambda lane, on the
    bulk task in the bulk lane (Spot), and a million images on Spot all told."""
    measured = bench.vision_caption
    if measured is None:
        return ""
    deployed, lam = deployment(), prices.lambda_
    vision, text = measured.vision, measured.text_only
    added_s = vision.caption_median_s - text.caption_median_s
    caption_gb = deployed.functions["CaptionFunction"].gb
    on_lambda = added_s * caption_gb * lam.x86_gb_second * 1000
    on_spot = added_s / 3600 * prices.fargate_spot.hourly(deployed.bulk_vcpus, deployed.bulk_memory_gb) * 1000
    with_vision = bulk.model_copy(update={"worker_s": bulk.worker_s + added_s})
    million = bulk_lane(1_000_000, bench, with_vision, prices).total
    return (
        "Captions that see the image (CaptionVision=true; SmolVLM-256M's architecture, annotate bench): "
        f"{vision.caption_median_s:.2f} s a caption against the text-only {text.caption_median_s:.2f} s "
        f"({added_s:+.2f} s an image; cold start {vision.cold_start_s:.1f} s, peak {vision.cold_peak_rss_mb:.0f} MB, "
        f"against {text.cold_start_s:.1f} s and {text.cold_peak_rss_mb:.0f} MB): ${on_lambda:+.3f} per 1,000 "
        f"images in the Lambda lane (Caption at {caption_gb:g} GB), ${on_spot:+.4f} in the bulk lane on Spot; a "
        f"million images on Spot ${million:.2f} all told."
    )


# Fargate's ARM64 tasks run on Graviton2 (Neoverse N1): two 128-bit FMA pipes a core, 16 fp32 FLOPs a cycle at
# 2.5 GHz. An upper bound of its fp32 rate, not a measurement: no ARM CPU is at hand here.
GRAVITON2_FP32_GFLOPS_PER_VCPU = 2.5 * 16


def graviton_line(bench: BenchSeconds, bulk: BulkSeconds, prices: Prices, flops: dict[str, Any] | None) -> str:
    """A million images on ARM64 Fargate Spot (FargateArchitecture=ARM64): at this machine's seconds, the most it
    could save, and at Detect's fp32 floor on Graviton2 (its FLOPs at a phone photo's size over the vector units'
    rate), what the FLOPs allow at best. The ARM Spot price is estimated: x86 Spot's discount on the ARM list price."""
    on_demand, spot, deployed = prices.fargate, prices.fargate_spot, deployment()
    arm = on_demand.arm64_hourly(deployed.bulk_vcpus, deployed.bulk_memory_gb)
    if arm is None:
        return ""
    x86 = on_demand.hourly(deployed.bulk_vcpus, deployed.bulk_memory_gb)
    spot_share = spot.hourly(deployed.bulk_vcpus, deployed.bulk_memory_gb) / x86
    arm_spot = spot.model_copy(
        update={
            "x86_vcpu_hour": on_demand.arm64_vcpu_hour * spot.x86_vcpu_hour / on_demand.x86_vcpu_hour,  # type: ignore[operator]
            "x86_gb_hour": on_demand.arm64_gb_hour * spot.x86_gb_hour / on_demand.x86_gb_hour,  # type: ignore[operator]
        }
    )
    on_arm = prices.model_copy(update={"fargate_spot": arm_spot})
    x86_million = bulk_lane(1_000_000, bench, bulk, prices).total
    same_seconds = bulk_lane(1_000_000, bench, bulk, on_arm).total
    line = (
        f"Graviton (FargateArchitecture=ARM64; the bulk image builds for both): a task's hour ${arm:.4f} on demand "
        f"against ${x86:.4f} on x86 ({1 - arm / x86:.0%} less; on Spot estimated at x86 Spot's {spot_share:.0%} of "
        f"on-demand). A million images on ARM Spot: ${same_seconds:.2f} at this machine's seconds, against "
        f"${x86_million:.2f} on x86: the most it saves, unmeasured (no ARM CPU here). ARM pays while its seconds "
        f"an image stay under {x86 / arm:.2f}x x86's."
    )
    # the size bench-flops profiled as a phone photo's
    profiled = (flops or {}).get("profile", {}).get("size")
    photo_size = next((size for size in (flops or {}).get("sizes", []) if size["size"] == profiled), None)
    if photo_size is None:
        return line
    floor = photo_size["gflop"] / (GRAVITON2_FP32_GFLOPS_PER_VCPU * deployed.bulk_vcpus)
    slower = bulk.model_copy(update={"worker_s": bulk.worker_s + floor - photo_size["seconds"]})
    at_floor = bulk_lane(1_000_000, bench, slower, on_arm).total
    return line + (
        f" Detect's {photo_size['gflop']:.0f} GFLOP at a phone photo's size (annotate bench-flops) take at least "
        f"{floor:.1f} s on {deployed.bulk_vcpus:g} Graviton2 vCPUs at their fp32 peak "
        f"({GRAVITON2_FP32_GFLOPS_PER_VCPU * deployed.bulk_vcpus:.0f} GFLOP/s), against {photo_size['seconds']:.2f} s "
        f"here: with every other step as fast as here, a million would cost at least ${at_floor:.2f} on ARM Spot. "
        "Published comparisons that favour Graviton for inference (up to 50% lower cost for PyTorch on Graviton3 "
        'c7g against comparable x86 instances; PyTorch blog, "Optimized PyTorch 2.0 inference with AWS Graviton '
        "processors\", 2023) were measured on Graviton3, which has bf16 (lossy, off here) and twice Graviton2's fp32 "
        "FLOPs a cycle."
    )


def detectors_table(bench: BenchSeconds, bulk: BulkSeconds, prices: Prices, detectors: dict[str, Any]) -> str:
    """The detector a user picks (annotate bench-detectors): each one's published accuracy, its seconds here, and a
    million 12 MP photos on Spot with it, the bulk worker's seconds changed by its difference from Grounding DINO's,
    measured side by side in one run (none where the difference is within either one's spread over its runs)."""
    from tools.bench.detectors import DEFAULT

    rows = detectors["detectors"]
    default = rows[DEFAULT]
    steady = SCENARIOS[1]
    always_on = fargate_month(bench, prices, steady)
    lines = [
        "| detector | checkpoint | COCO AP | LVIS minival AP | Detect s here | a million on Spot | "
        f"{steady.name}, dial at {DIAL_MINUTES} min over always-on | published |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, row in rows.items():
        faster = default["warm_s"] - row["warm_s"]
        # a difference within either detector's spread over its runs is noise: priced as the default
        within_spread = abs(faster) <= max(row.get("warm_spread_s", 0.0), default.get("warm_spread_s", 0.0))
        worker = bulk.model_copy(update={"worker_s": bulk.worker_s - (0.0 if within_spread else faster)})
        million = bulk_lane(1_000_000, bench, worker, prices).total
        dial = gathered_month(bench, worker, prices, steady, DIAL_MINUTES).total / always_on
        seconds = f"{row['warm_s']:.2f}" + (
            " (as the default's, within the runs' spread)" if within_spread and row is not default else ""
        )
        coco = f"{row['coco_ap']:.1f}" if row["coco_ap"] is not None else "not published"
        lvis = f"{row['lvis_minival_ap']:.1f}" if row["lvis_minival_ap"] is not None else "not published"
        lines.append(
            f"| {name} | {row['checkpoint']} | {coco} | {lvis} | {seconds} | ${million:.2f} | {dial:.2f} | "
            f"{row['published']} |"
        )
    return (
        f"The detector a user picks (annotate bench-detectors, {detectors['measured_at'][:10]}: zero-shot box AP as "
        "each checkpoint's authors publish it, unmeasured here; Detect's warm seconds at a phone photo's size on the "
        "full-size architecture; the bulk lane's million and the steady load's gathered month at the worker's "
        "seconds with that detector; the goals: under $50, at most 0.33):\n\n" + "\n".join(lines) + "\n"
    )


def gathered_line(bench: BenchSeconds, bulk: BulkSeconds, prices: Prices) -> str:
    """The dial against the always-on task and the Lambda lane at the study's steady load, in this run's figures."""
    steady = SCENARIOS[1]
    fargate, on_lambda = fargate_month(bench, prices, steady), lambda_month(bench, prices, steady)
    parts = []
    for minutes in DIALS_MINUTES:
        month = gathered_month(bench, bulk, prices, steady, minutes)
        parts.append(
            f"at {minutes} min, ${month.total:,.2f} a month ({month.total / fargate:.2f} of the always-on Fargate "
            f"task's ${fargate:,.2f}, {on_lambda / month.total:.1f}x below Lambda's ${on_lambda:,.2f}), batches of "
            f"{month.images_per_batch} in the {month.choice.lane} lane, a drop's row within "
            f"{month.worst_wait_s / 60:.0f} min"
        )
    return (
        f"Dropped images gathered (MaxWaitMinutes above 0) at {steady.name}: " + "; ".join(parts) + ". The gathering "
        f"itself (a look a minute, the queue's and the claims' requests) is in each total; its Lambda seconds are "
        f"estimates ({GATHER_LOOK_S:g} s a look, {GATHER_PER_IMAGE_S:g} s an image)."
    )


def gathered_table(bench: BenchSeconds, bulk: BulkSeconds, prices: Prices) -> str:
    """The dial at each setting for the study's loads: batch size, lane (and why), cost by part, longest wait."""
    lines = [
        "| scenario | dial | images a batch | lane | batches | batches' cost | gathering | CloudWatch | total "
        "| longest wait |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for scenario in SCENARIOS:
        for minutes in DIALS_MINUTES:
            month = gathered_month(bench, bulk, prices, scenario, minutes)
            lane = f"{month.choice.lane}: {month.choice.reason}" if month.batches else "none"
            lines.append(
                f"| {scenario.name} | {minutes} min | {month.images_per_batch:,} | {lane} | {month.batches:,} | "
                f"${month.lane.total * month.batches:,.2f} | ${month.gathering:,.2f} | ${month.monitoring:,.2f} | "
                f"${month.total:,.2f} | "
                f"{month.worst_wait_s / 60:.0f} min |"
            )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ApiCosts:
    """The API function (EnableApi=true) at the template's memory: idle a month without SnapStart and with it (its
    snapshot's cache is billed for as long as the version is active), and per 1,000 requests at the warm answer's
    seconds measured by ``annotate bench-api``."""

    memory_mb: int
    measured_peak_mb: float
    idle_month_usd: float
    idle_month_with_snapstart_usd: float
    per_1000_requests_usd: float
    per_1000_requests_with_caption_usd: float


def api_costs(api: ApiSeconds, prices: Prices) -> ApiCosts:
    memory_mb, lam = deployment().api_memory_mb, prices.lambda_
    measured = api.runtimes["onnxruntime"]  # the API function's runtime

    def per_1000(seconds: float) -> float:
        return 1000 * (memory_mb / 1024 * seconds * lam.x86_gb_second + lam.per_million_requests / 1e6)

    return ApiCosts(
        memory_mb=memory_mb,
        measured_peak_mb=measured.server_peak_rss_mb,
        idle_month_usd=0.0,
        idle_month_with_snapstart_usd=round(memory_mb / 1024 * SECONDS_PER_MONTH * lam.snapstart_cache_gb_second, 2),
        per_1000_requests_usd=round(per_1000(measured.http_s), 3),
        per_1000_requests_with_caption_usd=round(per_1000(measured.http_with_caption_s), 3),
    )


def api_line(costs: ApiCosts) -> str:
    fits = "holds" if costs.measured_peak_mb <= costs.memory_mb else "does NOT hold"
    return (
        f"The API (EnableApi=true, {costs.memory_mb:.0f} MB, which {fits} the measured peak of "
        f"{costs.measured_peak_mb:.0f} MB): idle ${costs.idle_month_usd:.2f} a month as deployed, "
        f"${costs.idle_month_with_snapstart_usd:.2f} with SnapStart (the study's design: $39); "
        f"${costs.per_1000_requests_usd:.3f} per 1,000 answers (detect, classify, tag), "
        f"${costs.per_1000_requests_with_caption_usd:.3f} with the caption."
    )


def orchestration_line(bench: BenchSeconds, prices: Prices) -> str:
    steady = SCENARIOS[1]
    per_execution = dropped_images_per_execution(steady)
    express = orchestration_per_image(bench, prices, per_execution=per_execution)
    standard = orchestration_per_image(bench, prices, express=False, per_execution=per_execution)
    deployed, watch = deployment(), prices.cloudwatch
    return (
        f"Orchestration (Step Functions: the Standard parent and an Express child per {deployed.images_per_group} "
        "images) "
        f"costs ${express * 1000:.4f} per 1,000 images, {orchestration_share(bench, prices, steady):.1%} of the "
        f"Lambda option at the steady load, where Ingest's {deployed.batching_window_s} s batching window gathers "
        f"{per_execution:.1f} dropped images an execution; a stack with variants runs Standard children: "
        f"${standard * 1000:.4f} per 1,000 images. A hand-back round adds {len(STATES_PER_HAND_BACK)} transitions "
        f"(${len(STATES_PER_HAND_BACK) * prices.step_functions.standard_per_1000_transitions / 1000:.5f}) and its "
        f"groups' children again. The stack's options include its CloudWatch: "
        f"{deployed.deployed_count('AWS::CloudWatch::Alarm')} alarms reading {deployed.alarm_metrics()} metrics (each "
        f"billed) and {deployed.deployed_count('AWS::CloudWatch::Dashboard')} "
        f"dashboard as deployed (${monitoring_month(prices, SCENARIOS[0]):.2f} a month, idle or not; the free "
        f"tier's are the account's), {len(CUSTOM_METRICS)} custom metrics at "
        f"${watch.custom_metric_per_month:.2f} a month on the days images come, and the functions' logs "
        f"({LOG_BYTES_PER_INVOCATION / 1000:.2f} kB an invocation at ${watch.logs_ingested_per_gb:.2f} a GB) and "
        f"X-Ray's traces (the first each second and 5% beyond, per function, at "
        f"${prices.xray.traces_recorded_per_million:.2f} a million): "
        f"${_observability_per_1000(bench, prices, steady):.4f} per 1,000 images at the steady load."
    )


def _observability_per_1000(bench: BenchSeconds, prices: Prices, scenario: Scenario) -> float:
    month = lambda_month_parts(bench, prices, scenario)
    return 1000 * month.observability / scenario.images_per_month


def markdown_table(rows: list[CostRow], prices: Prices, bench: BenchSeconds | None = None) -> str:
    lines = ["| scenario | option | per month | per 1,000 images |", "|---|---|---:|---:|"]
    for row in rows:
        per_1000 = "" if row.per_1000_images_usd is None else f"${row.per_1000_images_usd:.3f}"
        lines.append(f"| {row.scenario} | {row.option} | ${row.monthly_usd:,.2f} | {per_1000} |")
    if bench is not None:
        lines.append("\n" + orchestration_line(bench, prices))
    lines.append(f"\nPrices: {prices.region}, {prices.date} ({prices.source}).")
    if bench is not None and bench.measured_at_size:
        lines.append(
            f"\nSeconds: {bench.measured_at_size}: each step's seconds on the bench's images plus what the photo"
            " adds to them, measured side by side (its decode, the detector's resize, the annotated picture)."
        )
    return "\n".join(lines) + "\n"


def write_chart(rows: list[CostRow], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(row.scenario for row in rows))
    options = list(dict.fromkeys(row.option for row in rows))
    figure, axes = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(options)
    for index, option in enumerate(options):
        values = [next(r.monthly_usd for r in rows if r.scenario == s and r.option == option) for s in scenarios]
        positions = [s + index * width for s in range(len(scenarios))]
        bars = axes.bar(positions, [max(v, 0.01) for v in values], width, label=option)
        axes.bar_label(bars, labels=[f"${v:,.0f}" if v >= 1 else f"${v:.2f}" for v in values], fontsize=7)
    axes.set_xticks([s + width * (len(options) - 1) / 2 for s in range(len(scenarios))], scenarios)
    axes.set_yscale("log")
    axes.set_ylabel("USD per month (log scale)")
    axes.set_title("Monthly cost by scenario")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
