"""Masks as they are stored: COCO's compressed run-length encoding, written and read by pycocotools (COCO's own
code, which COCO's tools, Label Studio's converters and evaluators read), not a codec of our own."""

from __future__ import annotations

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
