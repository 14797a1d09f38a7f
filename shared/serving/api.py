"""The synchronous API: one image annotated now, and OpenAI-compatible chat and images, on the workflow's models.

One ASGI app (FastAPI) serves both places: `annotate serve` runs it on uvicorn, and the API function runs it on Lambda
through Mangum (:func:`lambda_adapter`), so the routes, bounds and errors are the same code. Model work runs one call
at a time (each model already uses every core); calls beyond that wait in a bounded queue, and past it get 429.

Here: the annotation route, the page, /health and the app put together; its bounds are in bounds.py, its
OpenAI-compatible routes in openai_routes.py, Label Studio's in label_studio_backend.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from shared.contracts import MAX_SEARCH_TEXT_CHARS
from shared.observability import metrics
from shared.pipeline.dependencies import Dependencies, Step, build_dependencies
from shared.serving.bounds import (
    AnswerFailures,
    ApiContext,
    ApiError,
    BodyLimit,
    SameSiteOnly,
    bearer_check,
    error_handlers,
    upload,
)
from shared.serving.calls import (
    Annotation,
    AnnotationCall,
    AnnotationOptions,
    DependenciesOf,
    RecordRows,
    annotate_one,
    image_source,
    rows_by_function,
    rows_in_process,
)
from shared.serving.label_studio_backend import FindAnnotated, label_studio_routes
from shared.serving.openai_routes import image_routes, openai_routes
from shared.settings import Settings, get_settings

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


# The images nearest a vector in the rows the pipeline wrote: (model, revision, vector, limit) -> hits, best first,
# each with source_uri, score, labels and caption. annotate serve gives it over its data dir (tools/results/search.py).
FindSimilar = Callable[[str, str, list[float], int], list[dict[str, Any]]]


class SearchCall(BaseModel):
    """``POST /v1/search``: a phrase, and how many images."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=MAX_SEARCH_TEXT_CHARS)
    limit: int = Field(10, ge=1, le=100)


def _search_routes(context: ApiContext, find_similar: FindSimilar | None) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/search", summary="The annotated images nearest a phrase, by their CLIP embeddings")
    async def search_images(call: SearchCall) -> dict[str, Any]:
        if find_similar is None:
            raise ApiError(501, "this server has no annotated images to search: annotate serve searches its data dir")
        if not call.query.strip():
            raise ApiError(400, "query: say what to look for", param="query", code="invalid_value")

        def nearest() -> dict[str, Any]:
            tagger = context.dependencies_of(Step.TAG).tagger
            if tagger is None:
                raise TypeError("the Tag step's dependencies have no tagger")
            [vector] = tagger.embed_texts([call.query])
            return {
                "model": tagger.name,
                "data": find_similar(tagger.name, tagger.revision, vector.tolist(), call.limit),
            }

        return await context.run(nearest)

    return router


def _annotation_routes(context: ApiContext) -> APIRouter:
    router = APIRouter()
    settings = context.settings

    @router.post(
        "/v1/annotations",
        response_model=Annotation,
        summary="Annotate one image: boxes, classes, attributes and a caption, as the workflow writes them",
        openapi_extra=ANNOTATIONS_BODY,
    )
    async def annotations(request: Request) -> Annotation:
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            form = await request.form(max_files=1, max_fields=1)
            source = image_source(await upload(form, "image"), settings)
            options = AnnotationOptions.model_validate_json(str(form.get("request") or "{}"))
        else:
            call = AnnotationCall.model_validate_json(await request.body())
            options = AnnotationOptions.model_validate(call.model_dump(exclude={"image"}))
            source = await run_in_threadpool(image_source, call.image, settings)
        return await context.run(
            lambda: annotate_one(source, options, settings, context.dependencies_of, context.record_rows)
        )

    return router


def create_app(
    settings: Settings,
    dependencies_of: DependenciesOf,
    record_rows: RecordRows,
    after_call: Callable[[], None] = metrics.clear_metrics,
    behind_function_url: bool = False,
    find_annotated: FindAnnotated | None = None,
    find_similar: FindSimilar | None = None,
) -> FastAPI:
    """The API on ``settings``' models; ``record_rows`` writes a recorded call's table rows, ``find_annotated`` reads
    the rows the pipeline wrote (Label Studio's tasks are answered from them), ``find_similar`` searches them.
    ``after_call``: what becomes of the steps' metrics after each call: dropped here; on Lambda the handler flushes
    them as EMF.
    ``behind_function_url``: every call was authenticated before it arrived (the URL's IAM auth, or the key), and
    it is named by the URL's own host."""
    context = ApiContext(settings, dependencies_of, record_rows, after_call)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if settings.preload_models:
            # Loaded before the first call, not during it; a model that cannot load answers 503 when asked for.
            asyncio.get_running_loop().run_in_executor(None, context.preload)
        yield

    app = FastAPI(
        title="annotate",
        summary="One image annotated now; OpenAI-compatible chat and images on the same CPU models",
        lifespan=lifespan,
        exception_handlers=error_handlers(),
    )
    app.add_middleware(AnswerFailures)
    app.add_middleware(BodyLimit, max_bytes=settings.api_max_body_bytes)
    app.add_middleware(
        SameSiteOnly,
        hosts=frozenset(settings.api_hosts),
        authenticated=behind_function_url or bool(settings.api_key_secret or settings.api_key.get_secret_value()),
    )
    authorized = [Depends(bearer_check(settings))]
    app.include_router(_annotation_routes(context), dependencies=authorized)
    app.include_router(openai_routes(context), dependencies=authorized)
    app.include_router(image_routes(context), dependencies=authorized)
    app.include_router(label_studio_routes(context, find_annotated), dependencies=authorized)
    app.include_router(_search_routes(context, find_similar), dependencies=authorized)

    @app.get("/", include_in_schema=False)
    def playground() -> HTMLResponse:
        page = resources.files("shared.serving").joinpath("playground.html").read_text()
        return HTMLResponse(page.replace("{{ max_body_bytes }}", str(settings.api_max_body_bytes)))

    @app.get("/health", summary="Whether the server answers (UP, as Label Studio's ML backends say), its calls held")
    def health() -> dict[str, Any]:
        return {"status": "UP", "calls_held": context.admission.inside, "queue_size": settings.api_queue_size}

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
    find_annotated: FindAnnotated | None = None,
    find_similar: FindSimilar | None = None,
) -> FastAPI:
    """The API on the settings in force and the real models; a recorded call's rows are written here, or in AWS by
    the stack's WriteGroupTable function; ``find_annotated`` reads the rows the pipeline wrote, ``find_similar``
    searches them."""
    settings = settings or get_settings()

    def models(step: Step) -> Dependencies:
        return build_dependencies(step, settings)

    function = settings.write_group_table_function
    rows = rows_by_function(function) if function else rows_in_process(models)
    return create_app(settings, models, rows, after_call, behind_function_url, find_annotated, find_similar)
