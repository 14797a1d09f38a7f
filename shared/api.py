"""The synchronous API: one image annotated now, and OpenAI-compatible chat and images, on the workflow's models.

One ASGI app (FastAPI) serves both places: `annotate serve` runs it on uvicorn, and the API function runs it on Lambda
through Mangum (:func:`lambda_adapter`), so the routes, bounds and errors are the same code. Model work runs one call
at a time (each model already uses every core); calls beyond that wait in a bounded queue, and past it get 429.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import statistics
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.datastructures import Headers, UploadFile
from starlette.exceptions import HTTPException

from shared.dependencies import Dependencies, Step, build_dependencies
from shared.errors import ImageRejected, ModelUnavailable, RequestRejected
from shared.label_studio_backend import label_studio_routes
from shared.observability import logger, metrics
from shared.secrets import secret_value
from shared.serving import (
    Annotation,
    AnnotationCall,
    AnnotationOptions,
    DependenciesOf,
    RecordRows,
    annotate_one,
    chat_chunks,
    chat_completion,
    generate_pictures,
    image_source,
    rows_by_function,
    rows_in_process,
    server_sent_event,
    variants_request,
)
from shared.settings import Settings, get_settings

T = TypeVar("T")
STREAM_END = b"data: [DONE]\n\n"
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

    def body(self) -> dict[str, Any]:
        return {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.body()}, status_code=self.status, headers=self.headers)


class Admission:
    """One model call at a time, ``waiting`` more queued; past them, 429 with the seconds the queue needs."""

    def __init__(self, waiting: int) -> None:
        self._running = asyncio.Semaphore(1)
        self._limit = 1 + waiting
        self._inside = 0
        self._seconds: deque[float] = deque([1.0], maxlen=32)  # recent calls' durations, for Retry-After
        self._started = 0.0

    @property
    def inside(self) -> int:
        return self._inside

    def retry_after(self) -> int:
        return max(1, round(statistics.median(self._seconds) * self._inside))

    async def enter(self) -> None:
        """Wait for the models. Raises ApiError(429) at once when the queue is full."""
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
            await self._running.acquire()
        except BaseException:  # a caller that left while queued holds nothing
            self._inside -= 1
            raise
        self._started = time.monotonic()

    def leave(self) -> None:
        """Give the models to the next call; synchronous, so that a stream's end releases them wherever it ends."""
        self._seconds.append(time.monotonic() - self._started)
        self._running.release()
        self._inside -= 1

    @asynccontextmanager
    async def ticket(self) -> AsyncIterator[None]:
        """Held for the whole call."""
        await self.enter()
        try:
            yield
        finally:
            self.leave()


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


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message as this model reads it: a role and text (a string, or OpenAI's text parts)."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatCompletionCall(BaseModel):
    """The fields checked before llama-cpp-python's own request type reads the rest."""

    model_config = ConfigDict(extra="allow")

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="OpenAI's current name for max_tokens")
    n: int | None = 1
    stream: bool = False
    logprobs: bool | None = None
    top_logprobs: int | None = None
    grammar: Any = None  # llama.cpp's own field, not OpenAI's: refused

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def _bearer_check(settings: Settings) -> Callable[[Request], None]:
    def check(request: Request) -> None:
        expected = api_key(settings)
        if not expected:
            return
        scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() == "basic":  # Label Studio's ML backend connection: the key as the basic auth password
            given = _basic_password(given)
        elif scheme.lower() != "bearer":  # RFC 6750: the scheme is case-insensitive, and it is required
            given = ""
        # constant time: no key guessed by timing
        if not hmac.compare_digest(given.strip().encode(), expected.encode()):
            raise ApiError(401, "a valid API key is required: Authorization: Bearer <key>", code="invalid_api_key")

    return check


def _basic_password(credentials: str) -> str:
    """The password of HTTP basic credentials (RFC 7617: base64 of user:password); '' when malformed."""
    try:
        return base64.b64decode(credentials.strip(), validate=True).decode().partition(":")[2]
    except ValueError:
        return ""


def api_key(settings: Settings) -> str:
    """The key calls must carry: the settings' own, or the stack's secret (read once per process); '' for none."""
    if settings.api_key_secret:
        return secret_value(settings.api_key_secret)
    return settings.api_key.get_secret_value()


def _validation_error(error: ValidationError | RequestValidationError) -> ApiError:
    first = error.errors()[0]
    param = ".".join(str(part) for part in first["loc"] if part not in ("body",)) or None
    message = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in error.errors()[:5])
    return ApiError(400, message, param=param, code="invalid_value")


class _AnswerFailures:
    """A failure of the server's own is a 500 in OpenAI's shape on a connection that stays open (Starlette's own
    last resort answers and then re-raises, which makes the server drop the client's keep-alive connection)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        started = False

        async def watched_send(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except Exception as error:
            if started or scope["type"] != "http":
                raise
            logger.error("api call failed", exc_info=error)
            failure = ApiError(
                500, f"the server failed ({type(error).__name__}); its log has the details", kind="server_error"
            )
            await failure.response()(scope, receive, send)


# What each route reads from a body. A browser sends text/plain, form-urlencoded and multipart bodies to any site
# without asking first (a "simple" request): a page elsewhere could make it call the models. JSON is never sent
# cross-site without a CORS preflight, which this server does not answer; multipart is checked by its Origin.
BODY_TYPES = {
    "/v1/annotations": ("application/json", "multipart/form-data"),
    "/v1/chat/completions": ("application/json",),
    "/v1/images/generations": ("application/json",),
    "/v1/images/edits": ("multipart/form-data",),
    "/setup": ("application/json",),
    "/predict": ("application/json",),
    "/webhook": ("application/json",),
}
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})


class _SameSiteOnly:
    """Calls from this server's own pages and from programs only: a body of the type its route reads; no ``Origin``
    but the server's own; and, where calls need no key, a ``Host`` the server is named by (a DNS-rebinding page
    names its own, and only a key it cannot know would stop it then).
    """

    def __init__(self, app: Any, hosts: frozenset[str], authenticated: bool) -> None:
        self.app, self.hosts, self.authenticated = app, LOOPBACK_NAMES | hosts, authenticated

    def refusal(self, scope: Any) -> ApiError | None:
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if not self.authenticated and urlsplit(f"//{host}").hostname not in {h.strip("[]") for h in self.hosts}:
            return ApiError(403, f"Host {host[:80]!r} is not a name this server answers to", code="host_not_allowed")
        origin = headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != host:
            return ApiError(
                403,
                f"calls from {origin[:80]!r} are not accepted: only this server's own pages",
                code="origin_not_allowed",
            )
        accepted = BODY_TYPES.get(scope["path"])
        if scope["method"] == "POST" and accepted:
            media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if media_type not in accepted:
                return ApiError(
                    415,
                    f"Content-Type {media_type or 'none'!r}: {scope['path']} reads {' or '.join(accepted)}",
                    code="unsupported_media_type",
                )
        return None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        refused = self.refusal(scope) if scope["type"] == "http" else None
        if refused is not None:
            logger.warning("call refused", extra={"status": refused.status, "reason": refused.message})
            await refused.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)


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
    """The request as llama-cpp-python's own type reads it, within this server's bounds; every caller's mistake is
    found here, before a stream starts."""
    from llama_cpp.server.types import CreateChatCompletionRequest  # llama-cpp-python's OpenAI request type

    checked = ChatCompletionCall.model_validate_json(body)
    # Within the model's context with room for the answer: about four characters a token, so at most half of it
    longest = settings.caption_context * 2
    if sum(len(message.text()) for message in checked.messages) > longest:
        raise ApiError(400, f"messages: at most {longest:,} characters in all", param="messages", code="invalid_value")
    if (checked.n or 1) != 1:
        raise ApiError(400, "n: one choice per call", param="n", code="invalid_value")
    limit = checked.token_limit
    if (limit or 0) > settings.api_max_chat_tokens:
        name = "max_completion_tokens" if checked.max_completion_tokens else "max_tokens"
        raise ApiError(400, f"{name}: at most {settings.api_max_chat_tokens}", param=name, code="invalid_value")
    if checked.logprobs or checked.top_logprobs is not None:
        raise ApiError(400, "logprobs: this server returns no log probabilities", param="logprobs")
    if checked.grammar is not None:
        raise ApiError(400, "grammar: not part of OpenAI's API; ask for response_format instead", param="grammar")
    completion = CreateChatCompletionRequest.model_validate_json(body).model_dump(exclude_none=True)
    if completion.get("tools") or completion.get("functions"):
        raise ApiError(400, "tools and functions are not supported by this model", param="tools")
    messages = [message.model_dump(exclude_none=True) | {"content": message.text()} for message in checked.messages]
    return completion | {"messages": messages, "max_tokens": limit or settings.api_max_chat_tokens}


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
        await calls.admission.enter()  # 429 now, before the stream's headers are sent
        chunks: Generator[dict[str, Any]] | None = None
        try:
            chunks = await run_in_threadpool(chat_chunks, completion, settings.caption_model, calls.dependencies_of)
            # The first chunk before the headers: a failure to start is answered with its status, not a 200
            first = await run_in_threadpool(_next_or_none, chunks)
        except BaseException:
            _close_stream(chunks, calls)
            raise
        stream = chunks
        return _EventStream(_events(first, stream), release=lambda: _close_stream(stream, calls))

    return router


def _next_or_none(chunks: Iterator[dict[str, Any]]) -> dict[str, Any] | None:
    return next(chunks, None)


def _close_stream(chunks: Generator[dict[str, Any]] | None, calls: _Calls) -> None:
    """Close the model's stream (its generator holds the model) and give the models to the next call."""
    try:
        if chunks is not None:
            chunks.close()
    finally:
        calls.after_call()
        calls.admission.leave()


class _EventStream(StreamingResponse):
    """Server-sent events that release what they hold when the response ends, however it ends: sent whole, failed,
    or abandoned by a client that closed the stream or the connection (Starlette then ends this call)."""

    def __init__(self, content: AsyncIterator[bytes], release: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


async def _events(first: dict[str, Any] | None, chunks: Iterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """OpenAI's stream of ``first`` and the rest; a failure once it has started is an error event, as OpenAI sends."""
    try:
        if first is not None:
            yield server_sent_event(first)
            async for chunk in iterate_in_threadpool(chunks):
                yield server_sent_event(chunk)
    except Exception as error:
        logger.error("chat stream failed", exc_info=error)
        failure = ApiError(500, f"the stream failed ({type(error).__name__})", kind="server_error")
        yield server_sent_event({"error": failure.body()})
        return
    yield STREAM_END


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
    behind_function_url: bool = False,
) -> FastAPI:
    """The API on ``settings``' models; ``record_rows`` writes a recorded call's table rows. ``after_call``: what
    becomes of the steps' metrics after each call: dropped here; on Lambda the handler flushes them as EMF.
    ``behind_function_url``: every call was authenticated before it arrived (the URL's IAM auth, or the key), and
    it is named by the URL's own host."""
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
    app.add_middleware(_AnswerFailures)
    app.add_middleware(_BodyLimit, max_bytes=settings.api_max_body_bytes)
    app.add_middleware(
        _SameSiteOnly,
        hosts=frozenset(settings.api_hosts),
        authenticated=behind_function_url or bool(settings.api_key_secret or settings.api_key.get_secret_value()),
    )
    authorized = [Depends(_bearer_check(settings))]
    app.include_router(_annotation_routes(calls), dependencies=authorized)
    app.include_router(_openai_routes(calls), dependencies=authorized)
    app.include_router(_image_routes(calls), dependencies=authorized)
    app.include_router(
        label_studio_routes(
            settings,
            calls.run,
            lambda source, options: annotate_one(source, options, settings, calls.dependencies_of, calls.record_rows),
        ),
        dependencies=authorized,
    )

    @app.get("/", include_in_schema=False)
    def playground() -> HTMLResponse:
        page = resources.files("shared").joinpath("playground.html").read_text()
        return HTMLResponse(page.replace("{{ max_body_bytes }}", str(settings.api_max_body_bytes)))

    @app.get("/health", summary="Whether the server answers (UP, as Label Studio's ML backends say), its calls held")
    def health() -> dict[str, Any]:
        return {"status": "UP", "calls_held": calls.admission.inside, "queue_size": settings.api_queue_size}

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
        _adapters[key] = Mangum(
            serving_app(settings, after_call=lambda: None, behind_function_url=True), lifespan="off"
        )
    return _adapters[key]


def serving_app(
    settings: Settings | None = None,
    after_call: Callable[[], None] = metrics.clear_metrics,
    behind_function_url: bool = False,
) -> FastAPI:
    """The API on the settings in force and the real models; a recorded call's rows are written here, or in AWS by
    the stack's WriteGroupTable function."""
    settings = settings or get_settings()

    def models(step: Step) -> Dependencies:
        return build_dependencies(step, settings)

    function = settings.write_group_table_function
    rows = rows_by_function(function) if function else rows_in_process(models)
    return create_app(settings, models, rows, after_call, behind_function_url)
