"""`annotate cost`: what the pipeline costs per 1,000 images and per month, from measured seconds and prices.

Inputs: a bench report (seconds per step and cold starts, measured here on 2 cores: a Lambda function with
3,538 MB or more has at least 2 vCPUs, so the figures are conservative for the memory sizes used), the prices in
``tools/bench/data/aws_prices.json``, and the functions' memory sizes as ``template.yaml`` deploys them by default.
Scenarios are the original study's: idle; 17,000 images a day, every day; bursts of 25,000 images a day on 10
days a month.

One piece: the scenarios, the lanes and the chart are priced from one price table and one set of measured seconds;
split, each part would carry both.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from shared.pipeline.batches import LaneChoice
from shared.settings import IngestSettings
from tools.aws.sam_template import by_default, load_template

SECONDS_PER_MONTH = 30 * 24 * 3600
HOURS_PER_MONTH = 30 * 24

# Per image, on the usual path (boxes found, caption on, no variants), inside a group's Express child: Detect,
# HasDetections, Describe, Classify, Tag, CaptionWanted, Caption, VariantsWanted, WriteResult. Express children are
# billed by request and duration, not per transition: these count only for Standard children (a stack deployed with
# variants). A test keeps these names in the ASL.
STATES_PER_IMAGE = (
    "Detect",
    "HasDetections",
    "Describe",
    "Classify",
    "Tag",
    "CaptionWanted",
    "Caption",
    "VariantsWanted",
    "WriteResult",
)
# Per group: the child's own states (billed as transitions only in a Standard child).
STATES_PER_GROUP = ("AnnotateImages", "WriteGroupTable")
# Per batch, in the Standard parent: its states (each child it starts is a transition of the Map besides).
STATES_PER_BATCH = ("ChooseLane", "AnnotateGroups", "SummarizeBatch", "BatchEnded", "BatchDone")
# The functions every image passes through (logical ids in template.yaml) and the bench step whose seconds each bills.
BILLED_FUNCTIONS = {
    "DetectFunction": "detect",
    "ClassifyFunction": "classify",
    "TagFunction": "tag",
    "CaptionFunction": "caption",
    "WriteResultFunction": None,
}
EXPRESS_MEMORY_GB = 64 / 1024  # Express duration is billed in 64 MB steps; a group's state is far below


@dataclass(frozen=True)
class BilledFunction:
    """A function as ``template.yaml`` deploys it by default, and the bench step whose seconds it bills."""

    memory_mb: int
    step: str | None  # None: WriteResult, billed at a fixed estimate
    arm64: bool
    snapstart: bool

    @property
    def gb(self) -> float:
        return self.memory_mb / 1024

    def gb_second_price(self, prices: dict[str, Any]) -> float:
        return float(prices["lambda"]["arm64_gb_second" if self.arm64 else "x86_gb_second"])


def billed_functions(template: dict[str, Any], parameters: dict[str, str] | None = None) -> dict[str, BilledFunction]:
    """Each billed function's memory (its MemorySize, or the default of the parameter it names), architecture and
    SnapStart, from the function or the template's Globals, as ``template.yaml`` deploys them by default (or with
    ``parameters`` given)."""
    defaults = template.get("Globals", {}).get("Function", {})
    billed = {}
    for logical_id, step in BILLED_FUNCTIONS.items():
        properties = by_default(template, defaults | template["Resources"][logical_id]["Properties"], parameters)
        billed[logical_id] = BilledFunction(
            memory_mb=int(properties["MemorySize"]),
            step=step,
            arm64=properties.get("Architectures", ["x86_64"]) == ["arm64"],
            snapstart=properties.get("SnapStart", {}).get("ApplyOn") == "PublishedVersions",
        )
    return billed


def images_per_group(template: dict[str, Any]) -> int:
    """The template's default ImagesPerGroup: how many images one child workflow (one Express execution) takes."""
    return int(template["Parameters"]["ImagesPerGroup"]["Default"])


TEMPLATE = load_template()
FUNCTIONS = billed_functions(TEMPLATE)
FUNCTIONS_WITH_SNAPSTART = billed_functions(TEMPLATE, {"EnableSnapStart": "true"})
DETECT_RUNTIME = by_default(
    TEMPLATE,
    TEMPLATE["Resources"]["DetectFunction"]["Properties"]["Environment"]["Variables"]["ANNOTATE_DETECTOR_RUNTIME"],
)
IMAGES_PER_GROUP = images_per_group(TEMPLATE)
WRITE_RESULT_SECONDS = 0.3  # drawing and writing one result, where bench-photo did not measure it
GROUP_TABLE_GB_SECONDS = 1.0 * 1.0  # WriteGroupTable per group: about a second at 1 GB; not benchmarked
SUMMARY_GB_SECONDS = 1.0 * 2.0  # SummarizeBatch per batch: about a second at 2 GB; not benchmarked
# Detect, Classify, Tag and WriteResult read the image, WriteGroupTable its result; the JSON and the picture written
S3_GETS_PER_IMAGE, S3_PUTS_PER_IMAGE = 5, 2
SQS_REQUESTS_PER_IMAGE = 3  # send, receive, delete
# Dropped images: Ingest's event source hands it a batch when BatchSize events wait or its batching window has passed
# ("Lambda reads messages in batches ... until ... the batching window expires, the batch size is reached",
# Lambda guide, "Using Lambda with Amazon SQS"), and each invocation starts one execution
_DROPPED_IMAGES = TEMPLATE["Resources"]["IngestFunction"]["Properties"]["Events"]["DroppedImages"]["Properties"]
BATCH_SIZE = int(_DROPPED_IMAGES["BatchSize"])
BATCHING_WINDOW_S = int(_DROPPED_IMAGES["MaximumBatchingWindowInSeconds"])


@dataclass(frozen=True)
class Scenario:
    name: str
    images_per_month: int
    peak_images_per_day: int
    cold_start_fraction: float


SCENARIOS = (
    Scenario("idle", 0, 0, 0.0),
    Scenario("steady: 17,000 a day", 17_000 * 30, 17_000, 0.10),
    Scenario("bursts: 25,000 a day on 10 days", 25_000 * 10, 25_000, 0.25),
)


def dropped_images_per_execution(scenario: Scenario) -> float:
    """The images one execution takes when they are dropped at the scenario's rate through the day: what arrives
    within Ingest's batching window, at most its batch size (17,000 a day: about 4)."""
    arriving = scenario.peak_images_per_day / (24 * 3600) * BATCHING_WINDOW_S
    return max(1.0, min(float(BATCH_SIZE), arriving))


def active_days(scenario: Scenario) -> float:
    return scenario.images_per_month / scenario.peak_images_per_day if scenario.peak_images_per_day else 0.0


# What the stack's CloudWatch holds, priced whether images come or not (alarms, dashboards), and the custom metrics
# the functions publish (Powertools' EMF, one dimension), billed for the hours they are published
CUSTOM_METRICS = (
    "BatchesStarted",
    "ImagesStarted",
    "MessagesRejected",
    "DuplicateEvents",
    "ImagesGathered",
    "CaptionTimeToFirstToken",
    "CaptionTokensPerSecond",
    "CaptionPromptTokens",
    "CaptionCompletionTokens",
    "CaptionPeakMemory",
)


def deployed_count(resource_type: str, overrides: dict[str, str] | None = None) -> int:
    """How many resources of the type a deployment with ``overrides`` creates (each whose Condition holds)."""
    return sum(
        1
        for resource in TEMPLATE["Resources"].values()
        if resource["Type"] == resource_type
        and (
            "Condition" not in resource
            or by_default(TEMPLATE, {"Fn::If": [resource["Condition"], True, False]}, overrides)
        )
    )


def monitoring_month(prices: dict[str, Any], scenario: Scenario, overrides: dict[str, str] | None = None) -> float:
    """The stack's alarms and dashboards for a month, and its custom metrics for the days images come."""
    watch = prices["cloudwatch"]
    standing = deployed_count("AWS::CloudWatch::Alarm", overrides) * watch["alarm_per_month"]
    standing += deployed_count("AWS::CloudWatch::Dashboard", overrides) * watch["dashboard_per_month"]
    return standing + len(CUSTOM_METRICS) * watch["custom_metric_per_month"] * min(1.0, active_days(scenario) / 30)


def load_prices(path: Path | None = None) -> dict[str, Any]:
    text = path.read_text() if path else resources.files("tools.bench").joinpath("data/aws_prices.json").read_text()
    return json.loads(text)


def _seconds(function: BilledFunction, bench: dict[str, Any]) -> float:
    if function.step:
        return float(bench["steps"][function.step]["pipeline_median_s"])
    return float(bench.get("write_result_s", WRITE_RESULT_SECONDS))  # measured at a photo's size (bench-photo)


def lambda_compute_per_image(bench: dict[str, Any], prices: dict[str, Any], per_execution: float = BATCH_SIZE) -> float:
    """Each function's GB-seconds for one image at its architecture's price, and a share of the per-group and
    per-batch functions' (billed at x86's), ``per_execution`` images sharing a batch's."""
    per_image = sum(f.gb * _seconds(f, bench) * f.gb_second_price(prices) for f in FUNCTIONS.values())
    shared_gb_s = GROUP_TABLE_GB_SECONDS / IMAGES_PER_GROUP + SUMMARY_GB_SECONDS / per_execution
    return per_image + shared_gb_s * prices["lambda"]["x86_gb_second"]


def _cold_starts(bench: dict[str, Any], prices: dict[str, Any], scenario: Scenario, snapstart: bool) -> float:
    """A month's cold starts of the model functions: a restore for those with SnapStart (and their snapshot's cache,
    which is billed idle or not), the import and model load for the others."""
    lam = prices["lambda"]
    cold_starts = scenario.images_per_month * scenario.cold_start_fraction
    total = 0.0
    for function in (FUNCTIONS_WITH_SNAPSTART if snapstart else FUNCTIONS).values():
        if function.step is None:
            continue
        if function.snapstart:
            total += cold_starts * function.gb * lam["snapstart_restore_per_gb"]
            total += function.gb * SECONDS_PER_MONTH * lam["snapstart_cache_gb_second"]
        else:
            step = bench["steps"][function.step]
            # An environment without a snapshot has no compiled cache: Detect reads its export and compiles its first
            # image's size (measured as Lambda runs it where annotate bench-lambda-detect has run, else from disk)
            init_s = step.get("cold_start_without_snapshot_s", step.get("cold_start_compiling_s", step["cold_start_s"]))
            total += cold_starts * function.gb * init_s * function.gb_second_price(prices)
    return total


def with_lambda_cold_start(bench: dict[str, Any], lambda_detect: dict[str, Any]) -> dict[str, Any]:
    """``bench`` with Detect's cold start as a Lambda environment without a snapshot pays it: from the report of
    ``annotate bench-lambda-detect``, the first answer less a warm one, on the runtime the template deploys."""
    row = lambda_detect["runtimes"][DETECT_RUNTIME]
    updated = copy.deepcopy(bench)
    updated["steps"]["detect"]["cold_start_without_snapshot_s"] = round(row["first_answer_s"] - row["warm_answer_s"], 2)
    return updated


def orchestration_per_image(
    bench: dict[str, Any], prices: dict[str, Any], express: bool = True, per_execution: float = BATCH_SIZE
) -> float:
    """Step Functions per image: the Standard parent's transitions (its states per batch of ``per_execution``
    images and a start per child), and per group either an Express execution (a request and its duration: the
    group's images run side by side, about one image's time) or, in a Standard child, every state's transition."""
    sfn = prices["step_functions"]
    transition = sfn["standard_per_1000_transitions"] / 1000
    parent = (len(STATES_PER_BATCH) / per_execution + 1 / IMAGES_PER_GROUP) * transition
    if express:
        seconds = bench["whole_image"]["pipeline_s"]
        per_group = sfn["express_per_million_requests"] / 1e6 + seconds * EXPRESS_MEMORY_GB * sfn["express_gb_second"]
        return parent + per_group / IMAGES_PER_GROUP
    return parent + (len(STATES_PER_IMAGE) + len(STATES_PER_GROUP) / IMAGES_PER_GROUP) * transition


def lambda_month_parts(
    bench: dict[str, Any],
    prices: dict[str, Any],
    scenario: Scenario,
    snapstart: bool = False,
    per_execution: float | None = None,
) -> dict[str, float]:
    """Lambda, Step Functions (Express children), SQS, S3 and the claims for a month of ``scenario``'s images, by
    part: as the template deploys the functions, or with SnapStart on (EnableSnapStart=true). ``per_execution``:
    the images of one execution (one message's); None: dropped images, each claimed, as Ingest's batching window
    gathers them."""
    images = scenario.images_per_month
    dropped = per_execution is None
    per_execution = dropped_images_per_execution(scenario) if per_execution is None else per_execution
    invocations = len(FUNCTIONS) + 1 / IMAGES_PER_GROUP + 2 / per_execution  # + WriteGroupTable, ingest, summary
    requests = images * invocations * prices["lambda"]["per_million_requests"] / 1e6
    compute = images * lambda_compute_per_image(bench, prices, per_execution)
    storage = (
        images
        * (S3_GETS_PER_IMAGE * prices["s3"]["get_per_1000"] + S3_PUTS_PER_IMAGE * prices["s3"]["put_per_1000"])
        / 1000
    )
    claims = images * CLAIM_WRITES_PER_IMAGE * prices["dynamodb"]["write_per_million"] / 1e6 if dropped else 0.0
    return {
        "compute": compute + requests + _cold_starts(bench, prices, scenario, snapstart),
        "orchestration": images * orchestration_per_image(bench, prices, per_execution=per_execution),
        "queues_and_storage": images * SQS_REQUESTS_PER_IMAGE * prices["sqs"]["per_million_requests"] / 1e6
        + storage
        + claims,
    }


def lambda_month(bench: dict[str, Any], prices: dict[str, Any], scenario: Scenario, snapstart: bool = False) -> float:
    """Lambda + Step Functions + SQS + S3 + the claims for a month of ``scenario``'s dropped images, and the stack's
    CloudWatch (its alarms, dashboard and custom metrics)."""
    return sum(lambda_month_parts(bench, prices, scenario, snapstart).values()) + monitoring_month(prices, scenario)


def orchestration_share(bench: dict[str, Any], prices: dict[str, Any], scenario: Scenario) -> float:
    """Step Functions' share of the Lambda option's cost per image (as deployed)."""
    parts = lambda_month_parts(bench, prices, scenario)
    return parts["orchestration"] / sum(parts.values())


def fargate_month(
    bench: dict[str, Any], prices: dict[str, Any], scenario: Scenario, vcpus: int = 2, memory_gb: int = 8
) -> float:
    """Always-on Fargate tasks sized for the scenario's peak day (at least one), running the whole pipeline, each with
    its public IPv4 address, and the S3 requests of its results (as the bulk worker makes them: every option writes
    the same results)."""
    per_task_per_day = 86_400 / bench["whole_image"]["pipeline_s"]
    tasks = max(1, math.ceil(scenario.peak_images_per_day / per_task_per_day))
    fargate = prices["fargate"]
    hourly = vcpus * fargate["x86_vcpu_hour"] + memory_gb * fargate["x86_gb_hour"] + prices["vpc"]["public_ipv4_hour"]
    return tasks * hourly * HOURS_PER_MONTH + _bulk_s3_requests(scenario.images_per_month, prices)


def _bulk_s3_requests(images: int, prices: dict[str, Any]) -> float:
    s3 = prices["s3"]
    return (
        images * (BULK_S3_GETS_PER_IMAGE * s3["get_per_1000"] + BULK_S3_PUTS_PER_IMAGE * s3["put_per_1000"])
        + math.ceil(images / BULK_IMAGES_PER_GROUP) * S3_PUTS_PER_GROUP * s3["put_per_1000"]
    ) / 1000


def template_default(name: str) -> int:
    return int(TEMPLATE["Parameters"][name]["Default"])


# The bulk lane as template.yaml deploys it by default (EnableBulk=true): its task size and how many run at once.
BULK_VCPUS = template_default("BulkCpu") / 1024
BULK_MEMORY_GB = template_default("BulkMemory") / 1024
BULK_CONCURRENCY = template_default("BulkConcurrency")
BULK_IMAGES_PER_GROUP = template_default("BulkImagesPerGroup")
GROUP_CONCURRENCY = template_default("GroupConcurrency")
# Not measurable here: pulling the worker's image (about 1.3 GB) and attaching the task's network interface; an
# estimate, billed (Fargate bills from the image pull on) and waited for by every task.
TASK_START_S = 60.0
MODEL_STEPS = ("detect", "classify", "tag", "caption")
# Per image: the image read once (its steps share the bytes) and a check for its result (a retried job's skip; the
# table write reads nothing back); its JSON and picture written. Per group (BulkImagesPerGroup images in the bulk lane,
# ImagesPerGroup in the Lambda lane's): its two table files and its summary.
BULK_S3_GETS_PER_IMAGE, BULK_S3_PUTS_PER_IMAGE, S3_PUTS_PER_GROUP = 2, 2, 3
# Both tables' Parquet per image, an upper bound: a 3-image group's files (51 kB) hold mostly Parquet's own overhead.
ATHENA_BYTES_PER_IMAGE = 17_000
# Per batch in the bulk lane, in the Standard parent; per job, the Map's start of its Standard child and the child's
# task (a Spot interruption's retry adds one).
STATES_PER_BULK_BATCH = ("ChooseLane", "AnnotateGroupsInBulk", "SummarizeBatch", "BatchEnded", "BatchDone")
TRANSITIONS_PER_BULK_JOB = 3


@dataclass(frozen=True)
class LaneEstimate:
    """What ``images`` images cost in one lane, by part, and how long they take at the template's concurrency."""

    lane: str
    images: int
    parts: dict[str, float]  # compute, S3 requests, orchestration, Athena (one query reading every row)
    wall_s: float
    limited_by: str

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def _athena(images: int, prices: dict[str, Any]) -> float:
    athena = prices["athena"]
    scanned = max(images * ATHENA_BYTES_PER_IMAGE, athena["minimum_mb_per_query"] * 1e6)
    return scanned / 1e12 * athena["per_tb_scanned"]


def bulk_jobs(images: int) -> tuple[int, int]:
    """(jobs, images per job) for a batch of ``images`` as ingest plans it at the template's defaults."""
    from shared.pipeline.batches import groups_per_bulk_job
    from shared.settings import Settings

    settings = Settings(
        bulk_images_per_group=BULK_IMAGES_PER_GROUP,
        bulk_concurrency=BULK_CONCURRENCY,
        groups_per_bulk_job=template_default("GroupsPerBulkJob"),
    ).ingest
    groups = math.ceil(images / BULK_IMAGES_PER_GROUP)
    per_job = groups_per_bulk_job(groups, settings)
    return math.ceil(groups / per_job), per_job * BULK_IMAGES_PER_GROUP


def bulk_model_load_s(bench: dict[str, Any]) -> float:
    """A bulk task's model load, measured: it starts on empty storage, with no compiled cache, so Detect compiles
    each size its images need (every size, at most, as ``annotate bench`` measured it) where a warm machine's
    cold start loads one from the cache."""
    detect = bench["steps"]["detect"]
    return detect.get("cold_start_all_sizes_s", detect["cold_start_s"]) + sum(
        bench["steps"][step]["cold_start_s"] for step in MODEL_STEPS if step != "detect"
    )


def bulk_task_hours(images: int, bench: dict[str, Any], bulk: dict[str, Any], jobs: int | None = None) -> float:
    """The bulk lane's task hours for ``images`` in ``jobs`` tasks (as ingest plans them unless given): each task's
    start and model load, a minute at least (Fargate's least billed), and its images at the worker's seconds."""
    jobs = bulk_jobs(images)[0] if jobs is None else jobs
    start_s = TASK_START_S + bulk_model_load_s(bench)
    return (jobs * max(60.0, start_s) + images * bulk["seconds_per_image"]["worker"]) / 3600


def bulk_lane(
    images: int,
    bench: dict[str, Any],
    bulk: dict[str, Any],
    prices: dict[str, Any],
    spot: bool = True,
    jobs: int | None = None,
) -> LaneEstimate:
    """The bulk lane: each task's start and model load (measured by annotate bench), then its images at the worker's
    seconds (measured by annotate bench-bulk on this machine's cores, as many as a task's vCPUs), on Fargate Spot or
    on-demand at the template's task size; in ``jobs`` tasks if given (a gathered batch's), else as ingest plans."""
    if jobs is None:
        jobs, per_job = bulk_jobs(images)
    else:
        per_job = math.ceil(images / jobs)
    seconds_per_image = bulk["seconds_per_image"]["worker"]
    start_s = TASK_START_S + bulk_model_load_s(bench)
    fargate = prices["fargate_spot" if spot else "fargate"]
    hourly = BULK_VCPUS * fargate["x86_vcpu_hour"] + BULK_MEMORY_GB * fargate["x86_gb_hour"]
    task_hours = bulk_task_hours(images, bench, bulk, jobs)
    requests = _bulk_s3_requests(images, prices)
    transitions = len(STATES_PER_BULK_BATCH) + jobs * TRANSITIONS_PER_BULK_JOB
    return LaneEstimate(
        lane="bulk, Fargate Spot" if spot else "bulk, Fargate on-demand",
        images=images,
        parts={
            "compute": task_hours * hourly,
            "public IPv4": task_hours * prices["vpc"]["public_ipv4_hour"],
            "S3 requests": requests,
            "orchestration": transitions * prices["step_functions"]["standard_per_1000_transitions"] / 1000,
            "Athena": _athena(images, prices),
        },
        wall_s=math.ceil(jobs / BULK_CONCURRENCY) * (start_s + per_job * seconds_per_image),
        limited_by=(
            f"Fargate {'Spot ' if spot else ''}vCPUs: {min(jobs, BULK_CONCURRENCY)} tasks x {BULK_VCPUS:g} "
            "(BulkConcurrency; the account's vCPU quota must allow them)"
        ),
    )


def lambda_lane(images: int, bench: dict[str, Any], prices: dict[str, Any]) -> LaneEstimate:
    """The Lambda lane as deployed: ``GroupConcurrency`` groups of ``ImagesPerGroup`` images at once, each image at
    the pipeline's seconds; every environment those need starts cold once."""
    in_flight = GROUP_CONCURRENCY * IMAGES_PER_GROUP
    scenario = Scenario(f"{images} images", images, images, min(1.0, in_flight / images))
    parts = lambda_month_parts(bench, prices, scenario, per_execution=images)
    s3 = prices["s3"]
    requests = images * (S3_GETS_PER_IMAGE * s3["get_per_1000"] + S3_PUTS_PER_IMAGE * s3["put_per_1000"]) / 1000
    return LaneEstimate(
        lane="lambda",
        images=images,
        parts={
            "compute": parts["compute"],
            "public IPv4": 0.0,  # Lambda's functions run outside the stack's VPC
            "S3 requests": requests
            + math.ceil(images / IMAGES_PER_GROUP) * S3_PUTS_PER_GROUP * s3["put_per_1000"] / 1000,
            "orchestration": parts["orchestration"] + parts["queues_and_storage"] - requests,
            "Athena": _athena(images, prices),
        },
        wall_s=math.ceil(images / in_flight) * bench["whole_image"]["pipeline_s"],
        limited_by=f"Lambda concurrency: {in_flight} images at once (GroupConcurrency x ImagesPerGroup)",
    )


BATCH_SIZES = (10_000, 100_000, 1_000_000)


def lanes_table(bench: dict[str, Any], bulk: dict[str, Any], prices: dict[str, Any]) -> str:
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


def _photo_added(bulk: dict[str, Any]) -> str:
    added = bulk.get("added_by_photo_s")
    return "" if added is None else f"; {added:.2f} s of it what a 12 MP photo adds, annotate bench-photo"


def bulk_line(bench: dict[str, Any], bulk: dict[str, Any], prices: dict[str, Any]) -> str:
    """The bulk lane's compute per 1,000 images against the Lambda lane's, and the figures behind it."""
    images = 1_000_000
    spot, on_demand = bulk_lane(images, bench, bulk, prices), bulk_lane(images, bench, bulk, prices, spot=False)
    lam = lambda_lane(images, bench, prices)
    _, per_job = bulk_jobs(images)
    per_1000 = {name: lane.parts["compute"] / images * 1000 for name, lane in (("spot", spot), ("od", on_demand))}
    lambda_per_1000 = lam.parts["compute"] / images * 1000
    return (
        f"The bulk lane's compute (EnableBulk=true; a {BULK_VCPUS:g} vCPU, {BULK_MEMORY_GB:g} GB task): "
        f"${per_1000['spot']:.3f} per 1,000 images on Fargate Spot, ${per_1000['od']:.3f} on-demand, against "
        f"${lambda_per_1000:.3f} in the Lambda lane ({lambda_per_1000 / per_1000['spot']:.0f}x); from "
        f"{bulk['seconds_per_image']['worker']:.2f} s an image (annotate bench-bulk, {bulk['cores']} cores, "
        f"{bulk['measured_at'][:10]}{_photo_added(bulk)}), and each task's start ({TASK_START_S:.0f} s, estimated) "
        f"and model load ({bulk_model_load_s(bench):.1f} s, measured, every size of Detect compiled) over its "
        f"{per_job} images. "
        f"A million images: ${spot.total:.2f} all told on Spot. Spot prices: {prices['fargate_spot']['date']} "
        f"({prices['fargate_spot']['source']})."
    )


# The latency dial (MaxWaitMinutes): the settings each priced, and the gatherer's own work, estimated (not measured
# here): a look a minute reads the queue's size and the clock, about 0.2 s; each image gathered adds about 0.01 s of
# receiving and claiming. Per image besides: its event sent to the queue, received and deleted (by tens), and its
# claim written three times (in progress, the execution it starts in, started: shared/pipeline/claims.py); per look,
# the queue's attributes, the clock read, and (when gathering) written.
DIALS_MINUTES = (15, 60)
GATHER_LOOK_S, GATHER_PER_IMAGE_S = 0.2, 0.01
GATHER_MEMORY_GB = int(TEMPLATE["Resources"]["GatherFunction"]["Properties"]["MemorySize"]) / 1024
LOOKS_PER_MONTH = 30 * 24 * 60
GATHER_SQS_REQUESTS_PER_IMAGE = 1 + 2 / 10
CLAIM_WRITES_PER_IMAGE = 3


def gathered_settings(
    bench: dict[str, Any], bulk: dict[str, Any], minutes: int, bulk_enabled: bool = True
) -> IngestSettings:
    """The stack's ingest settings by default, with the dial at ``minutes`` (and the bulk lane, EnableBulk, as
    given) and the rule's figures measured: a bulk task's start (estimated) and model load (annotate bench), its
    seconds an image (annotate bench-bulk)."""
    from shared.settings import Settings

    return Settings(
        max_wait_minutes=minutes,
        bulk_enabled=bulk_enabled,
        bulk_task_start_s=TASK_START_S + bulk_model_load_s(bench),
        bulk_seconds_per_image=bulk["seconds_per_image"]["worker"],
        bulk_images_per_group=BULK_IMAGES_PER_GROUP,
        bulk_concurrency=BULK_CONCURRENCY,
        fargate_vcpus=template_default("FargateVcpus"),
        bulk_task_cpu=template_default("BulkCpu"),
    ).ingest


def gathered_bulk_from_images(bench: dict[str, Any], bulk: dict[str, Any], prices: dict[str, Any]) -> int:
    """The fewest gathered images whose one bulk task (its start, model load and images, on Spot) costs less than
    Lambda's warm seconds for them: where the rule starts taking the bulk lane (``gathered_bulk_from_images``)."""
    spot = prices["fargate_spot"]
    hourly = (
        BULK_VCPUS * spot["x86_vcpu_hour"] + BULK_MEMORY_GB * spot["x86_gb_hour"] + prices["vpc"]["public_ipv4_hour"]
    )
    start_s = max(60.0, TASK_START_S + bulk_model_load_s(bench))  # Fargate bills a minute at least
    per_image_s = bulk["seconds_per_image"]["worker"]
    on_lambda = lambda_compute_per_image(bench, prices)
    return next(n for n in range(1, 10_000) if (start_s + n * per_image_s) * hourly / 3600 < n * on_lambda)


@dataclass(frozen=True)
class GatheredMonth:
    """A month of ``scenario`` with the dial at ``minutes``: its batches, the lane the rule picks for each, their
    cost and the gathering's, and the longest a drop waits for its row."""

    minutes: int
    images_per_batch: int
    batches: int
    choice: LaneChoice
    lane: LaneEstimate
    gathering: float
    monitoring: float  # the stack's CloudWatch: alarms, dashboard, custom metrics

    @property
    def total(self) -> float:
        return self.lane.total * self.batches + self.gathering + self.monitoring

    @property
    def worst_wait_s(self) -> float:
        return self.minutes * 60 + self.lane.wall_s


def gathered_month(
    bench: dict[str, Any],
    bulk: dict[str, Any],
    prices: dict[str, Any],
    scenario: Scenario,
    minutes: int,
    bulk_enabled: bool = True,
) -> GatheredMonth:
    """Drops spread over each active day, gathered every ``minutes``: each batch in the lane
    :func:`~shared.pipeline.batches.gathered_lane` picks (the deployed rule, on the measured figures), with the bulk
    lane deployed (EnableBulk=true) or not (the template's default: every batch on Lambda)."""
    from shared.pipeline.batches import gathered_lane

    images = scenario.images_per_month
    per_batch = math.ceil(scenario.peak_images_per_day * minutes / (24 * 60)) if images else 0
    batches = math.ceil(images / per_batch) if per_batch else 0
    choice = gathered_lane(max(1, per_batch), gathered_settings(bench, bulk, minutes, bulk_enabled))
    if choice.lane == "bulk":
        lane = bulk_lane(per_batch, bench, bulk, prices, jobs=math.ceil(per_batch / choice.images_per_task))
    else:
        lane = lambda_lane(max(1, per_batch), bench, prices)
    lambda_prices, per_million = prices["lambda"], 1e6
    per_look = (
        GATHER_LOOK_S * GATHER_MEMORY_GB * lambda_prices["x86_gb_second"]
        + (
            lambda_prices["per_million_requests"]
            + prices["eventbridge"]["per_million_events"]
            + prices["sqs"]["per_million_requests"]
            + prices["dynamodb"]["read_per_million"]
        )
        / per_million
    )
    per_image = (
        GATHER_PER_IMAGE_S * GATHER_MEMORY_GB * lambda_prices["x86_gb_second"]
        + (
            GATHER_SQS_REQUESTS_PER_IMAGE * prices["sqs"]["per_million_requests"]
            + CLAIM_WRITES_PER_IMAGE * prices["dynamodb"]["write_per_million"]
        )
        / per_million
    )
    clock_writes = batches * prices["dynamodb"]["write_per_million"] / per_million
    gathering = LOOKS_PER_MONTH * per_look + images * per_image + clock_writes
    overrides = {"MaxWaitMinutes": str(minutes), "EnableBulk": "true" if bulk_enabled else "false"}
    monitoring = monitoring_month(prices, scenario, overrides)
    return GatheredMonth(minutes, per_batch, batches, choice, lane, gathering, monitoring)


def gathered_line(bench: dict[str, Any], bulk: dict[str, Any], prices: dict[str, Any]) -> str:
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


def gathered_table(bench: dict[str, Any], bulk: dict[str, Any], prices: dict[str, Any]) -> str:
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


def rekognition_month(prices: dict[str, Any], scenario: Scenario) -> float:
    per_1000 = prices["rekognition"]["detect_labels_per_1000"] + prices["rekognition"]["image_properties_per_1000"]
    return scenario.images_per_month / 1000 * per_1000


def cost_table(
    bench: dict[str, Any], prices: dict[str, Any], bulk: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Each scenario's month per option; with a bulk bench (``bulk``), the latency dial's settings too."""
    rows = []
    for scenario in SCENARIOS:
        options = {
            "Lambda (as deployed)": lambda_month(bench, prices, scenario),
            "Lambda, with SnapStart (EnableSnapStart=true)": lambda_month(bench, prices, scenario, snapstart=True),
            "Fargate always-on": fargate_month(bench, prices, scenario),
            "Rekognition (labels + properties)": rekognition_month(prices, scenario),
        }
        for minutes in DIALS_MINUTES if bulk else ():
            with_bulk = gathered_month(bench, bulk or {}, prices, scenario, minutes)
            options[f"gathered, {minutes} min (MaxWaitMinutes={minutes} EnableBulk=true)"] = with_bulk.total
            if minutes == DIALS_MINUTES[0]:  # the dial without the bulk lane (the template's EnableBulk default)
                on_lambda = gathered_month(bench, bulk or {}, prices, scenario, minutes, bulk_enabled=False)
                options[f"gathered, {minutes} min, no bulk lane (MaxWaitMinutes={minutes})"] = on_lambda.total
        for option, monthly in options.items():
            per_1000 = monthly / scenario.images_per_month * 1000 if scenario.images_per_month else None
            rows.append(
                {
                    "scenario": scenario.name,
                    "option": option,
                    "monthly_usd": round(monthly, 2),
                    "per_1000_images_usd": None if per_1000 is None else round(per_1000, 3),
                }
            )
    return rows


API_MEMORY_MB = int(by_default(TEMPLATE, TEMPLATE["Resources"]["ApiFunction"]["Properties"]["MemorySize"]))


def api_costs(api: dict[str, Any], prices: dict[str, Any]) -> dict[str, float]:
    """The API function (EnableApi=true) at the template's memory: idle a month without SnapStart and with it (its
    snapshot's cache is billed for as long as the version is active), and per 1,000 requests at the warm answer's
    seconds measured by ``annotate bench-api``."""
    lam = prices["lambda"]
    gb = API_MEMORY_MB / 1024
    measured = api["runtimes"]["onnxruntime"]  # the API function's runtime

    def per_1000(seconds: float) -> float:
        return 1000 * (gb * seconds * lam["x86_gb_second"] + lam["per_million_requests"] / 1e6)

    return {
        "memory_mb": API_MEMORY_MB,
        "measured_peak_mb": measured["server_peak_rss_mb"],
        "idle_month_usd": 0.0,
        "idle_month_with_snapstart_usd": round(gb * SECONDS_PER_MONTH * lam["snapstart_cache_gb_second"], 2),
        "per_1000_requests_usd": round(per_1000(measured["medians_s"]["http"]), 3),
        "per_1000_requests_with_caption_usd": round(per_1000(measured["medians_s"]["http_with_caption"]), 3),
    }


def api_line(costs: dict[str, float]) -> str:
    fits = "holds" if costs["measured_peak_mb"] <= costs["memory_mb"] else "does NOT hold"
    return (
        f"The API (EnableApi=true, {costs['memory_mb']:.0f} MB, which {fits} the measured peak of "
        f"{costs['measured_peak_mb']:.0f} MB): idle ${costs['idle_month_usd']:.2f} a month as deployed, "
        f"${costs['idle_month_with_snapstart_usd']:.2f} with SnapStart (the study's design: $39); "
        f"${costs['per_1000_requests_usd']:.3f} per 1,000 answers (detect, classify, tag), "
        f"${costs['per_1000_requests_with_caption_usd']:.3f} with the caption."
    )


def orchestration_line(bench: dict[str, Any], prices: dict[str, Any]) -> str:
    steady = SCENARIOS[1]
    per_execution = dropped_images_per_execution(steady)
    express = orchestration_per_image(bench, prices, per_execution=per_execution)
    standard = orchestration_per_image(bench, prices, express=False, per_execution=per_execution)
    watch = prices["cloudwatch"]
    return (
        f"Orchestration (Step Functions: the Standard parent and an Express child per {IMAGES_PER_GROUP} images) "
        f"costs ${express * 1000:.4f} per 1,000 images, {orchestration_share(bench, prices, steady):.1%} of the "
        f"Lambda option at the steady load, where Ingest's {BATCHING_WINDOW_S} s batching window gathers "
        f"{per_execution:.1f} dropped images an execution; a stack with variants runs Standard children: "
        f"${standard * 1000:.4f} per 1,000 images. The stack's options include its CloudWatch: "
        f"{deployed_count('AWS::CloudWatch::Alarm')} alarms and {deployed_count('AWS::CloudWatch::Dashboard')} "
        f"dashboard as deployed (${monitoring_month(prices, SCENARIOS[0]):.2f} a month, idle or not; the free "
        f"tier's are the account's), and {len(CUSTOM_METRICS)} custom metrics at "
        f"${watch['custom_metric_per_month']:.2f} a month on the days images come."
    )


def markdown_table(rows: list[dict[str, Any]], prices: dict[str, Any], bench: dict[str, Any] | None = None) -> str:
    lines = ["| scenario | option | per month | per 1,000 images |", "|---|---|---:|---:|"]
    for row in rows:
        per_1000 = "" if row["per_1000_images_usd"] is None else f"${row['per_1000_images_usd']:.3f}"
        lines.append(f"| {row['scenario']} | {row['option']} | ${row['monthly_usd']:,.2f} | {per_1000} |")
    if bench is not None:
        lines.append("\n" + orchestration_line(bench, prices))
    lines.append(f"\nPrices: {prices['region']}, {prices['date']} ({prices['source']}).")
    if bench is not None and "measured_at_size" in bench:
        lines.append(
            f"\nSeconds: {bench['measured_at_size']}: each step's seconds on the bench's images plus what the photo"
            " adds to them, measured side by side (its decode, the detector's resize, the annotated picture)."
        )
    return "\n".join(lines) + "\n"


def write_chart(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(row["scenario"] for row in rows))
    options = list(dict.fromkeys(row["option"] for row in rows))
    figure, axes = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(options)
    for index, option in enumerate(options):
        values = [
            next(r["monthly_usd"] for r in rows if r["scenario"] == s and r["option"] == option) for s in scenarios
        ]
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
