"""Label Studio's ML backend protocol, context at the API's root: the backend URL a user gives a Label Studio project
is the server's own (`annotate serve`, or the API function's URL).

The routes are the ones the public label-studio-ml-backend serves (label_studio_ml/api.py): ``GET /health``
(``"status": "UP"``), ``POST /setup`` (the project's label config: answered with the model version and what the
models fill, or refused when they fill nothing), ``POST /predict`` (tasks and the label config: one answer per task,
in order, under ``results``) and ``POST /webhook``. Each task's image is read as Label Studio serves it: its own
uploads and local files (a path on ``LABEL_STUDIO_URL``, read with ``LABEL_STUDIO_API_KEY``), or ``s3://`` in a
bucket the deployment reads.

Label Studio sends every selected task in one ``/predict`` and waits ``ML_TIMEOUT_PREDICT`` (100 s) for the answer;
it stores each task's answer as a prediction, an empty list as none, and asks again next time only for tasks with
no prediction of the current model version (label_studio/ml/models.py, ``predict_tasks`` and
``_get_predictions_from_ml_backend``). So a call answers every task whose image the pipeline already annotated at
once, from its rows; runs the models for the others while ``label_studio_answer_within_s`` lasts, recording their
rows as any run does; and answers the rest, and any task it cannot read, with no prediction: the next Retrieve
Predictions starts with them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Protocol
from urllib.parse import urlsplit

from fastapi import APIRouter
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from shared.contracts import AnnotationRequest, split_phrases
from shared.errors import AnnotateError, ImageRejected, RequestRejected
from shared.observability import logger
from shared.pipeline.batches import image_ref
from shared.pipeline.dependencies import Step
from shared.serving.bounds import ApiContext
from shared.serving.calls import Annotation, AnnotationOptions, Source, annotate_one, image_source
from shared.serving.label_studio import (
    MODEL_VERSION,
    LabelledBox,
    Project,
    image_choice_results,
    original_name,
    prediction,
    read_label_config,
)
from shared.serving.secrets import secret_value
from shared.settings import Settings
from shared.storage.images import decode_image
from shared.storage.objects import store_for

MAX_TASKS_PER_CALL = 10_000  # Label Studio sends every selected task at once: a project's page is far fewer
DOWNLOAD_TIMEOUT_S = 30


class BackendSetup(BaseModel):
    """``POST /setup``: the project Label Studio connects (its other fields are Label Studio's own)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    label_config: str = Field(alias="schema", max_length=100_000)


class BackendPredict(BaseModel):
    """``POST /predict``: the tasks to pre-annotate (each read on its own: one malformed task is that task's
    failure) and the project's label config."""

    model_config = ConfigDict(extra="allow")
    tasks: list[Any] = Field(max_length=MAX_TASKS_PER_CALL)
    label_config: str = Field(max_length=100_000)


class Annotated(Protocol):
    """What the pipeline wrote for an image, read back from its rows (tools/results/annotations.AnnotatedImage)."""

    @property
    def image_id(self) -> str: ...
    @property
    def source_uri(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def width(self) -> int | None: ...
    @property
    def height(self) -> int | None: ...
    @property
    def caption(self) -> str | None: ...
    @property
    def prompt(self) -> str | None: ...
    @property
    def processed_at(self) -> Any: ...
    @property
    def boxes(self) -> list[LabelledBox]: ...


# The annotated images whose source is one of these URIs, or whose file is named one of these names: the latest
# annotation of each source (tools/results: the local tables, or a deployed stack's).
FindAnnotated = Callable[[Sequence[str], Sequence[str]], Sequence[Annotated]]


@dataclass(frozen=True)
class TaskImage:
    """A task's image as it was read (where it lives, its name and a digest of its bytes, not the bytes: a call of
    thousands of tasks holds one image at a time), or why it could not be read."""

    task: Any
    uri: str = ""
    kept: bool = False  # in storage (an s3:// location): its rows are found by this URI
    name: str = ""
    digest: str = ""  # the sha256 of its bytes
    error: str | None = None

    @property
    def task_id(self) -> Any:
        return self.task.get("id") if isinstance(self.task, dict) else None


def task_image(
    task: Any, project: Project, settings: Settings, authorization: Callable[[], str] | None = None
) -> Source:
    """The task's image, read as Label Studio serves it; ``authorization`` gives the header for Label Studio (one
    token exchange per call of /predict, not per task).

    Raises:
        RequestRejected: the task is not a task, names no image, one elsewhere than Label Studio or the input
            buckets, or one Label Studio would not give.
        ImageRejected: the image is too large, or gone.
    """
    data = task.get("data") if isinstance(task, dict) else None
    if not isinstance(data, dict):
        raise RequestRejected(f"the task's data is not an object ({type(data).__name__})")
    value = data.get(project.image_key)
    if not isinstance(value, str) or not value:
        raise RequestRejected(f"the task has no {project.image_key!r} in its data")
    if value.startswith(("s3://", "data:")):
        return image_source(value, settings, name=original_name(value))
    base = settings.label_studio_url.rstrip("/")
    url = f"{base}{value}" if value.startswith("/") else value
    if not base:
        raise RequestRejected(f"{value[:120]!r} is Label Studio's: set LABEL_STUDIO_URL (and LABEL_STUDIO_API_KEY)")
    if not url.startswith(f"{base}/"):
        raise RequestRejected(f"{value[:120]!r} is neither on Label Studio ({base}) nor s3:// in an input bucket")
    header = authorization() if authorization else _authorization(settings)
    return image_source(_download(url, header, settings.max_image_bytes), settings, name=original_name(value))


def _authorization(settings: Settings) -> str:
    """Label Studio's header for the key: a personal access token (a JWT) is exchanged for an access token at
    ``/api/token/refresh`` ("Authorization: Bearer"); a legacy token is sent as it is ("Authorization: Token")."""
    key = settings.label_studio_api_key.get_secret_value() or (
        secret_value(settings.label_studio_api_key_secret) if settings.label_studio_api_key_secret else ""
    )
    if key.count(".") != 2:
        return f"Token {key}"
    refresh = urllib.request.Request(
        f"{settings.label_studio_url.rstrip('/')}/api/token/refresh/",
        data=json.dumps({"refresh": key}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(refresh, timeout=DOWNLOAD_TIMEOUT_S) as answer:
            return f"Bearer {json.load(answer)['access']}"
    except (urllib.error.URLError, ValueError, KeyError) as error:
        raise RequestRejected(f"Label Studio refused LABEL_STUDIO_API_KEY: {error}") from None


class _KeyStaysHome(urllib.request.HTTPRedirectHandler):
    """Follows Label Studio's redirects (a cloud storage's presigned URL) without the key: it is Label Studio's, and
    a presigned URL is refused with a second means of authentication."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        redirected = super().redirect_request(req, fp, code, msg, headers, newurl)
        if redirected is not None and urlsplit(newurl).netloc != urlsplit(req.full_url).netloc:
            redirected.remove_header("Authorization")
        return redirected


_OPENER = urllib.request.build_opener(_KeyStaysHome)


def _download(url: str, authorization: str, max_bytes: int) -> bytes:
    request = urllib.request.Request(url, headers={"Authorization": authorization})
    try:
        with _OPENER.open(request, timeout=DOWNLOAD_TIMEOUT_S) as answer:
            data: bytes = answer.read(max_bytes + 1)
    except urllib.error.HTTPError as error:
        raise RequestRejected(f"Label Studio answered {error.code} for {url[:160]}") from None
    except (urllib.error.URLError, TimeoutError) as error:
        raise RequestRejected(f"Label Studio could not be read at {url[:160]}: {error}") from None
    if len(data) > max_bytes:
        raise ImageRejected(f"{url[:160]} is over the limit of {max_bytes:,} bytes")
    return data


def read_task_images(
    tasks: Sequence[Any], project: Project, settings: Settings, deadline: float, authorization: Callable[[], str]
) -> list[TaskImage]:
    """Each task's image, or why not; tasks past ``deadline`` are not read (their answer waits for the next call)."""
    images = []
    for task in tasks:
        if time.monotonic() > deadline:
            images.append(TaskImage(task, error="not reached within the call's time"))
            continue
        try:
            source = task_image(task, project, settings, authorization)
            digest = hashlib.sha256(source.data).hexdigest()
            images.append(TaskImage(task, source.uri, source.kept, source.name, digest))
        except (ImageRejected, RequestRejected) as error:
            images.append(TaskImage(task, error=str(error)))
    return images


def annotated_before(image: TaskImage, candidates: Sequence[Annotated], phrases: list[str]) -> Annotated | None:
    """The latest of ``candidates`` that annotated this very image for these phrases: the same source, or a file
    of the same name whose bytes are the task's, still as it was when annotated (its image id holds its content)."""
    fitting = [
        candidate
        for candidate in candidates
        if candidate.status == "succeeded"
        and sorted(split_phrases(candidate.prompt or "")) == sorted(phrases)
        and (candidate.source_uri == image.uri or PurePosixPath(candidate.source_uri).name == image.name)
    ]
    for candidate in sorted(fitting, key=lambda candidate: str(candidate.processed_at), reverse=True):
        store = store_for(candidate.source_uri)
        try:
            unchanged = image_ref(candidate.source_uri, store.fingerprint(candidate.source_uri)).image_id
            if unchanged != candidate.image_id:
                continue
            same_source = candidate.source_uri == image.uri
            if same_source or hashlib.sha256(store.read_bytes(candidate.source_uri)).hexdigest() == image.digest:
                return candidate
        except (AnnotateError, OSError) as error:
            logger.info(
                "an earlier annotation is not readable", extra={"uri": candidate.source_uri, "reason": str(error)}
            )
    return None


def _boxes(annotation: Annotation) -> list[LabelledBox]:
    return [
        LabelledBox(
            label=d.label,
            score=d.score,
            box=d.box,
            class_label=d.class_label,
            class_score=d.class_score,
            attributes={a.name: a.value for a in d.attributes},
        )
        for d in annotation.detections
    ]


@dataclass
class _Predicting:
    """One /predict call's work on its tasks."""

    project: Project
    request: AnnotationRequest | None  # None: the config needs CLIP on the whole image alone
    context: ApiContext
    find_annotated: FindAnnotated | None
    deadline: float

    def __post_init__(self) -> None:
        # Label Studio's token is exchanged once a call, not once a task
        self.authorization = functools.cache(functools.partial(_authorization, self.context.settings))

    async def answers(self, tasks: Sequence[Any]) -> list[Any]:
        settings = self.context.settings
        images = await run_in_threadpool(
            read_task_images, tasks, self.project, settings, self.deadline, self.authorization
        )
        earlier = await run_in_threadpool(self._annotated_before, images)
        answers: list[Any] = []
        longest_s, left = 0.0, 0
        for index, image in enumerate(images):
            answer: Any = []
            if image.error is not None:
                logger.warning("task not pre-annotated", extra={"task": image.task_id, "reason": image.error})
            elif index not in earlier and time.monotonic() + longest_s > self.deadline:
                left += 1  # a model run would end past the call's time: the next call asks again
            else:
                started = time.monotonic()
                try:
                    answer = await self.context.run(functools.partial(self._predict, image, earlier.get(index)))
                except AnnotateError as error:  # the task's own (a model that cannot load fails each task)
                    logger.warning("task not pre-annotated", extra={"task": image.task_id, "reason": str(error)})
                if index not in earlier:
                    longest_s = max(longest_s, time.monotonic() - started)
            answers.append(answer)
        logger.info(
            "predicted",
            extra={
                "tasks": len(tasks),
                "from_rows": len(earlier),
                "answered": sum(1 for answer in answers if answer),
                "left_for_the_next_call": left,
            },
        )
        return answers

    def _annotated_before(self, images: list[TaskImage]) -> dict[int, Annotated]:
        if self.request is None or self.find_annotated is None:
            return {}
        read = {index: image for index, image in enumerate(images) if image.error is None}
        uris = sorted({image.uri for image in read.values() if image.kept})
        names = sorted({image.name for image in read.values() if image.name})
        try:
            candidates = self.find_annotated(uris, names) if uris or names else []
        except AnnotateError as error:
            logger.warning("the rows could not be read: every task runs the models", extra={"reason": str(error)})
            return {}
        phrases = self.request.phrases
        found = {index: annotated_before(image, candidates, phrases) for index, image in read.items()}
        return {index: annotation for index, annotation in found.items() if annotation is not None}

    def _predict(self, image: TaskImage, earlier: Annotated | None) -> dict[str, Any]:
        """The task's prediction: from its earlier annotation, or the models'. The image is read again only where
        CLIP or the models need its pixels."""
        settings = self.context.settings
        source, choices = None, []
        if self.project.image_choices or self.request is None:
            source = task_image(image.task, self.project, settings, self.authorization)
            pixels = decode_image(source.data, max_pixels=settings.max_image_pixels).pixels
            choices = self._image_choices(pixels, source.uri)
            if self.request is None:
                return prediction(self.project, source.uri, pixels.size, [], None, choices)
        if earlier is not None:
            size = (earlier.width or 1, earlier.height or 1)
            return prediction(self.project, earlier.image_id, size, earlier.boxes, earlier.caption, choices)
        source = source or task_image(image.task, self.project, settings, self.authorization)
        options = AnnotationOptions.model_validate(self.request.model_dump() | {"record": True})
        annotation = annotate_one(source, options, settings, self.context.dependencies_of, self.context.record_rows)
        if annotation.status != "succeeded":
            raise RequestRejected(f"the pipeline failed on it: {annotation.error}")
        size = (annotation.width or 1, annotation.height or 1)
        caption = annotation.caption.caption if annotation.caption else None
        return prediction(self.project, annotation.image_id, size, _boxes(annotation), caption, choices)

    def _image_choices(self, pixels: Image.Image, region_key: str) -> list[dict[str, Any]]:
        tagger = self.context.dependencies_of(Step.TAG).tagger
        if tagger is None:
            raise TypeError("the Tag dependencies have no tagger")
        texts = {choices.name: [option.text for option in choices.options] for choices in self.project.image_choices}
        scores = tagger.choose(pixels, texts)
        min_score = self.context.settings.label_studio_multiple_choice_min_score
        return image_choice_results(self.project, scores, min_score, region_key)


def label_studio_routes(context: ApiContext, find_annotated: FindAnnotated | None) -> APIRouter:
    """The backend's routes; model work is queued as the API's other routes' is; ``find_annotated`` reads the rows
    the pipeline wrote (None: every task runs the models)."""
    router = APIRouter(tags=["Label Studio ML backend"])
    settings = context.settings

    def checked(label_config: str) -> tuple[Project, AnnotationRequest | None]:
        project = read_label_config(label_config)
        return project, project.request(settings.ingest_prompt) if project.runs_pipeline else None

    @router.post("/setup", summary="Label Studio connects a project: what its label config asks, checked")
    def setup(call: BackendSetup) -> dict[str, Any]:
        project, _ = checked(call.label_config)  # refused (400, one line) when the models fill nothing
        logger.info("project connected", extra={"fills": project.fills(), "left_to_people": project.left_to_people})
        return {"model_version": MODEL_VERSION, "fills": project.fills(), "left_to_people": project.left_to_people}

    @router.post("/predict", summary="Pre-annotations for Label Studio's tasks, one answer per task, in order")
    async def predict(call: BackendPredict) -> dict[str, Any]:
        deadline = time.monotonic() + settings.label_studio_answer_within_s
        project, request = checked(call.label_config)
        predicting = _Predicting(project, request, context, find_annotated, deadline)
        return {"results": await predicting.answers(call.tasks), "model_version": MODEL_VERSION}

    @router.post("/webhook", summary="Label Studio's events: nothing is trained here, so each is acknowledged")
    def webhook() -> dict[str, Any]:
        return {"status": "ok"}

    return router
