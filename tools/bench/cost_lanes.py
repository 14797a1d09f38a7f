"""What images cost in each lane: the Lambda lane (per image, per month of dropped images, per batch), the bulk lane
on Fargate, and an always-on Fargate task, from measured seconds, the prices and the template's defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass

from shared.pipeline.dependencies import DEFAULT_MODEL_STEPS
from shared.storage.tables import tables_written
from tools.bench.cost_inputs import (
    HOURS_PER_MONTH,
    SECONDS_PER_MONTH,
    BenchSeconds,
    BulkSeconds,
    LambdaDetectSeconds,
    Prices,
    Scenario,
    deployment,
)

# Per image, on the usual path (boxes found, caption on, no variants), inside a group's Express child. Express
# children are billed by request and duration, not per transition: these count only for Standard children (a stack
# deployed with variants). A test keeps these names in the ASL.
STATES_PER_IMAGE = (
    "Detect",
    "DescribeWanted",
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
# Per batch in the bulk lane, in the Standard parent; per job, the Map's start of its Standard child and the child's
# task (a Spot interruption's retry adds one).
STATES_PER_BULK_BATCH = ("ChooseLane", "AnnotateGroupsInBulk", "SummarizeBatch", "BatchEnded", "BatchDone")
TRANSITIONS_PER_BULK_JOB = 3
# Per hand-back round (a group throttled past its child's retries, a bulk job failed past Batch's), in the Standard
# parent: SummarizeBatch, BatchEnded, the wait, HandBackGroups, ChooseLane and the Map again; and per group handed
# back, its child's start (an Express child's request, or a bulk job's child transitions)
STATES_PER_HAND_BACK = (
    "SummarizeBatch",
    "BatchEnded",
    "WaitForCapacity",
    "HandBackGroups",
    "ChooseLane",
    "AnnotateGroups",
)
EXPRESS_MEMORY_GB = 64 / 1024  # Express duration is billed in 64 MB steps; a group's state is far below
GROUP_TABLE_GB_SECONDS = 1.0 * 1.0  # WriteGroupTable per group: about a second at 1 GB; not benchmarked
SUMMARY_GB_SECONDS = 1.0 * 2.0  # SummarizeBatch per batch: about a second at 2 GB; not benchmarked
# Detect, Classify and Tag read the image, WriteGroupTable its result; the JSON written
S3_GETS_PER_IMAGE, S3_PUTS_PER_IMAGE = 4, 1
# In the bulk lane, per image: the image read once (its steps share the bytes) and a check for its result (a retried
# job's skip; the table write reads nothing back); its JSON written. Per group (BulkImagesPerGroup images in the bulk
# lane, ImagesPerGroup in the Lambda lane's): a file of each table (written even where it has no rows) and its summary.
# each group's file of each table a request without masks fills, and its summary
BULK_S3_GETS_PER_IMAGE, BULK_S3_PUTS_PER_IMAGE, S3_PUTS_PER_GROUP = 2, 1, len(tables_written(masks=False)) + 1
# With StorePictures=true, each image's picture written too, and in the Lambda lane the image read again to draw it
PICTURE_GETS_LAMBDA, PICTURE_PUTS = 1, 1
SQS_REQUESTS_PER_IMAGE = 3  # send, receive, delete
# A dropped image's claim is written three times: in progress, the execution it starts in, started
# (shared/pipeline/claims.py)
CLAIM_WRITES_PER_IMAGE = 3
# The images' and detections' Parquet per image, an upper bound: a 3-image group's files (51 kB) hold mostly
# Parquet's own overhead. The embeddings' are measured apart (tools/bench/storage.embedding_bytes_per_image).
ATHENA_BYTES_PER_IMAGE = 17_000
# Not measurable here: pulling the worker's image (about 1.3 GB) and attaching the task's network interface; an
# estimate, billed (Fargate bills from the image pull on) and waited for by every task.
TASK_START_S = 60.0
# What an invocation writes to CloudWatch Logs: the functions' own lines, 0.93 kB an invocation on samples/
# (`annotate run --verbose`, 2026-12-06: 11 invocations, the models' first loads among them), and Lambda's START,
# END and REPORT lines with the X-Ray trace id, about 0.5 kB
LOG_BYTES_PER_INVOCATION = 1_450
# X-Ray's sampling of traced Lambda invocations and executions: "by default ... the first request each second, and
# five percent of any additional requests" (X-Ray developer guide, "Sampling rules"), each function on its own
SAMPLED_PER_SECOND, SAMPLED_BEYOND = 1, 0.05
MODEL_STEPS = tuple(step.value for step in DEFAULT_MODEL_STEPS)  # masks are an option, priced as one


def dropped_images_per_execution(scenario: Scenario) -> float:
    """The images one execution takes when they are dropped at the scenario's rate through the day: what arrives
    within Ingest's batching window, shared by the event source's pollers, at most its batch size (17,000 a day:
    about 4 a window, among 5 pollers: one).

    Ingest's event source hands it a batch when BatchSize events wait or its batching window has passed ("Lambda
    reads messages in batches ... until ... the batching window expires, the batch size is reached", Lambda guide,
    "Using Lambda with Amazon SQS"), each of its pollers its own ("maximum concurrency ... the number of concurrent
    instances of the function that an Amazon SQS event source can invoke"), and each invocation starts one
    execution."""
    deployed = deployment()
    arriving = scenario.peak_images_per_day / (24 * 3600) * deployed.batching_window_s / deployed.dropped_pollers
    return max(1.0, min(float(deployed.dropped_batch_size), arriving))


def lambda_compute_per_image(bench: BenchSeconds, prices: Prices, per_execution: float | None = None) -> float:
    """Each function's GB-seconds for one image at its architecture's price, and a share of the per-group and
    per-batch functions' (billed at x86's), ``per_execution`` images sharing a batch's (Ingest's batch size unless
    given)."""
    deployed = deployment()
    per_execution = deployed.dropped_batch_size if per_execution is None else per_execution
    per_image = sum(f.gb * f.seconds(bench) * f.gb_second_price(prices) for f in deployed.functions.values())
    per_group = min(float(deployed.images_per_group), per_execution)
    shared_gb_s = GROUP_TABLE_GB_SECONDS / per_group + SUMMARY_GB_SECONDS / per_execution
    return per_image + shared_gb_s * prices.lambda_.x86_gb_second


def _cold_starts(bench: BenchSeconds, prices: Prices, scenario: Scenario, snapstart: bool) -> float:
    """A month's cold starts of the model functions: a restore for those with SnapStart (and their snapshot's cache,
    which is billed idle or not), the import and model load for the others."""
    deployed = deployment()
    cold_starts = scenario.images_per_month * scenario.cold_start_fraction
    total = 0.0
    for function in (deployed.functions_with_snapstart if snapstart else deployed.functions).values():
        if function.step is None:
            continue
        if function.snapstart:
            total += cold_starts * function.gb * prices.lambda_.snapstart_restore_per_gb
            total += function.gb * SECONDS_PER_MONTH * prices.lambda_.snapstart_cache_gb_second
        else:
            init_s = bench.steps[function.step].cold_start_in_lambda_s
            total += cold_starts * function.gb * init_s * function.gb_second_price(prices)
    return total


def with_lambda_cold_start(bench: BenchSeconds, lambda_detect: LambdaDetectSeconds) -> BenchSeconds:
    """``bench`` with Detect's cold start as a Lambda environment without a snapshot pays it: from the report of
    ``annotate bench-lambda-detect``, the first answer less a warm one, on the runtime the template deploys."""
    row = lambda_detect.runtimes[deployment().detect_runtime]
    return bench.with_step("detect", cold_start_without_snapshot_s=round(row.first_answer_s - row.warm_answer_s, 2))


def orchestration_per_image(
    bench: BenchSeconds, prices: Prices, express: bool = True, per_execution: float | None = None
) -> float:
    """Step Functions per image: the Standard parent's transitions (its states per batch of ``per_execution``
    images and a start per child), and per group either an Express execution (a request and its duration: the
    group's images run side by side, about one image's time) or, in a Standard child, every state's transition."""
    deployed, sfn = deployment(), prices.step_functions
    per_execution = deployed.dropped_batch_size if per_execution is None else per_execution
    per_group_images = min(float(deployed.images_per_group), per_execution)
    transition = sfn.standard_per_1000_transitions / 1000
    parent = (len(STATES_PER_BATCH) / per_execution + 1 / per_group_images) * transition
    if express:
        duration = bench.one_process_s * EXPRESS_MEMORY_GB * sfn.express_gb_second
        return parent + (sfn.express_per_million_requests / 1e6 + duration) / per_group_images
    return parent + (len(STATES_PER_IMAGE) + len(STATES_PER_GROUP) / per_group_images) * transition


def traces_recorded(requests_per_month: float, traced: int, seconds: float = SECONDS_PER_MONTH) -> float:
    """The traces X-Ray records of ``traced`` functions (or state machines) sharing ``requests_per_month`` evenly."""
    each = requests_per_month / max(1, traced)
    reservoir = SAMPLED_PER_SECOND * seconds
    return traced * (min(each, reservoir) + SAMPLED_BEYOND * max(0.0, each - reservoir))


def observability_month(invocations: float, executions: float, prices: Prices) -> float:
    """CloudWatch Logs' ingestion of the invocations' lines and X-Ray's traces of them and of the executions
    (Tracing: Active on every function and the state machine)."""
    logs = invocations * LOG_BYTES_PER_INVOCATION / 1e9 * prices.cloudwatch.logs_ingested_per_gb
    traced = len(deployment().functions) + 3  # the billed functions, WriteGroupTable, Ingest and the workflow
    traces = traces_recorded(invocations + executions, traced)
    return logs + traces * prices.xray.traces_recorded_per_million / 1e6


@dataclass(frozen=True)
class LambdaMonth:
    """The Lambda lane's month by part."""

    compute: float  # the functions' seconds and requests, and their cold starts
    orchestration: float  # Step Functions
    queues_and_storage: float  # SQS, S3 requests, the claims
    observability: float = 0.0  # CloudWatch Logs' ingestion, X-Ray's traces

    @property
    def total(self) -> float:
        return self.compute + self.orchestration + self.queues_and_storage + self.observability


def lambda_month_parts(
    bench: BenchSeconds,
    prices: Prices,
    scenario: Scenario,
    snapstart: bool = False,
    per_execution: float | None = None,
) -> LambdaMonth:
    """Lambda, Step Functions (Express children), SQS, S3 and the claims for a month of ``scenario``'s images, by
    part: as the template deploys the functions, or with SnapStart on (EnableSnapStart=true). ``per_execution``:
    the images of one execution (one message's); None: dropped images, each claimed, as Ingest's batching window
    gathers them."""
    deployed, images = deployment(), scenario.images_per_month
    dropped = per_execution is None
    per_execution = dropped_images_per_execution(scenario) if per_execution is None else per_execution
    # a group is the execution's images, ImagesPerGroup at most: a trickle's execution of one image is one group
    per_group = min(float(deployed.images_per_group), per_execution)
    # + WriteGroupTable, Ingest, SummarizeBatch
    invocations = len(deployed.functions) + 1 / per_group + 2 / per_execution
    requests = images * invocations * prices.lambda_.per_million_requests / 1e6
    compute = images * lambda_compute_per_image(bench, prices, per_execution)
    s3_requests = images * lambda_s3_per_image(prices)
    s3_requests += images / per_group * S3_PUTS_PER_GROUP * prices.s3.put_per_1000 / 1000  # each group's table files
    claims = images * CLAIM_WRITES_PER_IMAGE * prices.dynamodb.write_per_million / 1e6 if dropped else 0.0
    return LambdaMonth(
        compute=compute + requests + _cold_starts(bench, prices, scenario, snapstart),
        orchestration=images * orchestration_per_image(bench, prices, per_execution=per_execution),
        queues_and_storage=images * SQS_REQUESTS_PER_IMAGE * prices.sqs.per_million_requests / 1e6
        + s3_requests
        + claims,
        observability=observability_month(images * invocations, images / per_execution, prices),
    )


def fargate_month(bench: BenchSeconds, prices: Prices, scenario: Scenario, vcpus: int = 2, memory_gb: int = 8) -> float:
    """Always-on Fargate tasks sized for the scenario's peak day (at least one), running the whole pipeline, each with
    its public IPv4 address, and the S3 requests of its results (as the bulk worker makes them: every option writes
    the same results)."""
    per_task_per_day = 86_400 / bench.one_process_s
    tasks = max(1, math.ceil(scenario.peak_images_per_day / per_task_per_day))
    hourly = prices.fargate.hourly(vcpus, memory_gb) + prices.vpc.public_ipv4_hour
    return tasks * hourly * HOURS_PER_MONTH + _bulk_s3_requests(scenario.images_per_month, prices)


def lambda_s3_per_image(prices: Prices) -> float:
    """An image's S3 requests in the Lambda lane (its group's files apart), in dollars, pictures stored as the
    template deploys them (StorePictures)."""
    stored = deployment().stores_pictures
    gets = S3_GETS_PER_IMAGE + stored * PICTURE_GETS_LAMBDA
    return (gets * prices.s3.get_per_1000 + (S3_PUTS_PER_IMAGE + stored * PICTURE_PUTS) * prices.s3.put_per_1000) / 1000


def _bulk_s3_requests(images: int, prices: Prices) -> float:
    s3, groups = prices.s3, math.ceil(images / deployment().parameter("BulkImagesPerGroup"))
    stored = deployment().stores_pictures
    per_image = (
        BULK_S3_GETS_PER_IMAGE * s3.get_per_1000 + (BULK_S3_PUTS_PER_IMAGE + stored * PICTURE_PUTS) * s3.put_per_1000
    )
    return (images * per_image + groups * S3_PUTS_PER_GROUP * s3.put_per_1000) / 1000


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


def athena_query(images: int, prices: Prices) -> float:
    """One Athena query reading every row of ``images`` images (Athena bills 10 MB at least)."""
    scanned = max(images * ATHENA_BYTES_PER_IMAGE, prices.athena.minimum_mb_per_query * 1e6)
    return scanned / 1e12 * prices.athena.per_tb_scanned


def bulk_jobs(images: int) -> tuple[int, int]:
    """(jobs, images per job) for a batch of ``images`` as ingest plans it at the template's defaults."""
    from shared.pipeline.batches import groups_per_bulk_job
    from shared.settings import Settings

    deployed = deployment()
    per_group = deployed.parameter("BulkImagesPerGroup")
    settings = Settings(
        bulk_images_per_group=per_group,
        bulk_concurrency=deployed.parameter("BulkConcurrency"),
        groups_per_bulk_job=deployed.parameter("GroupsPerBulkJob"),
    ).ingest
    groups = math.ceil(images / per_group)
    per_job = groups_per_bulk_job(groups, settings)
    return math.ceil(groups / per_job), per_job * per_group


def bulk_model_load_s(bench: BenchSeconds) -> float:
    """A bulk task's model load, measured: it starts on empty storage, with no compiled cache, so Detect compiles
    each size its images need (every size, at most, as ``annotate bench`` measured it) where a warm machine's
    cold start loads one from the cache."""
    detect = bench.steps["detect"]
    all_sizes = detect.cold_start_s if detect.cold_start_all_sizes_s is None else detect.cold_start_all_sizes_s
    return all_sizes + sum(bench.steps[step].cold_start_s for step in MODEL_STEPS if step != "detect")


def bulk_task_start_s(bench: BenchSeconds) -> float:
    return TASK_START_S + bulk_model_load_s(bench)


def bulk_task_hours(images: int, bench: BenchSeconds, bulk: BulkSeconds, jobs: int | None = None) -> float:
    """The bulk lane's task hours for ``images`` in ``jobs`` tasks (as ingest plans them unless given): each task's
    start and model load, a minute at least (Fargate's least billed), and its images at the worker's seconds."""
    jobs = bulk_jobs(images)[0] if jobs is None else jobs
    return (jobs * max(60.0, bulk_task_start_s(bench)) + images * bulk.worker_s) / 3600


def bulk_lane(
    images: int,
    bench: BenchSeconds,
    bulk: BulkSeconds,
    prices: Prices,
    spot: bool = True,
    jobs: int | None = None,
) -> LaneEstimate:
    """The bulk lane: each task's start and model load (measured by annotate bench), then its images at the worker's
    seconds (measured by annotate bench-bulk on this machine's cores, as many as a task's vCPUs), on Fargate Spot or
    on-demand at the template's task size; in ``jobs`` tasks if given (a gathered batch's), else as ingest plans."""
    deployed = deployment()
    if jobs is None:
        jobs, per_job = bulk_jobs(images)
    else:
        per_job = math.ceil(images / jobs)
    concurrency = deployed.parameter("BulkConcurrency")
    hourly = (prices.fargate_spot if spot else prices.fargate).hourly(deployed.bulk_vcpus, deployed.bulk_memory_gb)
    task_hours = bulk_task_hours(images, bench, bulk, jobs)
    transitions = len(STATES_PER_BULK_BATCH) + jobs * TRANSITIONS_PER_BULK_JOB
    return LaneEstimate(
        lane="bulk, Fargate Spot" if spot else "bulk, Fargate on-demand",
        images=images,
        parts={
            "compute": task_hours * hourly,
            "public IPv4": task_hours * prices.vpc.public_ipv4_hour,
            "S3 requests": _bulk_s3_requests(images, prices),
            "orchestration": transitions * prices.step_functions.standard_per_1000_transitions / 1000,
            "Athena": athena_query(images, prices),
        },
        wall_s=math.ceil(jobs / concurrency) * (bulk_task_start_s(bench) + per_job * bulk.worker_s),
        limited_by=(
            f"Fargate {'Spot ' if spot else ''}vCPUs: {min(jobs, concurrency)} tasks x {deployed.bulk_vcpus:g} "
            "(BulkConcurrency; the account's vCPU quota must allow them)"
        ),
    )


def lambda_lane(images: int, bench: BenchSeconds, prices: Prices) -> LaneEstimate:
    """The Lambda lane as deployed: ``GroupConcurrency`` groups of ``ImagesPerGroup`` images at once, each image at
    the pipeline's seconds; every environment those need starts cold once."""
    deployed, s3 = deployment(), prices.s3
    in_flight = deployed.parameter("GroupConcurrency") * deployed.images_per_group
    scenario = Scenario(f"{images} images", images, images, min(1.0, in_flight / images))
    month = lambda_month_parts(bench, prices, scenario, per_execution=images)
    requests = images * lambda_s3_per_image(prices)
    group_files = math.ceil(images / deployed.images_per_group) * S3_PUTS_PER_GROUP * s3.put_per_1000 / 1000
    return LaneEstimate(
        lane="lambda",
        images=images,
        parts={
            "compute": month.compute,
            "public IPv4": 0.0,  # Lambda's functions run outside the stack's VPC
            "S3 requests": requests + group_files,
            "orchestration": month.orchestration + month.queues_and_storage - requests,
            "Athena": athena_query(images, prices),
        },
        wall_s=math.ceil(images / in_flight) * bench.one_process_s,
        limited_by=f"Lambda concurrency: {in_flight} images at once (GroupConcurrency x ImagesPerGroup)",
    )
