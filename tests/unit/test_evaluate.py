"""annotate evaluate's numbers against values computed here by hand, on boxes of known geometry."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from shared.errors import RequestRejected
from shared.serving.label_studio import LabelledBox, read_label_config
from tools.results.annotations import AnnotatedImage
from tools.results.evaluate import evaluate_labels, iou, word_f1
from tools.results.export import label_studio_config, label_studio_task
from tools.results.truth import TruthImage, read_truth


def box(
    label: str, x0: float, score: float = 0.9, width: float = 40, class_label: str | None = None, **attributes: str
) -> LabelledBox:
    return LabelledBox(
        label=label,
        score=score,
        x0=x0,
        y0=10,
        x1=x0 + width,
        y1=50,
        class_label=class_label,
        class_score=None,
        attributes=dict(attributes),
    )


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
            boxes=[replace(b, x0=b.x0 + 40 * 0.38 / 1.62, x1=b.x1 + 40 * 0.38 / 1.62) for b in i.boxes],
        )
        for i in PREDICTED
    ]
    assert iou(moved[0].boxes[0], PREDICTED[0].boxes[0]) == pytest.approx(0.62)
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
        assert [(b.x0, b.y0, b.x1, b.y1) for b in read.boxes] == pytest.approx(
            [(b.x0, b.y0, b.x1, b.y1) for b in original.boxes]
        )
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
    predicted = [replace(PREDICTED[0], boxes=[replace(box("dog", 0, width=50), y0=0, y1=50)])]
    assert evaluate_labels([truth], predicted, 0.35).overall.ap50 == pytest.approx(1.0)
    (tmp_path / "labels" / "id-a.txt").write_text("7 0.1 0.1 0.1 0.1\n")
    with pytest.raises(RequestRejected, match=r"id-a\.txt:1: not a YOLO box of a known class"):
        read_truth(tmp_path)
