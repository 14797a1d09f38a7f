from __future__ import annotations

from PIL import Image

from tools.bench.models import grid_boxes, markdown_report


def test_grid_boxes_tile_the_image_with_alternating_labels() -> None:
    boxes = grid_boxes(Image.new("RGB", (400, 200)), 8)
    assert len(boxes) == 8 and [b.label for b in boxes[:2]] == ["dog", "cat"]
    assert boxes[-1].box.x1 == 400 and boxes[-1].box.y1 == 200
    assert sum(b.box.area for b in boxes) == 400 * 200


def test_the_markdown_report_shows_each_step_and_the_whole_image_ratio() -> None:
    step = {
        "pipeline_median_s": 1.0,
        "reference_median_s": 2.0,
        "speedup": 2.0,
        "cold_start_s": 3.0,
        "cold_peak_rss_mb": 500.0,
    }
    report = {
        "measured_at": "2026-11-29T00:00:00+00:00",
        "machine": {"cores": 2},
        "options": {"repeats": 3, "images": ["a.jpg"], "crops": 8},
        "models": {"detector": "d"},
        "steps": {"detect": step},
        "peak_rss_mb": 900.0,
        "whole_image": {
            "pipeline_s": 1.0,
            "reference_s": 2.0,
            "speedup": 2.0,
            "pipeline_images_per_minute": 60.0,
            "reference_images_per_minute": 30.0,
        },
        "detector_drift": {
            "onnx fp32 (pipeline)": {
                "boxes_found_again": "16/16",
                "mean_matched_iou": 1.0,
                "mean_abs_score_delta": 0.0,
                "median_s": 0.5,
                "speedup": 2.0,
            }
        },
        "caption_prefix": {},
    }
    text = markdown_report(report)
    assert "| detect | 1.000 | 2.000 | 2.00x |" in text and "**2.00x**" in text
    assert "| onnx fp32 (pipeline) | 16/16 | 1.0 | 0.0 | 0.500 | 2.00x |" in text
