"""Labels a person reviewed, read for `annotate evaluate`: a COCO detection file, a Label Studio export (JSON) of a
project's annotations, or a YOLO dataset; and their images matched to the pipeline's, by URI, by file name (a Label
Studio upload by the name it had before Label Studio prefixed it), or by the ``<image_id>.<ext>`` names the
project's own exports give them.

What cannot be scored as boxes is refused in one line, never read as an image with nothing: a box that is not
finite or has no size, regions that are neither rectangles nor polygons (a polygon is scored by the box around it,
a rotated rectangle by the upright box around it), a task whose data is not an object.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from shared.contracts import Box, BoxMask
from shared.errors import AnnotateError, RequestRejected
from shared.serving.label_studio import CLASS_CONTROL, LabelledBox, original_name
from tools.results.annotations import AnnotatedImage

MAX_TRUTH_BYTES = 2 * 2**30
MAX_YAML_BYTES = 1_000_000
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".gif", ".mpo", ".heic", ".heif", ".avif")
# Label Studio's region types: those whose geometry is a box or has one around it, and those that only label one
BOX_TYPES = {"rectanglelabels", "rectangle", "polygonlabels", "polygon"}
LABEL_TYPES = {"rectanglelabels", "polygonlabels", "labels"}
NOT_REGIONS = {"choices", "textarea", "rating", "number", "taxonomy", "datetime", "pairwise", "ranker", "relation"}


@dataclass(frozen=True)
class TruthImage:
    """One image as a person labelled it: ``key`` names it (a URI or a file name)."""

    key: str
    boxes: list[LabelledBox] = field(default_factory=list)
    caption: str | None = None
    relative: bool = False  # boxes in fractions of the image's sides (YOLO's), scaled once the image is matched

    def in_pixels(self, width: int, height: int) -> TruthImage:
        if not self.relative:
            return self
        boxes = [
            replace(
                labelled,
                box=Box(
                    x0=labelled.box.x0 * width,
                    y0=labelled.box.y0 * height,
                    x1=labelled.box.x1 * width,
                    y1=labelled.box.y1 * height,
                ),
            )
            for labelled in self.boxes
        ]
        return replace(self, boxes=boxes, relative=False)


def read_truth(path: Path) -> list[TruthImage]:
    """The images of a COCO file, a Label Studio JSON export, or a YOLO dataset (its data.yaml, or its folder).

    Raises:
        RequestRejected: the file is missing, not a file, not JSON, neither format, or holds what cannot be scored.
    """
    if path.is_dir() or path.suffix in {".yaml", ".yml"}:
        return _yolo_truth(path if path.is_dir() else path.parent)
    text = read_text_file(path, MAX_TRUTH_BYTES, "JSON")
    try:
        document = json.loads(text, parse_constant=_no_constant)
    except ValueError as unreadable:
        raise RequestRejected(f"{path}: not a JSON file ({unreadable})") from None
    except RequestRejected as refused:
        raise RequestRejected(f"{path}: {refused}") from None
    try:
        if isinstance(document, dict) and {"images", "annotations"} <= document.keys():
            images = _coco_truth(document)
        elif isinstance(document, list) and all(isinstance(task, dict) and "data" in task for task in document):
            images = _label_studio_truth(document)
        else:
            raise RequestRejected("neither a COCO file (images, annotations) nor a Label Studio export (tasks)")
    except RequestRejected as refused:
        raise RequestRejected(f"{path}: {refused}") from None
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as malformed:
        raise RequestRejected(f"{path}: a malformed {type(document).__name__} of labels ({malformed!r})") from None
    return images


def _no_constant(name: str) -> Any:
    raise RequestRejected(f"it holds {name}, which is no number a box corner can be")


def read_text_file(path: Path, max_bytes: int, kind: str) -> str:
    """A file a user names, read as text only from a regular file of at most ``max_bytes``.

    Raises:
        RequestRejected: missing, not a regular file (a folder, /dev/zero), too large, or not UTF-8 text.
    """
    if not path.exists():
        raise RequestRejected(f"{path}: no such file")
    if not path.is_file():
        raise RequestRejected(f"{path}: not a regular file")
    if path.stat().st_size > max_bytes:
        raise RequestRejected(f"{path}: over {max_bytes:,} bytes")
    try:
        return path.read_bytes().decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as unreadable:
        raise RequestRejected(f"{path}: not a {kind} file ({unreadable})") from None


def checked_box(x0: float, y0: float, x1: float, y1: float, where: str) -> Box:
    """The box of these corners if they are finite numbers and it has an area.

    Raises:
        RequestRejected: it has not.
    """
    if not all(math.isfinite(value) for value in (x0, y0, x1, y1)) or x1 <= x0 or y1 <= y0:
        raise RequestRejected(
            f"{where}: a box of width {x1 - x0:g} and height {y1 - y0:g} at ({x0:g}, {y0:g}): "
            "a box needs finite corners and a size"
        )
    return Box(x0=x0, y0=y0, x1=x1, y1=y1)


def _yaml_without_aliases(text: str, where: str) -> Any:
    """YAML read without its aliases: a document that repeats a node by alias can grow without bound (the "billion
    laughs"), and a dataset's data.yaml has no need for one."""
    import yaml

    try:
        if any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(text, Loader=yaml.SafeLoader)):
            raise RequestRejected(f"{where}: YAML aliases (*name) are not read here; write the values out")
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise RequestRejected(f"{where}: not YAML ({str(error).splitlines()[0]})") from None


def _yolo_truth(folder: Path) -> list[TruthImage]:
    """A YOLO dataset's labels: each ``labels/**/<stem>.txt`` (class, centre x, centre y, width, height, in fractions
    of the image) is the image of the same path under ``images/`` (YOLO's own rule), named by that image's file
    name, or by its stem where the images are not there (the project's export names them by image id).

    Raises:
        RequestRejected: no data.yaml with names, or a label line that is not five numbers of a known class.
    """
    yaml_file = folder / "data.yaml"
    document = _yaml_without_aliases(read_text_file(yaml_file, MAX_YAML_BYTES, "YAML"), str(yaml_file))
    names = document.get("names") if isinstance(document, dict) else None
    if isinstance(names, list):
        names = dict(enumerate(names))
    if not isinstance(names, dict) or not names:
        raise RequestRejected(f"{folder}: not a YOLO dataset (its data.yaml has no names)")
    images = []
    for labels in sorted((folder / "labels").rglob("*.txt")):
        boxes = []
        for number, line in enumerate(labels.read_text(errors="replace").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                category, cx, cy, width, height = line.split()[:5]
                x, y, w, h = (float(value) for value in (cx, cy, width, height))
                label = str(names[int(category)])
            except (ValueError, KeyError) as error:
                raise RequestRejected(f"{labels}:{number}: not a YOLO box of a known class ({error})") from None
            corners = checked_box(x - w / 2, y - h / 2, x + w / 2, y + h / 2, f"{labels}:{number}")
            boxes.append(LabelledBox(label, 1.0, corners, None, None))
        images.append(TruthImage(key=_yolo_image_name(folder, labels), boxes=boxes, relative=True))
    if not images:
        raise RequestRejected(f"{folder}: no label files under {folder / 'labels'}")
    return images


def _yolo_image_name(folder: Path, labels: Path) -> str:
    relative = labels.relative_to(folder / "labels").with_suffix("")
    for suffix in IMAGE_SUFFIXES:
        for candidate in (
            folder / "images" / relative.with_suffix(suffix),
            folder / "images" / relative.with_suffix(suffix.upper()),
        ):
            if candidate.is_file():
                return candidate.name
    return f"{labels.stem}.txt"


def coco_segmentation_mask(segmentation: Any, height: int, width: int) -> BoxMask:
    """A COCO ``segmentation`` (polygons, or a run-length encoding compressed or not) as a mask, by pycocotools."""
    from pycocotools import mask as coco_mask

    if isinstance(segmentation, list):  # polygons: one object's parts, merged
        rle = coco_mask.merge(coco_mask.frPyObjects(segmentation, height, width))
    elif isinstance(segmentation.get("counts"), list):
        rle = coco_mask.frPyObjects(segmentation, height, width)
    else:
        rle = {"size": segmentation["size"], "counts": str(segmentation["counts"]).encode()}
    counts = rle["counts"]
    return BoxMask(
        counts=counts.decode() if isinstance(counts, bytes) else counts,
        height=int(rle["size"][0]),
        width=int(rle["size"][1]),
        area=int(coco_mask.area(rle)),
        score=1.0,
    )


def _coco_truth(document: dict[str, Any]) -> list[TruthImage]:
    names = {category["id"]: str(category["name"]) for category in document.get("categories", [])}
    sizes = {image["id"]: (image.get("height"), image.get("width")) for image in document["images"]}
    boxes: dict[Any, list[LabelledBox]] = {image["id"]: [] for image in document["images"]}
    captions: dict[Any, str] = {}
    for number, annotation in enumerate(document["annotations"], start=1):
        if "caption" in annotation:  # COCO's captions format
            captions[annotation["image_id"]] = str(annotation["caption"])
        if "bbox" not in annotation:
            continue
        x, y, width, height = (float(value) for value in annotation["bbox"])
        attributes = dict(annotation.get("attributes") or {})
        class_label = attributes.pop(CLASS_CONTROL, None)
        box = LabelledBox(
            label=names[annotation["category_id"]],
            score=float(annotation.get("score", 1.0)),
            box=checked_box(x, y, x + width, y + height, f"annotation {number}"),
            class_label=None if class_label is None else str(class_label),
            class_score=None,
            attributes={str(name): str(value) for name, value in attributes.items() if value},
        )
        height, width = sizes.get(annotation["image_id"], (None, None))
        if annotation.get("segmentation") and height and width:
            box = replace(box, mask=coco_segmentation_mask(annotation["segmentation"], int(height), int(width)))
        boxes[annotation["image_id"]].append(box)
    return [
        TruthImage(key=str(image["file_name"]), boxes=boxes[image["id"]], caption=captions.get(image["id"]))
        for image in document["images"]
    ]


def _label_studio_truth(tasks: list[dict[str, Any]]) -> list[TruthImage]:
    """Each task's latest annotation that was not cancelled (a task nobody annotated is no truth, and is left out)."""
    images = []
    for number, task in enumerate(tasks, start=1):
        data = task["data"]
        if not isinstance(data, dict) or not data:
            raise RequestRejected(f"task {number}: its data is not an object naming the image")
        done = [a for a in task.get("annotations") or [] if isinstance(a, dict) and not a.get("was_cancelled")]
        if not done:
            continue
        boxes, caption = _label_studio_boxes(done[-1].get("result") or [], f"task {task.get('id', number)}")
        image = data.get("image", next(iter(data.values())))
        images.append(TruthImage(key=str(image), boxes=boxes, caption=caption))
    if tasks and not images:
        predicted = sum(1 for task in tasks if task.get("predictions"))
        what = f", {predicted} with predictions (the models', not a person's)" if predicted else ""
        raise RequestRejected(
            f"a Label Studio export of {len(tasks)} tasks and no annotation{what}: review the tasks in Label Studio "
            "(Submit on each), export again and evaluate that"
        )
    return images


def _label_studio_boxes(result: list[dict[str, Any]], where: str) -> tuple[list[LabelledBox], str | None]:
    """An annotation's regions as boxes (the results of one region share its id), and its caption."""
    unscored = Counter(
        str(item.get("type")) for item in result if item.get("type") not in BOX_TYPES | LABEL_TYPES | NOT_REGIONS
    )
    if unscored:
        kinds = ", ".join(f"{count} {kind}" for kind, count in unscored.most_common())
        raise RequestRejected(
            f"{where} has regions evaluate cannot score as boxes ({kinds}): it scores rectangles and polygons"
        )
    boxes = []
    for region_id, region in _regions(result).items():
        if "box" not in region:
            continue
        if "label" not in region:
            raise RequestRejected(f"{where}: region {region_id} has no label")
        choices = dict(region.get("choices", {}))
        x0, y0, x1, y1 = region["box"]
        corners = checked_box(x0, y0, x1, y1, f"{where}, region {region_id}")
        boxes.append(
            LabelledBox(
                region["label"], 1.0, corners, choices.pop(CLASS_CONTROL, None), None, choices, region.get("mask")
            )
        )
    captions = [
        " ".join(map(str, (item.get("value") or {}).get("text", [])))
        for item in result
        if item.get("type") == "textarea"
    ]
    return boxes, captions[-1] if captions else None


def _regions(result: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The results of each region (by id): its box, its label, its per-region choices."""
    regions: dict[str, dict[str, Any]] = defaultdict(dict)
    for item in result:
        kind, value = item.get("type"), item.get("value") or {}
        region = regions[str(item.get("id", id(item)))]
        if kind in BOX_TYPES:
            width, height = float(item["original_width"]), float(item["original_height"])
            region["box"] = _region_box(value, width, height)
            if len(value.get("points") or []) >= 3:  # a polygon is a mask too (COCO's polygons, in pixels)
                outline = [coordinate for x, y in value["points"] for coordinate in (x * width / 100, y * height / 100)]
                region["mask"] = coco_segmentation_mask([outline], round(height), round(width))
        labels = [value[key] for key in ("rectanglelabels", "polygonlabels", "labels") if value.get(key)]
        if labels:
            region["label"] = str(labels[0][0])
        if kind == "choices" and value.get("choices") and "id" in item:
            region.setdefault("choices", {})[str(item["from_name"])] = str(value["choices"][0])
    return regions


def _region_box(value: dict[str, Any], width: float, height: float) -> tuple[float, float, float, float]:
    """The upright box around a region, in pixels: a polygon's points, or a rectangle turned by ``rotation`` degrees
    clockwise about its top-left corner (Label Studio's geometry, in percent of the image)."""
    if "points" in value:
        points = [(float(x), float(y)) for x, y in value["points"]]
    else:
        x, y, w, h = (float(value[key]) for key in ("x", "y", "width", "height"))
        if w < 0 or h < 0:  # refused as COCO's box of negative size is (checked_box), not turned into another box
            raise RequestRejected(f"a rectangle of negative width or height ({w:g}% by {h:g}%)")
        turn = math.radians(float(value.get("rotation") or 0))
        cos, sin = math.cos(turn), math.sin(turn)
        # Percent of the width and of the height are not the same length: turn in pixels
        x, y, w, h = x * width / 100, y * height / 100, w * width / 100, h * height / 100
        corners = [(0.0, 0.0), (w, 0.0), (0.0, h), (w, h)]
        turned = [(x + dx * cos - dy * sin, y + dx * sin + dy * cos) for dx, dy in corners]
        return (
            min(p[0] for p in turned),
            min(p[1] for p in turned),
            max(p[0] for p in turned),
            max(p[1] for p in turned),
        )
    xs, ys = [x * width / 100 for x, _ in points], [y * height / 100 for _, y in points]
    return min(xs), min(ys), max(xs), max(ys)


def image_name(key: str) -> str:
    """The file name a truth key names (a Label Studio upload's name before Label Studio prefixed it)."""
    return original_name(key) or PurePosixPath(key.split("?", 1)[0]).name


Digest = Callable[[str], str | None]  # a source's content digest (None: unreadable)


def match_images(
    truth: list[TruthImage], predicted: list[AnnotatedImage], digest: Digest | None = None
) -> tuple[list[tuple[TruthImage, AnnotatedImage]], list[str]]:
    """Each truth image with the pipeline's image it names, and the keys of those that name none.

    A key names an image by its URI, by its file name (when one image has it, or every image that has it is the
    same picture: ``digest`` reads their contents), or as the project's exports name its picture
    (``images/<image_id>.<ext>``).

    Raises:
        RequestRejected: one image is labelled twice, differently.
    """
    by_uri = {image.source_uri: image for image in predicted}
    by_id = {image.image_id: image for image in predicted}
    named: dict[str, list[AnnotatedImage]] = defaultdict(list)
    for annotated in predicted:
        named[PurePosixPath(annotated.source_uri).name].append(annotated)
    matched: dict[str, tuple[TruthImage, AnnotatedImage]] = {}
    unmatched = []
    for labelled in truth:
        name = image_name(labelled.key)
        found = (
            by_uri.get(labelled.key) or by_id.get(PurePosixPath(name).stem) or _one_picture(named.get(name, []), digest)
        )
        if found is None:
            unmatched.append(labelled.key)
            continue
        earlier = matched.get(found.source_uri)
        if earlier is not None and (earlier[0].boxes, earlier[0].caption) != (labelled.boxes, labelled.caption):
            raise RequestRejected(
                f"{found.source_uri} is labelled twice, differently ({earlier[0].key} and {labelled.key}): keep one"
            )
        matched[found.source_uri] = (labelled, found)
    return list(matched.values()), unmatched


def _one_picture(images: list[AnnotatedImage], digest: Digest | None) -> AnnotatedImage | None:
    """The image a file name names: the one image of that name, or the latest where they are all one picture."""
    if len(images) == 1:
        return images[0]
    if not images or digest is None:
        return None
    digests = {digest(image.source_uri) for image in images}
    if len(digests) != 1 or None in digests:
        return None
    return max(images, key=lambda image: str(image.processed_at))


def content_digest(store_for: Any) -> Digest:
    """:data:`Digest` over the stores: the sha256 of the source's bytes."""

    def digest(uri: str) -> str | None:
        try:
            return hashlib.sha256(store_for(uri).read_bytes(uri)).hexdigest()
        except (AnnotateError, OSError):
            return None

    return digest


def unmatched_refusal(unmatched: list[str], truth: Iterable[TruthImage]) -> RequestRejected:
    return RequestRejected(
        f"{len(unmatched)} of the {len(list(truth))} labelled images were not annotated by the pipeline (the first: "
        f"{unmatched[0]}): annotate them first, or leave them out of the truth file"
    )
