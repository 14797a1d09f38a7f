"""Detect's accounting against the CPU's limit (annotate bench-flops): the FLOPs read off OpenVINO's compiled shapes,
and a run on the tiny export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shared.settings import Settings
from tools.bench.flops import _compiled, product_layers, write_report


def test_a_products_flops_are_read_off_the_compiled_models_shapes() -> None:
    import openvino
    import openvino.opset13 as ops

    rng = np.random.default_rng(0)
    source = ops.parameter([1, 300, 64], np.float32, name="source")
    linear = ops.matmul(source, ops.constant(rng.standard_normal((64, 48), dtype=np.float32)), False, False)
    keys = ops.parameter([1, 200, 48], np.float32, name="keys")
    scores = ops.matmul(linear, keys, False, True)  # (300 x 48)(48 x 200): attention's scores
    image = ops.parameter([1, 3, 32, 40], np.float32, name="image")
    conv = ops.convolution(
        image, ops.constant(rng.standard_normal((16, 3, 3, 3), dtype=np.float32)), [2, 2], [1, 1], [1, 1], [1, 1]
    )
    compiled = _compiled(openvino.Model([scores, conv], [source, keys, image]), threads=1)

    layers = {layer["type"]: layer for layer in product_layers(compiled.get_runtime_model())}

    assert layers["FullyConnected"]["shape"] == [300, 64, 48]
    assert layers["FullyConnected"]["gflop"] == pytest.approx(2 * 300 * 64 * 48 / 1e9)
    assert layers["MatMul"]["shape"] == [300, 48, 200]
    assert layers["Convolution"]["shape"] == [16 * 20, 27, 16]  # 16x20 outputs, each over 3 channels' 3x3


@pytest.mark.slow
def test_the_accounting_of_the_tiny_detector_is_consistent(tiny_settings: Settings, tmp_path: Path) -> None:
    write_report(full_size=False, repeats=1, out_dir=tmp_path)

    report = json.loads((tmp_path / "flops.json").read_text())
    sizes = {tuple(size["size"]): size for size in report["sizes"]}
    assert set(sizes) == {tuple(size) for size in tiny_settings.detection.export_sizes()}
    for size in sizes.values():
        # the formulas torch lacks are applied: the deformable attention's sampling is counted
        assert size["gflop_by_op"]["grid_sampler_2d"] > 0 and size["gflop_by_op"]["addmm"] > 0
        assert size["gflop"] == pytest.approx(sum(size["gflop_by_op"].values()))
        assert size["floor_s"] == pytest.approx(size["gflop"] / report["peak"]["gflops_per_s"])
        assert size["achieved_gflops_per_s"] < report["clock"]["gflops_per_s"]
    # the FLOPs grow with the pixels: 1333x800 and 800x1333 the same work, 800x1066 less
    assert sizes[(800, 1333)]["gflop"] == pytest.approx(sizes[(1333, 800)]["gflop"], rel=0.02)
    assert sizes[(800, 1066)]["gflop"] < sizes[(800, 1333)]["gflop"]
    profile = report["profile"]
    # the counters account for the run they were read from (their sum may pass its wall time: 1.35x at full size
    # alone, 2.1x for the tiny model's small layers beside another test worker; compile time in them would be
    # tens of times more), and every layer ran in fp32 (the pipeline's hint)
    assert 0.5 * profile["wall_median_s"] < profile["counted_s"] < 4 * profile["wall_median_s"]
    assert profile["bf16_primitives"] == [] and "bf16" not in profile["runtime_precisions"]
    assert sum(entry["share"] for entry in profile["by_type"].values()) == pytest.approx(1.0)
    # OpenVINO's products are torch's linear layers and convolutions, give or take what a Subgraph fused
    profiled = sizes[tuple(profile["size"])]["gflop_by_op"]
    torch_products = sum(profiled.get(op, 0.0) for op in ("addmm", "mm", "bmm", "convolution"))
    assert 0.5 * torch_products < profile["product_gflop"] <= 1.01 * torch_products
    markdown = (tmp_path / "flops.md").read_text()
    assert "| 800x1333 |" in markdown and "**Measured peak**" in markdown and "| FullyConnected |" in markdown
