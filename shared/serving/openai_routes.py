"""The API's OpenAI-compatible routes: chat completions (streamed as server-sent events, a stream abandoned by its
caller closed so the models are free again), embeddings, image generations and edits, and the models list."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

from shared.errors import ModelUnavailable
from shared.observability import logger
from shared.pipeline.dependencies import Step
from shared.serving.bounds import ApiContext, ApiError, upload
from shared.serving.calls import (
    chat_chunks,
    chat_completion,
    embeddings,
    generate_pictures,
    image_source,
    server_sent_event,
    variants_request,
)
from shared.settings import Settings

STREAM_END = b"data: [DONE]\n\n"


ANNOTATION_MODEL = "annotate"  # the id /v1/models lists for the annotation pipeline (detect, classify, tag)


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


class EmbeddingsCall(BaseModel):
    """``POST /v1/embeddings``: OpenAI's fields; an input that is a ``data:`` URL or an ``s3://`` location is an
    image (this server's own reading: CLIP embeds both into one space)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: str | list[str]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ImageUrl(BaseModel):
    url: str = Field(description="A data: URL of the picture (this server fetches no other URL)")
    detail: str | None = None


class ImagePart(BaseModel):
    type: Literal["image_url"]
    image_url: ImageUrl


class ChatMessage(BaseModel):
    """One message as this model reads it: a role and text (a string, or OpenAI's text parts), and pictures
    (``image_url`` parts) where the chat model sees them."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart | ImagePart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if isinstance(part, TextPart))

    def images(self) -> list[ImagePart]:
        return [] if isinstance(self.content, str) else [part for part in self.content if isinstance(part, ImagePart)]


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
    pictures = [image for message in checked.messages for image in message.images()]
    if pictures and not (settings.caption_vision or settings.caption_mmproj):
        raise ApiError(
            400, "messages: this server's chat model sees no image (serve it with --caption-vision)", param="messages"
        )
    if any(not image.image_url.url.startswith("data:image/") for image in pictures):
        raise ApiError(400, "image_url: a data:image/... URL (this server fetches none)", param="messages")
    messages = [
        message.model_dump(exclude_none=True) | ({} if message.images() else {"content": message.text()})
        for message in checked.messages
    ]
    return completion | {"messages": messages, "max_tokens": limit or settings.api_max_chat_tokens}


def chat_model(settings: Settings) -> str:
    """The model /v1/chat/completions answers with: the vision-language one where captions see the image."""
    return settings.caption_vision_model if settings.caption_vision else settings.caption_model


def openai_routes(context: ApiContext) -> APIRouter:
    router = APIRouter(prefix="/v1")
    settings = context.settings

    @router.get("/models", summary="The models this server answers with (OpenAI's list)")
    def models() -> dict[str, Any]:
        from llama_cpp.server.types import ModelData, ModelList  # llama-cpp-python's OpenAI types

        owners = {chat_model(settings): "llama.cpp", ANNOTATION_MODEL: "annotate"}
        embedding_model = _loaded_clip(context)
        if embedding_model:
            owners[embedding_model] = "open_clip"  # /v1/embeddings': the one that loaded, not those passed over
        if settings.api_images:
            owners[settings.variants_model] = "stable-diffusion.cpp"
        data = [ModelData(id=name, object="model", owned_by=owner, permissions=[]) for name, owner in owners.items()]
        return dict(ModelList(object="list", data=data))

    @router.post("/embeddings", summary="CLIP embeddings of texts and images (data: URLs, s3:// locations)")
    async def embed(call: EmbeddingsCall) -> dict[str, Any]:
        if call.model != await run_in_threadpool(_loaded_clip, context):
            # OpenAI's answer to a model it does not have
            raise ApiError(404, f"The model `{call.model[:80]}` does not exist", param="model", code="model_not_found")
        inputs = [call.input] if isinstance(call.input, str) else call.input
        return await context.run(
            lambda: embeddings(
                inputs, call.encoding_format, call.model, settings, context.dependencies_of, call.dimensions
            )
        )

    @router.post("/chat/completions", summary="A chat completion from the caption model; stream=true for events")
    async def chat(request: Request) -> Any:
        completion = _chat_arguments(await request.body(), settings)
        if not completion.get("stream"):
            return await context.run(lambda: chat_completion(completion, chat_model(settings), context.dependencies_of))
        await context.admission.enter()  # 429 now, before the stream's headers are sent
        chunks: Generator[dict[str, Any]] | None = None
        try:
            chunks = await run_in_threadpool(chat_chunks, completion, chat_model(settings), context.dependencies_of)
            # The first chunk before the headers: a failure to start is answered with its status, not a 200
            first = await run_in_threadpool(_next_or_none, chunks)
        except BaseException:
            _close_stream(chunks, context)
            raise
        stream = chunks
        return _EventStream(_events(first, stream), release=lambda: _close_stream(stream, context))

    return router


def _loaded_clip(context: ApiContext) -> str | None:
    """The CLIP model /v1/embeddings answers with: the first of the settings' that loads (None: none does)."""
    try:
        tagger = context.dependencies_of(Step.TAG).tagger
    except ModelUnavailable:
        return None
    return tagger.name if tagger else None


def _next_or_none(chunks: Iterator[dict[str, Any]]) -> dict[str, Any] | None:
    return next(chunks, None)


def _close_stream(chunks: Generator[dict[str, Any]] | None, context: ApiContext) -> None:
    """Close the model's stream (its generator holds the model) and give the models to the next call."""
    try:
        if chunks is not None:
            chunks.close()
    finally:
        context.after_call()
        context.admission.leave()


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


def image_routes(context: ApiContext) -> APIRouter:
    router = APIRouter(prefix="/v1")
    settings = context.settings

    def images_served() -> None:
        if not settings.api_images:
            raise ApiError(
                501, "this server makes no pictures: annotate serve does, and prompt messages with variants", code="501"
            )

    @router.post("/images/generations", summary="Pictures from a prompt (b64_json)")
    async def generations(call: ImageGeneration) -> dict[str, Any]:
        images_served()
        wanted = variants_request(call.prompt, call.n, call.size, "txt2img")
        return await context.run(lambda: generate_pictures(wanted, None, settings, context.dependencies_of))

    @router.post("/images/edits", summary="Pictures made from an uploaded one (b64_json)")
    async def edits(request: Request) -> dict[str, Any]:
        images_served()
        form = await request.form(max_files=1, max_fields=8)
        call = ImageEdit.model_validate({name: value for name, value in form.items() if name != "image"})
        wanted = variants_request(call.prompt, call.n, call.size, "img2img", call.strength)
        source = image_source(await upload(form, "image"), settings)
        return await context.run(lambda: generate_pictures(wanted, source, settings, context.dependencies_of))

    return router
