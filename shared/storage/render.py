"""The annotated picture: boxes, labels and (where the request asked) masks drawn over the image. It is a view of the
result document over its source image, drawn where someone looks (``result_picture``); stored only where
``store_pictures`` asks."""

from __future__ import annotations

import io
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from shared.contracts import BoxMask, Detection, ImageResult, PictureFormat
from shared.settings import ImageLimits
from shared.storage.images import load_image
from shared.storage.masks import decoded
from shared.storage.objects import StoreFor

# Pillow's options per format: JPEG at 90 keeps the captions' edges clean enough to read; WebP at 80 (method 4, its
# default effort) about half a JPEG's bytes for thirty times its seconds; PNG as it was, lossless and uncompressed.
_ENCODINGS: dict[PictureFormat, dict[str, Any]] = {
    PictureFormat.JPEG: {"format": "JPEG", "quality": 90},
    PictureFormat.WEBP: {"format": "WEBP", "quality": 80, "method": 4},
    PictureFormat.PNG: {"format": "PNG", "optimize": False},
}
_PALETTE = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#bfef45"]


def encode_picture(picture: Image.Image, picture_format: PictureFormat) -> bytes:
    """``picture``'s bytes in ``picture_format``."""
    buffer = io.BytesIO()
    picture.save(buffer, **_ENCODINGS[picture_format])
    return buffer.getvalue()


def draw_detections(
    image: Image.Image,
    detections: list[Detection],
    max_side: int = 0,
    picture_format: PictureFormat = PictureFormat.JPEG,
    masks: list[BoxMask | None] | None = None,
) -> bytes:
    """The bytes of ``image`` with each detection's box and 'label score class attributes' caption (and its mask,
    tinted in its label's colour, where ``masks`` has one), in ``picture_format``; downscaled first to ``max_side``
    pixels on its longest side where it is longer (0: its own size)."""
    scale = min(1.0, max_side / max(image.size)) if max_side else 1.0
    if scale < 1.0:
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        canvas = image.resize(size, Image.Resampling.LANCZOS)
    else:
        canvas = image.copy()
    labels = sorted({d.label for d in detections})
    for detection, mask in zip(detections, masks or [None] * len(detections), strict=True):
        if mask is not None:
            color = _PALETTE[labels.index(detection.label) % len(_PALETTE)]
            _tint(canvas, mask, color)
    draw = ImageDraw.Draw(canvas)
    line = max(2, round(min(canvas.size) / 200))
    font = ImageFont.load_default(size=max(12, round(min(canvas.size) / 30)))
    for detection in detections:
        color = _PALETTE[labels.index(detection.label) % len(_PALETTE)]
        x0, y0, x1, y1 = (scale * v for v in (detection.box.x0, detection.box.y0, detection.box.x1, detection.box.y1))
        draw.rectangle((x0, y0, x1, y1), outline=color, width=line)
        text = f"{detection.label} {detection.score:.2f}"
        if detection.class_label:
            text += f" {detection.class_label}"
        if detection.attributes:
            text += " " + " ".join(attribute.value for attribute in detection.attributes)
        left, top, right, bottom = draw.textbbox((x0, y0), text, font=font)
        lift = min(bottom - top + 2 * line, y0)  # above the box when there is room
        draw.rectangle((left, top - lift, right + 2 * line, bottom - lift + line), fill=color)
        draw.text((x0 + line, y0 - lift), text, fill="white", font=font)
    return encode_picture(canvas, picture_format)


def drawn_result(
    result: ImageResult, image: Image.Image, max_side: int = 0, picture_format: PictureFormat = PictureFormat.JPEG
) -> bytes:
    """``result``'s picture over ``image``, its source as decoded for the steps (oriented as a viewer shows it)."""
    return draw_detections(
        image, result.detections, max_side, picture_format, result.masks.masks if result.masks else None
    )


def result_picture(
    result: ImageResult,
    store_for: StoreFor,
    limits: ImageLimits,
    max_side: int = 0,
    picture_format: PictureFormat = PictureFormat.JPEG,
) -> tuple[bytes, PictureFormat]:
    """The annotated picture of ``result`` and its format: the stored one where there is one, else drawn now from
    the document and its source image.

    Raises:
        ImageRejected: the source cannot be read or is no longer an image (the stored picture, where there is one,
            cannot be read).
    """
    if result.annotated_uri:
        stored = PictureFormat.of_uri(result.annotated_uri)
        return store_for(result.annotated_uri).read_bytes(result.annotated_uri), stored
    source = load_image(result.source_uri, store_for, limits)
    return drawn_result(result, source.pixels, max_side, picture_format), picture_format


def _tint(canvas: Image.Image, mask: BoxMask, color: str, opacity: float = 0.45) -> None:
    """The mask's pixels of ``canvas`` blended towards ``color`` (the mask resized to the canvas where it was
    downscaled)."""
    covered = Image.fromarray(decoded(mask) * round(255 * opacity), mode="L")
    if covered.size != canvas.size:
        covered = covered.resize(canvas.size, Image.Resampling.NEAREST)
    canvas.paste(Image.new(canvas.mode, canvas.size, color), (0, 0), covered)
