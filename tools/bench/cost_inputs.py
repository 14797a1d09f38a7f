"""What `annotate cost` prices from, typed and read once: the benches' seconds, the prices, and the stack as
``template.yaml`` deploys it by default.

A bench report holds much more than cost reads; each model here is the part it reads (other fields are ignored),
validated when the report is loaded, so a report of another shape fails there, with its field's name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from pydantic import AliasPath, BaseModel, ConfigDict, Field

from tools.aws.sam_template import by_default, load_template

SECONDS_PER_MONTH = 30 * 24 * 3600
HOURS_PER_MONTH = 30 * 24


class _Read(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


# The seconds annotate bench and its siblings measured (bench/*.json)


class StepSeconds(_Read):
    pipeline_median_s: float
    cold_start_s: float
    cold_start_all_sizes_s: float | None = None  # every size of Detect compiled (a bulk task's start)
    cold_start_compiling_s: float | None = None  # Detect without its compiled cache
    cold_start_without_snapshot_s: float | None = None  # Detect as Lambda starts it (annotate bench-lambda-detect)

    @property
    def cold_start_in_lambda_s(self) -> float:
        """A Lambda environment without a snapshot: it has no compiled cache, so Detect reads its export and compiles
        its first image's size (measured as Lambda runs it where annotate bench-lambda-detect has run, else from
        disk)."""
        return next(
            seconds
            for seconds in (self.cold_start_without_snapshot_s, self.cold_start_compiling_s, self.cold_start_s)
            if seconds is not None
        )


class CaptionSeconds(_Read):
    caption_median_s: float
    cold_start_s: float
    cold_peak_rss_mb: float


class VisionCaptionSeconds(_Read):
    """annotate bench's caption that sees the image, beside the text-only one."""

    text_only: CaptionSeconds
    vision: CaptionSeconds


class BenchSeconds(_Read):
    """annotate bench's report: each step's seconds and cold start, and the whole image in one process."""

    steps: dict[str, StepSeconds]
    vision_caption: VisionCaptionSeconds | None = None
    # Segment's seconds over the whole image's, measured side by side in one run
    masks_added: float | None = Field(None, validation_alias=AliasPath("whole_image", "masks_added"))
    one_process_s: float = Field(validation_alias=AliasPath("whole_image", "pipeline_s"))
    write_result_s: float = 0.3  # drawing and writing one result, where bench-photo did not measure it
    measured_at_size: str | None = None  # set when the seconds are a photo's (tools/bench/photo.at_photo_size)

    def with_step(self, step: str, **seconds: float) -> BenchSeconds:
        steps = {**self.steps, step: self.steps[step].model_copy(update=seconds)}
        return self.model_copy(update={"steps": steps})


class BulkSeconds(_Read):
    """annotate bench-bulk's report: the worker's seconds an image, on how many cores, when."""

    worker_s: float = Field(validation_alias=AliasPath("seconds_per_image", "worker"))
    cores: int
    measured_at: str
    added_by_photo_s: float | None = None  # set when priced at a photo's seconds


ReportT = TypeVar("ReportT", bound=_Read)


class LambdaDetectAnswers(_Read):
    first_answer_s: float
    warm_answer_s: float


class LambdaDetectSeconds(_Read):
    """annotate bench-lambda-detect's report: Detect's first and warm answers, per runtime, as Lambda runs it."""

    runtimes: dict[str, LambdaDetectAnswers]


class ApiRuntimeSeconds(_Read):
    server_peak_rss_mb: float
    http_s: float = Field(validation_alias=AliasPath("medians_s", "http"))
    http_with_caption_s: float = Field(validation_alias=AliasPath("medians_s", "http_with_caption"))


class ApiSeconds(_Read):
    """annotate bench-api's report, per runtime."""

    runtimes: dict[str, ApiRuntimeSeconds]


def read_report(kind: type[ReportT], path: Path) -> ReportT:
    return kind.model_validate(json.loads(path.read_text()))


# The prices (tools/bench/data/aws_prices.json), each service's as it is billed


class LambdaPrices(_Read):
    x86_gb_second: float
    arm64_gb_second: float
    per_million_requests: float
    snapstart_cache_gb_second: float
    snapstart_restore_per_gb: float


class StepFunctionsPrices(_Read):
    standard_per_1000_transitions: float
    express_per_million_requests: float
    express_gb_second: float


class FargatePrices(_Read):
    x86_vcpu_hour: float
    x86_gb_hour: float
    arm64_vcpu_hour: float | None = None  # Linux/ARM (Graviton), where the price list gives it
    arm64_gb_hour: float | None = None
    date: str = ""
    source: str = ""

    def hourly(self, vcpus: float, memory_gb: float) -> float:
        return vcpus * self.x86_vcpu_hour + memory_gb * self.x86_gb_hour

    def arm64_hourly(self, vcpus: float, memory_gb: float) -> float | None:
        if self.arm64_vcpu_hour is None or self.arm64_gb_hour is None:
            return None
        return vcpus * self.arm64_vcpu_hour + memory_gb * self.arm64_gb_hour


class SqsPrices(_Read):
    per_million_requests: float


class S3Prices(_Read):
    put_per_1000: float
    get_per_1000: float
    standard_gb_month: float


class AthenaPrices(_Read):
    per_tb_scanned: float
    minimum_mb_per_query: float


class RekognitionPrices(_Read):
    detect_labels_per_1000: float
    image_properties_per_1000: float


class DynamoDbPrices(_Read):
    write_per_million: float
    read_per_million: float


class EventBridgePrices(_Read):
    per_million_events: float


class VpcPrices(_Read):
    public_ipv4_hour: float
    nat_gateway_hour: float
    nat_gateway_per_gb: float
    interface_endpoint_hour: float


class CloudWatchPrices(_Read):
    alarm_per_month: float  # per metric an alarm reads
    dashboard_per_month: float
    custom_metric_per_month: float
    logs_ingested_per_gb: float


class XRayPrices(_Read):
    traces_recorded_per_million: float


class Prices(_Read):
    date: str
    region: str
    source: str
    lambda_: LambdaPrices = Field(alias="lambda")
    step_functions: StepFunctionsPrices
    fargate: FargatePrices
    fargate_spot: FargatePrices
    sqs: SqsPrices
    s3: S3Prices
    athena: AthenaPrices
    rekognition: RekognitionPrices
    dynamodb: DynamoDbPrices
    eventbridge: EventBridgePrices
    vpc: VpcPrices
    cloudwatch: CloudWatchPrices
    xray: XRayPrices


def load_prices(path: Path | None = None) -> Prices:
    text = path.read_text() if path else resources.files("tools.bench").joinpath("data/aws_prices.json").read_text()
    return Prices.model_validate(json.loads(text))


# The stack as template.yaml deploys it by default

# The functions every image passes through (logical ids in template.yaml) and the bench step whose seconds each bills.
BILLED_FUNCTIONS = {
    "DetectFunction": "detect",
    "ClassifyFunction": "classify",
    "TagFunction": "tag",
    "CaptionFunction": "caption",
    "WriteResultFunction": None,
}


@dataclass(frozen=True)
class BilledFunction:
    """A function as ``template.yaml`` deploys it by default, and the bench step whose seconds it bills."""

    memory_mb: int
    step: str | None  # None: WriteResult, billed at its own seconds
    arm64: bool
    snapstart: bool

    @property
    def gb(self) -> float:
        return self.memory_mb / 1024

    def gb_second_price(self, prices: Prices) -> float:
        return prices.lambda_.arm64_gb_second if self.arm64 else prices.lambda_.x86_gb_second

    def seconds(self, bench: BenchSeconds) -> float:
        return bench.steps[self.step].pipeline_median_s if self.step else bench.write_result_s


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


@dataclass(frozen=True)
class Deployment:
    """What the prices depend on in ``template.yaml``, each at its default."""

    template: dict[str, Any]
    functions: dict[str, BilledFunction]
    functions_with_snapstart: dict[str, BilledFunction]  # EnableSnapStart=true
    detect_runtime: str  # the Detect function's ANNOTATE_DETECTOR_RUNTIME
    dropped_batch_size: int  # Ingest's event source: its BatchSize ...
    batching_window_s: int  # ... its MaximumBatchingWindowInSeconds ...
    dropped_pollers: int  # ... and its ScalingConfig's MaximumConcurrency
    gather_memory_gb: float
    api_memory_mb: int
    segment_memory_gb: float  # Segment's function: billed where a request asks for masks

    def parameter(self, name: str) -> int:
        return int(self.template["Parameters"][name]["Default"])

    @property
    def stores_pictures(self) -> bool:
        """Whether WriteResult and the bulk task store each image's annotated picture (StorePictures)."""
        return str(self.template["Parameters"]["StorePictures"]["Default"]) == "true"

    @property
    def images_per_group(self) -> int:
        """How many images one child workflow (one Express execution) takes."""
        return self.parameter("ImagesPerGroup")

    @property
    def bulk_vcpus(self) -> float:
        return self.parameter("BulkCpu") / 1024

    @property
    def bulk_memory_gb(self) -> float:
        return self.parameter("BulkMemory") / 1024

    def alarm_metrics(self, overrides: dict[str, str] | None = None) -> int:
        """The metrics the deployed alarms read: one each, or each of a metric math alarm's (CloudWatch bills an
        alarm per metric it evaluates: "$0.10 per alarm metric", Amazon CloudWatch pricing)."""
        return sum(
            sum(1 for metric in resource["Properties"].get("Metrics", []) if "MetricStat" in metric) or 1
            for resource in self.template["Resources"].values()
            if resource["Type"] == "AWS::CloudWatch::Alarm" and self._deployed(resource, overrides)
        )

    def _deployed(self, resource: dict[str, Any], overrides: dict[str, str] | None) -> bool:
        return "Condition" not in resource or bool(
            by_default(self.template, {"Fn::If": [resource["Condition"], True, False]}, overrides)
        )

    def deployed_count(self, resource_type: str, overrides: dict[str, str] | None = None) -> int:
        """How many resources of the type a deployment with ``overrides`` creates (each whose Condition holds)."""
        return sum(
            1
            for resource in self.template["Resources"].values()
            if resource["Type"] == resource_type
            and (
                "Condition" not in resource
                or by_default(self.template, {"Fn::If": [resource["Condition"], True, False]}, overrides)
            )
        )


@cache
def deployment() -> Deployment:
    template = load_template()
    resources_ = template["Resources"]
    dropped = resources_["IngestFunction"]["Properties"]["Events"]["DroppedImages"]["Properties"]
    detect_variables = resources_["DetectFunction"]["Properties"]["Environment"]["Variables"]
    return Deployment(
        template=template,
        functions=billed_functions(template),
        functions_with_snapstart=billed_functions(template, {"EnableSnapStart": "true"}),
        detect_runtime=by_default(template, detect_variables["ANNOTATE_DETECTOR_RUNTIME"]),
        dropped_batch_size=int(dropped["BatchSize"]),
        batching_window_s=int(dropped["MaximumBatchingWindowInSeconds"]),
        dropped_pollers=int(dropped["ScalingConfig"]["MaximumConcurrency"]),
        gather_memory_gb=int(resources_["GatherFunction"]["Properties"]["MemorySize"]) / 1024,
        api_memory_mb=int(by_default(template, resources_["ApiFunction"]["Properties"]["MemorySize"])),
        segment_memory_gb=int(by_default(template, resources_["SegmentFunction"]["Properties"]["MemorySize"])) / 1024,
    )


@dataclass(frozen=True)
class Scenario:
    name: str
    images_per_month: int
    peak_images_per_day: int
    cold_start_fraction: float

    @property
    def active_days(self) -> float:
        return self.images_per_month / self.peak_images_per_day if self.peak_images_per_day else 0.0


# The original study's: idle; 17,000 images a day, every day; bursts of 25,000 images a day on 10 days a month.
SCENARIOS = (
    Scenario("idle", 0, 0, 0.0),
    Scenario("steady: 17,000 a day", 17_000 * 30, 17_000, 0.10),
    Scenario("bursts: 25,000 a day on 10 days", 25_000 * 10, 25_000, 0.25),
)
