"""Detect held to this CPU's measured limit (`annotate bench-flops`): its floating-point operations at each exported
size, this CPU's fp32 matrix-product rate measured with Detect's own runtime at Detect's own shapes, how far Detect's
seconds are from what that rate allows, and OpenVINO's per-operation profile of one size (where the rest goes).

FLOPs are counted by torch's ``FlopCounterMode`` on the checkpoint's architecture in eager fp32 (two FLOPs a
multiply-add), with two formulas it lacks: CPU attention (``_scaled_dot_product_flash_attention_for_cpu``) and the
deformable attention's bilinear sampling (``grid_sampler_2d``, four taps a value). Normalisations, softmax and
element-wise ops are not counted: the count is of the work a floor can be drawn under.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from shared.detector_geometry import ImageSize, resized_size, smallest_holding
from shared.models.grounding_onnx import WEIGHTS_FILE, OnnxGroundingDino, export_file_name
from shared.models.onnx_runtime import mapped_file, openvino_graph_file, openvino_options
from shared.settings import DetectionSettings

PHONE_PHOTO = (3024, 4032)  # (height, width) of a 12 MP photo as a phone stores it, landscape: the profiled size
PROMPT = "dog. cat."
# OpenVINO's layer types that are matrix products (a Subgraph may hold some too: its FLOPs are not read here)
PRODUCT_LAYERS = ("FullyConnected", "MatMul", "Convolution", "GroupConvolution")
GEMM_SHAPES_MEASURED = 4  # Detect's products of most FLOPs, each timed alone
# Two 512-bit FMA units a core, 16 fp32 lanes each, two FLOPs a multiply-add (AVX-512 server cores); at the clock
# the kernel reports, which a hypervisor may show below the turbo the cores run at.
FP32_FLOPS_PER_CYCLE = 64


def _sampling_flop(input_shape: Any, grid_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """Bilinear sampling: four taps, a multiply-add each, per channel of each sampled point."""
    batch, channels = input_shape[0], input_shape[1]
    return 8 * batch * channels * math.prod(grid_shape[1:-1])


def _cpu_attention_flop(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """Scores and the weighted sum: (L x E)(E x S) and (L x S)(S x Ev) per batch and head."""
    *batch, length, embed = query
    source, value_embed = key[-2], value[-1]
    return 2 * math.prod(batch) * length * source * (embed + value_embed)


def torch_flops(model: Any, processor: Any, size: ImageSize) -> dict[str, float]:
    """GFLOP of one forward of ``model`` at ``size`` (height, width), per aten operation."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    aten = torch.ops.aten
    text = processor.tokenizer(PROMPT, return_tensors="pt")
    counter = FlopCounterMode(
        display=False,
        custom_mapping={
            aten.grid_sampler_2d: _sampling_flop,
            aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flop,
        },
    )
    with torch.inference_mode(), counter:
        model(
            pixel_values=torch.rand(1, 3, *size),
            pixel_mask=torch.ones(1, *size, dtype=torch.int64),
            input_ids=text["input_ids"],
            attention_mask=text["attention_mask"],
        )
    by_op = counter.get_flop_counts()["Global"]
    return {str(op).split(".")[1]: count / 1e9 for op, count in sorted(by_op.items(), key=lambda item: -item[1])}


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``run``, after one that is not timed (its buffers allocated)."""
    run()
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def detect_seconds(detector: OnnxGroundingDino, size: ImageSize, repeats: int) -> float:
    """Median seconds of Detect's graph (the pipeline's session) on an image of exactly ``size``."""
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (*size, 3), dtype=np.uint8))
    phrases = [phrase.strip() for phrase in PROMPT.split(".") if phrase.strip()]
    return median_seconds(lambda: detector.forward(image, phrases), repeats)


def _compiled(model: Any, threads: int, profile: bool = False) -> Any:
    import openvino

    return openvino.Core().compile_model(model, "CPU", openvino_options(threads) | {"PERF_COUNT": profile})


def product_layers(runtime_model: Any) -> list[dict[str, Any]]:
    """Each matrix product OpenVINO runs, with its (M, K, N) and FLOPs, from the compiled model's own shapes."""
    layers = []
    for op in runtime_model.get_ordered_ops():
        info = op.get_rt_info()
        layer_type = info["layerType"].astype(str)
        if layer_type not in PRODUCT_LAYERS:
            continue
        first, weights = (op.input(index).get_partial_shape().to_shape() for index in (0, 1))
        out = op.output(0).get_partial_shape().to_shape()
        if layer_type == "FullyConnected":
            contracted = first[-1]
            m, n = math.prod(first[:-1]), out[-1]
        elif layer_type == "MatMul":
            m, n = out[-2], out[-1]
            contracted = first[-1] if first[-2] == m else first[-2]
            m *= math.prod(out[:-2])
        else:  # convolutions: each output value a product over its window of every input channel of its group
            contracted = math.prod(weights[2:] if layer_type == "GroupConvolution" else weights[1:])
            m, n = math.prod(out) // out[1], out[1]
        layers.append(
            {
                "name": op.get_friendly_name(),
                "type": layer_type,
                "shape": [int(m), int(contracted), int(n)],
                "gflop": 2 * m * contracted * n / 1e9,
            }
        )
    return layers


def profile_size(folder: Path, size: ImageSize, feeds: dict[str, np.ndarray], threads: int, repeats: int) -> dict:
    """OpenVINO's performance counters for ``size``'s graph: median seconds per layer over ``repeats`` runs, summed
    by layer type, with each type's FLOPs and rate where it is a product, and the precisions the layers ran in."""
    import openvino

    model = openvino.Core().read_model(
        openvino_graph_file(folder / export_file_name(size)).read_bytes(),
        openvino.Tensor(mapped_file(folder / WEIGHTS_FILE), shared_memory=True),
    )
    compiled = _compiled(model, threads, profile=True)
    request = compiled.create_infer_request()
    request.infer(feeds)
    layer_runs: dict[str, list[float]] = defaultdict(list)
    layer_type: dict[str, str] = {}
    walls = []
    for _ in range(repeats):
        started = time.perf_counter()
        request.infer(feeds)
        walls.append(time.perf_counter() - started)
        for layer in request.profiling_info:
            layer_runs[layer.node_name].append(layer.real_time.total_seconds())
            layer_type[layer.node_name] = layer.node_type
    runtime = compiled.get_runtime_model()
    precisions: dict[str, int] = defaultdict(int)
    primitives: dict[str, int] = defaultdict(int)
    for op in runtime.get_ordered_ops():
        info = op.get_rt_info()
        precisions[info["runtimePrecision"].astype(str)] += 1
        primitives[info["primitiveType"].astype(str)] += 1
    products = product_layers(runtime)
    product_flop: dict[str, float] = defaultdict(float)
    for layer in products:
        product_flop[layer["type"]] += layer["gflop"]
    by_type: dict[str, dict[str, Any]] = {}
    for name, runs in layer_runs.items():
        entry = by_type.setdefault(layer_type[name], {"seconds": 0.0, "layers": 0})
        entry["seconds"] += statistics.median(runs)
        entry["layers"] += 1
    counted = sum(entry["seconds"] for entry in by_type.values())
    for name, entry in by_type.items():
        entry["share"] = entry["seconds"] / counted
        if name in product_flop:
            entry["gflop"] = product_flop[name]
            entry["gflops_per_s"] = product_flop[name] / entry["seconds"]
    return {
        "size": list(size),
        "wall_median_s": statistics.median(walls),
        "counted_s": counted,
        "by_type": dict(sorted(by_type.items(), key=lambda item: -item[1]["seconds"])),
        "runtime_precisions": dict(precisions),
        "bf16_primitives": sorted(name for name in primitives if "bf16" in name.lower()),
        "products": products,
    }


def gemm_rate(m: int, k: int, n: int, threads: int, repeats: int) -> float:
    """GFLOP/s of OpenVINO multiplying an (m, k) input by a constant (k, n) weight, as Detect's linear layers do,
    compiled with the pipeline's options: the median of ``repeats`` runs."""
    import openvino
    import openvino.opset13 as ops

    rng = np.random.default_rng(0)
    source = ops.parameter([m, k], np.float32, name="source")
    weight = ops.constant(rng.standard_normal((k, n), dtype=np.float32))
    compiled = _compiled(openvino.Model([ops.matmul(source, weight, False, False)], [source]), threads)
    request = compiled.create_infer_request()
    feeds = {"source": rng.standard_normal((m, k), dtype=np.float32)}
    return 2 * m * k * n / median_seconds(lambda: request.infer(feeds), repeats) / 1e9


def measured_peak(products: list[dict[str, Any]], threads: int, repeats: int) -> dict[str, Any]:
    """The fp32 product rate at the shapes that carry most of Detect's product FLOPs, each alone: the best of them
    is the peak the floor is drawn at (the rate a product of Detect's own shapes reaches on this CPU, this runtime)."""
    by_shape: dict[tuple[int, int, int], float] = defaultdict(float)
    for layer in products:
        if layer["type"] == "FullyConnected":
            by_shape[tuple(layer["shape"])] += layer["gflop"]  # type: ignore[index]
    total = sum(layer["gflop"] for layer in products)
    heaviest = sorted(by_shape.items(), key=lambda item: -item[1])[:GEMM_SHAPES_MEASURED]
    shapes = [
        {"shape": list(shape), "share_of_products": gflop / total, "gflops_per_s": gemm_rate(*shape, threads, repeats)}
        for shape, gflop in heaviest
    ]
    return {"shapes": shapes, "gflops_per_s": max(shape["gflops_per_s"] for shape in shapes)}


def clock_bound() -> dict[str, Any]:
    """What the cores' clock allows in fp32 at FP32_FLOPS_PER_CYCLE, by the clock the kernel reports."""
    mhz, model_name, flags = 0.0, platform.processor(), set[str]()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "cpu MHz" and not mhz:
                mhz = float(value)
            elif key.strip() == "model name":
                model_name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    cores = len(os.sched_getaffinity(0))
    return {
        "cpu": model_name,
        "cores": cores,
        "mhz": mhz,
        "gflops_per_s": cores * mhz * FP32_FLOPS_PER_CYCLE / 1e3,
        "bf16_units": sorted(flag for flag in flags if "bf16" in flag),
    }


def run_flops_bench(settings: DetectionSettings, folder: Path, repeats: int, torch_dir: Path) -> dict[str, Any]:
    """The accounting at every exported size of the export in ``folder`` (of the checkpoint in ``torch_dir``), the
    profile at a phone photo's size."""
    import torch
    from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

    from shared.models.grounding_onnx import load_onnx_detector

    threads = settings.torch_threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    model = AutoModelForZeroShotObjectDetection.from_pretrained(torch_dir).eval()
    processor = AutoProcessor.from_pretrained(torch_dir)
    detector = load_onnx_detector(folder, settings.model_copy(update={"detector_runtime": "openvino"}))
    manifest = detector.manifest
    photo = smallest_holding(manifest.sizes, resized_size(*PHONE_PHOTO, manifest.short_side, manifest.longest_edge))
    profiled_size = photo or manifest.sizes[0]
    image = Image.new("RGB", (profiled_size[1], profiled_size[0]), (120, 110, 100))
    pixels, pixel_mask = detector.image_inputs(image)
    feeds = {"pixel_values": pixels, "pixel_mask": pixel_mask, **detector.encoded_text(PROMPT)}
    profile = profile_size(folder, profiled_size, feeds, threads, repeats)
    peak = measured_peak(profile["products"], threads, repeats)
    clock = clock_bound()
    sizes = []
    for size in manifest.sizes:
        flops = torch_flops(model, processor, size)
        seconds = detect_seconds(detector, size, repeats)
        floor = sum(flops.values()) / peak["gflops_per_s"]
        sizes.append(
            {
                "size": list(size),
                "gflop": sum(flops.values()),
                "gflop_by_op": flops,
                "seconds": seconds,
                "floor_s": floor,
                "over_floor": seconds / floor,
                "achieved_gflops_per_s": sum(flops.values()) / seconds,
            }
        )
    return {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": settings.detector_model,
        "threads": threads,
        "repeats": repeats,
        "clock": clock,
        "peak": peak,
        "sizes": sizes,
        "profile": {key: value for key, value in profile.items() if key != "products"}
        | {"product_gflop": sum(layer["gflop"] for layer in profile["products"])},
    }


def markdown_report(report: dict[str, Any]) -> str:
    clock, peak = report["clock"], report["peak"]
    profile = report["profile"]
    size_name = "x".join(map(str, profile["size"]))
    lines = [
        f"# Detect against this CPU's limit ({report['measured_at']})",
        "",
        f"{report['model']} on OpenVINO, fp32, {report['threads']} threads; {clock['cpu']}, {clock['cores']} cores "
        f"at {clock['mhz']:.0f} MHz as the kernel reports it. Medians of {report['repeats']} runs.",
        "",
        f"**Measured peak**: {peak['gflops_per_s']:.0f} GFLOP/s, the best of Detect's heaviest product shapes, "
        f"each alone in OpenVINO with the pipeline's options. The clock allows {clock['gflops_per_s']:.0f} GFLOP/s "
        f"at {FP32_FLOPS_PER_CYCLE} fp32 FLOPs a cycle a core.",
        "",
        "| product (M x K x N) | share of Detect's product FLOPs | GFLOP/s |",
        "|---|---:|---:|",
        *(
            f"| {' x '.join(map(str, shape['shape']))} | {shape['share_of_products']:.0%} | "
            f"{shape['gflops_per_s']:.0f} |"
            for shape in peak["shapes"]
        ),
        "",
        "| size (h x w) | GFLOP (torch count) | Detect, s | floor at the peak, s | Detect over floor | "
        "achieved GFLOP/s |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {'x'.join(map(str, size['size']))} | {size['gflop']:.4g} | {size['seconds']:.2f} | "
            f"{size['floor_s']:.2f} | {size['over_floor']:.2f}x | {size['achieved_gflops_per_s']:.0f} |"
            for size in report["sizes"]
        ),
        "",
        f"OpenVINO's performance counters at {size_name} (a phone photo's size): the layers' medians sum to "
        f"{profile['counted_s']:.2f} s of a {profile['wall_median_s']:.2f} s run. Layer precisions: "
        + ", ".join(f"{name} {count}" for name, count in sorted(profile["runtime_precisions"].items()))
        + "; bf16 primitives: "
        + (", ".join(profile["bf16_primitives"]) or "none")
        + ".",
        "",
        "| layer type | layers | seconds | share | GFLOP | GFLOP/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, entry in list(profile["by_type"].items())[:12]:
        rate = f"{entry['gflops_per_s']:.0f}" if "gflops_per_s" in entry else ""
        gflop = f"{entry['gflop']:.0f}" if "gflop" in entry else ""
        lines.append(
            f"| {name} | {entry['layers']} | {entry['seconds']:.3f} | {entry['share']:.0%} | {gflop} | {rate} |"
        )
    return "\n".join(lines) + "\n"


def write_report(full_size: bool, repeats: int, out_dir: Path) -> str:
    """Run the accounting on the full-size architecture (random weights) or the tiny model, write flops.json and
    flops.md into ``out_dir``; the markdown."""
    import json

    from shared.models.sources import resolve_model_dir
    from shared.settings import Profile, Settings
    from tools.bench.models import FULL_SIZE_RANDOM
    from tools.models.detector_export import exported_detector_dir

    models = {"detector_model": FULL_SIZE_RANDOM["detector_model"]} if full_size else {}
    settings = Settings(profile=Profile.TINY, detection_short_side=800, detector_compiled_cache=False, **models)
    folder = exported_detector_dir(settings.detection)
    torch_dir = resolve_model_dir(settings.detection.detector_model, settings.detection)
    report = run_flops_bench(settings.detection, folder, repeats, torch_dir)
    markdown = markdown_report(report)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "flops.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "flops.md").write_text(markdown)
    return markdown
