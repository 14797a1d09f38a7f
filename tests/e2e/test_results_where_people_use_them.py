"""After a local run on the tiny models: the exports read back by a library that reads them, the gallery in a real
headless browser, and the status of what was sent."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field
from typer.testing import CliRunner

from tests.conftest import REPO, SAMPLES
from tools.cli import app
from tools.results.query import run_local_query

pytestmark = pytest.mark.slow
cli = CliRunner()
ARTIFACTS = REPO / "test-artifacts"


def annotate(*args: str) -> tuple[int, str]:
    result = cli.invoke(app, list(args))
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The samples and an empty file."""
    inputs = tmp_path_factory.mktemp("inputs")
    for sample in SAMPLES.iterdir():
        shutil.copy(sample, inputs / sample.name)
    (inputs / "empty.jpg").write_bytes(b"")
    return inputs


@pytest.fixture(scope="module")
def annotated(tmp_path_factory: pytest.TempPathFactory, tiny_settings: object, inputs: Path) -> Path:
    """GIVEN the inputs annotated through the local workflow (tiny models, no captions)"""
    data_dir = tmp_path_factory.mktemp("data")
    code, output = annotate(
        "run", str(inputs), "--prompt", "dog. cat.", "--profile", "tiny", "--data-dir", str(data_dir), "--no-caption"
    )
    assert code == 1 and "3 succeeded, 1 failed" in output, output
    return data_dir


def table_boxes(data_dir: Path) -> dict[str, list[tuple[str, list[float]]]]:
    """image_id -> [(label, [x0, y0, x1, y1])] from the detections table, in detection order."""
    rows = run_local_query(
        "SELECT image_id, label, x0, y0, x1, y1 FROM detections ORDER BY image_id, detection_index", data_dir
    ).to_pylist()
    boxes: dict[str, list[tuple[str, list[float]]]] = {}
    for row in rows:
        boxes.setdefault(row["image_id"], []).append((row["label"], [row[k] for k in ("x0", "y0", "x1", "y1")]))
    return boxes


def assert_same_boxes(dataset: object, expected: dict[str, list[tuple[str, list[float]]]]) -> None:
    """Every image of the supervision dataset holds its table boxes, labels equal, corners within 1 px."""
    found = 0
    for path, _, detections in dataset:  # type: ignore[attr-defined]
        image_id = Path(path).stem
        labels = [dataset.classes[int(class_id)] for class_id in detections.class_id]  # type: ignore[attr-defined]
        assert labels == [label for label, _ in expected[image_id]]
        for corners, (_, table_corners) in zip(detections.xyxy.tolist(), expected[image_id], strict=True):
            assert max(abs(a - b) for a, b in zip(corners, table_corners, strict=True)) <= 1.0
        found += 1
    assert found == len(expected) == 3


def test_coco_and_yolo_exports_read_back_through_supervision_with_the_tables_boxes(
    annotated: Path, tmp_path: Path
) -> None:
    import supervision as sv

    expected = table_boxes(annotated)
    for export_format in ("coco", "yolo"):
        # WHEN the annotations are exported
        code, output = annotate(
            "export", "--format", export_format, "--out", str(tmp_path / export_format), "--data-dir", str(annotated)
        )
        assert code == 0 and "3 images" in output, output
        assert "skipped" in output and "empty.jpg" in output  # the failed image, with its reason

    # THEN supervision reads each dataset back with every box of the table
    coco = tmp_path / "coco"
    assert_same_boxes(sv.DetectionDataset.from_coco(str(coco / "images"), str(coco / "annotations.json")), expected)
    yolo = tmp_path / "yolo"
    dataset = sv.DetectionDataset.from_yolo(str(yolo / "images"), str(yolo / "labels"), str(yolo / "data.yaml"))
    assert_same_boxes(dataset, expected)
    # AND the picture whose EXIF turns it is exported turned, so that it agrees with its boxes
    [rotated] = run_local_query(
        "SELECT image_id FROM images WHERE source_uri LIKE '%rotated-exif%'", annotated
    ).to_pylist()
    assert (coco / "images" / f"{rotated['image_id']}.png").is_file()


# Label Studio's task format, as its documentation gives it (labelstud.io/guide/task_format, .../predictions).
class LsValue(BaseModel):
    model_config = ConfigDict(extra="forbid")
    x: float = Field(ge=0, le=100)
    y: float = Field(ge=0, le=100)
    width: float = Field(ge=0, le=100)
    height: float = Field(ge=0, le=100)
    rotation: float
    rectanglelabels: list[str] | None = None
    choices: list[str] | None = None


class LsText(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: list[str]


class LsResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    from_name: str
    to_name: str
    type: Literal["rectanglelabels", "choices", "textarea"]
    original_width: int | None = None  # a region's; a text area's result has none
    original_height: int | None = None
    image_rotation: float | None = None
    value: LsValue | LsText
    score: float | None = None


class LsPrediction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_version: str
    score: float
    result: list[LsResult]


class LsTask(BaseModel):
    model_config = ConfigDict(extra="forbid")
    data: dict[str, str]
    predictions: list[LsPrediction]


def test_label_studio_tasks_follow_the_documented_format_and_name_the_configs_controls(
    annotated: Path, tmp_path: Path
) -> None:
    code, output = annotate("export", "--format", "labelstudio", "--out", str(tmp_path), "--data-dir", str(annotated))
    assert code == 0, output

    tasks = [LsTask.model_validate(task) for task in json.loads((tmp_path / "tasks.json").read_text())]
    config = (tmp_path / "label_config.xml").read_text()
    expected = table_boxes(annotated)
    ids = {r["source_uri"]: r["image_id"] for r in run_local_query("SELECT * FROM images", annotated).to_pylist()}
    assert len(tasks) == 3
    for task in tasks:
        [prediction] = task.predictions
        boxes = [r for r in prediction.result if r.type == "rectanglelabels"]
        table = expected[ids[task.data["image"]]]
        assert [box.value.rectanglelabels for box in boxes] == [[label] for label, _ in table]
        for box, (_, (x0, y0, x1, y1)) in zip(boxes, table, strict=True):
            assert (box.value.x, box.value.width) == pytest.approx(
                (100 * x0 / box.original_width, 100 * (x1 - x0) / box.original_width)
            )
            assert (box.value.y, box.value.height) == pytest.approx(
                (100 * y0 / box.original_height, 100 * (y1 - y0) / box.original_height)
            )
        choices = [r for r in prediction.result if r.type == "choices"]
        assert {r.from_name for r in choices} == {"class", "color", "pattern"}
        assert {r.id for r in choices} <= {r.id for r in boxes}  # a class or attribute belongs to its box
        for result in prediction.result:
            assert f'name="{result.from_name}"' in config and result.to_name == "image"
    # AND the config reads back as the project the ML backend fills: the same controls, the labels as the prompt
    from shared.serving.label_studio import read_label_config

    project = read_label_config(config)
    assert (project.image, project.boxes, project.caption) == ("image", "label", "caption")
    assert set(project.region_choices) == {"class", "color", "pattern"}


def test_the_gallery_renders_one_card_per_image_in_headless_chromium_without_console_errors(
    annotated: Path, tmp_path: Path
) -> None:
    from tests.browser import chromium_page

    code, output = annotate("gallery", "--out", str(tmp_path), "--data-dir", str(annotated))
    assert code == 0, output

    with chromium_page() as (page, errors):
        page.goto((tmp_path / "index.html").as_uri())

        assert page.locator(".card").count() == 4  # one per row of `images`
        assert page.locator(".card.failed .reason").inner_text().startswith("detect: ImageRejected: file is empty")
        assert page.locator(".card img").count() == 3 and all(
            page.evaluate("img => img.naturalWidth", img.element_handle()) > 0
            for img in page.locator(".card img").all()
        )
        page.get_by_role("button", name="failed").click()
        assert page.locator(".card:visible").count() == 1
        page.get_by_role("button", name="all").click()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "gallery.png"), full_page=True)
    assert errors == []


def test_status_of_the_last_run_reports_its_images_done_and_failed_with_reasons(annotated: Path) -> None:
    code, output = annotate("status", "--last", "--data-dir", str(annotated))

    assert code == 1, output  # one image failed
    assert "SUCCEEDED" in output and "4 images, 3 done, 1 failed, 0 still running" in output
    assert "empty.jpg: detect: ImageRejected: file is empty" in output


def test_status_of_a_batch_id_and_of_a_message_file(annotated: Path, inputs: Path, tmp_path: Path) -> None:
    [batch] = run_local_query("SELECT DISTINCT batch_id FROM images", annotated).to_pylist()
    code, output = annotate("status", batch["batch_id"], "--data-dir", str(annotated))
    assert f"batch {batch['batch_id']}: SUCCEEDED" in output

    # The message that was run: its batch is found from its content, as ingest planned it
    sent = tmp_path / "sent.json"
    sent.write_text(json.dumps({"prompt": "dog. cat.", "images": [str(inputs)], "caption": False}))
    code, output = annotate("status", str(sent), "--data-dir", str(annotated))
    assert f"batch {batch['batch_id']}: SUCCEEDED" in output and "3 done, 1 failed" in output

    # A message never sent (another prompt is another batch) is said to be unknown
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"prompt": "cat.", "images": [str(inputs)]}))
    code, output = annotate("status", str(other), "--data-dir", str(annotated))
    assert code == 2 and "no batch b-" in output


def test_evaluate_against_the_projects_own_coco_export_then_with_labels_changed_is_kept_for_annotate_query(
    annotated: Path, tmp_path: Path
) -> None:
    # GIVEN the run's COCO export, reviewed and brought back unchanged
    code, output = annotate("export", "--format", "coco", "--out", str(tmp_path / "coco"), "--data-dir", str(annotated))
    assert code == 0, output
    truth = tmp_path / "coco" / "annotations.json"

    # WHEN it is the truth, THEN every figure is 1 and the images are matched by the export's names for them
    code, output = annotate("evaluate", "--truth", str(truth), "--data-dir", str(annotated), "--format", "json")
    assert code == 0, output
    perfect = json.loads(output)
    assert perfect["images"] == 3 and perfect["threshold"] == 0.35  # the batch's box threshold
    assert (perfect["mAP"], perfect["AP50"], perfect["precision"], perfect["recall"]) == (1.0, 1.0, 1.0, 1.0)

    # AND the same from the run's YOLO export (boxes in fractions of the image, matched by the export's file names)
    code, output = annotate("export", "--format", "yolo", "--out", str(tmp_path / "yolo"), "--data-dir", str(annotated))
    assert code == 0, output
    yolo = tmp_path / "yolo" / "data.yaml"
    code, output = annotate("evaluate", "--truth", str(yolo), "--data-dir", str(annotated), "--format", "json")
    assert code == 0, output
    from_yolo = json.loads(output)
    assert from_yolo["images"] == 3 and (from_yolo["AP50"], from_yolo["precision"], from_yolo["recall"]) == (1, 1, 1)
    assert from_yolo["mAP"] == pytest.approx(1.0)  # its corners are rounded to millionths of a side

    # WHEN a reviewer renamed every box's label, THEN nothing the pipeline found counts
    coco = json.loads(truth.read_text())
    coco["categories"] = [{**category, "name": f"not {category['name']}"} for category in coco["categories"]]
    renamed = tmp_path / "renamed.json"
    renamed.write_text(json.dumps(coco))
    code, output = annotate("evaluate", "--truth", str(renamed), "--data-dir", str(annotated))
    assert code == 0, output
    assert "written to" in output and "(all)" in output

    # AND both evaluations are rows of the evaluations table, beside images and detections
    rows = run_local_query(
        "SELECT ap, ap50, precision, recall FROM evaluations WHERE label IS NULL ORDER BY evaluated_at", annotated
    ).to_pylist()
    assert rows[0] == {"ap": 1.0, "ap50": 1.0, "precision": 1.0, "recall": 1.0}
    assert rows[2] == {"ap": 0.0, "ap50": 0.0, "precision": 0.0, "recall": 0.0} and len(rows) == 3

    # AND labels of images the pipeline never saw are refused in one line, nothing written
    def evaluation_rows() -> int:
        return int(run_local_query("SELECT count(*) AS n FROM evaluations", annotated).to_pylist()[0]["n"])

    written = evaluation_rows()
    # AND the same evaluation run again replaces its rows instead of adding them twice; a caption people wrote for
    # an image the run did not caption is said, not scored 0
    coco["annotations"].append({"id": 999, "image_id": coco["images"][0]["id"], "caption": "A dog on grass."})
    renamed.write_text(json.dumps(coco))
    code, output = annotate("evaluate", "--truth", str(renamed), "--data-dir", str(annotated))
    assert code == 0 and "no caption written for 1 of the images people captioned" in output, output
    assert "caption word F1" not in output and evaluation_rows() == written
    other = {"images": [{"id": 1, "file_name": "elsewhere.jpg"}], "annotations": [], "categories": []}
    (tmp_path / "other.json").write_text(json.dumps(other))
    code, output = annotate("evaluate", "--truth", str(tmp_path / "other.json"), "--data-dir", str(annotated))
    assert code == 2 and output.strip().count("\n") == 0 and "none of the 1 labelled images" in output, output
    assert evaluation_rows() == written


def test_masks_run_export_and_evaluate_read_back_by_supervision_and_pycocotools(
    tiny_settings: object, inputs: Path, tmp_path: Path
) -> None:
    import numpy as np
    import supervision as sv

    from shared.contracts import BoxMask
    from shared.storage.masks import decoded

    # GIVEN the inputs annotated with a mask per box
    data_dir = tmp_path / "data"
    code, output = annotate(
        "run", str(inputs), "--prompt", "dog. cat.", "--profile", "tiny", "--data-dir", str(data_dir), "--no-caption",
        "--masks", "--box-threshold", "0.2",
    )  # fmt: skip
    assert code == 1 and "3 succeeded, 1 failed" in output, output
    rows = run_local_query(
        "SELECT m.image_id, m.detection_index, m.counts, m.height, m.width, m.area, m.score, d.x0, d.y0, d.x1, d.y1 "
        "FROM masks m JOIN detections d USING (image_id, batch_id, detection_index) "
        "ORDER BY m.image_id, m.detection_index",
        data_dir,
    ).to_pylist()
    assert rows and len(rows) == run_local_query("SELECT count(*) AS n FROM detections", data_dir).to_pylist()[0]["n"]
    masks: dict[str, list[np.ndarray]] = {}
    for row in rows:
        mask = decoded(BoxMask(**{k: row[k] for k in ("counts", "height", "width", "area", "score")}))
        # THEN each row's RLE decodes (pycocotools) to a mask inside its box
        ys, xs = np.nonzero(mask)
        assert xs.size == row["area"] > 0
        assert xs.min() >= np.floor(row["x0"]) and xs.max() < np.ceil(row["x1"])
        assert ys.min() >= np.floor(row["y0"]) and ys.max() < np.ceil(row["y1"])
        masks.setdefault(row["image_id"], []).append(mask.astype(bool))
    # AND COCO's and YOLO's exports carry them, as supervision reads them
    for export_format in ("coco", "yolo"):
        code, output = annotate(
            "export", "--format", export_format, "--out", str(tmp_path / export_format), "--data-dir", str(data_dir)
        )
        assert code == 0, output
    coco = sv.DetectionDataset.from_coco(
        str(tmp_path / "coco" / "images"), str(tmp_path / "coco" / "annotations.json"), force_masks=True
    )
    yolo = tmp_path / "yolo"
    outlined = sv.DetectionDataset.from_yolo(
        str(yolo / "images"), str(yolo / "labels"), str(yolo / "data.yaml"), force_masks=True
    )
    for path, _, detections in coco:  # the RLE, exactly
        expected = masks[Path(path).stem]
        assert detections.mask is not None and len(detections.mask) == len(expected)
        assert all((found == mask).all() for found, mask in zip(detections.mask, expected, strict=True))
    # one polygon an object, the outer outline of the mask's largest part: its pixels are mostly the mask's, but for
    # the holes it closes (a random model's masks have many) and those OpenCV fills along its edge
    for path, _, detections in outlined:
        expected = masks[Path(path).stem]
        assert detections.mask is not None and len(detections.mask) == len(expected)
        within = [(found & mask).sum() / found.sum() for found, mask in zip(detections.mask, expected, strict=True)]
        assert min(within) > 0.3 and np.median(within) >= 0.7, within
        for found, mask in zip(detections.mask, expected, strict=True):
            rows, columns = np.nonzero(mask)
            inside = np.zeros_like(mask)
            inside[rows.min() : rows.max() + 2, columns.min() : columns.max() + 2] = True  # OpenCV's edge row
            assert not (found & ~inside).any()
    # AND evaluate scores the masks against the COCO export: pycocotools' segm finds them the truth's own
    truth = tmp_path / "coco" / "annotations.json"
    code, output = annotate("evaluate", "--truth", str(truth), "--data-dir", str(data_dir), "--format", "json")
    assert code == 0, output
    scores = json.loads(output)
    assert scores["mask_mAP"] == pytest.approx(1.0) and scores["mAP"] == pytest.approx(1.0)
