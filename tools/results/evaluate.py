"""`annotate evaluate`: how good the pipeline's labels were, against labels a person reviewed.

The truth (a COCO detection file, a Label Studio export or a YOLO dataset) is read, and its images matched to the
pipeline's, by truth.py. Box quality is COCO's (pycocotools: mAP@[.5:.95] and AP50); precision and recall are counted at
a score threshold, each truth box matched to at most one box of its label at an IoU of 0.5 or more, highest score
first; the F1-best threshold is the score at which that count's F1 peaks. Classes and attributes are compared on
matched boxes, and captions by their word F1 (the harmonic mean of the share of shared words among each caption's
words).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from shared.contracts import BoxMask, phrase_of
from shared.detector_geometry import iou
from shared.errors import RequestRejected
from shared.serving.label_studio import LabelledBox
from tools.results.annotations import AnnotatedImage
from tools.results.truth import Digest, TruthImage, match_images, unmatched_refusal

MATCH_IOU = 0.5


@dataclass(frozen=True)
class LabelScores:
    label: str  # "" for all labels together
    truth_boxes: int
    predicted_boxes: int  # at the threshold
    ap: float | None  # COCO's mAP@[.5:.95] (None: the label has no truth box)
    ap50: float | None
    precision: float | None  # None: no box predicted at the threshold
    recall: float | None
    f1: float
    best_threshold: float | None  # the score at which F1 peaks (None: no box predicted at all)
    best_f1: float
    mask_ap: float | None = None  # COCO's segm mAP@[.5:.95] (None: no truth mask, or no mask predicted)
    mask_ap50: float | None = None


@dataclass(frozen=True)
class Evaluation:
    images: int
    threshold: float
    overall: LabelScores
    labels: list[LabelScores]
    class_accuracy: float | None  # on matched boxes whose truth names a class
    attribute_accuracy: dict[str, float]  # per attribute, on matched boxes whose truth names it
    caption_word_f1: float | None  # mean over images with a truth caption and one the pipeline wrote
    captions_compared: int = 0
    captions_missing: int = 0  # images with a truth caption the pipeline wrote none for (captions off)

    def as_json(self) -> dict[str, Any]:
        overall = self.overall
        return {
            "images": self.images,
            "threshold": self.threshold,
            "mAP": overall.ap,
            "AP50": overall.ap50,
            "precision": overall.precision,
            "recall": overall.recall,
            "f1": overall.f1,
            "best_threshold": overall.best_threshold,
            "best_f1": overall.best_f1,
            "mask_mAP": overall.mask_ap,
            "mask_AP50": overall.mask_ap50,
            "class_accuracy": self.class_accuracy,
            "attribute_accuracy": self.attribute_accuracy,
            "caption_word_f1": self.caption_word_f1,
            "captions_compared": self.captions_compared,
            "captions_missing": self.captions_missing,
            "labels": [scores.__dict__ for scores in self.labels],
        }


def evaluate_labels(
    truth: list[TruthImage], predicted: list[AnnotatedImage], threshold: float, digest: Digest | None = None
) -> Evaluation:
    """The pipeline's ``predicted`` images against ``truth``. Labels are compared as the phrases the detector looks
    for (Label Studio's "Coffee Cup" is the pipeline's "coffee cup"), and reported as the truth spells them.

    Raises:
        RequestRejected: a truth image names none of the pipeline's, or one is labelled twice, differently.
    """
    matched, unmatched = match_images(truth, predicted, digest)
    if not matched:
        raise RequestRejected(
            f"none of the {len(truth)} labelled images is one the pipeline annotated (by URI, file name or image id)"
        )
    if unmatched:
        raise unmatched_refusal(unmatched, truth)
    spelled: dict[str, str] = {}
    for box in [box for image, _ in matched for box in image.boxes] + [box for _, f in matched for box in f.boxes]:
        spelled.setdefault(phrase_of(box.label), box.label)
    matched = [
        (_as_phrases(image.in_pixels(found.width or 1, found.height or 1)), replace(found, boxes=_phrases(found.boxes)))
        for image, found in matched
    ]
    labels = sorted({box.label for image, found in matched for box in image.boxes + found.boxes})
    coco = _coco_scores(matched, labels)
    # the masks, scored as COCO scores them ("segm"), where the truth has masks and the pipeline made some
    truth_masks = any(box.mask for image, _ in matched for box in image.boxes)
    found_masks = any(box.mask for _, found in matched for box in found.boxes)
    masks = _coco_scores(matched, labels, "segm") if truth_masks and found_masks else {}
    pairs = [_ImagePairs(image.boxes, found.boxes) for image, found in matched]
    hits = _hits(pairs)

    def scored(label: str) -> LabelScores:
        mask_ap, mask_ap50 = masks.get(label, (None, None))
        found = _label_scores(label, pairs, hits, threshold, coco.get(label, (None, None)))
        return replace(found, mask_ap=mask_ap, mask_ap50=mask_ap50)

    per_label = [replace(scored(label), label=spelled[label]) for label in labels]
    overall = scored("")
    kept = [(t, p) for image_pairs in pairs for t, p, iou in image_pairs.matches(threshold) if iou >= MATCH_IOU]
    captioned = [(image.caption, found.caption) for image, found in matched if image.caption]
    compared = [word_f1(said, written) for said, written in captioned if written is not None]
    return Evaluation(
        images=len(matched),
        threshold=threshold,
        overall=overall,
        labels=per_label,
        class_accuracy=_accuracy([(t.class_label, p.class_label) for t, p in kept if t.class_label]),
        attribute_accuracy={
            name: accuracy
            for name in sorted({name for t, _ in kept for name in t.attributes})
            if (
                accuracy := _accuracy(
                    [(t.attributes[name], p.attributes.get(name)) for t, p in kept if name in t.attributes]
                )
            )
            is not None
        },
        caption_word_f1=_mean(compared),
        captions_compared=len(compared),
        captions_missing=len(captioned) - len(compared),
    )


def _phrases(boxes: list[LabelledBox]) -> list[LabelledBox]:
    return [replace(box, label=phrase_of(box.label)) for box in boxes]


def _as_phrases(image: TruthImage) -> TruthImage:
    return replace(image, boxes=_phrases(image.boxes))


def _accuracy(pairs: list[tuple[str | None, str | None]]) -> float | None:
    return sum(truth == predicted for truth, predicted in pairs) / len(pairs) if pairs else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


_WORD = re.compile(r"[\w']+")


def word_f1(truth: str, predicted: str) -> float:
    """The caption word F1: shared words (counted with repeats, case folded) over each caption's words, combined
    as their harmonic mean; 1.0 when both are empty."""
    truth_words, predicted_words = Counter(_WORD.findall(truth.lower())), Counter(_WORD.findall(predicted.lower()))
    if not truth_words and not predicted_words:
        return 1.0
    shared = sum((truth_words & predicted_words).values())
    if not shared:
        return 0.0
    precision, recall = shared / sum(predicted_words.values()), shared / sum(truth_words.values())
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class _ImagePairs:
    """One image's truth and predicted boxes."""

    truth: list[LabelledBox]
    predicted: list[LabelledBox]

    def matches(self, threshold: float, label: str | None = None) -> list[tuple[LabelledBox, LabelledBox, float]]:
        """Greedy matches of the boxes at ``threshold`` (of ``label``, or every label each with its own), highest
        score first, each truth box taken once, at an IoU of MATCH_IOU or more."""
        taken: set[int] = set()
        found = []
        ranked = sorted(
            (p for p in self.predicted if p.score >= threshold and label in (None, p.label)), key=lambda p: -p.score
        )
        for box in ranked:
            candidates = [
                (iou(truth.box, box.box), index)
                for index, truth in enumerate(self.truth)
                if index not in taken and truth.label == box.label
            ]
            best = max(candidates, default=(0.0, -1))
            if best[0] >= MATCH_IOU:
                taken.add(best[1])
                found.append((self.truth[best[1]], box, best[0]))
        return found


def _hits(pairs: list[_ImagePairs]) -> list[tuple[float, str, bool]]:
    """Every predicted box's score and label, and whether it matched a truth box, highest score first.

    Matching at a threshold takes the boxes at or above it highest score first, each the best truth box left: the
    boxes above a higher threshold are a prefix of that order and take the same truth boxes. So one matching at 0
    says, for every threshold at once, which boxes match (n log n, not a matching per threshold)."""
    hits = []
    for image in pairs:
        matched = {id(box) for _, box, _ in image.matches(0.0)}
        hits += [(box.score, box.label, id(box) in matched) for box in image.predicted]
    return sorted(hits, key=lambda hit: -hit[0])


def _f1(truth: int, predicted: int, matches: int) -> float:
    return 2 * matches / (truth + predicted) if truth + predicted else 0.0


def _label_scores(
    label: str,
    pairs: list[_ImagePairs],
    hits: list[tuple[float, str, bool]],
    threshold: float,
    coco: tuple[float | None, float | None],
) -> LabelScores:
    """``label``'s scores ("": every label's together) at ``threshold``, and the threshold at which F1 peaks (the
    higher one where two tie)."""
    truth = sum(1 for image in pairs for box in image.truth if label in ("", box.label))
    own = [(score, matched) for score, box_label, matched in hits if label in ("", box_label)]
    predicted = sum(1 for score, _ in own if score >= threshold)
    matches = sum(1 for score, matched in own if matched and score >= threshold)
    best_threshold, best_f1, counted, right = None, 0.0, 0, 0
    for index, (score, matched) in enumerate(own):
        counted, right = counted + 1, right + matched
        last_of_its_score = index + 1 == len(own) or own[index + 1][0] != score
        if last_of_its_score and _f1(truth, counted, right) > best_f1:
            best_threshold, best_f1 = score, _f1(truth, counted, right)
    return LabelScores(
        label=label,
        truth_boxes=truth,
        predicted_boxes=predicted,
        ap=coco[0],
        ap50=coco[1],
        precision=matches / predicted if predicted else None,
        recall=matches / truth if truth else None,
        f1=_f1(truth, predicted, matches),
        best_threshold=best_threshold,
        best_f1=best_f1,
    )


def _coco_scores(
    matched: list[tuple[TruthImage, AnnotatedImage]], labels: list[str], iou_type: str = "bbox"
) -> dict[str, tuple[float | None, float | None]]:
    """COCO's (mAP@[.5:.95], AP50), by label and overall (""), from pycocotools' COCOeval on every box the pipeline
    wrote (whatever its score: AP ranks them); ``iou_type="segm"``: on their masks (a box without one, truth or
    predicted, is left out). A label without a truth box has none (None)."""
    import numpy as np
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    category = {label: number for number, label in enumerate(labels, start=1)}
    truth: dict[str, Any] = {
        "images": [
            {"id": number, "height": found.height or 1, "width": found.width or 1}
            for number, (_, found) in enumerate(matched, start=1)
        ],
        "categories": [{"id": number, "name": label} for label, number in category.items()],
        "annotations": [],
    }
    detections = []
    segm = iou_type == "segm"
    for number, (image, found) in enumerate(matched, start=1):
        for box in image.boxes:
            if segm and box.mask is None:
                continue
            width, height = box.box.x1 - box.box.x0, box.box.y1 - box.box.y0
            truth["annotations"].append(
                {
                    "id": len(truth["annotations"]) + 1,
                    "image_id": number,
                    "category_id": category[box.label],
                    "bbox": [box.box.x0, box.box.y0, width, height],
                    "area": box.mask.area if segm and box.mask else width * height,
                    "iscrowd": 0,
                    **({"segmentation": _rle(box.mask)} if segm and box.mask else {}),
                }
            )
        for box in found.boxes:
            if segm and box.mask is None:
                continue
            detections.append(
                {
                    "image_id": number,
                    "category_id": category[box.label],
                    "bbox": [box.box.x0, box.box.y0, box.box.x1 - box.box.x0, box.box.y1 - box.box.y0],
                    "score": box.score,
                    **({"segmentation": _rle(box.mask)} if segm and box.mask else {}),
                }
            )
    if not truth["annotations"]:
        return {}
    if not detections:  # nothing predicted: every label with truth boxes scores 0
        zero: tuple[float | None, float | None] = (0.0, 0.0)
        return {box.label: zero for image, _ in matched for box in image.boxes} | {"": zero}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress and its summary
        ground = COCO()
        ground.dataset = truth
        ground.createIndex()
        results = ground.loadRes(detections)
        evaluation = COCOeval(ground, results, iou_type)
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    # precision[T, R, K, A, M]: IoU thresholds x recall points x categories x area "all" x at most 100 boxes
    precision = evaluation.eval["precision"][:, :, :, 0, -1]

    def mean(values: Any) -> float | None:
        valid = values[values > -1]
        return float(np.mean(valid)) if valid.size else None

    scores = {
        label: (mean(precision[:, :, index]), mean(precision[0, :, index]))
        for index, label in enumerate(labels)
        if mean(precision[:, :, index]) is not None
    }
    return scores | {"": (float(evaluation.stats[0]), float(evaluation.stats[1]))}


def _rle(mask: BoxMask) -> dict[str, Any]:
    """A mask as COCO's tools take an RLE (``counts`` as bytes)."""
    return {"size": [mask.height, mask.width], "counts": mask.counts.encode()}


EVALUATIONS_TABLE = "evaluations"


def evaluation_table(evaluation: Evaluation, truth_file: str, prompt: str | None, evaluated_at: Any) -> Any:
    """The evaluation's rows: one per label and one for every label together (``label`` null)."""
    import pyarrow as pa

    from shared.storage.tables import EVALUATIONS_SCHEMA

    common = {
        "evaluated_at": evaluated_at,
        "truth_file": truth_file,
        "prompt": prompt,
        "threshold": evaluation.threshold,
        "images": evaluation.images,
    }
    rows = []
    for scores in [evaluation.overall, *evaluation.labels]:
        overall = scores is evaluation.overall
        rows.append(
            common
            | {name: value for name, value in scores.__dict__.items() if name != "label"}
            | {
                "label": None if overall else scores.label,
                "class_accuracy": evaluation.class_accuracy if overall else None,
                "caption_word_f1": evaluation.caption_word_f1 if overall else None,
            }
        )
    return pa.Table.from_pylist(rows, schema=EVALUATIONS_SCHEMA)


def write_evaluation(table: Any, results_root: str, evaluated_at: Any, store_for: Any) -> str:
    """Writes the evaluation's table file beside the images' and detections' (in its day's partition); returns its
    URI. The file is named by what was evaluated (the rows but their time), so the same evaluation run again
    replaces its earlier file instead of adding its rows twice."""
    import hashlib

    import pyarrow as pa
    import pyarrow.parquet as pq

    from shared.storage import layout
    from shared.storage.tables import PARTITION_COLUMN

    what = json.dumps(table.drop_columns(["evaluated_at"]).to_pylist(), sort_keys=True, default=str)
    stem = hashlib.sha256(what.encode()).hexdigest()[:24]
    uri = layout.table_file(results_root, EVALUATIONS_TABLE, f"{PARTITION_COLUMN}={evaluated_at:%Y-%m-%d}", stem)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    store = store_for(uri)
    store.write_bytes(uri, sink.getvalue().to_pybytes(), "application/vnd.apache.parquet")
    for earlier in list(store.list_uris(layout.table_folder(results_root, EVALUATIONS_TABLE))):
        if earlier.endswith(f"/{stem}.parquet") and earlier != uri:
            store.delete(earlier)
    return uri


def request_threshold(images: list[AnnotatedImage], results_root: str, store_for: Any) -> float:
    """The lowest box threshold of the batches ``images`` came from: every box those batches kept scored at least
    that much. The request's default where no batch's input is left."""
    from shared.contracts import AnnotationRequest
    from tools.results.annotations import batch_requests

    default = AnnotationRequest.model_fields["box_threshold"].default
    return min((request.box_threshold for request in batch_requests(images, results_root, store_for)), default=default)
