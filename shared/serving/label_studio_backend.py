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
``_get_predictions_from_ml_backend``). So a call of thousands of tasks must answer some of them within that time and
leave the rest for the next: it first answers the tasks whose picture the pipeline already annotated, from their
rows (found by name or location with one query, matched by the sha256 of the bytes that each row keeps: a lookup,
not a re-read of the files the rows came from; only these tasks' images are read, several at once); then runs the
models on the others in order while ``label_studio_answer_within_s`` lasts, recording their rows as any run does.
The rest, and any task it cannot read, get no prediction, and the log says why: the next Retrieve Predictions
starts with them.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Protocol

from fastapi import APIRouter
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from shared.contracts import AnnotationRequest, split_phrases
from shared.errors import AnnotateError, RequestRejected
from shared.observability import logger
from shared.pipeline.batches import image_ref
from shared.pipeline.dependencies import Step
from shared.serving.bounds import ApiContext
from shared.serving.calls import Annotation, AnnotationOptions, Source, annotate_one
from shared.serving.label_studio import MODEL_VERSION, LabelledBox, Project, read_label_config
from shared.serving.label_studio_media import TaskImage, authorization_header, locate_task_image, read_task_image
from shared.serving.label_studio_results import answer_result, image_choice_results, prediction
from shared.storage.images import decode_image
from shared.storage.objects import store_for

MAX_TASKS_PER_CALL = 100_000  # Label Studio sends every selected task at once: a whole project, where all are chosen
# Images read at once from Label Studio to match rows: its media are served by a pool of workers, and eight keep a
# page moving without crowding the people using it
DOWNLOADS_AT_ONCE = 8
MAX_QUESTION_CHARS = 500  # a question a task holds, as the vision-language model reads it
LEFT = "not reached within the call's time: the next Retrieve Predictions asks again"


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
    def content_sha256(self) -> str | None: ...
    @property
    def boxes(self) -> list[LabelledBox]: ...


# The annotated images whose source is one of these URIs, or whose file is named one of these names: the latest
# annotation of each source (tools/results: the local tables, or a deployed stack's).
FindAnnotated = Callable[[Sequence[str], Sequence[str]], Sequence[Annotated]]


def answers_config(row: Annotated, project: Project, request: AnnotationRequest) -> bool:
    """Whether ``row`` holds all the config asks: a success for the same phrases, its caption where the config has
    a place for one, each box's mask where it has a place for masks, and on each box a value of each attribute the
    config asks, among the config's own choices."""
    if row.status != "succeeded" or sorted(split_phrases(row.prompt or "")) != sorted(request.phrases):
        return False
    if project.caption and not row.caption:
        return False
    if request.masks and not all(box.mask is not None for box in row.boxes):
        return False
    return all(
        box.attributes.get(attribute) in vocabulary
        for box in row.boxes
        for attribute, vocabulary in request.attributes.items()
    )


@dataclass(frozen=True)
class EarlierRows:
    """The rows that answer a call's config, as lookups: by the sha256 of the bytes they annotated, by source (an
    s3:// task's rows name its URI), and by file name where one picture has that name (``by_own_name``)."""

    by_digest: dict[str, Annotated]
    by_source: dict[str, Annotated]
    names: frozenset[str]
    by_own_name: dict[str, Annotated]

    @classmethod
    def of(cls, rows: Sequence[Annotated], project: Project, request: AnnotationRequest) -> EarlierRows:
        by_digest: dict[str, Annotated] = {}
        by_source: dict[str, Annotated] = {}
        for row in sorted(rows, key=lambda row: str(row.processed_at)):  # the latest of each wins
            if answers_config(row, project, request):
                by_source[row.source_uri] = row
                if row.content_sha256:
                    by_digest[row.content_sha256] = row
        pictures: dict[str, set[str]] = {}
        named: dict[str, Annotated] = {}
        for uri, row in by_source.items():
            name = PurePosixPath(uri).name
            pictures.setdefault(name, set()).add(row.content_sha256 or uri)
            named[name] = row
        own = {name: row for name, row in named.items() if len(pictures[name]) == 1}
        return cls(by_digest, by_source, frozenset(pictures), own)

    def may_hold(self, image: TaskImage) -> bool:
        """Whether a row may answer the task: one of its name, or of its location."""
        return image.error is None and (image.name in self.names or image.location in self.by_source)


@dataclass(frozen=True)
class Identified:
    """A task's image as the rows know it: the row that answers it (None: the models must), and its bytes where
    they were read."""

    earlier: Annotated | None
    source: Source | None


def _boxes(annotation: Annotation) -> list[LabelledBox]:
    masks = annotation.masks.masks if annotation.masks else [None] * len(annotation.detections)
    return [
        LabelledBox(
            label=d.label,
            score=d.score,
            box=d.box,
            class_label=d.class_label,
            class_score=d.class_score,
            attributes={a.name: a.value for a in d.attributes},
            mask=mask,
        )
        for d, mask in zip(annotation.detections, masks, strict=True)
    ]


class _Left(Exception):
    """The call's time would end before this task's answer: the next call asks again."""


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
        self.authorization = functools.cache(functools.partial(authorization_header, self.context.settings))
        self.longest_model_s = 0.0
        self.longest_choices_s = 0.0

    async def answers(self, tasks: Sequence[Any]) -> list[Any]:
        settings = self.context.settings
        images = [locate_task_image(task, self.project, settings) for task in tasks]
        answers: list[Any] = [[] for _ in images]
        reasons: dict[int, str] = {index: image.error for index, image in enumerate(images) if image.error}
        rows = await run_in_threadpool(self._earlier_rows, images)
        candidates = [index for index, image in enumerate(images) if rows and rows.may_hold(image)]
        from_rows = await self._answer_from_rows(candidates, images, rows, answers, reasons) if rows else set()
        for index, image in enumerate(images):
            if index in from_rows or index in reasons:
                continue
            reasons[index] = await self._answer_with_models(index, image, answers)
        for index, reason in reasons.items():
            if reason and reason != LEFT:  # those left are counted below: a call of thousands would log thousands
                logger.warning("task not pre-annotated", extra={"task": images[index].task_id, "reason": reason})
        logger.info(
            "predicted",
            extra={
                "tasks": len(tasks),
                "from_rows": len(from_rows),
                "answered": sum(1 for answer in answers if answer),
                "left_for_the_next_call": sum(1 for reason in reasons.values() if reason == LEFT),
            },
        )
        return answers

    def _earlier_rows(self, images: list[TaskImage]) -> EarlierRows | None:
        if self.request is None or self.find_annotated is None:
            return None
        uris = sorted({image.location for image in images if image.kept})
        names = sorted({image.name for image in images if image.error is None and image.name})
        try:
            found = self.find_annotated(uris, names) if uris or names else []
        except AnnotateError as error:
            logger.warning("the rows could not be read: every task runs the models", extra={"reason": str(error)})
            return None
        return EarlierRows.of(found, self.project, self.request)

    async def _answer_from_rows(
        self,
        candidates: list[int],
        images: list[TaskImage],
        rows: EarlierRows,
        answers: list[Any],
        reasons: dict[int, str],
    ) -> set[int]:
        """Answers the ``candidates`` whose image a row annotated; their images are read several at once, no more
        than a few ahead of the answers (a call of thousands holds a few images at a time). Returns those
        answered, and those left for want of time (in ``reasons``)."""
        answered: set[int] = set()
        pool = ThreadPoolExecutor(DOWNLOADS_AT_ONCE, thread_name_prefix="label-studio-media")
        ahead: deque[tuple[int, Future[Identified]]] = deque()
        waiting = iter(candidates)
        try:
            for index in itertools.islice(waiting, 2 * DOWNLOADS_AT_ONCE):
                ahead.append((index, pool.submit(self._identify, images[index], rows)))
            while ahead:
                index, identifying = ahead.popleft()
                for following in itertools.islice(waiting, 1):
                    ahead.append((following, pool.submit(self._identify, images[following], rows)))
                remaining_s = self.deadline - time.monotonic()
                try:
                    if remaining_s <= 0:
                        raise _Left
                    identified = await asyncio.wait_for(asyncio.wrap_future(identifying), remaining_s)
                    if identified.earlier is None:
                        continue  # another picture of the same name: the models' turn
                    answers[index] = await self._from_row(images[index], identified)
                    answered.add(index)
                except (_Left, TimeoutError):
                    reasons[index] = LEFT
                    answered.add(index)
                except AnnotateError as error:
                    reasons[index] = str(error)
                except Exception as error:  # one task's problem is that task's, whatever it is
                    logger.exception("task failed", extra={"task": images[index].task_id})
                    reasons[index] = f"{type(error).__name__}: {error}"
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        return answered

    def _identify(self, image: TaskImage, rows: EarlierRows) -> Identified:
        """The row that annotated the task's picture: for an s3:// task, its source's row while the object is as it
        was (one HEAD); with ``label_studio_match_by_name``, the row of the one picture of the task's file name (no
        read); otherwise, the row of the same bytes (one read)."""
        if self.context.settings.label_studio_match_by_name and not image.kept and image.name in rows.by_own_name:
            return Identified(rows.by_own_name[image.name], None)
        earlier = rows.by_source.get(image.location)
        if earlier is not None:
            unchanged = image_ref(image.location, store_for(image.location).fingerprint(image.location)).image_id
            if unchanged == earlier.image_id:
                return Identified(earlier, None)
        source = read_task_image(image, self.context.settings, self.authorization)
        return Identified(rows.by_digest.get(hashlib.sha256(source.data).hexdigest()), source)

    async def _from_row(self, image: TaskImage, identified: Identified) -> dict[str, Any]:
        earlier = identified.earlier
        assert earlier is not None
        whole_image: list[dict[str, Any]] = []
        if self.project.image_choices or self.project.questions:
            whole_image = await self._timed_whole_image(image, identified.source)
        size = (earlier.width or 1, earlier.height or 1)
        return prediction(self.project, earlier.image_id, size, earlier.boxes, earlier.caption, whole_image)

    async def _timed_whole_image(self, image: TaskImage, source: Source | None) -> list[dict[str, Any]]:
        if time.monotonic() + self.longest_choices_s > self.deadline:
            raise _Left
        started = time.monotonic()
        results = await self.context.run(functools.partial(self._whole_image, image, source))
        self.longest_choices_s = max(self.longest_choices_s, time.monotonic() - started)
        return results

    async def _answer_with_models(self, index: int, image: TaskImage, answers: list[Any]) -> str:
        """Runs the models on the task where the call's time allows; returns why it got no answer ("" when it
        did)."""
        if time.monotonic() + self.longest_model_s > self.deadline:
            return LEFT  # a model run would end past the call's time
        started = time.monotonic()
        try:
            if self.request is None:
                whole_image = await self._timed_whole_image(image, None)
                answers[index] = prediction(self.project, image.location, (1, 1), [], None, whole_image)
            else:
                answers[index] = await self.context.run(functools.partial(self._predict, image))
        except _Left:
            return LEFT
        except AnnotateError as error:  # the task's own (a model that cannot load fails each task)
            return str(error)
        except Exception as error:  # one task's problem is that task's, whatever it is
            logger.exception("task failed", extra={"task": image.task_id})
            return f"{type(error).__name__}: {error}"
        finally:
            if self.request is not None:
                self.longest_model_s = max(self.longest_model_s, time.monotonic() - started)
        return ""

    def _predict(self, image: TaskImage) -> dict[str, Any]:
        """The task's prediction from the models (the whole image's choices and answers on the same pixels)."""
        settings = self.context.settings
        assert self.request is not None
        source = read_task_image(image, settings, self.authorization)
        choices = self._whole_image(image, source) if self.project.image_choices or self.project.questions else []
        options = AnnotationOptions.model_validate(self.request.model_dump() | {"record": True})
        annotation = annotate_one(source, options, settings, self.context.dependencies_of, self.context.record_rows)
        if annotation.status != "succeeded":
            raise RequestRejected(f"the pipeline failed on it: {annotation.error}")
        size = (annotation.width or 1, annotation.height or 1)
        caption = annotation.caption.caption if annotation.caption else None
        return prediction(self.project, annotation.image_id, size, _boxes(annotation), caption, choices)

    def _whole_image(self, image: TaskImage, source: Source | None) -> list[dict[str, Any]]:
        """CLIP's whole-image choices and the vision-language model's answers to the task's questions, on the
        task's picture (read here where it was not yet)."""
        settings = self.context.settings
        source = source or read_task_image(image, settings, self.authorization)
        pixels = decode_image(source.data, max_pixels=settings.max_image_pixels).pixels
        choices = self._image_choices(pixels, source.uri) if self.project.image_choices else []
        return choices + self._answers(image, pixels, source.uri)

    def _answers(self, image: TaskImage, pixels: Image.Image, region_key: str) -> list[dict[str, Any]]:
        """Each question the task holds (Visual Question Answering's $q1...), answered by the vision-language model
        on the picture; a question missing from the task, or empty, gets no answer."""
        data = image.task.get("data") if isinstance(image.task, dict) else None
        questions = {
            question: data.get(question.key) if isinstance(data, dict) else None for question in self.project.questions
        }
        asked = [(question, text) for question, text in questions.items() if isinstance(text, str) and text.strip()]
        if not asked:
            return []
        captioner = self.context.dependencies_of(Step.CAPTION).captioner
        if captioner is None:
            raise TypeError("the Caption dependencies have no captioner")
        return [
            answer_result(question, captioner.answer(pixels, text[:MAX_QUESTION_CHARS]), region_key)
            for question, text in asked
        ]

    def _image_choices(self, pixels: Image.Image, region_key: str) -> list[dict[str, Any]]:
        """CLIP's whole-image choices on the task's picture."""
        settings = self.context.settings
        tagger = self.context.dependencies_of(Step.TAG).tagger
        if tagger is None:
            raise TypeError("the Tag dependencies have no tagger")
        texts = {choices.name: [option.text for option in choices.options] for choices in self.project.image_choices}
        independent = {choices.name for choices in self.project.image_choices if choices.multiple}
        scores = tagger.choose(pixels, texts, independent)
        min_score = settings.label_studio_multiple_choice_min_score
        return image_choice_results(self.project, scores, min_score, region_key)


def label_studio_routes(context: ApiContext, find_annotated: FindAnnotated | None) -> APIRouter:
    """The backend's routes; model work is queued as the API's other routes' is; ``find_annotated`` reads the rows
    the pipeline wrote (None: every task runs the models)."""
    router = APIRouter(tags=["Label Studio ML backend"])
    settings = context.settings

    def checked(label_config: str) -> tuple[Project, AnnotationRequest | None]:
        project = read_label_config(label_config, sees_images=settings.caption_vision or bool(settings.caption_mmproj))
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
