"""Label Studio's ML backend protocol, served at the API's root: the backend URL a user gives a Label Studio project
is the server's own (`annotate serve`, or the API function's URL).

The routes are the ones the public label-studio-ml-backend serves (label_studio_ml/api.py): ``GET /health``
(``"status": "UP"``), ``POST /setup`` (the project's label config: answered with the model version, or refused when
the models cannot fill it), ``POST /predict`` (tasks and the label config: one prediction per task, in order, under
``results``) and ``POST /webhook``. Each task's image is read as Label Studio serves it: its own uploads and
local files (a path on ``LABEL_STUDIO_URL``, read with ``LABEL_STUDIO_API_KEY``), or ``s3://`` in a bucket the
deployment reads; an image that cannot be read is that task's error, never the call's.
"""

from __future__ import annotations

import functools
import json
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from shared.errors import ImageRejected, RequestRejected
from shared.observability import logger
from shared.serving.calls import Annotation, AnnotationOptions, Source, image_source
from shared.serving.label_studio import LabelledBox, Project, caption_result, read_label_config, region_results
from shared.serving.secrets import secret_value
from shared.settings import Settings

MODEL_VERSION = "annotate"
MAX_TASKS_PER_CALL = 100
DOWNLOAD_TIMEOUT_S = 30


class BackendSetup(BaseModel):
    """``POST /setup``: the project Label Studio connects (its other fields are Label Studio's own)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    label_config: str = Field(alias="schema", max_length=100_000)


class BackendPredict(BaseModel):
    """``POST /predict``: the tasks to pre-annotate and the project's label config."""

    model_config = ConfigDict(extra="allow")
    tasks: list[dict[str, Any]] = Field(max_length=MAX_TASKS_PER_CALL)
    label_config: str = Field(max_length=100_000)


def prediction(annotation: Annotation, project: Project) -> dict[str, Any]:
    """The annotation as one of Label Studio's predictions: its regions, the caption, a score per region and the
    lowest for the prediction."""
    boxes = [
        LabelledBox(
            label=d.label,
            score=d.score,
            x0=d.box.x0,
            y0=d.box.y0,
            x1=d.box.x1,
            y1=d.box.y1,
            class_label=d.class_label,
            class_score=d.class_score,
            attributes={a.name: a.value for a in d.attributes},
        )
        for d in annotation.detections
    ]
    result = region_results(boxes, annotation.width or 1, annotation.height or 1, project, annotation.image_id)
    result += caption_result(annotation.caption.caption if annotation.caption else "", project)
    score = min((box.score for box in boxes), default=1.0)
    return {"result": result, "score": score, "model_version": MODEL_VERSION}


def task_image(
    task: dict[str, Any], project: Project, settings: Settings, authorization: Callable[[], str] | None = None
) -> Source:
    """The task's image, read as Label Studio serves it; ``authorization`` gives the header for Label Studio (one
    token exchange per call of /predict, not per task).

    Raises:
        RequestRejected: the task names no image, one elsewhere than Label Studio or the input buckets, or one
            Label Studio would not give.
        ImageRejected: the image is too large, or gone.
    """
    value = (task.get("data") or {}).get(project.image_key)
    if not isinstance(value, str) or not value:
        raise RequestRejected(f"the task has no {project.image_key!r} in its data")
    if value.startswith(("s3://", "data:")):
        return image_source(value, settings)
    base = settings.label_studio_url.rstrip("/")
    url = f"{base}{value}" if value.startswith("/") else value
    if not base:
        raise RequestRejected(f"{value[:120]!r} is Label Studio's: set LABEL_STUDIO_URL (and LABEL_STUDIO_API_KEY)")
    if not url.startswith(f"{base}/"):
        raise RequestRejected(f"{value[:120]!r} is neither on Label Studio ({base}) nor s3:// in an input bucket")
    header = authorization() if authorization else _authorization(settings)
    return image_source(_download(url, header, settings.max_image_bytes), settings)


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


def label_studio_routes(
    settings: Settings,
    run_call: Callable[[Callable[[], Annotation]], Awaitable[Annotation]],
    annotate: Callable[[Source, AnnotationOptions], Annotation],
) -> APIRouter:
    """The backend's routes; ``run_call`` queues a model call as the API's other routes do, ``annotate`` annotates
    one image (nothing recorded)."""
    router = APIRouter(tags=["Label Studio ML backend"])

    @router.post("/setup", summary="Label Studio connects a project: its label config, checked")
    def setup(call: BackendSetup) -> dict[str, Any]:
        read_label_config(call.label_config).request()  # refused (400) when the models cannot fill it
        return {"model_version": MODEL_VERSION}

    @router.post("/predict", summary="Pre-annotations for Label Studio's tasks, one per task, in order")
    async def predict(call: BackendPredict) -> dict[str, Any]:
        project = read_label_config(call.label_config)
        options = AnnotationOptions.model_validate(project.request().model_dump())
        authorization = functools.cache(functools.partial(_authorization, settings))
        results = []
        for task in call.tasks:
            try:
                source = await run_in_threadpool(task_image, task, project, settings, authorization)
                annotation = await run_call(lambda source=source: annotate(source, options))  # type: ignore[misc]
                results.append(prediction(annotation, project))
            except (ImageRejected, RequestRejected) as error:
                logger.warning("task not pre-annotated", extra={"task": task.get("id"), "reason": str(error)})
                results.append({"result": [], "score": 0.0, "model_version": MODEL_VERSION, "error": str(error)})
        return {"results": results, "model_version": MODEL_VERSION}

    @router.post("/webhook", summary="Label Studio's events: nothing is trained here, so each is acknowledged")
    def webhook() -> dict[str, Any]:
        return {"status": "ok"}

    return router
