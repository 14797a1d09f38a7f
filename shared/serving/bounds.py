"""What every route of the API shares and is held to: its key, same-site calls only, bounded bodies, the queue in
front of the models (past it, 429), and OpenAI's error shape for every refusal."""

from __future__ import annotations

import asyncio
import base64
import hmac
import statistics
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers, UploadFile
from starlette.exceptions import HTTPException

from shared.errors import ImageRejected, ModelUnavailable, RequestRejected
from shared.observability import logger
from shared.pipeline.dependencies import DEFAULT_MODEL_STEPS
from shared.serving.calls import (
    DependenciesOf,
    RecordRows,
)
from shared.serving.secrets import secret_value
from shared.settings import Settings

T = TypeVar("T")


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


def bearer_check(settings: Settings) -> Callable[[Request], None]:
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


def validation_error(error: ValidationError | RequestValidationError) -> ApiError:
    first = error.errors()[0]
    param = ".".join(str(part) for part in first["loc"] if part not in ("body",)) or None
    message = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in error.errors()[:5])
    return ApiError(400, message, param=param, code="invalid_value")


class AnswerFailures:
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


class SameSiteOnly:
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


def error_handlers() -> dict[Any, Any]:
    def answer(error: ApiError) -> JSONResponse:
        if error.status >= 500:
            logger.error("api call failed", extra={"status": error.status, "reason": error.message})
        return error.response()

    return {
        ApiError: lambda _, error: answer(error),
        RequestValidationError: lambda _, error: answer(validation_error(error)),
        ValidationError: lambda _, error: answer(validation_error(error)),
        ImageRejected: lambda _, error: answer(ApiError(400, f"image: {error}", param="image", code="invalid_image")),
        RequestRejected: lambda _, error: answer(ApiError(400, str(error), code="invalid_value")),
        ModelUnavailable: lambda _, error: answer(
            ApiError(503, f"a model is unavailable: {error}", kind="server_error", code="model_unavailable")
        ),
        HTTPException: lambda _, error: answer(
            error.error
            if isinstance(error, BodyTooLarge)
            else ApiError(error.status_code, str(error.detail), code=str(error.status_code))
        ),
    }


class BodyTooLarge(HTTPException):
    """A body found over the limit as it arrives (sent chunked, with no Content-Length). An HTTPException, since
    FastAPI answers any other error raised while it reads a body as 400 "There was an error parsing the body"
    (fastapi/routing.py) and passes an HTTPException on as it is."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.status, error.message)
        self.error = error


class BodyLimit:
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
                raise BodyTooLarge(self._too_large())
            return message

        await self.app(scope, bounded_receive, send)


async def upload(form: Any, name: str) -> bytes:
    part = form.get(name)
    if not isinstance(part, UploadFile):
        raise ApiError(400, f"the multipart body needs a file part {name!r}", param=name, code="missing_file")
    return await part.read()


class ApiContext:
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
        """Every model a request with the defaults runs, Detect first (masks load with the first call that asks for
        them): a first annotation waits for Detect, Classify and Tag only. One after another:
        side by side on two cores, they took 1.5 s longer to the first answer (annotate bench-api)."""
        for step in DEFAULT_MODEL_STEPS:
            try:
                self.dependencies_of(step)
            except ModelUnavailable as error:
                logger.warning("model unavailable", extra={"step": step, "reason": str(error)})
