"""annotate evaluate's numbers against values computed here by hand, on boxes of known geometry."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from shared.contracts import Box, BoxMask
from shared.detector_geometry import iou
from shared.errors import RequestRejected
from shared.serving.label_studio import LabelledBox, read_label_config
from shared.storage.masks import encoded
from tools.results.annotations import AnnotatedImage
from tools.results.evaluate import evaluate_labels, word_f1
from tools.results.export import label_studio_config, label_studio_task
from tools.results.truth import TruthImage, read_truth


def box(
    label: str, x0: float, score: float = 0.9, width: float = 40, class_label: str | None = None, **attributes: str
) -> LabelledBox:
    return LabelledBox(
        label=label,
        score=score,
        box=Box(x0=x0, y0=10, x1=x0 + width, y1=50),
        class_label=class_label,
        class_score=None,
        attributes=dict(attributes),
    )


def corners(box: Box) -> tuple[float, float, float, float]:
    return (box.x0, box.y0, box.x1, box.y1)


def shifted(box: Box, dx: float) -> Box:
    return box.model_copy(update={"x0": box.x0 + dx, "x1": box.x1 + dx})


def image(name: str, boxes: list[LabelledBox], caption: str | None = None) -> AnnotatedImage:
    return AnnotatedImage(
        image_id=f"id-{name}",
        source_uri=f"s3://in/photos/{name}.jpg",
        batch_id="b-1",
        status="succeeded",
        width=200,
        height=100,
        caption=caption,
        annotated_uri=None,
        error=None,
        processed_at="2026-12-02",
        boxes=boxes,
    )


PREDICTED = [
    image("a", [box("dog", 10, class_label="beagle", color="brown"), box("cat", 100, score=0.8)], "a brown dog"),
    image("b", [box("dog", 20, score=0.7, class_label="pug", color="black")], "a black dog"),
]


def as_truth(images: list[AnnotatedImage]) -> list[TruthImage]:
    return [
        TruthImage(key=i.source_uri, boxes=[replace(b, score=1.0) for b in i.boxes], caption=i.caption) for i in images
    ]


def test_the_pipeline_against_its_own_labels_scores_1_everywhere() -> None:
    result = evaluate_labels(as_truth(PREDICTED), PREDICTED, threshold=0.35)
    overall = result.overall
    assert (overall.ap, overall.ap50, overall.precision, overall.recall, overall.f1) == pytest.approx((1, 1, 1, 1, 1))
    assert result.class_accuracy == 1 and result.attribute_accuracy == {"color": 1} and result.caption_word_f1 == 1
    assert [(s.label, s.truth_boxes, s.predicted_boxes) for s in result.labels] == [("cat", 1, 1), ("dog", 2, 2)]
    assert result.images == 2


def test_boxes_moved_to_an_iou_of_062_pass_three_of_cocos_ten_thresholds() -> None:
    # GIVEN each truth box the predicted one moved right by d: IoU = (w - d) / (w + d) = 0.62 for d = w * 0.38 / 1.62
    moved = [
        TruthImage(
            key=i.source_uri,
            boxes=[replace(b, box=shifted(b.box, 40 * 0.38 / 1.62)) for b in i.boxes],
        )
        for i in PREDICTED
    ]
    assert iou(moved[0].boxes[0].box, PREDICTED[0].boxes[0].box) == pytest.approx(0.62)
    result = evaluate_labels(moved, PREDICTED, threshold=0.35)
    # THEN every box matches at IoU 0.50, 0.55 and 0.60 and none at 0.65 to 0.95: AP 1 at three thresholds, 0 at seven
    assert result.overall.ap50 == pytest.approx(1.0) and result.overall.ap == pytest.approx(0.3)
    # AND at the matching IoU of 0.5 every box is a true positive
    assert (result.overall.precision, result.overall.recall) == (1.0, 1.0)


def test_labels_that_disagree_score_0() -> None:
    truth = [TruthImage(key=i.source_uri, boxes=[replace(b, label="hamster") for b in i.boxes]) for i in PREDICTED]
    result = evaluate_labels(truth, PREDICTED, threshold=0.35)
    assert (result.overall.ap, result.overall.ap50, result.overall.precision, result.overall.recall) == (0, 0, 0, 0)
    by_label = {s.label: s for s in result.labels}
    assert by_label["hamster"].ap == 0 and by_label["hamster"].recall == 0
    assert by_label["dog"].ap is None and by_label["dog"].precision == 0  # no truth box: no AP, every box false


def test_precision_recall_and_the_f1_best_threshold_are_counted_at_their_scores() -> None:
    # GIVEN two truth dogs; predicted: one on the first (0.9), a stray (0.4), one on the second (0.3)
    truth = [TruthImage(key="s3://in/photos/x.jpg", boxes=[box("dog", 10, 1.0), box("dog", 120, 1.0)])]
    predicted = [image("x", [box("dog", 10, 0.9), box("dog", 60, 0.4), box("dog", 120, 0.3)])]
    result = evaluate_labels(truth, predicted, threshold=0.35)
    [dog] = result.labels
    # THEN at 0.35: two predicted, one right: precision 1/2, recall 1/2, F1 1/2
    assert (dog.predicted_boxes, dog.precision, dog.recall, dog.f1) == (2, 0.5, 0.5, 0.5)
    # AND F1 is 2/3 at 0.9, 1/2 at 0.4 and 4/5 at 0.3 (three predicted, two right): 0.3 is the best threshold
    assert (dog.best_threshold, dog.best_f1) == (0.3, pytest.approx(0.8))


def test_classes_and_attributes_are_compared_on_matched_boxes_only() -> None:
    truth = as_truth(PREDICTED)
    truth[1] = TruthImage(
        key=truth[1].key, boxes=[replace(truth[1].boxes[0], class_label="beagle", attributes={"color": "white"})]
    )
    truth[0].boxes.append(box("dog", 150, class_label="pug"))  # no box of the pipeline's: not compared
    result = evaluate_labels(truth, PREDICTED, threshold=0.35)
    assert result.class_accuracy == 0.5 and result.attribute_accuracy == {"color": 0.5}


def test_caption_word_f1() -> None:
    # shared: a, dog, on, grass; five words each: precision = recall = 4/5
    assert word_f1("A brown dog on grass.", "a dog on the grass") == pytest.approx(0.8)
    assert word_f1("", "") == 1.0 and word_f1("a cat", "") == 0.0


def test_nothing_predicted_scores_0_and_images_are_matched_by_file_name_and_image_id() -> None:
    truth = [
        TruthImage(key="photos/a.jpg", boxes=[box("dog", 10)]),  # the file name
        TruthImage(key="images/id-b.png", boxes=[box("dog", 20)]),  # an export's name for it
    ]
    empty = [replace(i, boxes=[]) for i in PREDICTED]
    result = evaluate_labels(truth, empty, threshold=0.35)
    assert result.images == 2
    assert (result.overall.ap, result.overall.recall, result.overall.precision) == (0, 0, None)


def test_a_label_studio_export_of_the_reviewed_predictions_reads_back_as_the_boxes(tmp_path: Path) -> None:
    # GIVEN the project's own Label Studio tasks, each prediction accepted by a reviewer as the task's annotation
    project = read_label_config(label_studio_config(PREDICTED, []))
    tasks = [label_studio_task(i, project) for i in PREDICTED]
    for task in tasks:
        task["annotations"] = [{"result": task.pop("predictions")[0]["result"], "was_cancelled": False}]
        task["annotations"][0]["result"].append(
            {"type": "textarea", "from_name": "caption", "value": {"text": ["a dog"]}}
        )
    path = tmp_path / "export.json"
    path.write_text(json.dumps(tasks))
    truth = read_truth(path)
    assert [t.key for t in truth] == [i.source_uri for i in PREDICTED]
    for read, original in zip(truth, PREDICTED, strict=True):
        assert [(b.label, b.class_label, b.attributes) for b in read.boxes] == [
            (b.label, b.class_label, b.attributes) for b in original.boxes
        ]
        assert [corners(b.box) for b in read.boxes] == pytest.approx([corners(b.box) for b in original.boxes])
        assert read.caption == "a dog"
    assert evaluate_labels(truth, PREDICTED, 0.35).overall.ap == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("not json", "not a JSON file"),
        ('{"rows": []}', "neither a COCO file"),
        (
            json.dumps(
                {"images": [{"id": 1, "file_name": "a.jpg"}], "annotations": [{"image_id": 2, "bbox": [0, 0, 1, 1]}]}
            ),
            "malformed",
        ),
    ],
)
def test_a_file_that_is_no_truth_is_refused_in_one_line(tmp_path: Path, content: str, said: str) -> None:
    path = tmp_path / "truth.json"
    path.write_text(content)
    with pytest.raises(RequestRejected, match=said):
        read_truth(path)


def test_truth_about_other_images_is_refused() -> None:
    with pytest.raises(RequestRejected, match="none of the 1 labelled images"):
        evaluate_labels([TruthImage(key="s3://elsewhere/z.jpg")], PREDICTED, 0.35)
    with pytest.raises(RequestRejected, match=r"1 of the 2 labelled images .* \(the first: s3://elsewhere/z.jpg\)"):
        evaluate_labels([*as_truth(PREDICTED[:1]), TruthImage(key="s3://elsewhere/z.jpg")], PREDICTED, 0.35)


def test_a_yolo_dataset_reads_as_fractions_scaled_to_the_matched_image(tmp_path: Path) -> None:
    # GIVEN a YOLO dataset naming the image by its id: a dog whose box is the left quarter, top half of the image
    (tmp_path / "labels").mkdir()
    (tmp_path / "data.yaml").write_text("names:\n  0: dog\n")
    (tmp_path / "labels" / "id-a.txt").write_text("0 0.125 0.25 0.25 0.5\n")
    [truth] = read_truth(tmp_path / "data.yaml")
    # THEN against the 200 x 100 image, its box is 0..50 x 0..50 in pixels: the pipeline's same box scores 1
    predicted = [replace(PREDICTED[0], boxes=[replace(box("dog", 0, width=50), box=Box(x0=0, y0=0, x1=50, y1=50))])]
    assert evaluate_labels([truth], predicted, 0.35).overall.ap50 == pytest.approx(1.0)
    (tmp_path / "labels" / "id-a.txt").write_text("7 0.1 0.1 0.1 0.1\n")
    with pytest.raises(RequestRejected, match=r"id-a\.txt:1: not a YOLO box of a known class"):
        read_truth(tmp_path)


def labelled_task(result: list[dict], image: str = "/data/upload/4/0a1b2c3d-a.jpg") -> dict:
    return {"id": 1, "data": {"image": image}, "annotations": [{"result": result, "was_cancelled": False}]}


def rectangle(**value: float | list[str]) -> dict:
    geometry = {"x": 10, "y": 20, "width": 20, "height": 40, "rotation": 0} | value
    return {
        "id": "r1",
        "type": "rectanglelabels",
        "from_name": "label",
        "to_name": "image",
        "original_width": 200,
        "original_height": 100,
        "value": {"rectanglelabels": ["Dog"], **geometry},
    }


def read_json(tmp_path: Path, document: object) -> list[TruthImage]:
    path = tmp_path / "truth.json"
    path.write_text(json.dumps(document))
    return read_truth(path)


def test_label_studio_s_labels_are_the_pipeline_s_phrases_and_its_uploads_are_matched_by_their_own_names(
    tmp_path: Path,
) -> None:
    # GIVEN a reviewed upload ("<8 hex>-a.jpg" is the pipeline's a.jpg) whose box is labelled "Dog", as the config
    # spells it, where the pipeline found "dog"
    truth = read_json(tmp_path, [labelled_task([rectangle(x=5, y=10, width=20, height=40)])])
    # THEN it is the pipeline's image and its dog
    result = evaluate_labels(truth, PREDICTED[:1], 0.35)
    assert result.images == 1 and [(s.label, s.truth_boxes) for s in result.labels] == [("cat", 0), ("Dog", 1)]
    assert result.overall.recall == 1.0


def test_an_upload_named_with_accents_is_matched_by_its_name_as_it_was_written(tmp_path: Path) -> None:
    # GIVEN Label Studio's upload of café.jpg, kept percent-encoded in its path, and the pipeline's café.jpg
    truth = read_json(tmp_path, [labelled_task([rectangle()], image="/data/upload/4/7c04a148-caf%C3%A9.jpg")])
    cafe = replace(PREDICTED[0], source_uri="s3://in/photos/café.jpg")
    # THEN they are one image
    assert evaluate_labels(truth, [cafe], 0.35).images == 1


def test_a_label_studio_rectangle_of_negative_width_is_refused_as_coco_s_is(tmp_path: Path) -> None:
    with pytest.raises(RequestRejected, match="negative width or height"):
        read_json(tmp_path, [labelled_task([rectangle(width=-20)])])


def test_the_backend_s_own_export_of_predictions_says_what_it_is_and_what_to_do(tmp_path: Path) -> None:
    # GIVEN a Label Studio export of tasks that hold the backend's predictions and nobody's annotation
    task = {"id": 1, "data": {"image": "/data/upload/4/0a1b2c3d-a.jpg"}, "annotations": [], "predictions": [{}]}
    # THEN it is said to be predictions only, and what to do
    with pytest.raises(RequestRejected, match=r"1 tasks and no annotation, 1 with predictions .* \(Submit on each\)"):
        read_json(tmp_path, [task])


def test_a_rotated_rectangle_is_scored_as_the_upright_box_around_it(tmp_path: Path) -> None:
    # 20% x 40% of a 200 x 100 image is 40 x 40 px from (20, 20); turned 90 degrees clockwise about its top-left
    # corner it covers x from -20 to 20, y from 20 to 60
    [turned] = read_json(tmp_path, [labelled_task([rectangle(rotation=90)])])
    [box] = turned.boxes
    assert corners(box.box) == pytest.approx((-20, 20, 20, 60))


def test_a_polygon_is_scored_as_the_box_around_it_and_other_regions_are_refused(tmp_path: Path) -> None:
    polygon = {
        "id": "p",
        "type": "polygonlabels",
        "original_width": 200,
        "original_height": 100,
        "value": {"points": [[10, 10], [50, 20], [30, 60]], "polygonlabels": ["dog"]},
    }
    [image] = read_json(tmp_path, [labelled_task([polygon])])
    assert [corners(b.box) for b in image.boxes] == [pytest.approx((20, 10, 100, 60))]
    brush = {"id": "b", "type": "brushlabels", "value": {"rle": [1, 2], "brushlabels": ["dog"]}}
    with pytest.raises(RequestRejected, match=r"cannot score as boxes \(1 brushlabels\)"):
        read_json(tmp_path, [labelled_task([polygon, brush])])


@pytest.mark.parametrize(
    ("annotation", "said"),
    [
        ({"bbox": [0, 0, -5, 10]}, "width -5 and height 10"),
        ({"bbox": [0, 0, 0, 10]}, "width 0 and height 10"),
        ({"bbox": [0, 0, float("inf"), 10]}, "Infinity, which is no number"),
        ({"bbox": [float("nan"), 0, 5, 10]}, "NaN, which is no number"),
    ],
)
def test_a_box_that_is_not_finite_or_has_no_size_is_refused_in_one_line(
    tmp_path: Path, annotation: dict, said: str
) -> None:
    coco = {
        "images": [{"id": 1, "file_name": "a.jpg"}],
        "categories": [{"id": 1, "name": "dog"}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, **annotation}],
    }
    with pytest.raises(RequestRejected, match=said) as refused:
        read_json(tmp_path, coco)
    assert "\n" not in str(refused.value)


def test_malformed_exports_are_refused_in_one_line_and_a_numeric_category_is_a_label(tmp_path: Path) -> None:
    with pytest.raises(RequestRejected, match="task 1: its data is not an object"):
        read_json(tmp_path, [{"data": "a.jpg", "annotations": []}])
    coco = {
        "images": [{"id": 1, "file_name": "a.jpg"}],
        "categories": [{"id": 1, "name": 7}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 10, 40, 40]}],
    }
    [image] = read_json(tmp_path, coco)
    assert image.boxes[0].label == "7"
    assert "7" in [scores.label for scores in evaluate_labels([image], PREDICTED[:1], 0.35).labels]


def test_an_image_labelled_twice_counts_once_and_differently_is_refused() -> None:
    twice = as_truth(PREDICTED[:1]) * 2
    assert evaluate_labels(twice, PREDICTED, 0.35).overall.truth_boxes == 2
    other = TruthImage(key=PREDICTED[0].source_uri, boxes=[box("dog", 10)])
    with pytest.raises(RequestRejected, match="labelled twice, differently"):
        evaluate_labels([*as_truth(PREDICTED[:1]), other], PREDICTED, 0.35)


def test_a_yaml_alias_bomb_is_refused_before_it_grows(tmp_path: Path) -> None:
    (tmp_path / "labels").mkdir()
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [
        f"{chr(98 + n)}: &{chr(98 + n)} [*{chr(97 + n)},*{chr(97 + n)},*{chr(97 + n)},*{chr(97 + n)}]" for n in range(8)
    ]
    (tmp_path / "data.yaml").write_text("\n".join([*lines, "names: *i"]) + "\n")
    with pytest.raises(RequestRejected, match="YAML aliases"):
        read_truth(tmp_path / "data.yaml")


def test_a_yolo_dataset_in_its_usual_split_folders_is_matched_by_its_images_names(tmp_path: Path) -> None:
    # GIVEN images/train/a.jpg and its labels/train/a.txt, as YOLO datasets are laid out
    for folder in ("images/train", "labels/train"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "images/train/a.jpg").write_bytes(b"picture")
    (tmp_path / "labels/train/a.txt").write_text("0 0.15 0.3 0.2 0.4\n")
    (tmp_path / "data.yaml").write_text("path: .\ntrain: images/train\nnames: [dog]\n")
    [truth] = read_truth(tmp_path / "data.yaml")
    # THEN its labels are the pipeline's a.jpg's, by name
    assert truth.key == "a.jpg" and evaluate_labels([truth], PREDICTED[:1], 0.35).overall.recall == 1.0


def f1_afresh(pairs: list, truth_boxes: int, label: str | None, threshold: float) -> float:
    """F1 at ``threshold`` from a matching done for that threshold alone."""
    from tools.results.evaluate import _f1

    kept = sum(1 for p in pairs for b in p.predicted if b.score >= threshold and label in (None, b.label))
    return _f1(truth_boxes, kept, sum(len(p.matches(threshold, label)) for p in pairs))


def test_the_f1_best_threshold_and_counts_equal_a_matching_at_every_threshold() -> None:
    # GIVEN many overlapping boxes of random scores and places (ties included), on a few images
    import random

    from tools.results.evaluate import _ImagePairs

    chance = random.Random(7)
    truth, predicted = [], []
    for n in range(6):
        boxes = [box(chance.choice(["dog", "cat"]), chance.randrange(0, 150, 5), score=1.0) for _ in range(8)]
        found = [
            box(
                chance.choice(["dog", "cat"]),
                chance.randrange(0, 150, 5),
                score=chance.choice([0.3, 0.7, chance.random()]),
            )
            for _ in range(12)
        ]
        truth.append(TruthImage(key=f"s3://in/photos/{n}.jpg", boxes=boxes))
        predicted.append(image(str(n), found))
    result = evaluate_labels(truth, predicted, 0.5)
    # THEN the counts at each score are those of a matching done afresh at that score
    pairs = [_ImagePairs(t.boxes, p.boxes) for t, p in zip(truth, predicted, strict=True)]
    for scores in [result.overall, *result.labels]:
        label = scores.label or None
        every = sorted({b.score for p in pairs for b in p.predicted if label in (None, b.label)}, reverse=True)
        best = max(every, key=lambda t: (f1_afresh(pairs, scores.truth_boxes, label, t), t))
        assert scores.best_threshold == best
        assert scores.best_f1 == pytest.approx(f1_afresh(pairs, scores.truth_boxes, label, best))
        assert scores.f1 == pytest.approx(f1_afresh(pairs, scores.truth_boxes, label, 0.5))


def rectangle_mask(x0: int, x1: int, y0: int = 10, y1: int = 50) -> BoxMask:
    pixels = np.zeros((100, 200), np.uint8, order="F")
    pixels[y0:y1, x0:x1] = 1
    return encoded(pixels, 0.9)


def test_masks_are_scored_as_coco_scores_them_apart_from_their_boxes(tmp_path: Path) -> None:
    # GIVEN the pipeline's boxes exactly right, and each mask the truth's moved 9 pixels right within the same box:
    # IoU (40 - 9) / (40 + 9) = 0.63
    truth_masks = [rectangle_mask(round(b.box.x0), round(b.box.x1)) for i in PREDICTED for b in i.boxes]
    moved_masks = [rectangle_mask(round(b.box.x0) + 9, round(b.box.x1) + 9) for i in PREDICTED for b in i.boxes]
    masks = iter(moved_masks)
    predicted = [replace(i, boxes=[replace(b, mask=next(masks)) for b in i.boxes]) for i in PREDICTED]
    # AND the truth as COCO writes it: its masks as polygons, read back by pycocotools
    document = {
        "images": [
            {"id": n, "file_name": f"{i.source_uri}", "width": 200, "height": 100} for n, i in enumerate(PREDICTED)
        ],
        "categories": [{"id": 1, "name": "dog"}, {"id": 2, "name": "cat"}],
        "annotations": [],
    }
    flat = iter(truth_masks)
    for n, i in enumerate(PREDICTED):
        for b in i.boxes:
            mask = next(flat)
            x0, x1 = b.box.x0, b.box.x1
            document["annotations"].append(
                {
                    "id": len(document["annotations"]) + 1,
                    "image_id": n,
                    "category_id": 1 if b.label == "dog" else 2,
                    "bbox": [b.box.x0, b.box.y0, b.box.x1 - b.box.x0, b.box.y1 - b.box.y0],
                    "segmentation": [[x0, 10, x1, 10, x1, 50, x0, 50]],
                }
            )
            assert mask.area == (x1 - x0) * 40
    (tmp_path / "truth.json").write_text(json.dumps(document))
    truth = read_truth(tmp_path / "truth.json")
    assert [b.mask.area for t in truth for b in t.boxes if b.mask] == [m.area for m in truth_masks]
    result = evaluate_labels(truth, predicted, threshold=0.35)
    # THEN the boxes score 1 and the masks pass three of COCO's ten IoU thresholds (0.50, 0.55, 0.60): 0.3
    assert (result.overall.ap, result.overall.ap50) == pytest.approx((1.0, 1.0))
    assert (result.overall.mask_ap, result.overall.mask_ap50) == pytest.approx((0.3, 1.0))
    # AND masks that are the truth's score 1, and a pipeline without masks gets no mask score
    exact = iter(truth_masks)
    same = [replace(i, boxes=[replace(b, mask=next(exact)) for b in i.boxes]) for i in PREDICTED]
    assert evaluate_labels(truth, same, threshold=0.35).overall.mask_ap == pytest.approx(1.0)
    assert evaluate_labels(truth, PREDICTED, threshold=0.35).overall.mask_ap is None
