"""Segment on a tiny real EdgeTAM (random weights, the real architecture): its ONNX export against transformers'
own processor and model, the masks as COCO reads them, and the step's document and rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as coco_mask

from shared.contracts import AnnotationRequest, Box, DescribeInput, Detection, ImageRef, ImageState, ImageTask
from shared.models.segmentation import box_window, load_segmenter, upsampling_weights
from shared.models.sources import resolve_model_dir
from shared.pipeline import steps
from shared.pipeline.dependencies import Step, build_dependencies
from shared.settings import Settings
from shared.storage.masks import decoded
from shared.storage.tables import masks_table
from tests.conftest import SAMPLES
from tools.models.segment_export import load_torch_segmenter

pytestmark = pytest.mark.slow
CAT = Image.open(SAMPLES / "chelsea-the-cat.jpg").convert("RGB")
BOXES = [Box(x0=10.5, y0=20.2, x1=200.7, y1=250.1), Box(x0=100, y0=50, x1=CAT.width - 1, y1=CAT.height - 3)]


def test_the_upsampling_is_torch_s_bilinear_resize_over_a_box_s_rows_and_columns() -> None:
    logits = np.random.default_rng(0).normal(size=(16, 16))
    full = torch.nn.functional.interpolate(
        torch.from_numpy(logits)[None, None], (61, 47), mode="bilinear", align_corners=False
    )[0, 0].numpy()
    window = upsampling_weights(16, 61, 7, 30) @ logits @ upsampling_weights(16, 47, 3, 45).T
    np.testing.assert_allclose(window, full[7:30, 3:45], atol=1e-12)


def test_the_export_masks_each_box_as_transformers_does_within_the_box(tiny_settings: Settings) -> None:
    # GIVEN the tiny EdgeTAM, exported and as transformers runs it with its own processor
    segmenter = load_segmenter(tiny_settings.segment)
    model, processor = load_torch_segmenter(resolve_model_dir(tiny_settings.segment_model, tiny_settings.model_files))
    inputs = processor(images=CAT, input_boxes=[[[b.x0, b.y0, b.x1, b.y1] for b in BOXES]], return_tensors="pt")
    with torch.no_grad():
        reference = model(**inputs, multimask_output=False)
    expected = processor.post_process_masks(reference.pred_masks, inputs["original_sizes"])[0][:, 0].numpy()
    # WHEN the export segments the boxes
    masks = segmenter.segment(CAT, BOXES)
    # THEN each mask is transformers' within its box (a pixel or so apart: Pillow's resize of the image against the
    # processor's), its score the model's predicted IoU, and COCO reads it as written
    for box, mask, torch_mask, torch_score in zip(BOXES, masks, expected, reference.iou_scores[0, :, 0], strict=True):
        assert mask is not None
        x0, y0, x1, y1 = box_window(box, CAT.width, CAT.height)
        within = np.zeros_like(torch_mask)
        within[y0:y1, x0:x1] = torch_mask[y0:y1, x0:x1]
        ours = decoded(mask).astype(bool)
        assert (ours & within).sum() / (ours | within).sum() > 0.999
        assert 0 < ours.sum() < (x1 - x0) * (y1 - y0)  # the model's mask, not its box
        assert not ours[:y0].any() and not ours[y1:].any() and not ours[:, :x0].any() and not ours[:, x1:].any()
        rle = {"size": [mask.height, mask.width], "counts": mask.counts.encode()}
        assert int(coco_mask.area(rle)) == mask.area == ours.sum()
        assert mask.score == pytest.approx(float(torch_score), abs=1e-3)
    assert segmenter.segment(CAT, []) == []


def test_the_step_writes_the_masks_beside_the_result_and_each_becomes_a_row(
    tiny_settings: Settings, tmp_path: Path
) -> None:
    task = ImageTask(
        batch_id="b-" + "0" * 20,
        request=AnnotationRequest(prompt="cat.", masks=True),
        image=ImageRef(image_id="0" * 16, source_uri=str(SAMPLES / "chelsea-the-cat.jpg")),
        results_uri=str(tmp_path),
    )
    detections = [Detection(label="cat", score=0.9, box=box) for box in BOXES]
    deps = build_dependencies(Step.SEGMENT, tiny_settings)
    output = steps.segment(DescribeInput(task=task, detections=detections), deps)
    assert output.masks == 2 and output.masks_uri.endswith(".masks.json") and output.made_by.model == "tiny:edgetam"
    assert Path(output.masks_uri).parent == tmp_path / "results" / task.batch_id
    state = ImageState.model_validate(
        {
            "task": task,
            "detection": {"width": CAT.width, "height": CAT.height, "detections": detections, "ms": 1.0},
            "description": {"tag": {"tags": [{}, {}], "ms": 1.0}, "segment": output},
        }
    )
    result = steps.write_result_document(state, deps)
    assert result.masks is not None and result.segment_ms == output.ms and "segment" in result.made_by
    rows = masks_table([result]).to_pylist()
    assert [row["detection_index"] for row in rows] == [0, 1]
    assert rows[0]["counts"] == result.masks.masks[0].counts and rows[0]["model"] == "tiny:edgetam"
