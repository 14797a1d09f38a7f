"""What the synchronous API does for one call, without HTTP: annotate one image (uploaded or named by an s3://
location), write a chat completion, generate or edit pictures. The API (shared/serving/api.py) parses and answers; this
module holds the work, on the same steps and models as the workflow (shared/pipeline/one_image.py)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from typing import Any

from PIL import Image, ImageOps
from pydantic import Field, model_validator

from shared.contracts import (
    MAX_SEARCH_TEXT_CHARS,
    AnnotationRequest,
    ImageOutcome,
    ImageResult,
    ImageTask,
    PictureFormat,
    VariantsRequest,
    WriteGroupTableInput,
)
from shared.errors import ImageRejected, RequestRejected
from shared.pipeline import steps
from shared.pipeline.batches import batch_id, image_ref
from shared.pipeline.dependencies import Dependencies, Step, steps_wanted
from shared.pipeline.one_image import annotate_image
from shared.settings import Settings
from shared.storage import layout
from shared.storage.images import decode_image
from shared.storage.objects import MemoryStore, ObjectStore, is_s3, split_s3, store_for
from shared.storage.render import drawn_result, encode_picture

NOT_KEPT_ROOT = "memory://not-kept"  # where an unrecorded call's result document and picture live, in memory
API_GROUP_ID = "g-000000"


class AnnotationOptions(AnnotationRequest):
    """The prompt message's request fields, and what the caller wants back."""

    picture: bool = Field(False, description="Add the annotated picture (base64) to the answer")
    record: bool = Field(
        False, description="Also keep the result where the workflow keeps results, with its table rows"
    )

    @model_validator(mode="after")
    def _no_variants(self) -> AnnotationOptions:
        if self.variants is not None:
            raise ValueError("variants are not made here: call /v1/images/edits, or send a prompt message")
        return self

    def request(self) -> AnnotationRequest:
        return AnnotationRequest.model_validate(self.model_dump(include=set(AnnotationRequest.model_fields)))


class AnnotationCall(AnnotationOptions):
    """``POST /v1/annotations`` as JSON: the options and the image, base64 (or a data: URI) or an s3:// location."""

    image: str = Field(min_length=1, description="The image: base64, a data: URI, or an s3:// location")


class Annotation(ImageResult):
    """The image's result document, as the workflow writes it, and the annotated picture when asked for."""

    picture_base64: str | None = Field(
        None,
        description="The annotated picture in base64 (picture=true), drawn in picture_format (or as stored:"
        " store_pictures); downscaled"
        " (picture_scale) where it would pass api_max_picture_bytes, so that an answer fits a Lambda function URL's"
        " 6 MB",
    )
    picture_media_type: str | None = Field(None, description="The picture's media type, e.g. image/jpeg")
    picture_scale: float | None = Field(
        None, description="The picture's size over the image's (1.0: full size); boxes are in the image's pixels"
    )


RecordRows = Callable[[WriteGroupTableInput], None]
DependenciesOf = Callable[[Step], Dependencies]


@dataclass(frozen=True)
class Source:
    """The image a call names: its bytes, read once, and where it lives (or would live, once recorded)."""

    uri: str
    data: bytes
    kept: bool  # already in storage (an s3:// location), so recording does not copy it
    name: str = ""  # its file name where it came from (a Label Studio upload's), which a recorded copy keeps


def image_source(image: bytes | str, settings: Settings, name: str = "") -> Source:
    """The call's image: the uploaded bytes, base64 text, or an s3:// location in a bucket the deployment reads;
    ``name``: its file name where it came from.

    Raises:
        RequestRejected: not base64, or a location this deployment does not read.
        ImageRejected: the location holds nothing, or too many bytes.
    """
    if isinstance(image, bytes):
        data = image
    elif is_s3(image):
        try:
            bucket, key = split_s3(image)
        except ValueError:
            bucket, key = "", ""
        if not (bucket and key):
            raise RequestRejected(f"{image[:80]!r} names no object: give s3://BUCKET/KEY")
        if bucket not in settings.input_buckets:
            allowed = ", ".join(settings.input_buckets) or "none: pass the image's bytes"
            raise RequestRejected(f"{image[:80]!r} is not in a bucket this deployment reads (allowed: {allowed})")
        data = store_for(image).read_bytes(image, max_bytes=settings.max_image_bytes)
        return Source(uri=image, data=data, kept=True, name=name)
    else:
        _, comma, data_part = image.partition(",")
        if image.startswith("data:") and not comma:
            raise RequestRejected("image: a data: URI has its base64 after a comma (data:image/png;base64,...)")
        encoded = data_part if image.startswith("data:") else image
        try:
            data = base64.b64decode(encoded, validate=True)
        except ValueError as error:
            raise RequestRejected("image is neither base64 nor an s3:// location") from error
    return Source(uri=f"sha256:{hashlib.sha256(data).hexdigest()[:32]}", data=data, kept=False, name=name)


def _upload_uri(results_root: str, source: Source, source_format: str) -> str:
    """Where a recorded upload is kept: by its content, under its own file name where it has one (so that labels
    reviewed elsewhere find it by that name)."""
    digest = source.uri.removeprefix("sha256:")
    if source.name:
        return layout.upload(results_root, f"{digest}/{source.name}")
    extension = {"JPEG": "jpg", "MPO": "jpg"}.get(source_format, source_format.lower())
    return layout.upload(results_root, f"{digest}.{extension}")


def annotate_one(
    source: Source,
    options: AnnotationOptions,
    settings: Settings,
    dependencies_of: DependenciesOf,
    record_rows: RecordRows,
) -> Annotation:
    """The image's result document, as the workflow would write it for the same image and request.

    Unless ``options.record``, nothing is kept: the document and picture are made in memory. With it, the upload
    is kept under ``uploads/``, the document (and, with store_pictures, the picture) where the workflow writes them,
    and its rows in the tables.

    Raises:
        ImageRejected: the bytes are not an image this pipeline accepts (checked before any model runs).
        ModelUnavailable: a model the request needs cannot be loaded.
    """
    if len(source.data) > settings.max_image_bytes:
        raise ImageRejected(f"the image is {len(source.data):,} bytes, over the limit of {settings.max_image_bytes:,}")
    decoded = decode_image(source.data, max_pixels=settings.max_image_pixels)
    request = options.request()
    root = settings.results_root if options.record else NOT_KEPT_ROOT
    source_uri = source.uri
    if options.record and not source.kept:
        source_uri = _upload_uri(root, source, decoded.source_format)
        store_for(source_uri).write_bytes(source_uri, source.data)
    read_once = MemoryStore({source_uri: source.data})

    def store_for_this_call(uri: str) -> ObjectStore:
        """The image from the bytes already read; what a call writes, in memory, or where the workflow keeps it when
        recorded."""
        return read_once if uri == source_uri or not options.record else store_for(uri)

    # Named as the workflow names an image: its location and the content its store fingerprints (exports check it).
    fingerprinting = store_for if options.record else store_for_this_call
    ref = image_ref(source_uri, fingerprinting(source_uri).fingerprint(source_uri))
    task = ImageTask(batch_id=batch_id(request, [ref]), request=request, image=ref, results_uri=root)
    needed = steps_wanted(request)
    # Loaded before the image runs: a model that cannot load is the service's failure (503), not the image's.
    dependencies = {step: replace(dependencies_of(step), store_for=store_for_this_call) for step in needed}
    result = annotate_image(task, dependencies.__getitem__, decoded)
    if options.record:
        outcome = ImageOutcome(image=ref, status=result.status, error=result.error, result_uri=result.result_uri)
        record_rows(
            WriteGroupTableInput(
                batch_id=task.batch_id,
                group_id=API_GROUP_ID,
                request=request,
                results_uri=root,
                planned_at=result.processed_at,
                outcomes=[outcome],
            )
        )
    picture, scale, media_type = None, None, None
    if options.picture and result.width is not None:  # detected: there is something to draw
        if result.annotated_uri:  # stored (store_pictures)
            drawn = store_for_this_call(result.annotated_uri).read_bytes(result.annotated_uri)
        else:
            drawn = drawn_result(result, decoded.pixels, settings.picture_max_side, settings.picture_format)
        fitted, scale, picture_format = fitted_picture(drawn, settings.api_max_picture_bytes, result.width)
        picture, media_type = base64.b64encode(fitted).decode(), picture_format.media_type
    unkept = (
        {} if options.record else {"result_uri": None, "annotated_uri": None}
    )  # memory:// means nothing to a caller
    return Annotation(
        **(result.model_dump() | unkept), picture_base64=picture, picture_media_type=media_type, picture_scale=scale
    )


def fitted_picture(stored: bytes, max_bytes: int, image_width: int) -> tuple[bytes, float, PictureFormat]:
    """The ``stored`` picture as it is when it has at most ``max_bytes``, else downscaled, in its own format, until
    it has: its size follows its pixels, so each try scales by the square root of the ratio, a tenth under it.
    Returns the picture, its width over the image's (the stored picture may be smaller already:
    ``picture_max_side``), and its format."""
    scale, fitted = 1.0, stored
    with Image.open(io.BytesIO(stored)) as picture:  # its header only: decoded where it must be downscaled
        width, picture_format = picture.width, PictureFormat(picture.format.lower())  # type: ignore[union-attr]
        while len(fitted) > max_bytes:
            scale *= 0.9 * (max_bytes / len(fitted)) ** 0.5
            size = (max(1, round(picture.width * scale)), max(1, round(picture.height * scale)))
            fitted, width = encode_picture(picture.resize(size, Image.Resampling.LANCZOS), picture_format), size[0]
    return fitted, round(width / image_width, 4), picture_format


def rows_in_process(dependencies_of: DependenciesOf) -> RecordRows:
    """Table rows written here, by the WriteGroupTable step's code (local mode)."""

    def write(table_input: WriteGroupTableInput) -> None:
        steps.write_group_table(table_input, dependencies_of(Step.WRITE_GROUP_TABLE))

    return write


def rows_by_function(function_name: str) -> RecordRows:
    """Table rows written by the stack's WriteGroupTable function (the API function ships no pyarrow)."""

    def invoke(table_input: WriteGroupTableInput) -> None:
        import boto3

        response = boto3.client("lambda").invoke(
            FunctionName=function_name, Payload=table_input.model_dump_json().encode()
        )
        if response.get("FunctionError"):
            raise RuntimeError(f"WriteGroupTable failed: {response['Payload'].read()[:500]!r}")

    return invoke


# --- OpenAI's image endpoints, on the Variants step's engine and bounds ---------------------------------------


def variants_request(prompt: str, count: int, size: str, mode: str, strength: float | None = None) -> VariantsRequest:
    """OpenAI's ``n`` and ``size`` ("512x512") as the Variants step's request, within its bounds.

    Raises:
        ValidationError: outside the Variants step's bounds.
        RequestRejected: a size that is not square.
    """
    width, _, height = size.partition("x")
    if not (re.fullmatch("[0-9]{1,5}", width) and width == height):
        raise RequestRejected(f"size {size[:20]!r}: give a square size such as 512x512")
    fields: dict[str, Any] = {"prompt": prompt, "count": count, "size": int(width), "mode": mode}
    if strength is not None:
        fields["strength"] = strength
    return VariantsRequest.model_validate(fields)


def generate_pictures(
    request: VariantsRequest, source: Source | None, settings: Settings, dependencies_of: DependenciesOf
) -> dict[str, Any]:
    """OpenAI's images response (``b64_json``) for a generation, or an edit of ``source``'s picture."""
    from shared.models.variants import SdGenerator

    generator = dependencies_of(Step.VARIANTS).generator
    if not isinstance(generator, SdGenerator):
        raise TypeError("the Variants dependencies have no stable-diffusion.cpp engine")
    init_image = None
    if source is not None:
        pixels = decode_image(source.data, max_pixels=settings.max_image_pixels).pixels
        init_image = ImageOps.fit(pixels, (request.size, request.size), method=Image.Resampling.LANCZOS)
    seed = (
        request.seed if request.seed is not None else int(hashlib.sha256(request.prompt.encode()).hexdigest()[:7], 16)
    )
    data = []
    for picture, _, _ in generator.render(request, init_image, seed):
        buffer = io.BytesIO()
        picture.save(buffer, format="PNG")
        data.append({"b64_json": base64.b64encode(buffer.getvalue()).decode(), "revised_prompt": request.prompt})
    return {"created": int(time.time()), "data": data}


# --- OpenAI's chat, on the Caption step's llama.cpp model ------------------------------------------------------

# llama-cpp-python's own server takes these out of the request before calling the model; so do we.
NOT_FOR_THE_MODEL = {"model", "n", "user", "logit_bias_type", "min_tokens", "functions", "function_call", "tools"}


def _captioner(dependencies_of: DependenciesOf) -> Any:
    from shared.models.captioning import LlamaCaptioner

    captioner = dependencies_of(Step.CAPTION).captioner
    if not isinstance(captioner, LlamaCaptioner):
        raise TypeError("the Caption dependencies have no llama.cpp model")
    return captioner


def _model_arguments(completion: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in completion.items() if name not in NOT_FOR_THE_MODEL | {"stream"}}


def chat_completion(completion: dict[str, Any], model_name: str, dependencies_of: DependenciesOf) -> dict[str, Any]:
    """llama-cpp-python's chat completion (OpenAI's shape), named as the API lists it."""
    return {**_captioner(dependencies_of).chat(_model_arguments(completion)), "model": model_name}


def chat_chunks(
    completion: dict[str, Any], model_name: str, dependencies_of: DependenciesOf
) -> Generator[dict[str, Any]]:
    """:func:`chat_completion` as OpenAI's chunks. The model is the stream's until it ends or is closed: close it."""
    return _named_chunks(_captioner(dependencies_of).chat_stream(_model_arguments(completion)), model_name)


def _named_chunks(chunks: Generator[dict[str, Any]], model_name: str) -> Generator[dict[str, Any]]:
    """The chunks named as the API lists the model; closing this closes the model's stream (it holds the model)."""
    try:
        for chunk in chunks:
            yield {**chunk, "model": model_name}
    finally:
        chunks.close()


def server_sent_event(data: dict[str, Any]) -> bytes:
    """One event of OpenAI's stream (which ends with ``data: [DONE]``)."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


MAX_EMBEDDING_INPUTS = 64


def embeddings(
    inputs: list[str],
    encoding_format: str,
    model_name: str,
    settings: Settings,
    dependencies_of: DependenciesOf,
    dimensions: int | None = None,
) -> dict[str, Any]:
    """OpenAI's embeddings answer for ``inputs`` with the Tag model's CLIP: a text's vector (the text tower, the text
    as written), or an image's given as a ``data:`` URL or an ``s3://`` location the deployment reads (the image
    tower on the whole image, as the pipeline embeds it); unit length, as floats or base64 of little-endian float32.

    ``dimensions``: as OpenAI's, where it is the model's own length (a CLIP vector is not shortened: it would no
    longer be the one the tables keep).

    Raises:
        RequestRejected: another model named, no input or too many, an empty or too long text, other dimensions.
        ImageRejected: an image input that is not an image this pipeline accepts.
    """
    import numpy as np

    tagger = dependencies_of(Step.TAG).tagger
    if tagger is None:
        raise TypeError("the Tag step's dependencies have no tagger")
    if model_name != tagger.name:
        raise RequestRejected(f"model: this server embeds with {tagger.name!r}, not {model_name[:80]!r}")
    if not 1 <= len(inputs) <= MAX_EMBEDDING_INPUTS:
        raise RequestRejected(f"input: 1 to {MAX_EMBEDDING_INPUTS} texts or images a call, not {len(inputs)}")
    vectors: list[np.ndarray | None] = [None] * len(inputs)
    images = [(i, text) for i, text in enumerate(inputs) if text.startswith("data:") or is_s3(text)]
    texts = [(i, text) for i, text in enumerate(inputs) if not (text.startswith("data:") or is_s3(text))]
    for _, text in texts:
        if not text.strip() or len(text) > MAX_SEARCH_TEXT_CHARS:
            raise RequestRejected(f"input: a text is 1 to {MAX_SEARCH_TEXT_CHARS:,} characters, not {len(text):,}")
    if texts:
        for (i, _), vector in zip(texts, tagger.embed_texts([text for _, text in texts]), strict=True):
            vectors[i] = vector
    for i, image in images:
        pixels = decode_image(image_source(image, settings).data, max_pixels=settings.max_image_pixels).pixels
        [vectors[i]] = tagger.embed_images([pixels])
    length = next(len(vector) for vector in vectors if vector is not None)
    if dimensions is not None and dimensions != length:
        raise RequestRejected(f"dimensions: {tagger.name!r} gives vectors of {length}, not {dimensions}")
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(vector.astype("<f4").tobytes()).decode()
            if encoding_format == "base64"
            else vector.tolist(),
        }
        for i, vector in enumerate(vectors)
        if vector is not None
    ]
    tokens = sum(len(text.split()) for _, text in texts)  # words: CLIP's tokenizer is the model's, not counted here
    return {
        "object": "list",
        "data": data,
        "model": tagger.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
