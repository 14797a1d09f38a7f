"""Masks as they are stored: COCO's compressed run-length encoding, written and read by pycocotools (COCO's own
code, which COCO's tools, Label Studio's converters and evaluators read), not a codec of our own."""

from __future__ import annotations

from typing import cast

import numpy as np

from shared.contracts import BoxMask


def encoded(mask: np.ndarray, score: float) -> BoxMask:
    """A mask as COCO's compressed run-length encoding (pycocotools), with its area and the model's score."""
    from pycocotools import mask as coco_mask

    rle = coco_mask.encode(np.asfortranarray(mask))
    return BoxMask(
        counts=rle["counts"].decode("ascii"),
        height=int(rle["size"][0]),
        width=int(rle["size"][1]),
        area=int(coco_mask.area(rle)),
        score=round(min(max(score, 0.0), 1.0), 4),
    )


def decoded(mask: BoxMask) -> np.ndarray:
    """A stored mask as a (height, width) array of 0 and 1."""
    from pycocotools import mask as coco_mask

    return np.asarray(coco_mask.decode({"size": [mask.height, mask.width], "counts": mask.counts.encode("ascii")}))


def outlines(mask: BoxMask) -> list[list[tuple[float, float]]]:
    """The mask's outer outlines as polygons of (x, y) image coordinates (a pixel's corners at whole numbers),
    the largest first: contourpy traces the mask's 0.5 level, within the mask's extent only. For YOLO's
    segmentation lines and Label Studio's PolygonLabels; holes are not kept (neither format has them)."""
    from contourpy import contour_generator

    pixels = decoded(mask)
    rows, columns = np.nonzero(pixels)
    if rows.size == 0:
        return []
    top, left = int(rows.min()), int(columns.min())
    window = np.pad(pixels[top : int(rows.max()) + 1, left : int(columns.max()) + 1], 1).astype(np.float64)
    lines = cast(list[np.ndarray], contour_generator(z=window).lines(0.5))  # LineType.Separate: a list
    # a pixel at window (r, c) is the image's pixel (top + r - 1, left + c - 1), whose centre is at + 0.5
    shapes = [
        [(float(x) + left - 0.5, float(y) + top - 0.5) for x, y in _corners(line[:-1])]  # closed: last is first
        for line in lines
        if len(line) >= 4
    ]
    return sorted(shapes, key=lambda shape: -abs(_area(shape)))


def _corners(points: np.ndarray) -> np.ndarray:
    """The points where the outline turns: a straight edge is one segment, not a point a pixel."""
    before = points - np.roll(points, 1, axis=0)
    after = np.roll(points, -1, axis=0) - points
    turns = np.abs(before[:, 0] * after[:, 1] - before[:, 1] * after[:, 0]) > 1e-9
    return points[turns]


def _area(shape: list[tuple[float, float]]) -> float:
    xs, ys = np.asarray([x for x, _ in shape]), np.asarray([y for _, y in shape])
    return float(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1))) / 2


# Label Studio's brush format: the mask as an RGBA picture (row-major, 255 where it covers), run-length packed as its
# editor packs it (@thi.ng/rle-pack: a 32-bit count, the word size less one in 5 bits, four run-length widths less
# one in 4 bits each, then per run a repeat flag, the width's index in 2 bits, the run's length less one, and the
# 8-bit value). label-studio-sdk's own encoder (converter.brush.mask2rle) cannot be installed beside this runtime: it
# pins numpy below 2.3 and brings pandas, OpenCV and nltk; tests/integration/test_label_studio_templates.py decodes
# this one with the SDK's decoder, in Label Studio's own environment.
_RUN_WIDTHS = (3, 4, 8, 16)


def label_studio_brush(mask: BoxMask) -> list[int]:
    """The mask in Label Studio's brush RLE (a BrushLabels result's ``rle``)."""
    values = np.repeat(decoded(mask).reshape(-1) * 255, 4).astype(np.uint8)  # RGBA: each channel the same
    ends = np.append(np.flatnonzero(values[1:] != values[:-1]), values.size - 1)
    lengths = np.diff(np.append(-1, ends))
    header = f"{values.size:032b}{8 - 1:05b}" + "".join(f"{width - 1:04b}" for width in _RUN_WIDTHS)
    runs: list[str] = []
    for length, value in zip(lengths.tolist(), values[ends].tolist(), strict=True):
        while length > 0:
            taken = min(length, 2 ** _RUN_WIDTHS[-1])
            index = next(i for i, width in enumerate(_RUN_WIDTHS) if taken - 1 < 2**width)
            repeat = "1" if taken > 1 else "0"  # a single value is a literal run of one
            runs.append(f"{repeat}{index:02b}{taken - 1:0{_RUN_WIDTHS[index]}b}{value:08b}")
            length -= taken
    bits = header + "".join(runs)
    bits += "0" * (-len(bits) % 8)
    return list(np.packbits(np.frombuffer(bits.encode(), np.uint8) - ord("0")).tolist())
