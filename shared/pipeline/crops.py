"""Crops of detected boxes, with a margin, taken from the decoded original."""

from __future__ import annotations

from PIL import Image

from shared.contracts import Box

MIN_CROP_SIDE = 2


def crop_boxes(image: Image.Image, boxes: list[Box], margin: float) -> list[Image.Image | str]:
    """Per box, its crop (grown by ``margin`` of its size on each side, clipped to the image) or why it has none."""
    crops: list[Image.Image | str] = []
    for box in boxes:
        grow_x, grow_y = (box.x1 - box.x0) * margin, (box.y1 - box.y0) * margin
        left, top = max(0, round(box.x0 - grow_x)), max(0, round(box.y0 - grow_y))
        right, bottom = min(image.width, round(box.x1 + grow_x)), min(image.height, round(box.y1 + grow_y))
        if right - left < MIN_CROP_SIDE or bottom - top < MIN_CROP_SIDE:
            crops.append(f"box ({box.x0:g}, {box.y0:g}, {box.x1:g}, {box.y1:g}) is outside the image or too small")
        else:
            crops.append(image.crop((left, top, right, bottom)))
    return crops
