"""Typed boundaries: the prompt message, the batch manifest, each workflow state's input and output, results.

Field names here are the names the ASL uses (``state_machine/pipeline.asl.json``); a test keeps them in step.
Boxes are in pixels of the image as a viewer shows it (EXIF orientation applied): x0, y0 top-left, x1, y1
bottom-right.

One piece: every typed boundary in one file, so what crosses a boundary is read, and checked against the ASL, in
one place; split, the messages, the workflow's states and the results would import one another.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_PROMPT_CHARS = 512
MAX_PHRASES = 32
MAX_PHRASE_CHARS = 64
MAX_IMAGES_PER_MESSAGE = 10_000
MAX_ATTRIBUTES = 8
MAX_ATTRIBUTE_VALUES = 32
MAX_VALUE_CHARS = 40
MAX_TOP_K = 10
MAX_SEARCH_TEXT_CHARS = 1000  # a text embedded to search by (annotate search, /v1/search, /v1/embeddings)
DEFAULT_ATTRIBUTES: dict[str, list[str]] = {
    "color": ["black", "white", "gray", "brown", "beige", "red", "orange", "yellow", "green", "blue", "purple", "pink"],
    "pattern": ["solid", "striped", "spotted", "plaid", "checkered", "floral", "patchy"],
}
_ATTRIBUTE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# The names the exports give their own fields beside a box's attributes: COCO's attribute "class" (the classifier's),
# Label Studio's controls "image", "label", "class" and "caption". A vocabulary of the same name would overwrite one.
RESERVED_ATTRIBUTE_NAMES = frozenset({"image", "label", "class", "caption"})
_PHRASE_SEPARATOR = re.compile(r"\s*\.\s*")
_PRINTABLE_TEXT = re.compile(r"^[^\x00-\x1f\x7f]*$")


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


Score = Annotated[float, Field(ge=0.0, le=1.0)]


def phrase_of(label: str) -> str:
    """The phrase the detector looks for to find ``label`` (and the one its boxes come back as): lower case, single
    spaces, and no period, which separates a prompt's phrases ('St. Bernard' -> 'st bernard')."""
    return " ".join(label.lower().replace(".", " ").split())


def split_phrases(prompt: str) -> list[str]:
    """'dog. cat. hamster.' -> ['dog', 'cat', 'hamster'] (lower-cased, blanks and duplicates dropped)."""
    phrases: list[str] = []
    for phrase in _PHRASE_SEPARATOR.split(prompt.strip().lower()):
        phrase = " ".join(phrase.split())
        if phrase and phrase not in phrases:
            phrases.append(phrase)
    return phrases


MAX_VARIANTS = 4
MAX_VARIANT_STEPS = 50
MAX_VARIANT_SIZE = 768
MAX_VARIANT_PROMPT_CHARS = 300
# The image task, this request inside, is the Variants container's job in its Batch job's container overrides
# (SubmitJob's payload: at most 30 KiB, AWS Batch service quotas), which Batch passes on to the ECS task it runs
# the job as: "A total of 8192 characters are allowed for overrides. This limit includes the JSON formatting
# characters of the override structure" (ECS API reference, TaskOverride). The workflow passes it through
# States.JsonToString, so it arrives as a JSON string inside that JSON, every quote escaped: the request is measured
# as that, leaving room for the source key and the results root (up to 1,024 characters each, escaped) and the
# override's own structure.
MAX_VARIANTS_REQUEST_CHARS = 6_000


class VariantsRequest(Frozen):
    """Generated variants of each image: img2img from the image (or txt2img), all bounded before a model loads."""

    prompt: str = Field(min_length=1, max_length=MAX_VARIANT_PROMPT_CHARS, description="What the variants show")
    negative_prompt: str = Field("", max_length=MAX_VARIANT_PROMPT_CHARS)
    count: int = Field(1, ge=1, le=MAX_VARIANTS, description="Variants per image")
    mode: Literal["img2img", "txt2img"] = Field("img2img", description="From the image, or from the prompt alone")
    strength: float = Field(0.6, ge=0.05, le=1.0, description="img2img: how far from the image")
    steps: int = Field(2, ge=1, le=MAX_VARIANT_STEPS, description="Sampling steps (distilled models need 1-4)")
    cfg_scale: float = Field(1.0, ge=0.0, le=20.0, description="Classifier-free guidance (1 = off)")
    size: int = Field(512, description=f"Width and height in pixels: a multiple of 64, 128 to {MAX_VARIANT_SIZE}")
    seed: int | None = Field(None, ge=0, lt=2**31, description="Seed of the first variant; default from the image")

    @field_validator("size")
    @classmethod
    def _bounded_size(cls, size: int) -> int:
        if not 128 <= size <= MAX_VARIANT_SIZE:
            raise ValueError(f"{size} px is outside 128 to {MAX_VARIANT_SIZE} px")
        if size % 64:
            raise ValueError(f"{size} px is not a multiple of 64")
        return size

    @field_validator("prompt", "negative_prompt")
    @classmethod
    def _printable(cls, text: str) -> str:
        if not _PRINTABLE_TEXT.match(text):
            raise ValueError("contains control characters")
        return text


def _check_attribute_name(name: str) -> None:
    if not _ATTRIBUTE_NAME.match(name):
        raise ValueError(f"attribute name {name[:40]!r} must be lower-case letters, digits or _ (<= 32)")
    if name in RESERVED_ATTRIBUTE_NAMES:
        raise ValueError(
            f"attribute name {name!r} is one the exports use for their own fields "
            f"({', '.join(sorted(RESERVED_ATTRIBUTE_NAMES))}): name the vocabulary otherwise"
        )


class AnnotationRequest(Frozen):
    """What to look for in every image of a batch, and how."""

    prompt: str = Field(description="Phrases to detect, separated by periods: 'dog. cat. hamster.'")
    box_threshold: Score = Field(0.35, description="Lowest box score kept")
    text_threshold: Score = Field(0.25, description="Lowest phrase score for a box to take that phrase")
    attributes: dict[str, list[str]] = Field(
        default_factory=lambda: {name: list(values) for name, values in DEFAULT_ATTRIBUTES.items()},
        description="Attribute vocabularies to tag each box with, e.g. {'color': ['red', 'green']}; {}: none",
    )
    top_k: int = Field(3, ge=1, le=MAX_TOP_K, description="How many classes to keep per box")
    caption: bool = Field(True, description="Write a caption with the LLM")
    caption_format: Literal["text", "json"] = Field(
        "text", description="json: the LLM is constrained to {'caption': str, 'tags': [str]}"
    )
    variants: VariantsRequest | None = Field(None, description="Generate variants of each image (on Fargate)")
    embeddings: Literal["image", "boxes", "none"] = Field(
        "image",
        description="image: keep the whole image's CLIP embedding (the Tag model's), a row of the embeddings table that"
        " annotate search and annotate duplicates read; boxes: that and each box's crop embedding (the one its tags"
        " were scored with), a row each of the box_embeddings table; none: not computed",
    )
    masks: bool = Field(
        False,
        description="Segment each box: a mask (COCO run-length encoding) per detection, a row each of the masks table",
    )
    job_id: str | None = Field(
        None, pattern=r"^[A-Za-z0-9._:/-]{1,128}$", description="The sender's name for this work; every row keeps it"
    )

    @field_validator("prompt")
    @classmethod
    def _bounded_prompt(cls, prompt: str) -> str:
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ValueError(f"prompt is {len(prompt)} characters; at most {MAX_PROMPT_CHARS} are accepted")
        if not _PRINTABLE_TEXT.match(prompt):
            raise ValueError("prompt contains control characters")
        phrases = split_phrases(prompt)
        if not phrases:
            raise ValueError("prompt names nothing to detect; write phrases separated by periods: 'dog. cat.'")
        if len(phrases) > MAX_PHRASES:
            raise ValueError(f"prompt has {len(phrases)} phrases; at most {MAX_PHRASES} are accepted")
        too_long = [p for p in phrases if len(p) > MAX_PHRASE_CHARS]
        if too_long:
            raise ValueError(f"phrase {too_long[0][:20]!r}... is over {MAX_PHRASE_CHARS} characters")
        return prompt

    @field_validator("attributes")
    @classmethod
    def _bounded_vocabularies(cls, attributes: dict[str, list[str]]) -> dict[str, list[str]]:
        if len(attributes) > MAX_ATTRIBUTES:
            raise ValueError(f"{len(attributes)} attributes; at most {MAX_ATTRIBUTES} are accepted")
        for name, values in attributes.items():
            _check_attribute_name(name)
            if not values:
                raise ValueError(f"attribute {name!r} has an empty vocabulary")
            if len(values) > MAX_ATTRIBUTE_VALUES:
                raise ValueError(f"attribute {name!r} has {len(values)} values; at most {MAX_ATTRIBUTE_VALUES}")
            for value in values:
                if not value.strip() or len(value) > MAX_VALUE_CHARS or not _PRINTABLE_TEXT.match(value):
                    raise ValueError(
                        f"attribute {name!r}: value {value[:20]!r} must be 1-{MAX_VALUE_CHARS} printable characters"
                    )
            if len(set(values)) != len(values):
                raise ValueError(f"attribute {name!r} repeats a value")
        return attributes

    @model_validator(mode="after")
    def _variants_job_fits_ecs(self) -> AnnotationRequest:
        if self.variants is None:
            return self
        size = len(json.dumps(self.model_dump_json(include=set(AnnotationRequest.model_fields))))
        if size > MAX_VARIANTS_REQUEST_CHARS:
            raise ValueError(
                f"with variants, the request is {size} characters as ECS receives it (escaped); at most "
                f"{MAX_VARIANTS_REQUEST_CHARS} fit the Variants task's job (ECS passes it in 8 KiB): use fewer or "
                "shorter attribute values"
            )
        return self

    @property
    def phrases(self) -> list[str]:
        return split_phrases(self.prompt)


# Where a batch's images run: one Lambda invocation per step and image, or many images per Fargate (Spot) task.
Lane = Literal["lambda", "bulk"]


class PromptMessage(AnnotationRequest):
    """The SQS message (or `annotate send` file): images to annotate and the request for all of them.

    ``images`` holds S3 URIs (``s3://bucket/key.jpg``), S3 prefixes (``s3://bucket/folder/``) or local paths
    (files or folders; local mode only).
    """

    images: list[str] = Field(min_length=1, max_length=MAX_IMAGES_PER_MESSAGE)
    # Not part of the request: the same images and request name the same batch, and give the same rows, in either lane.
    lane: Literal["lambda", "bulk", "auto"] = Field(
        "auto", description="lambda, bulk (Fargate Spot tasks), or auto: bulk from bulk_from_images images"
    )

    @field_validator("images")
    @classmethod
    def _non_blank(cls, images: list[str]) -> list[str]:
        if any(not item.strip() for item in images):
            raise ValueError("image locations must not be blank")
        return images

    def request(self) -> AnnotationRequest:
        return AnnotationRequest.model_validate(self.model_dump(exclude={"images", "lane"}))


SHA256_PATTERN = r"^[0-9a-f]{64}$"


class ImageRef(Frozen):
    image_id: str = Field(pattern=r"^[0-9a-f]{16}$", description="Hash of the source location and content")
    source_uri: str


# A Lambda lane group's images run side by side in an inline Map, which runs at most 40 at once; a bulk lane group
# (a run of a task's images and one table write) keeps the same bound
MAX_IMAGES_PER_GROUP = 40
MAX_LISTED_GROUPS = 100
MAX_HAND_BACKS = 10


class ImageGroup(Frozen):
    """A child workflow's share of a batch (in the bulk lane, a run of a task's images): images annotated together
    and written as one table file."""

    group_id: str = Field(pattern=r"^g-\d{6}$")
    images: list[ImageRef] = Field(min_length=1, max_length=MAX_IMAGES_PER_GROUP)


class BatchInput(Frozen):
    """One workflow execution's input. Its images are in its groups manifest (shared/storage/layout.py), a JSON array
    of :class:`ImageGroup` that the Distributed Map reads, so the input stays small however many images there are."""

    batch_id: str = Field(pattern=r"^b-[0-9a-f]{20}$", description="Hash of the inputs' content and request")
    request: AnnotationRequest
    results_uri: str = Field(description="Root under which manifests, results and tables are written")
    planned_at: datetime = Field(description="When ingest planned the batch; its rows' partition day")
    images: int = Field(ge=1, description="How many images the groups hold")
    groups: int = Field(ge=1)
    group_concurrency: int = Field(ge=1, le=10_000, description="Child workflows running at once (MaxConcurrencyPath)")
    lane: Lane = "lambda"
    lane_reason: str = Field("", max_length=512, description="Why this lane (annotate status says it)")
    bulk_jobs: int = Field(0, ge=0, description="Bulk lane: how many jobs the bulk manifest holds")
    bulk_concurrency: int = Field(1, ge=1, le=10_000, description="Bulk lane: Fargate tasks running at once")
    round: int = Field(0, ge=0, le=MAX_HAND_BACKS, description="Which run of the groups: 0, then one per hand-back")
    hand_backs: int = Field(
        0, ge=0, le=MAX_HAND_BACKS, description="Lambda lane: how often groups that could not finish run again"
    )
    hand_back_wait_s: int = Field(60, ge=1, le=3600, description="The wait before the first hand-back's run")
    execution: str = Field("", max_length=80, description="The execution's name (ingest's, from its delivery)")


class GroupTask(Frozen):
    """A child workflow's input: its group and what the whole batch shares (the Distributed Map's ItemSelector)."""

    batch_id: str
    request: AnnotationRequest
    results_uri: str
    planned_at: datetime
    group: ImageGroup


class BulkJobRef(Frozen):
    """An item of the bulk manifest: one Fargate task's job, by where its document is."""

    job_uri: str


class BulkJob(Frozen):
    """A bulk task's share of a batch: what the batch shares, and its groups; a document the task reads, since
    a job's container overrides reach its ECS task, which holds at most 8 KiB of them (a job's groups are tens of
    kilobytes)."""

    batch_id: str
    request: AnnotationRequest
    results_uri: str
    planned_at: datetime
    groups: list[ImageGroup]


class PictureFormat(StrEnum):
    """How the annotated picture is encoded. JPEG by default: a 12 MP photo's PNG takes seconds to encode and about
    20 MB to keep, its JPEG hundredths of a second and a sixth of the bytes (docs/performance.md)."""

    JPEG = "jpeg"
    WEBP = "webp"
    PNG = "png"

    @property
    def media_type(self) -> str:
        return f"image/{self.value}"

    @property
    def suffix(self) -> str:
        return ".jpg" if self is PictureFormat.JPEG else f".{self.value}"

    @classmethod
    def of_uri(cls, uri: str) -> PictureFormat:
        """The format of a picture stored under ``uri`` (its ``suffix``)."""
        return next(kind for kind in cls if uri.endswith(kind.suffix))


class Box(Frozen):
    x0: float
    y0: float
    x1: float
    y1: float

    @model_validator(mode="after")
    def _ordered(self) -> Box:
        if self.x1 < self.x0 or self.y1 < self.y0:
            raise ValueError(f"box corners are out of order: {self}")
        return self

    @property
    def area(self) -> float:
        return (self.x1 - self.x0) * (self.y1 - self.y0)


class ClassScore(Frozen):
    label: str
    score: Score


class AttributeScore(Frozen):
    name: str
    value: str
    score: Score


class Detection(Frozen):
    """One box; the describe steps (Classify, Tag) fill the fields after ``box``."""

    label: str = Field(description="The prompt phrase this box matched")
    score: Score
    box: Box
    class_label: str | None = None
    class_score: Score | None = None
    top_k: list[ClassScore] = Field(default_factory=list)
    attributes: list[AttributeScore] = Field(default_factory=list)
    skipped: str | None = Field(None, description="Why the describe steps skipped this box")


class StepFailure(BaseModel):
    """What a Catch puts at its ResultPath: Step Functions' own field names."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    Error: str
    Cause: str = ""

    @property
    def reason(self) -> str:
        """'ImageRejected: file is empty' from a Lambda error's JSON cause; from a Batch job's (its description,
        as ``submitJob.sync`` fails with it) its status reason and its last attempt's container's; else the raw
        cause."""
        try:
            cause = json.loads(self.Cause)
        except ValueError:
            cause = None
        if isinstance(cause, dict) and "errorMessage" in cause:
            return f"{cause.get('errorType', self.Error)}: {cause['errorMessage']}"
        if isinstance(cause, dict) and ("StatusReason" in cause or "statusReason" in cause):
            attempts = cause.get("Attempts") or cause.get("attempts") or [{}]
            container = attempts[-1].get("Container") or attempts[-1].get("container") or {}
            said = [
                cause.get("StatusReason") or cause.get("statusReason"),
                container.get("Reason") or container.get("reason"),
            ]
            return f"{self.Error}: " + ": ".join(part for part in said if part)
        return f"{self.Error}: {self.Cause}" if self.Cause else self.Error


class ImageTask(Frozen):
    """One image of the batch with what the whole batch shares: the Map iteration's ``task``, which every
    per-image Task receives under that one name."""

    batch_id: str
    request: AnnotationRequest
    image: ImageRef
    results_uri: str


class FailedStep(StrEnum):
    """The keys of an image's ``failures``: each Catch's ResultPath in the ASL is ``$.failures.<one of these>``."""

    DETECT = "detect"
    CLASSIFY = "classify"
    TAG = "tag"
    SEGMENT = "segment"
    DESCRIBE = "describe"  # the Parallel state itself (its branches catch their own failures)
    CAPTION = "caption"
    VARIANTS = "variants"
    WRITE_RESULT = "write_result"
    GROUP = "group"  # the image's group never wrote its rows (its child workflow failed)


class MadeBy(Frozen):
    """Which model made a step's output, and the settings of that step that change it (rows keep both)."""

    model: str = ""
    settings: dict[str, str | int | float | bool | list[str] | list[float] | dict[str, list[str]] | None] = Field(
        default_factory=dict
    )


class DetectOutput(Frozen):
    width: int = Field(gt=0)
    height: int = Field(gt=0)
    content_sha256: str | None = Field(None, pattern=SHA256_PATTERN, description="The sha256 of the image's bytes")
    detections: list[Detection]
    ms: float = Field(ge=0, description="Time this step took for the image, fetch and decode included")
    made_by: MadeBy = Field(default_factory=MadeBy)


class DescribeInput(Frozen):
    """Classify's and Tag's input: the image task and its boxes (none where Tag only embeds the image)."""

    task: ImageTask
    detections: list[Detection]


class BoxClasses(Frozen):
    top_k: list[ClassScore] = Field(default_factory=list)
    skipped: str | None = None


class ClassifyOutput(Frozen):
    classes: list[BoxClasses] = Field(description="One entry per detection, in order")
    ms: float = Field(ge=0, description="Time this step took for the image, fetch and decode included")
    made_by: MadeBy = Field(default_factory=MadeBy)


class BoxAttributes(Frozen):
    attributes: list[AttributeScore] = Field(default_factory=list)
    skipped: str | None = None


def float32_values(values: Iterable[Any]) -> list[float]:
    """A vector's float32 values (numpy's) as floats that print as the shortest decimal of each, which is the float32
    again when read: at most 9 digits where the float64 the value also is prints up to 17, so a vector's JSON is a
    third smaller and its rows the same."""
    return [float(str(value)) for value in values]


class ImageEmbedding(Frozen):
    """The whole image's CLIP image embedding: unit length, float32 values, and the model that made it, by its name
    and its weights' revision (a vector is only comparable with vectors of the same model and revision).

    It travels in the image's state from Tag to WriteResult, within Step Functions' "Maximum input or output size for
    a task, state, or execution: 256 KiB" (Step Functions quotas): a CLIP's 512 to 1,024 values take 6 to 13 kB of it
    (tests/unit/test_contracts.py). The boxes' crop embeddings, up to max_detections of them, would not fit: they
    travel as a document of their own (:class:`BoxEmbeddings`).
    """

    model: str
    revision: str = Field(description="The model's weights' identity: vectors compare within one model and revision")
    vector: list[float]


class BoxEmbeddings(Frozen):
    """Each box's crop embedding (unit length, float32 values), in the detections' order; ``None`` for a box without
    a crop. Tag writes it as a document beside the image's result document, where WriteResult reads it in: three
    hundred boxes' vectors are megabytes, past the state's 256 KiB."""

    model: str
    revision: str
    vectors: list[list[float] | None]


class TagOutput(Frozen):
    tags: list[BoxAttributes] = Field(description="One entry per detection, in order")
    embedding: ImageEmbedding | None = Field(None, description="Set when the request asks for embeddings")
    box_embeddings_uri: str | None = Field(
        None, description="Where the boxes' BoxEmbeddings document is, when the request asks for them"
    )
    ms: float = Field(ge=0, description="Time this step took for the image, fetch and decode included")
    made_by: MadeBy = Field(default_factory=MadeBy)


class BoxMask(Frozen):
    """A box's mask as COCO's compressed run-length encoding (pycocotools' ``counts`` string and the image's size),
    within its box; its area in pixels and the model's predicted IoU as its score."""

    counts: str = Field(description="COCO RLE counts (compressed, as pycocotools writes them)")
    height: int = Field(gt=0)
    width: int = Field(gt=0)
    area: int = Field(ge=0)
    score: Score


class BoxMasks(Frozen):
    """Each box's mask, in the detections' order (``None`` for a box that covers no pixel). Segment writes it as a
    document beside the image's result document, as Tag does the boxes' embeddings: a 12 MP image's masks take
    kilobytes each, and an image may have hundreds of boxes, past the state's 256 KiB."""

    model: str
    revision: str
    masks: list[BoxMask | None]


class SegmentOutput(Frozen):
    masks_uri: str = Field(description="Where the boxes' BoxMasks document is")
    masks: int = Field(ge=0, description="How many boxes got a mask")
    ms: float = Field(ge=0, description="Time this step took for the image, fetch and decode included")
    made_by: MadeBy = Field(default_factory=MadeBy)


class BranchFailure(Frozen):
    """A Parallel branch whose step failed; its Catch turned the error into this output."""

    failure: StepFailure


class DescribeOutput(Frozen):
    """The Describe Parallel state's output, each branch's result selected by name (its ResultSelector)."""

    classify: ClassifyOutput | BranchFailure | None = Field(None, description="None: no box to classify")
    tag: TagOutput | BranchFailure
    segment: SegmentOutput | BranchFailure | None = Field(None, description="None: no mask asked for, or no box")


class CaptionOutput(Frozen):
    """The caption and how it was made: the model, and the speed and memory measured while writing it."""

    caption: str
    tags: list[str] = Field(default_factory=list)
    model: str
    ttft_ms: float = Field(description="Time to first token")
    tokens_per_s: float = Field(description="Speed of the tokens after the first")
    prompt_tokens: int
    completion_tokens: int
    peak_rss_mb: float
    ms: float | None = Field(None, ge=0, description="Time the Caption step took for the image (set by the step)")


class VariantsTaskRun(Frozen):
    """The Variants step's record in the image's state: the Batch job that ran (its logs are the job's)."""

    job_id: str


class Variant(Frozen):
    uri: str
    seed: int
    seconds: float


class VariantsOutput(Frozen):
    """The Variants container's result document, beside the image's result."""

    model: str
    mode: str
    images: list[Variant]
    ms: float = Field(ge=0, description="Time this step took for the image, fetch and decode included")


class ImageState(Frozen):
    """A Map iteration's state: the task, what each step produced, and why the failed ones failed.

    Caption and WriteResult receive it whole; each other Task receives ``task`` (and Classify and Tag the boxes).
    """

    task: ImageTask
    detection: DetectOutput | None = None
    description: DescribeOutput | None = None
    caption: CaptionOutput | None = None
    variants_task: VariantsTaskRun | None = Field(None, description="Set when the Variants task ran for this image")
    failures: dict[FailedStep, StepFailure] = Field(default_factory=dict)


class Status(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class ImageOutcome(Frozen):
    """A Map iteration's output, kept small: the full record is in the result document."""

    image: ImageRef
    status: Status
    error: str | None = None
    result_uri: str | None = None
    write_failure: StepFailure | None = Field(None, description="Set when writing the result itself failed")


class ImageResult(Frozen):
    """Everything known about one input image; one JSON document and one row of the ``images`` table."""

    image_id: str
    source_uri: str
    batch_id: str
    job_id: str | None = None
    status: Status
    error: str | None = None
    failed_step: str | None = None
    width: int | None = None
    height: int | None = None
    content_sha256: str | None = Field(
        None, pattern=SHA256_PATTERN, description="The sha256 of the bytes annotated: the same picture anywhere"
    )
    prompt: str
    detections: list[Detection] = Field(default_factory=list)
    detect_ms: float | None = None
    classify_ms: float | None = None
    tag_ms: float | None = None
    segment_ms: float | None = None
    made_by: dict[str, MadeBy] = Field(
        default_factory=dict,
        description="Per step (detect, classify, tag, segment): its model and output-changing settings",
    )
    caption: CaptionOutput | None = None
    variants: VariantsOutput | None = None
    embedding: ImageEmbedding | None = None
    box_embeddings: BoxEmbeddings | None = None
    masks: BoxMasks | None = None
    annotated_uri: str | None = None
    result_uri: str | None = None
    processed_at: datetime

    def document(self) -> bytes:
        """The result document as WriteResult writes it: indented JSON, for people to read too."""
        return self.model_dump_json(indent=2).encode()


class WriteGroupTableInput(Frozen):
    """WriteGroupTable's input: the group's outcomes, each image's full record being in its result document."""

    batch_id: str
    group_id: str
    request: AnnotationRequest
    results_uri: str
    planned_at: datetime
    outcomes: list[ImageOutcome]


class GroupSummary(Frozen):
    """A child workflow's output, also kept as ``batches/<batch_id>/groups/<group_id>.json``."""

    batch_id: str
    group_id: str
    succeeded: int
    failed: int
    images_table_uri: str
    detections_table_uri: str


class SummarizeInput(BatchInput):
    """The execution's state after the Distributed Map: its input, and the map's error when it failed."""

    map_run: dict[str, Any] | None = Field(None, description="The Map's ResultWriter details")
    error: StepFailure | None = None


class ExecutionStatusDetail(BaseModel):
    """The detail of Step Functions' "Step Functions Execution Status Change" event: "Step Functions sends events to
    Amazon EventBridge for each Standard workflow execution status change", the input included while under 248 KiB
    (Step Functions Developer Guide, "Automating Step Functions event delivery with EventBridge")."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    execution_arn: str = Field(alias="executionArn")
    state_machine_arn: str = Field(alias="stateMachineArn")
    name: str
    status: Literal["TIMED_OUT", "FAILED", "ABORTED", "SUCCEEDED", "RUNNING", "PENDING_REDRIVE"]
    input: str | None = None
    error: str | None = None
    cause: str | None = None


class ExecutionStatusChange(BaseModel):
    """EventBridge's envelope of an execution's status change, as the rule delivers it to BatchEnded."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    source: Literal["aws.states"]
    detail_type: Literal["Step Functions Execution Status Change"] = Field(alias="detail-type")
    detail: ExecutionStatusDetail


class HandBack(Frozen):
    """Groups whose child could not finish (the Lambda service refused a step past its retries, or the child passed
    the Express limit), run again in a later round after a wait."""

    round: int = Field(ge=1, le=MAX_HAND_BACKS, description="The round they run in")
    groups: int = Field(ge=1)
    wait_seconds: int = Field(ge=1, le=3600, description="The parent's wait before the round (its Wait state)")


class BatchSummary(Frozen):
    """The batch's last word, kept as ``batches/<batch_id>/summary.json`` and returned as the execution's output;
    with ``handed_back``, the word of a round after which the batch goes on."""

    batch_id: str
    images: int
    succeeded: int
    failed: int
    groups: int
    unfinished: int = Field(description="Groups whose child workflow wrote no summary (their images failed)")
    unfinished_groups: list[str] = Field(
        max_length=MAX_LISTED_GROUPS, description="The first of them (the execution's output stays small)"
    )
    error: StepFailure | None = None
    summary_uri: str
    handed_back: HandBack | None = None
