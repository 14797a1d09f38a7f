"""The annotated picture: boxes and labels drawn over the image."""

from __future__ import annotations

import io

from PIL import Image, ImageDraw, ImageFont

from shared.contracts import Detection

_PALETTE = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#bfef45"]


def draw_detections(image: Image.Image, detections: list[Detection]) -> bytes:
    """PNG bytes of ``image`` with each detection's box and 'label score class attributes' caption."""
    canvas = image.copy()
    draw = ImageDraw.Draw(canvas)
    line = max(2, round(min(canvas.size) / 200))
    font = ImageFont.load_default(size=max(12, round(min(canvas.size) / 30)))
    labels = sorted({d.label for d in detections})
    for detection in detections:
        color = _PALETTE[labels.index(detection.label) % len(_PALETTE)]
        box = detection.box
        draw.rectangle((box.x0, box.y0, box.x1, box.y1), outline=color, width=line)
        text = f"{detection.label} {detection.score:.2f}"
        if detection.class_label:
            text += f" {detection.class_label}"
        if detection.attributes:
            text += " " + " ".join(attribute.value for attribute in detection.attributes)
        left, top, right, bottom = draw.textbbox((box.x0, box.y0), text, font=font)
        lift = min(bottom - top + 2 * line, box.y0)  # above the box when there is room
        draw.rectangle((left, top - lift, right + 2 * line, bottom - lift + line), fill=color)
        draw.text((box.x0 + line, box.y0 - lift), text, fill="white", font=font)
    buffer = io.BytesIO()
    canvas.save(buffer, format="PNG", optimize=False)
    return buffer.getvalue()
