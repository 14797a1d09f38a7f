"""The annotations where people take them: a COCO detection dataset, a YOLO dataset, Label Studio pre-annotations.

Boxes are in pixels of the image as a viewer shows it (EXIF orientation applied). So that a dataset's pictures
agree with its boxes, a source whose EXIF turns it is exported turned (as PNG, lossless); any other is copied as
it is.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from PIL import Image

from shared.contracts import AnnotationRequest, BoxMask
from shared.errors import ImageRejected, RequestRejected
from shared.pipeline.batches import image_ref
from shared.serving.label_studio import CLASS_CONTROL, LabelledBox, Option, Project, ShapeControl, read_label_config
from shared.serving.label_studio_results import label_config, prediction
from shared.storage.images import decode_image
from shared.storage.masks import outlines
from shared.storage.objects import StoreFor
from tools.results.annotations import AnnotatedImage

IMAGES_FOLDER = "images"
EXPORT_MARKER = ".annotate-export.json"  # what an export wrote into its folder
EXIF_ORIENTATION = 0x0112
# Label Studio's own names for the controls its labelling config declares (label_config.xml beside the tasks).
LS_IMAGE, LS_BOXES, LS_MASKS, LS_CAPTION = "image", "label", "mask", "caption"


class ExportFormat(StrEnum):
    COCO = "coco"
    YOLO = "yolo"
    LABEL_STUDIO = "labelstudio"


@dataclass
class ExportReport:
    images: int = 0
    boxes: int = 0
    skipped: dict[str, str] = field(default_factory=dict)  # source -> why it is not in the export


def export(
    images: list[AnnotatedImage],
    export_format: ExportFormat,
    out_dir: Path,
    store_for: StoreFor,
    label_studio_config: str = "",
) -> ExportReport:
    """Write ``images`` in ``export_format`` under ``out_dir``. A failed image (no boxes to give), a source that
    cannot be read any more, is no longer a picture, or is not the one annotated (its content changed) is skipped,
    with the reason, and the rest is exported. The export is written beside ``out_dir`` and moved into it at the
    end, so a failure leaves no half-written folder. Label Studio's tasks fill ``label_studio_config`` (a label
    config: the project's own, or :func:`label_studio_config` of the images), which is written beside them.

    Raises:
        RequestRejected: ``out_dir`` holds files an export did not write; the label config is not one the models
            fill.
        OSError: ``out_dir`` cannot be written (a full disk, a path no folder can be made at).
    """
    project = read_label_config(label_studio_config) if export_format is ExportFormat.LABEL_STUDIO else None
    report = ExportReport()
    earlier = _earlier_export(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        kept: list[tuple[AnnotatedImage, str]] = []
        for image in images:
            reason = _why_not_exported(image, store_for)
            try:
                if reason is None and export_format is not ExportFormat.LABEL_STUDIO:
                    kept.append((image, _copy_picture(image, staging, store_for)))
                elif reason is None:
                    kept.append((image, ""))
            except (ImageRejected, OSError) as error:  # PIL's UnidentifiedImageError is an OSError
                reason = f"its source is not a picture any more: {error}"
            if reason is not None:
                report.skipped[image.source_uri] = reason
        if project is not None:
            _write_label_studio(kept, staging, project, label_studio_config)
        else:
            (_write_coco if export_format is ExportFormat.COCO else _write_yolo)(kept, staging)
        _move_into(staging, out_dir, earlier)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report.images, report.boxes = len(kept), sum(len(image.boxes) for image, _ in kept)
    return report


def _why_not_exported(image: AnnotatedImage, store_for: StoreFor) -> str | None:
    """Why ``image`` has no place in an export (None: it has): not annotated, or its source is gone or changed."""
    if image.status != "succeeded" or not image.width or not image.height:
        return f"not annotated: {image.error or image.status}"
    fingerprint = store_for(image.source_uri).fingerprint(image.source_uri)
    if fingerprint == "missing":
        return f"{image.source_uri} does not exist any more"
    if image_ref(image.source_uri, fingerprint).image_id != image.image_id:
        return "its source changed since it was annotated (the image id holds its content's digest): annotate it again"
    return None


def _files_under(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*") if not path.is_dir() or path.is_symlink()}


def _earlier_export(out_dir: Path) -> set[str]:
    """The files of an earlier export that ``out_dir`` holds, which a new export replaces; none for a new or empty
    folder.

    Raises:
        RequestRejected: ``out_dir`` holds anything an export did not write there (a dataset made by hand, notes,
            another tool's files): an export never deletes or overwrites what it did not write.
    """
    if not out_dir.is_dir():
        return set()
    written = _files_written(out_dir / EXPORT_MARKER)
    if not written and any(out_dir.iterdir()):  # not walked: it may be a whole disk (--out /)
        raise RequestRejected(
            f"--out {out_dir} already holds files annotate export did not write: name a new or empty folder"
        )
    present = _files_under(out_dir)
    foreign = sorted(present - written)
    if foreign:
        raise RequestRejected(
            f"--out {out_dir} already holds files annotate export did not write ({foreign[0]}"
            f"{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}): name a new or empty folder"
        )
    return present - {EXPORT_MARKER}


def _files_written(marker: Path) -> set[str]:
    """What an earlier export listed in its marker, the marker included; none when there is no readable marker (a
    marker edited by hand proves nothing, so the folder's files count as the user's)."""
    try:
        listed = json.loads(marker.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return set()
    return {str(name) for name in listed} | {EXPORT_MARKER}


def _move_into(staging: Path, out_dir: Path, earlier: set[str]) -> None:
    """The files an earlier export wrote are removed, then the new export moves in, with the list of what it wrote
    (so that the next export knows them from the user's)."""
    written = sorted(_files_under(staging))
    out_dir.mkdir(exist_ok=True)
    for name in earlier:
        (out_dir / name).unlink(missing_ok=True)
    for folder in sorted({(out_dir / name).parent for name in earlier}, key=lambda path: -len(path.parts)):
        if folder != out_dir and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    for entry in staging.iterdir():
        entry.replace(out_dir / entry.name)
    (out_dir / EXPORT_MARKER).write_text(json.dumps({"files": written}, indent=1) + "\n")


def categories(images: list[AnnotatedImage]) -> list[str]:
    """The detected labels, sorted: class ids are their positions."""
    return sorted({box.label for image in images for box in image.boxes})


def _copy_picture(image: AnnotatedImage, out_dir: Path, store_for: StoreFor) -> str:
    """The source picture as ``images/<image_id>.<ext>``, turned as a viewer shows it; its file name.

    Raises:
        ImageRejected: the source cannot be read any more (moved or deleted since it was annotated).
    """
    data = store_for(image.source_uri).read_bytes(image.source_uri)
    with Image.open(io.BytesIO(data)) as opened:
        turned = opened.getexif().get(EXIF_ORIENTATION, 1) != 1
        extension = {"JPEG": "jpg", "MPO": "jpg"}.get(opened.format or "", (opened.format or "bin").lower())
    folder = out_dir / IMAGES_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    if turned:
        name = f"{image.image_id}.png"
        decode_image(data, max_pixels=(image.width or 1) * (image.height or 1)).pixels.save(folder / name)
    else:
        name = f"{image.image_id}.{extension}"
        (folder / name).write_bytes(data)
    return name


def _write_coco(kept: list[tuple[AnnotatedImage, str]], out_dir: Path) -> None:
    names = categories([image for image, _ in kept])
    coco: dict[str, Any] = {
        "info": {"description": "annotate export", "version": "1.0"},
        "images": [],
        "annotations": [],
        "categories": [{"id": index + 1, "name": name, "supercategory": "none"} for index, name in enumerate(names)],
    }
    for image_number, (image, file_name) in enumerate(kept, start=1):
        coco["images"].append(
            {"id": image_number, "file_name": file_name, "width": image.width, "height": image.height}
        )
        for box in image.boxes:
            width, height = box.box.x1 - box.box.x0, box.box.y1 - box.box.y0
            coco["annotations"].append(
                {
                    "id": len(coco["annotations"]) + 1,
                    "image_id": image_number,
                    "category_id": names.index(box.label) + 1,
                    "bbox": [box.box.x0, box.box.y0, width, height],
                    # the mask's area where it has one (COCO's segm area), as pycocotools reads its RLE
                    "area": box.mask.area if box.mask else width * height,
                    **({"segmentation": _coco_rle(box.mask)} if box.mask else {}),
                    "iscrowd": 0,
                    "score": box.score,
                    "attributes": {"class": box.class_label, **box.attributes},
                }
            )
    (out_dir / "annotations.json").write_text(json.dumps(coco, indent=1))


def _coco_rle(mask: BoxMask) -> dict[str, Any]:
    return {"size": [mask.height, mask.width], "counts": mask.counts}


def _write_yolo(kept: list[tuple[AnnotatedImage, str]], out_dir: Path) -> None:
    """YOLO's detection dataset, or, where a box has a mask, its segmentation dataset: every line a polygon (a box
    without a mask as its rectangle), as one dataset holds one kind of line."""
    names = categories([image for image, _ in kept])
    segments = any(box.mask for image, _ in kept for box in image.boxes)
    labels = out_dir / "labels"
    labels.mkdir(parents=True, exist_ok=True)
    for image, file_name in kept:
        assert image.width and image.height
        shape = _yolo_polygon if segments else _yolo_box
        lines = [f"{names.index(box.label)} {shape(box, image.width, image.height)}\n" for box in image.boxes]
        (labels / f"{Path(file_name).stem}.txt").write_text("".join(lines))
    data = ["path: .", f"train: {IMAGES_FOLDER}", f"val: {IMAGES_FOLDER}", f"nc: {len(names)}", "names:"]
    # YAML's double-quoted escapes are JSON's but for characters past U+FFFF, which JSON writes as two surrogates
    # that a YAML reader keeps apart: such characters are written as they are
    data += [f"  {index}: {json.dumps(name, ensure_ascii=False)}" for index, name in enumerate(names)]
    (out_dir / "data.yaml").write_text("\n".join(data) + "\n", encoding="utf-8")


def _yolo_polygon(labelled: LabelledBox, width: int, height: int) -> str:
    """The mask's largest outline (its box's corners where it has none), each point a fraction of the image's side."""
    box = labelled.box
    shapes = outlines(labelled.mask) if labelled.mask else []
    points = shapes[0] if shapes else [(box.x0, box.y0), (box.x1, box.y0), (box.x1, box.y1), (box.x0, box.y1)]
    return " ".join(f"{min(max(x / width, 0.0), 1.0):.6f} {min(max(y / height, 0.0), 1.0):.6f}" for x, y in points)


def _yolo_box(labelled: LabelledBox, width: int, height: int) -> str:
    """Centre x, centre y, width, height, each a fraction of the image's side."""
    box = labelled.box
    values = (
        (box.x0 + box.x1) / 2 / width,
        (box.y0 + box.y1) / 2 / height,
        (box.x1 - box.x0) / width,
        (box.y1 - box.y0) / height,
    )
    return " ".join(f"{value:.6f}" for value in values)


def _write_label_studio(kept: list[tuple[AnnotatedImage, str]], out_dir: Path, project: Project, config: str) -> None:
    tasks = [label_studio_task(image, project) for image, _ in kept]
    (out_dir / "tasks.json").write_text(json.dumps(tasks, indent=1))
    (out_dir / "label_config.xml").write_text(config)


def label_studio_config(images: list[AnnotatedImage], requests: list[AnnotationRequest]) -> str:
    """The label config a project of these images needs: the requests' phrases as labels, the class each box took,
    every attribute's whole vocabulary (a reviewer picks among what was asked, not only what was found), a caption;
    the ML backend reads it back as the same project (shared/serving/label_studio.py)."""
    labels = [*(phrase for request in requests for phrase in request.phrases), *categories(images)]
    choices: dict[str, list[str]] = {CLASS_CONTROL: []}
    for request in requests:
        for name, values in request.attributes.items():
            choices.setdefault(name, []).extend(values)
    for image in images:
        for box in image.boxes:
            for name, value in ({CLASS_CONTROL: box.class_label} | box.attributes).items():
                if value:
                    choices.setdefault(name, []).append(value)
    labels_once = tuple(Option(label, label) for label in dict.fromkeys(labels))
    project = Project(
        image=LS_IMAGE,
        image_key=LS_IMAGE,
        boxes=LS_BOXES,
        labels=labels_once,
        region_choices={
            name: tuple(Option(value, value) for value in dict.fromkeys(values))
            for name, values in choices.items()
            if values
        },
        caption=LS_CAPTION,
        shapes=(ShapeControl(LS_MASKS, "brush", labels_once),)
        if any(box.mask for image in images for box in image.boxes)
        else (),
    )
    return label_config(project)


def label_studio_task(image: AnnotatedImage, project: Project) -> dict[str, Any]:
    """One task: the picture's location and the pipeline's boxes as a prediction, in the project's names."""
    assert image.width and image.height
    size = (image.width, image.height)
    return {
        "data": {project.image_key: image.source_uri},
        "predictions": [prediction(project, image.image_id, size, image.boxes, image.caption, [])],
    }
