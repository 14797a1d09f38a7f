"""The synchronous API: one image annotated now, and OpenAI-compatible chat and images, on the workflow's models.

One ASGI app (FastAPI) serves both places: `annotate serve` runs it on uvicorn, and the API function runs it on Lambda
through Mangum (:func:`lambda_adapter`), so the routes, bounds and errors are the same code. Model work runs one call
at a time (each model already uses every core); calls beyond that wait in a bounded queue, and past it get 429.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import statistics
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from shared.dependencies import Dependencies, Step, build_dependencies
from shared.errors import ImageRejected, ModelUnavailable, RequestRejected
from shared.observability import logger, metrics
from shared.serving import (
    Annotation,
    AnnotationCall,
    AnnotationOptions,
    DependenciesOf,
    RecordRows,
    annotate_one,
    chat_completion,
    generate_pictures,
    image_source,
    rows_by_function,
    rows_in_process,
    server_sent_events,
    variants_request,
)
from shared.settings import Settings, get_settings

T = TypeVar("T")
ANNOTATION_MODEL = "annotate"  # the id /v1/models lists for the annotation pipeline (detect, classify, tag)


class ApiError(Exception):
    """An answer in OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        return JSONResponse({"error": error}, status_code=self.status, headers=self.headers)


class Admission:
    """One model call at a time, ``waiting`` more queued; past them, 429 with the seconds the queue needs."""

    def __init__(self, waiting: int) -> None:
        self._running = asyncio.Semaphore(1)
        self._limit = 1 + waiting
        self._inside = 0
        self._seconds: deque[float] = deque([1.0], maxlen=32)  # recent calls' durations, for Retry-After

    @property
    def inside(self) -> int:
        return self._inside

    def retry_after(self) -> int:
        return max(1, round(statistics.median(self._seconds) * self._inside))

    @asynccontextmanager
    async def ticket(self) -> AsyncIterator[None]:
        """Held for the whole call (a stream included). Raises ApiError(429) at once when the queue is full."""
        if self._inside >= self._limit:
            raise ApiError(
                429,
                f"the server is busy: {self._inside} calls are running or queued; retry after the given seconds",
                kind="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(self.retry_after())},
            )
        self._inside += 1
        try:
            async with self._running:
                started = time.monotonic()
                yield
                self._seconds.append(time.monotonic() - started)
        finally:
            self._inside -= 1


class ImageGeneration(BaseModel):
    """``POST /v1/images/generations``: OpenAI's fields this server honours."""

    model_config = ConfigDict(extra="forbid")

    prompt: str
    model: str | None = None
    n: int = 1
    size: str = "512x512"
    response_format: Literal["b64_json"] = "b64_json"
    user: str | None = None


class ImageEdit(ImageGeneration):
    """``POST /v1/images/edits``' form fields besides the picture; ``strength`` is this server's own (img2img)."""

    strength: float | None = None


class ChatCompletionCall(BaseModel):
    """The fields checked before llama-cpp-python's own request type reads the rest."""

    model_config = ConfigDict(extra="allow")

    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    n: int | None = 1
    stream: bool = False


def _bearer_check(settings: Settings) -> Callable[[Request], None]:
    def check(request: Request) -> None:
        expected = api_key(settings)
        if not expected:
            return
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), expected.encode()):  # constant time: no key guessed by timing
            raise ApiError(401, "a valid API key is required: Authorization: Bearer <key>", code="invalid_api_key")

    return check


@functools.cache
def _secret_value(secret_id: str) -> str:
    import boto3

    return str(boto3.client("secretsmanager").get_secret_value(SecretId=secret_id)["SecretString"])


def api_key(settings: Settings) -> str:
    """The key calls must carry: the settings' own, or the stack's secret (read once per process); '' for none."""
    if settings.api_key_secret:
        return _secret_value(settings.api_key_secret)
    return settings.api_key.get_secret_value()


def _validation_error(error: ValidationError | RequestValidationError) -> ApiError:
    first = error.errors()[0]
    param = ".".join(str(part) for part in first["loc"] if part not in ("body",)) or None
    message = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in error.errors()[:5])
    return ApiError(400, message, param=param, code="invalid_value")


def _unexpected(error: Exception) -> JSONResponse:
    logger.error("api call failed", exc_info=error)
    return ApiError(
        500, f"the server failed ({type(error).__name__}); its log has the details", kind="server_error"
    ).response()


def _handlers() -> dict[Any, Any]:
    def answer(error: ApiError) -> JSONResponse:
        if error.status >= 500:
            logger.error("api call failed", extra={"status": error.status, "reason": error.message})
        return error.response()

    return {
        ApiError: lambda _, error: answer(error),
        RequestValidationError: lambda _, error: answer(_validation_error(error)),
        ValidationError: lambda _, error: answer(_validation_error(error)),
        ImageRejected: lambda _, error: answer(ApiError(400, f"image: {error}", param="image", code="invalid_image")),
        RequestRejected: lambda _, error: answer(ApiError(400, str(error), code="invalid_value")),
        ModelUnavailable: lambda _, error: answer(
            ApiError(503, f"a model is unavailable: {error}", kind="server_error", code="model_unavailable")
        ),
        Exception: lambda _, error: _unexpected(error),
        HTTPException: lambda _, error: answer(
            ApiError(error.status_code, str(error.detail), code=str(error.status_code))
        ),
    }


class _BodyLimit:
    """Bodies over the limit get 413, by their Content-Length or, without one, as they arrive (memory stays bounded)."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    def _too_large(self) -> ApiError:
        return ApiError(
            413,
            f"the body is over {self.max_bytes:,} bytes: pass a larger image as an s3:// location in a JSON body",
            code="body_too_large",
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large().response()(scope, receive, send)
            return
        received = 0

        async def bounded_receive() -> Any:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise self._too_large()
            return message

        await self.app(scope, bounded_receive, send)


async def _upload(form: Any, name: str) -> bytes:
    part = form.get(name)
    if not isinstance(part, UploadFile):
        raise ApiError(400, f"the multipart body needs a file part {name!r}", param=name, code="missing_file")
    return await part.read()


class _Calls:
    """What every route shares: the settings, the models, where recorded rows go, and the queue in front of them."""

    def __init__(
        self,
        settings: Settings,
        dependencies_of: DependenciesOf,
        record_rows: RecordRows,
        after_call: Callable[[], None],
    ) -> None:
        self.settings, self.dependencies_of, self.record_rows = settings, dependencies_of, record_rows
        self.after_call = after_call
        self.admission = Admission(settings.api_queue_size)

    async def run(self, work: Callable[[], T]) -> T:
        async with self.admission.ticket():
            try:
                return await run_in_threadpool(work)
            finally:
                self.after_call()

    def preload(self) -> None:
        """Every model, Detect first: a first annotation waits for Detect, Classify and Tag only. One after another:
        side by side on two cores, they took 1.5 s longer to the first answer (annotate bench-api)."""
        for step in (Step.DETECT, Step.CLASSIFY, Step.TAG, Step.CAPTION):
            try:
                self.dependencies_of(step)
            except ModelUnavailable as error:
                logger.warning("model unavailable", extra={"step": step, "reason": str(error)})


ANNOTATIONS_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": AnnotationCall.model_json_schema()},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["image"],
                    "properties": {
                        "image": {"type": "string", "format": "binary"},
                        "request": {"type": "string", "description": "The options (AnnotationOptions) as JSON"},
                    },
                }
            },
        },
    }
}


def _annotation_routes(calls: _Calls) -> APIRouter:
    router = APIRouter()
    settings = calls.settings

    @router.post(
        "/v1/annotations",
        response_model=Annotation,
        summary="Annotate one image: boxes, classes, attributes and a caption, as the workflow writes them",
        openapi_extra=ANNOTATIONS_BODY,
    )
    async def annotations(request: Request) -> Annotation:
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            form = await request.form(max_files=1, max_fields=1)
            source = image_source(await _upload(form, "image"), settings)
            options = AnnotationOptions.model_validate_json(str(form.get("request") or "{}"))
        else:
            call = AnnotationCall.model_validate_json(await request.body())
            options = AnnotationOptions.model_validate(call.model_dump(exclude={"image"}))
            source = await run_in_threadpool(image_source, call.image, settings)
        return await calls.run(
            lambda: annotate_one(source, options, settings, calls.dependencies_of, calls.record_rows)
        )

    return router


def _chat_arguments(body: bytes, settings: Settings) -> dict[str, Any]:
    """The request as llama-cpp-python's own type reads it, within this server's bounds."""
    from llama_cpp.server.types import CreateChatCompletionRequest  # llama-cpp-python's OpenAI request type

    checked = ChatCompletionCall.model_validate_json(body)
    # Within the model's context with room for the answer: about four characters a token, so at most half of it
    longest = settings.caption_context * 2
    if len(json.dumps([m.get("content") for m in checked.messages])) > longest:
        raise ApiError(400, f"messages: at most {longest:,} characters in all", param="messages", code="invalid_value")
    if (checked.n or 1) != 1:
        raise ApiError(400, "n: one choice per call", param="n", code="invalid_value")
    if (checked.max_tokens or 0) > settings.api_max_chat_tokens:
        raise ApiError(
            400, f"max_tokens: at most {settings.api_max_chat_tokens}", param="max_tokens", code="invalid_value"
        )
    completion = CreateChatCompletionRequest.model_validate_json(body).model_dump(exclude_none=True)
    if completion.get("tools") or completion.get("functions"):
        raise ApiError(400, "tools and functions are not supported by this model", param="tools")
    return completion | {"max_tokens": checked.max_tokens or settings.api_max_chat_tokens}


def _openai_routes(calls: _Calls) -> APIRouter:
    router = APIRouter(prefix="/v1")
    settings = calls.settings

    @router.get("/models", summary="The models this server answers with (OpenAI's list)")
    def models() -> dict[str, Any]:
        from llama_cpp.server.types import ModelData, ModelList  # llama-cpp-python's OpenAI types

        owners = {settings.caption_model: "llama.cpp", ANNOTATION_MODEL: "annotate"}
        if settings.api_images:
            owners[settings.variants_model] = "stable-diffusion.cpp"
        data = [ModelData(id=name, object="model", owned_by=owner, permissions=[]) for name, owner in owners.items()]
        return dict(ModelList(object="list", data=data))

    @router.post("/chat/completions", summary="A chat completion from the caption model; stream=true for events")
    async def chat(request: Request) -> Any:
        completion = _chat_arguments(await request.body(), settings)
        if not completion.get("stream"):
            return await calls.run(lambda: chat_completion(completion, settings.caption_model, calls.dependencies_of))
        ticket = calls.admission.ticket()
        await ticket.__aenter__()  # 429 now, before the stream's headers are sent
        try:
            chunks = await run_in_threadpool(chat_completion, completion, settings.caption_model, calls.dependencies_of)
        except BaseException:
            await ticket.__aexit__(None, None, None)
            raise

        async def events() -> AsyncIterator[bytes]:
            try:
                async for event in iterate_in_threadpool(server_sent_events(chunks)):  # type: ignore[arg-type]
                    yield event
            finally:
                await ticket.__aexit__(None, None, None)

        return StreamingResponse(events(), media_type="text/event-stream")

    return router


def _image_routes(calls: _Calls) -> APIRouter:
    router = APIRouter(prefix="/v1")
    settings = calls.settings

    def images_served() -> None:
        if not settings.api_images:
            raise ApiError(
                501, "this server makes no pictures: annotate serve does, and prompt messages with variants", code="501"
            )

    @router.post("/images/generations", summary="Pictures from a prompt (b64_json)")
    async def generations(call: ImageGeneration) -> dict[str, Any]:
        images_served()
        wanted = variants_request(call.prompt, call.n, call.size, "txt2img")
        return await calls.run(lambda: generate_pictures(wanted, None, settings, calls.dependencies_of))

    @router.post("/images/edits", summary="Pictures made from an uploaded one (b64_json)")
    async def edits(request: Request) -> dict[str, Any]:
        images_served()
        form = await request.form(max_files=1, max_fields=8)
        call = ImageEdit.model_validate({name: value for name, value in form.items() if name != "image"})
        wanted = variants_request(call.prompt, call.n, call.size, "img2img", call.strength)
        source = image_source(await _upload(form, "image"), settings)
        return await calls.run(lambda: generate_pictures(wanted, source, settings, calls.dependencies_of))

    return router


def create_app(
    settings: Settings,
    dependencies_of: DependenciesOf,
    record_rows: RecordRows,
    after_call: Callable[[], None] = metrics.clear_metrics,
) -> FastAPI:
    """The API on ``settings``' models; ``record_rows`` writes a recorded call's table rows. ``after_call``: what
    becomes of the steps' metrics after each call: dropped here; on Lambda the handler flushes them as EMF."""
    calls = _Calls(settings, dependencies_of, record_rows, after_call)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if settings.preload_models:
            # Loaded before the first call, not during it; a model that cannot load answers 503 when asked for.
            asyncio.get_running_loop().run_in_executor(None, calls.preload)
        yield

    app = FastAPI(
        title="annotate",
        summary="One image annotated now; OpenAI-compatible chat and images on the same CPU models",
        lifespan=lifespan,
        exception_handlers=_handlers(),
    )
    app.add_middleware(_BodyLimit, max_bytes=settings.api_max_body_bytes)
    authorized = [Depends(_bearer_check(settings))]
    app.include_router(_annotation_routes(calls), dependencies=authorized)
    app.include_router(_openai_routes(calls), dependencies=authorized)
    app.include_router(_image_routes(calls), dependencies=authorized)

    @app.get("/", include_in_schema=False)
    def playground() -> HTMLResponse:
        return HTMLResponse(resources.files("shared").joinpath("playground.html").read_text())

    @app.get("/health", summary="Whether the server answers, and how many calls it holds")
    def health() -> dict[str, Any]:
        return {"status": "ok", "calls_held": calls.admission.inside, "queue_size": settings.api_queue_size}

    return app


_adapters: dict[str, Any] = {}


def lambda_adapter() -> Any:
    """The app as a Lambda handler (Mangum: Function URL events to ASGI), on the settings in force; made once per
    environment (once per settings)."""
    from mangum import Mangum

    settings = get_settings()
    key = settings.model_dump_json()
    if key not in _adapters:
        _adapters.clear()
        _adapters[key] = Mangum(serving_app(settings, after_call=lambda: None), lifespan="off")
    return _adapters[key]


def serving_app(settings: Settings | None = None, after_call: Callable[[], None] = metrics.clear_metrics) -> FastAPI:
    """The API on the settings in force and the real models; a recorded call's rows are written here, or in AWS by
    the stack's WriteGroupTable function."""
    settings = settings or get_settings()

    def models(step: Step) -> Dependencies:
        return build_dependencies(step, settings)

    function = settings.write_group_table_function
    rows = rows_by_function(function) if function else rows_in_process(models)
    return create_app(settings, models, rows, after_call)
