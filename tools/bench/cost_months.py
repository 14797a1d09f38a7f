"""A month of each scenario per option: the Lambda lane as deployed and with SnapStart, an always-on Fargate task,
Rekognition, and the latency dial (dropped images gathered every N minutes, each batch in the lane the deployed rule
picks), with the stack's CloudWatch."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel

from shared.pipeline.batches import LaneChoice
from shared.settings import IngestSettings
from tools.bench.cost_inputs import SCENARIOS, BenchSeconds, BulkSeconds, Prices, Scenario, deployment
from tools.bench.cost_lanes import (
    CLAIM_WRITES_PER_IMAGE,
    LaneEstimate,
    bulk_lane,
    bulk_task_start_s,
    fargate_month,
    lambda_compute_per_image,
    lambda_lane,
    lambda_month_parts,
)

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


def monitoring_month(prices: Prices, scenario: Scenario, overrides: dict[str, str] | None = None) -> float:
    """The stack's alarms and dashboards for a month, and its custom metrics for the days images come."""
    deployed, watch = deployment(), prices.cloudwatch
    standing = deployed.alarm_metrics(overrides) * watch.alarm_per_month
    standing += deployed.deployed_count("AWS::CloudWatch::Dashboard", overrides) * watch.dashboard_per_month
    return standing + len(CUSTOM_METRICS) * watch.custom_metric_per_month * min(1.0, scenario.active_days / 30)


def lambda_month(bench: BenchSeconds, prices: Prices, scenario: Scenario, snapstart: bool = False) -> float:
    """Lambda + Step Functions + SQS + S3 + the claims for a month of ``scenario``'s dropped images, and the stack's
    CloudWatch (its alarms, dashboard and custom metrics)."""
    return lambda_month_parts(bench, prices, scenario, snapstart).total + monitoring_month(prices, scenario)


def orchestration_share(bench: BenchSeconds, prices: Prices, scenario: Scenario) -> float:
    """Step Functions' share of the Lambda option's cost per image (as deployed)."""
    month = lambda_month_parts(bench, prices, scenario)
    return month.orchestration / month.total


def rekognition_month(prices: Prices, scenario: Scenario) -> float:
    rekognition = prices.rekognition
    per_1000 = rekognition.detect_labels_per_1000 + rekognition.image_properties_per_1000
    return scenario.images_per_month / 1000 * per_1000


# The latency dial (MaxWaitMinutes): the settings each priced, and the gatherer's own work, estimated (not measured
# here): a look a minute reads the queue's size and the clock, about 0.2 s; each image gathered adds about 0.01 s of
# receiving and claiming. Per image besides: its event sent to the queue, received and deleted (by tens), and its
# claim written; per look, the queue's attributes, the clock read, and (when gathering) written.
DIALS_MINUTES = (15, 60)
GATHER_LOOK_S, GATHER_PER_IMAGE_S = 0.2, 0.01
LOOKS_PER_MONTH = 30 * 24 * 60
GATHER_SQS_REQUESTS_PER_IMAGE = 1 + 2 / 10


def gathered_settings(
    bench: BenchSeconds, bulk: BulkSeconds, minutes: int, bulk_enabled: bool = True
) -> IngestSettings:
    """The stack's ingest settings by default, with the dial at ``minutes`` (and the bulk lane, EnableBulk, as
    given) and the rule's figures measured: a bulk task's start (estimated) and model load (annotate bench), its
    seconds an image (annotate bench-bulk)."""
    from shared.settings import Settings

    deployed = deployment()
    return Settings(
        max_wait_minutes=minutes,
        bulk_enabled=bulk_enabled,
        bulk_task_start_s=bulk_task_start_s(bench),
        bulk_seconds_per_image=bulk.worker_s,
        bulk_images_per_group=deployed.parameter("BulkImagesPerGroup"),
        bulk_concurrency=deployed.parameter("BulkConcurrency"),
        fargate_vcpus=deployed.parameter("FargateVcpus"),
        bulk_task_cpu=deployed.parameter("BulkCpu"),
    ).ingest


def gathered_bulk_from_images(bench: BenchSeconds, bulk: BulkSeconds, prices: Prices) -> int:
    """The fewest gathered images whose one bulk task (its start, model load and images, on Spot) costs less than
    Lambda's warm seconds for them: where the rule starts taking the bulk lane (``gathered_bulk_from_images``)."""
    deployed = deployment()
    hourly = prices.fargate_spot.hourly(deployed.bulk_vcpus, deployed.bulk_memory_gb) + prices.vpc.public_ipv4_hour
    start_s = max(60.0, bulk_task_start_s(bench))  # Fargate bills a minute at least
    on_lambda = lambda_compute_per_image(bench, prices)
    return next(n for n in range(1, 10_000) if (start_s + n * bulk.worker_s) * hourly / 3600 < n * on_lambda)


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
    bench: BenchSeconds,
    bulk: BulkSeconds,
    prices: Prices,
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
    gb_second, memory_gb = prices.lambda_.x86_gb_second, deployment().gather_memory_gb
    requests_per_look = (
        prices.lambda_.per_million_requests
        + prices.eventbridge.per_million_events
        + prices.sqs.per_million_requests
        + prices.dynamodb.read_per_million
    )
    per_look = GATHER_LOOK_S * memory_gb * gb_second + requests_per_look / 1e6
    requests_per_image = (
        GATHER_SQS_REQUESTS_PER_IMAGE * prices.sqs.per_million_requests
        + CLAIM_WRITES_PER_IMAGE * prices.dynamodb.write_per_million
    )
    per_image = GATHER_PER_IMAGE_S * memory_gb * gb_second + requests_per_image / 1e6
    clock_writes = batches * prices.dynamodb.write_per_million / 1e6
    gathering = LOOKS_PER_MONTH * per_look + images * per_image + clock_writes
    overrides = {"MaxWaitMinutes": str(minutes), "EnableBulk": "true" if bulk_enabled else "false"}
    monitoring = monitoring_month(prices, scenario, overrides)
    return GatheredMonth(minutes, per_batch, batches, choice, lane, gathering, monitoring)


class CostRow(BaseModel):
    """One scenario's month in one option: a row of cost.json and of the report's first table."""

    scenario: str
    option: str
    monthly_usd: float
    per_1000_images_usd: float | None


def cost_table(bench: BenchSeconds, prices: Prices, bulk: BulkSeconds | None = None) -> list[CostRow]:
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
            assert bulk is not None
            with_bulk = gathered_month(bench, bulk, prices, scenario, minutes)
            options[f"gathered, {minutes} min (MaxWaitMinutes={minutes} EnableBulk=true)"] = with_bulk.total
            if minutes == DIALS_MINUTES[0]:  # the dial without the bulk lane (the template's EnableBulk default)
                on_lambda = gathered_month(bench, bulk, prices, scenario, minutes, bulk_enabled=False)
                options[f"gathered, {minutes} min, no bulk lane (MaxWaitMinutes={minutes})"] = on_lambda.total
        for option, monthly in options.items():
            per_1000 = monthly / scenario.images_per_month * 1000 if scenario.images_per_month else None
            rows.append(
                CostRow(
                    scenario=scenario.name,
                    option=option,
                    monthly_usd=round(monthly, 2),
                    per_1000_images_usd=None if per_1000 is None else round(per_1000, 3),
                )
            )
    return rows
