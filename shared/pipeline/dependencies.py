"""What each step works with (its ports), built once per function from the settings in force.

A handler asks :func:`dependencies_of` for its step's value and passes it to the step; tests put in-memory fakes
in force with :func:`use_dependencies` and run the same handlers and workflow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from shared.contracts import AnnotationRequest, MadeBy, PictureFormat
from shared.settings import ImageLimits, Settings, get_settings
from shared.storage.objects import StoreFor, store_for

if TYPE_CHECKING:
    from shared.models.captioning import Captioner
    from shared.models.classification import Classifier
    from shared.models.detection import Detector
    from shared.models.segmentation import Segmenter
    from shared.models.tagging import Tagger
    from shared.models.variants import Generator
    from shared.storage.images import LoadedImage


class Step(StrEnum):
    """A function (or the Variants task) of the workflow: ``functions/<step>/app.py``."""

    DETECT = "detect"
    CLASSIFY = "classify"
    TAG = "tag"
    SEGMENT = "segment"
    CAPTION = "caption"
    WRITE_RESULT = "write_result"
    WRITE_GROUP_TABLE = "write_group_table"
    SUMMARIZE_BATCH = "summarize_batch"
    BATCH_ENDED = "batch_ended"  # not a state: EventBridge's target for an execution that ended without its summary
    VARIANTS = "variants"


@dataclass(frozen=True)
class Dependencies:
    """The store that holds each URI, the image limits, crop margin and pictures' size and format, and the step's
    model (only its own). ``decoded`` and ``written``: where one process runs an image's steps one after another (the
    one-image path), the images its steps decoded and the documents they wrote for a later step, so that each image
    is decoded once and no document is read back."""

    store_for: StoreFor
    image_limits: ImageLimits
    crop_margin: float = 0.1
    picture_max_side: int = 0
    picture_format: PictureFormat = PictureFormat.JPEG
    store_pictures: bool = False
    decoded: dict[str, LoadedImage] | None = None
    written: dict[str, bytes] | None = None
    made_by: MadeBy = field(default_factory=MadeBy)
    detector: Detector | None = None
    classifier: Classifier | None = None
    tagger: Tagger | None = None
    segmenter: Segmenter | None = None
    captioner: Captioner | None = None
    generator: Generator | None = None


def _detect(settings: Settings) -> dict[str, Any]:
    from shared.models.grounding_onnx import load_detector

    detection = settings.detection
    made_by = MadeBy(
        model=detection.detector_model,
        settings=detection.model_dump(
            include={
                "detection_short_side",
                "detector_aspect_ratios",  # which size an image is padded to
                "detector_int8",
                "detector_max_queries",
                "detector_runtime",
                "max_detections",
                "nms_iou",
            }
        ),
    )
    return {"detector": load_detector(detection), "made_by": made_by}


def _classify(settings: Settings) -> dict[str, Any]:
    from shared.models.classification import load_classifier

    describe = settings.describe
    made_by = MadeBy(
        model=describe.classifier_model, settings=describe.model_dump(include={"class_filter", "crop_margin"})
    )
    return {"classifier": load_classifier(describe), "made_by": made_by}


def _tag(settings: Settings) -> dict[str, Any]:
    from shared.models.tagging import load_tagger

    describe = settings.describe
    tagger = load_tagger(describe)
    return {
        "tagger": tagger,
        "made_by": MadeBy(model=tagger.name, settings=describe.model_dump(include={"crop_margin"})),
    }


def _segment(settings: Settings) -> dict[str, Any]:
    from shared.models.segmentation import load_segmenter

    segmenter = load_segmenter(settings.segment)
    return {"segmenter": segmenter, "made_by": MadeBy(model=segmenter.name)}


def _caption(settings: Settings) -> dict[str, Any]:
    from shared.models.captioning import load_captioner

    return {"captioner": load_captioner(settings.caption)}


def _variants(settings: Settings) -> dict[str, Any]:
    from shared.models.variants import load_generator

    return {"generator": load_generator(settings.variants)}


@dataclass(frozen=True)
class StepPort:
    """A step with a model: the field of :class:`Dependencies` it fills, how that is loaded from the settings (once
    per process, heavy imports inside, with what made the step's output), whether it is one of an image's
    annotation steps (the API loads it before a call, the bench and chaos count it), when a request wants it, and
    whether the image's row names its model (a ``<fills>_model`` column)."""

    fills: str
    load: Callable[[Settings], dict[str, Any]]
    annotates: bool = True
    wanted: Callable[[AnnotationRequest], bool] = lambda _: True
    row_names_model: bool = False


# Every step with a model, in the order an image meets them. The real dependencies, the tests' fakes, SnapStart's
# warm-up, the API's preload and needed steps, the rows' model columns, chaos and the bench's step lists are read from
# here (tests/unit/test_step_registry.py holds each to it).
STEP_PORTS: dict[Step, StepPort] = {
    Step.DETECT: StepPort("detector", _detect, row_names_model=True),
    Step.CLASSIFY: StepPort("classifier", _classify, row_names_model=True),
    Step.TAG: StepPort("tagger", _tag, row_names_model=True),
    Step.SEGMENT: StepPort("segmenter", _segment, wanted=lambda request: request.masks, row_names_model=True),
    Step.CAPTION: StepPort("captioner", _caption, wanted=lambda request: request.caption),
    Step.VARIANTS: StepPort("generator", _variants, annotates=False),
}
# An image's annotation steps with a model (Variants, a task of its own, is not one)
ANNOTATION_MODEL_STEPS: tuple[Step, ...] = tuple(step for step, port in STEP_PORTS.items() if port.annotates)


def steps_wanted(request: AnnotationRequest) -> list[Step]:
    """The model steps ``request`` runs, in order, then WriteResult: what one call loads before its image runs."""
    return [step for step in ANNOTATION_MODEL_STEPS if STEP_PORTS[step].wanted(request)] + [Step.WRITE_RESULT]


# The model steps a request with the defaults runs: what the API loads before its first call (a call that asks for
# more, masks, loads it then) and what `annotate cost` prices per image (masks apart, as an option).
DEFAULT_MODEL_STEPS: tuple[Step, ...] = tuple(steps_wanted(AnnotationRequest(prompt="object."))[:-1])


def build_dependencies(step: Step, settings: Settings) -> Dependencies:
    """The real ports of ``step``: S3 or local files, and its model from the settings (loaded once per process)."""
    common = Dependencies(
        store_for=store_for,
        image_limits=settings.image_limits,
        crop_margin=settings.crop_margin,
        picture_max_side=settings.picture_max_side,
        picture_format=settings.picture_format,
        store_pictures=settings.store_pictures,
    )
    port = STEP_PORTS.get(step)
    return replace(common, **port.load(settings)) if port else common


_override: Callable[[Step], Dependencies] | None = None


def dependencies_of(step: Step) -> Dependencies:
    """The dependencies in force for ``step``: the ones given to :func:`use_dependencies`, else the real ones."""
    return _override(step) if _override is not None else build_dependencies(step, get_settings())


def use_dependencies(factory: Callable[[Step], Dependencies] | None) -> None:
    """Put ``factory``'s dependencies in force for this process (tests); None restores the real ones."""
    global _override
    _override = factory
