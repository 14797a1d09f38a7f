"""The benchmark's measurements on tiny models: the detector drift report and a short end-to-end run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from shared.settings import Settings, default_detector_runtime
from tests.conftest import SAMPLES
from tools.bench.models import BenchOptions, _detection_drift, run_bench

pytestmark = pytest.mark.slow


def test_the_drift_report_compares_each_way_of_detecting_with_torch_fp32(tiny_settings: Settings) -> None:
    image = Image.open(SAMPLES / "chelsea-the-cat.jpg").convert("RGB")
    options = BenchOptions(images=[SAMPLES / "chelsea-the-cat.jpg"], lossy_short_side=512, lossy_queries=10)
    drift = _detection_drift(tiny_settings.model_copy(update={"max_detections": 8}), [image], options)
    reference = drift["torch fp32 (model card)"]
    assert reference["boxes_found_again"] == "8/8" and reference["mean_matched_iou"] == 1.0
    # The exported graph is the pipeline's: the boxes it finds again are the reference's (the tiny model's scores
    # saturate at 1.0, so which 8 of the tied boxes are kept can change with the padding and the resize)
    runtime = tiny_settings.detector_runtime  # the pipeline's, on this machine
    other = "onnxruntime" if runtime == "openvino" else "openvino"
    found, total = map(int, drift[f"{runtime} fp32 (pipeline)"]["boxes_found_again"].split("/"))
    assert total == 8 and found >= 1
    assert drift[f"{runtime} fp32 (pipeline)"]["mean_matched_iou"] > 0.99
    assert drift[f"{other} fp32 (detector_runtime={other})"]["mean_matched_iou"] > 0.99
    assert set(drift) == {
        "torch fp32 (model card)",
        f"{runtime} fp32 (pipeline)",
        f"{other} fp32 (detector_runtime={other})",
        f"{runtime} int8 weights (detector_int8)",
        f"{runtime} fp32, short side 512",
        f"{runtime} fp32, 10 queries (detector_max_queries)",
        "torch bf16 autocast (not offered: no bf16 on Lambda's CPUs)",
    }
    assert all(way["median_s"] > 0 for way in drift.values())


def test_a_short_bench_run_writes_its_report(tmp_path: Path) -> None:
    options = BenchOptions(
        images=[SAMPLES / "coffee.webp"],
        repeats=1,
        crops=2,
        models="tiny",
        variants=False,
        vision_caption=False,
        out_dir=tmp_path,
    )
    report = run_bench(options)
    written = json.loads((tmp_path / "bench.json").read_text())
    assert written["whole_image"] == report["whole_image"]
    assert set(written["steps"]) == {"detect", "classify", "tag", "segment", "caption"}
    # the whole image is a request with the defaults (no masks); masks are said beside it
    defaults = sum(written["steps"][step]["pipeline_median_s"] for step in ("detect", "classify", "tag", "caption"))
    assert written["whole_image"]["pipeline_s"] == pytest.approx(defaults, abs=2e-3)
    added = written["steps"]["segment"]["pipeline_median_s"] / written["whole_image"]["pipeline_s"]
    assert written["whole_image"]["masks_added"] == pytest.approx(added, abs=2e-3)
    assert all(step["pipeline_median_s"] > 0 and step["cold_start_s"] > 0 for step in written["steps"].values())
    markdown = (tmp_path / "bench.md").read_text()
    assert "| **whole image** |" in markdown
    if default_detector_runtime() == "openvino":  # Detect's cold start also compiling its size, and every size
        assert written["steps"]["detect"]["cold_start_compiling_s"] > 0
        assert written["steps"]["detect"]["cold_start_all_sizes_s"] > 0
        assert "compiling every size" in markdown
    # The detect reference is the model card's recipe; transformers' pipeline() is a second, labelled row
    assert written["detect_against_transformers_pipeline"]["transformers_pipeline_median_s"] > 0
    assert '| detect, against `pipeline("zero-shot-object-detection")`' in markdown


def test_the_ingest_bench_plans_a_prefix_from_its_listing_and_writes_its_report(tmp_path: Path) -> None:
    from tools.bench.ingest import run_ingest_bench

    report = run_ingest_bench(1_200, tmp_path)

    # one execution: its input and its groups manifest
    assert report["planning"]["requests"] == {"ListObjectsV2": 2, "PutObject": 2}
    assert report["head_per_object"]["requests"] == {"ListObjectsV2": 2, "HeadObject": 1_200}
    assert (report["executions_started"], report["groups"]) == (1, 120) and report["planning"]["peak_python_mb"] > 0
    assert json.loads((tmp_path / "ingest.json").read_text()) == report
    assert "| listing's ETags (now) |" in (tmp_path / "ingest.md").read_text()


def test_a_short_bulk_bench_times_both_sides_and_the_tasks_memory(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tools.cli import app

    # GIVEN two copies of a sample, tiny models
    arguments = ["bench-bulk", str(SAMPLES / "coffee.webp"), "--copies", "2", "--repeats", "1", "--models", "tiny"]
    # WHEN annotate bench-bulk runs
    result = CliRunner().invoke(app, [*arguments, "--out-dir", str(tmp_path)])
    # THEN both sides were timed, and the worker's peak memory measured in a process of its own
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "bulk.json").read_text())
    assert written["images"] == 2 and written["models"] == "tiny"
    assert all(seconds > 0 for seconds in written["seconds_per_image"].values())
    assert written["task_peak_rss_mb"] > 100
    # AND again with the models read from S3 (moto's, on 127.0.0.1), as the deployed task reads them
    assert written["task_peak_rss_models_from_s3_mb"] > 100
    # AND each side ran on its lane's runtimes: the worker on the bulk task's, the other on the Classify function's
    assert written["runtimes"]["worker"]["classifier_runtime"] == "openvino"
    assert written["runtimes"]["one_at_a_time"]["classifier_runtime"] == "onnxruntime"
    assert "| the bulk worker" in (tmp_path / "bulk.md").read_text()
