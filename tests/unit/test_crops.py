from __future__ import annotations

from PIL import Image

from shared.contracts import Box
from shared.pipeline.crops import crop_boxes

IMAGE = Image.new("RGB", (100, 80))


def test_crops_grow_by_the_margin_of_the_box_size() -> None:
    [crop] = crop_boxes(IMAGE, [Box(x0=40, y0=30, x1=60, y1=50)], margin=0.1)
    assert isinstance(crop, Image.Image)
    assert crop.size == (24, 24)


def test_crops_are_clipped_to_the_image() -> None:
    [crop] = crop_boxes(IMAGE, [Box(x0=90, y0=70, x1=140, y1=120)], margin=0.0)
    assert isinstance(crop, Image.Image)
    assert crop.size == (10, 10)


def test_boxes_outside_the_image_or_degenerate_are_skipped_with_a_reason() -> None:
    outside, flat, good = crop_boxes(
        IMAGE, [Box(x0=200, y0=200, x1=300, y1=300), Box(x0=10, y0=10, x1=50, y1=10.4), Box(x0=0, y0=0, x1=5, y1=5)], 0
    )
    assert isinstance(outside, str) and "outside the image" in outside
    assert isinstance(flat, str) and "too small" in flat
    assert isinstance(good, Image.Image)
