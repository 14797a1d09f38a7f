"""What Grounding DINO's processor does to an image's size, which exported size holds it, and how much two boxes
overlap: plain arithmetic that the settings (the sizes to export), the exported detector, evaluate and the benches
share."""

from __future__ import annotations

from typing import Protocol

ImageSize = tuple[int, int]  # (height, width)


def resized_size(height: int, width: int, short_side: int, longest_edge: int) -> ImageSize:
    """The (height, width) the model card's processor resizes an image to: the short side to ``short_side``
    unless that makes the long side longer than ``longest_edge`` (transformers' ``get_size_with_aspect_ratio``)."""
    size, raw_size = short_side, None
    short, long = float(min(height, width)), float(max(height, width))
    if long / short * size > longest_edge:
        raw_size = longest_edge * short / long
        size = round(raw_size)
    if (height <= width and height == size) or (width <= height and width == size):
        return height, width
    scaled = raw_size if raw_size is not None else size
    if width < height:
        return int(scaled * height / width), size
    return size, int(scaled * width / height)


def smallest_holding(sizes: list[ImageSize], needed: ImageSize) -> ImageSize | None:
    """The exported size of least area that holds an image of ``needed`` size, if any does."""
    holding = [size for size in sizes if size[0] >= needed[0] and size[1] >= needed[1]]
    return min(holding, key=lambda size: (size[0] * size[1], size)) if holding else None


class Corners(Protocol):
    """A box by its corners, in pixels: a detection's :class:`~shared.contracts.Box`, a labelled box of an export."""

    @property
    def x0(self) -> float: ...
    @property
    def y0(self) -> float: ...
    @property
    def x1(self) -> float: ...
    @property
    def y1(self) -> float: ...


def iou(a: Corners, b: Corners) -> float:
    """Intersection over union; 0 for two boxes without area."""
    overlap = max(0.0, min(a.x1, b.x1) - max(a.x0, b.x0)) * max(0.0, min(a.y1, b.y1) - max(a.y0, b.y0))
    union = (a.x1 - a.x0) * (a.y1 - a.y0) + (b.x1 - b.x0) * (b.y1 - b.y0) - overlap
    return overlap / union if union > 0 else 0.0
