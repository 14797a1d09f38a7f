"""`annotate bench`: this pipeline's steps against the straightforward way, side by side in one process.

The reference is what a user would write from each library's own documentation: Grounding DINO's model card
(the processor, one forward for all phrases, ``post_process_grounded_object_detection``; transformers'
``pipeline("zero-shot-object-detection")``, a forward per phrase, is a second, labelled row), and
``pipeline("image-classification")`` per crop,
open_clip's zero-shot recipe per crop, and llama-cpp-python's plain completion per image. Both sides use the
same models (by default random-weight models with the full-size architectures: the compute is the real one),
on the same images; their runs alternate, and medians are reported, since the machine is noisy.

One piece: each step's two sides are one measurement, timed in one alternation over the same images and models.
"""

from __future__ import annotations

import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from PIL import Image
from pydantic import BaseModel, Field, field_validator

from shared.contracts import DEFAULT_ATTRIBUTES, AnnotationRequest, Box, Detection
from shared.detector_geometry import iou
from shared.pipeline.dependencies import DEFAULT_MODEL_STEPS
from shared.settings import Profile, Settings

PHRASES = ["dog", "cat"]
FULL_SIZE_RANDOM: dict[str, Any] = {
    "detector_model": "random:grounding-dino-tiny",
    "classifier_model": "random:convnext-tiny-224",
    "tagger_models": ["random:clip-vit-b-32"],
    "segment_model": "random:edgetam-hf",
}
# step -> (its loader, the Settings section it takes)
# Each annotation step's loader, by the path a cold start's own process imports (tests/unit/test_step_registry.py
# holds its steps to the registry's)
STEP_LOADERS = {
    "detect": ("shared.models.grounding_onnx:load_detector", "detection"),
    "classify": ("shared.models.classification:load_classifier", "describe"),
    "tag": ("shared.models.tagging:load_tagger", "describe"),
    "segment": ("shared.models.segmentation:load_segmenter", "segment"),
    "caption": ("shared.models.captioning:load_captioner", "caption"),
}


class BenchOptions(BaseModel):
    images: list[Path] = Field(min_length=1)
    repeats: int = Field(3, ge=1, le=20)
    threads: int = Field(0, ge=0, le=64, description="torch and llama.cpp threads; 0 = every core")
    short_side: int = Field(800, ge=224, le=1333, description="The pipeline's detection resolution")
    crops: int = Field(8, ge=1, le=32, description="Boxes per image for Classify and Tag")
    models: Literal["random", "tiny"] = "random"
    lossy_short_side: int = Field(512, ge=224, le=1333, description="The lower detection resolution measured")
    lossy_queries: int = Field(300, ge=10, le=900, description="The fewer decoder queries measured")
    variants: bool = Field(True, description="Also time variants at 256 and 512 px")
    vision_caption: bool = Field(True, description="Also time the vision-language caption beside the text-only one")
    out_dir: Path = Path("bench")

    @field_validator("images")
    @classmethod
    def _readable_images(cls, images: list[Path]) -> list[Path]:
        missing = [str(path) for path in images if not path.is_file()]
        if missing:
            raise ValueError(f"not files: {', '.join(missing)}")
        return images


def bench_settings(options: BenchOptions) -> Settings:
    models: dict[str, Any] = FULL_SIZE_RANDOM if options.models == "random" else {}
    return Settings(
        profile=Profile.TINY,
        detection_short_side=options.short_side,
        torch_threads=options.threads,
        caption_threads=options.threads,
        max_detections=options.crops,
        detector_load_all_sizes=True,  # the runs time detection, not a size's first load (the cold starts do)
        **models,
    )


def grid_boxes(image: Image.Image, count: int) -> list[Detection]:
    """``count`` boxes tiling the image, labelled dog and cat in turn: the same crops for both sides."""
    columns = min(count, 4)
    rows = -(-count // columns)
    width, height = image.width / columns, image.height / rows
    return [
        Detection(
            label=PHRASES[index % 2],
            score=1.0,
            box=Box(
                x0=(index % columns) * width,
                y0=(index // columns) * height,
                x1=(index % columns + 1) * width,
                y1=(index // columns + 1) * height,
            ),
        )
        for index in range(count)
    ]


def model_card_detect(processor: Any, model: Any, image: Image.Image) -> None:
    """Grounding DINO's model card: one forward for all phrases, then its post-processing."""
    import torch

    inputs = processor(images=image, text=". ".join(PHRASES) + ".", return_tensors="pt")
    with torch.no_grad():
        outputs = model(**inputs)
    processor.post_process_grounded_object_detection(
        outputs, inputs.input_ids, threshold=0.35, text_threshold=0.25, target_sizes=[image.size[::-1]]
    )


def _timed(call: Callable[..., Any], *arguments: Any) -> float:
    started = time.perf_counter()
    call(*arguments)
    return time.perf_counter() - started


class _Sides:
    """The pipeline's and the reference's implementation of each step, over the same models."""

    def __init__(self, settings: Settings) -> None:
        from shared.models.captioning import load_captioner
        from shared.models.classification import load_classifier
        from shared.models.grounding_onnx import load_detector
        from shared.models.segmentation import load_segmenter
        from shared.models.sources import resolve_model_dir, resolve_model_file
        from shared.models.tagging import load_tagger
        from tools.models.segment_export import load_torch_segmenter

        self.settings = settings
        self.segmenter = load_segmenter(settings.segment)
        self._torch_segmenter = load_torch_segmenter(resolve_model_dir(settings.segment_model, settings.model_files))
        self.detector = load_detector(settings.detection)
        self.classifier = load_classifier(settings.describe)
        self.tagger = load_tagger(settings.describe)
        self.captioner = load_captioner(settings.caption)
        files = settings.model_files
        detector_dir = resolve_model_dir(settings.detector_model, files)
        self._detection_pipeline, self._reference_classifier = self._transformers_pipelines(
            detector_dir, resolve_model_dir(settings.classifier_model, files)
        )
        from transformers import AutoProcessor

        self._card_processor = AutoProcessor.from_pretrained(detector_dir)  # the model card's recipe, same weights
        self._clip = self._open_clip(resolve_model_dir((settings.tagger_models or [""])[0], files))
        from llama_cpp import Llama

        self._llm = Llama(
            model_path=str(resolve_model_file(settings.caption_model, files)),
            n_ctx=settings.caption_context,
            n_threads=settings.caption_threads or None,
            verbose=False,
        )
        from shared.models.captioning import PREFIX

        self._llm_prefix_tokens = len(self._llm.tokenize(PREFIX.encode(), add_bos=True))

    @staticmethod
    def _transformers_pipelines(detector_dir: Path, classifier_dir: Path) -> tuple[Any, Any]:
        from transformers import pipeline

        return (
            pipeline("zero-shot-object-detection", model=str(detector_dir)),
            pipeline("image-classification", model=str(classifier_dir)),
        )

    @staticmethod
    def _open_clip(folder: Path) -> tuple[Any, Any, Any]:
        import open_clip

        model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{folder}")
        return model.eval(), preprocess, open_clip.get_tokenizer(f"local-dir:{folder}")

    def pipeline_step(
        self, step: str, image: Image.Image, crops: list[Image.Image], facts: dict, boxes: list[Detection]
    ) -> None:
        labels = [PHRASES[index % 2] for index in range(len(crops))]
        if step == "segment":
            self.segmenter.segment(image, [detection.box for detection in boxes])
        elif step == "detect":
            self.detector.detect(image, PHRASES, 0.35, 0.25)
        elif step == "classify":
            self.classifier.classify(crops, labels, 3)
        elif step == "tag":
            self.tagger.tag(crops, labels, DEFAULT_ATTRIBUTES)
        else:
            self.captioner.caption(facts)

    def reference_step(
        self, step: str, image: Image.Image, crops: list[Image.Image], facts: dict, boxes: list[Detection]
    ) -> None:
        import torch

        from shared.models.captioning import build_prompt

        if step == "segment":  # transformers' EdgeTAM recipe: its processor, the model, the masks at full size
            model, processor = self._torch_segmenter
            prompts = [[[b.box.x0, b.box.y0, b.box.x1, b.box.y1] for b in boxes]]
            inputs = processor(images=image, input_boxes=prompts, return_tensors="pt")
            with torch.no_grad():
                output = model(**inputs, multimask_output=False)
            processor.post_process_masks(output.pred_masks, inputs["original_sizes"])
        elif step == "detect":
            model_card_detect(self._card_processor, self._detection_pipeline.model, image)
        elif step == "classify":
            for crop in crops:
                self._reference_classifier(crop, top_k=3)
        elif step == "tag":
            model, preprocess, tokenizer = self._clip
            for index, crop in enumerate(crops):
                for values in DEFAULT_ATTRIBUTES.values():  # open_clip's README recipe, once per crop and attribute
                    with torch.no_grad():
                        image_features = model.encode_image(preprocess(crop).unsqueeze(0))
                        text = tokenizer([f"a photo of a {v} {PHRASES[index % 2]}" for v in values])
                        text_features = model.encode_text(text)
                        image_features /= image_features.norm(dim=-1, keepdim=True)
                        text_features /= text_features.norm(dim=-1, keepdim=True)
                        (100.0 * image_features @ text_features.T).softmax(dim=-1)
        else:
            # As after another image's prompt: llama-cpp-python keeps what the two prompts share (the instructions),
            # not this image's facts, which the bench's repeats of one image would otherwise find cached whole.
            self._llm.n_tokens = min(self._llm.n_tokens, self._llm_prefix_tokens)
            self._llm(build_prompt(facts), max_tokens=self.settings.caption_max_tokens, temperature=0.0, stop=["\n"])

    def transformers_pipeline_detect(self, image: Image.Image) -> None:
        """pipeline("zero-shot-object-detection"): one forward per phrase (a second, labelled reference)."""
        self._detection_pipeline(image, candidate_labels=PHRASES)


def _cold_start(step: str, settings: Settings, image: Path, runs: int = 3) -> dict[str, float]:
    """Import and model load of one step in a fresh process, ready for ``image``: what a cold Lambda pays before
    its first image (Detect loads the size the image runs at, unless it loads every size at start). The median of
    ``runs`` processes, one after another, and the highest peak."""
    loader, section = STEP_LOADERS[step]
    module, function = loader.split(":")
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across execve, so a child would report its parent's peak.
    script = (
        "import sys, time\n"
        "started = time.perf_counter()\n"
        f"from {module} import {function}\n"
        "from shared.settings import Settings\n"
        f"model = {function}(Settings.model_validate_json(sys.argv[1]).{section})\n"
        + (
            "from PIL import Image\n"
            "pixels, _ = model.image_inputs(Image.open(sys.argv[2]))\n"
            "model.text_session()\n"
            "model.session(pixels.shape[2:])\n"
            if step == "detect"
            else ""
        )
        + "seconds = time.perf_counter() - started\n"
        "status = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]\n"
        "print(seconds, int(status) / 1024)\n"
    )
    command = [sys.executable, "-c", script, settings.model_dump_json(), str(image)]
    measured = [
        subprocess.run(command, capture_output=True, text=True, check=True).stdout.split()[-2:] for _ in range(runs)
    ]
    return {
        "seconds": round(statistics.median(float(seconds) for seconds, _ in measured), 2),
        "peak_rss_mb": round(max(float(peak_mb) for _, peak_mb in measured), 1),
    }


def _cold_starts(steps: list[str], settings: Settings, image: Path) -> dict[str, dict[str, float]]:
    """Each step's cold start on a machine that has run it before; Detect's also compiling its first size (a new
    CPU, or a Lambda environment with no snapshot) and loading every size (SnapStart's init, before the snapshot)."""
    settings = settings.model_copy(update={"detector_load_all_sizes": False})  # as outside Lambda
    # Detect's first process fills OpenVINO's compiled cache if it is empty: the median is the later ones' load
    cold = {step: _cold_start(step, settings, image) for step in steps}
    fields = {step: {"cold_start_s": c["seconds"], "cold_peak_rss_mb": c["peak_rss_mb"]} for step, c in cold.items()}
    if "detect" in steps and settings.detector_runtime == "openvino":
        uncached = settings.model_copy(update={"detector_compiled_cache": False})
        compiling = _cold_start("detect", uncached, image)
        all_sizes = _cold_start("detect", uncached.model_copy(update={"detector_load_all_sizes": True}), image)
        fields["detect"] |= {
            "cold_start_compiling_s": compiling["seconds"],
            "cold_peak_rss_compiling_mb": compiling["peak_rss_mb"],
            "cold_start_all_sizes_s": all_sizes["seconds"],
            "cold_peak_rss_all_sizes_mb": all_sizes["peak_rss_mb"],
        }
    return fields


def _detection_drift(settings: Settings, images: list[Image.Image], options: BenchOptions) -> dict[str, Any]:
    """Each way of running the detector against torch eager fp32 (the model card's) on the same images: how many
    of its boxes each finds again (same label, IoU >= 0.5), their mean IoU and score difference, and speed. The
    exported fp32 graph is the pipeline's, on its runtime and on the other; the others are lossy, each off unless its
    setting is given."""
    from dataclasses import replace

    from shared.models.grounding_onnx import load_detector
    from tools.models.detector_export import exported_detector_dir
    from tools.models.torch_models import load_torch_detector

    reference = load_torch_detector(settings.detection)
    lower = settings.detection.model_copy(update={"detection_short_side": options.lossy_short_side})
    int8 = settings.detection.model_copy(update={"detector_int8": True})
    fewer = settings.detection.model_copy(update={"detector_max_queries": options.lossy_queries})
    for lossy in (lower, int8, fewer):
        exported_detector_dir(lossy)
    runtime = settings.detector_runtime
    other = "onnxruntime" if runtime == "openvino" else "openvino"
    ways: dict[str, Any] = {
        "torch fp32 (model card)": reference,
        f"{runtime} fp32 (pipeline)": load_detector(settings.detection),
        f"{other} fp32 (detector_runtime={other})": load_detector(
            settings.detection.model_copy(update={"detector_runtime": other})
        ),
        f"{runtime} int8 weights (detector_int8)": load_detector(int8),
        f"{runtime} fp32, short side {options.lossy_short_side}": load_detector(lower),
        f"{runtime} fp32, {options.lossy_queries} queries (detector_max_queries)": load_detector(fewer),
        "torch bf16 autocast (not offered: no bf16 on Lambda's CPUs)": replace(reference, bf16=True),
    }
    found: dict[str, list[list[Detection]]] = {name: [] for name in ways}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for image in images:
        for name, detector in ways.items():
            started = time.perf_counter()
            found[name].append(detector.detect(image, PHRASES, 0.35, 0.25))
            seconds[name].append(time.perf_counter() - started)
    reference_s = statistics.median(seconds["torch fp32 (model card)"])
    report = {}
    for name in ways:
        matched = [_match(ref, ours) for ref, ours in zip(found["torch fp32 (model card)"], found[name], strict=True)]
        pairs = [pair for image_pairs in matched for pair in image_pairs]
        total = sum(len(boxes) for boxes in found["torch fp32 (model card)"])
        report[name] = {
            "boxes_found_again": f"{len(pairs)}/{total}",
            "mean_matched_iou": round(statistics.fmean(iou for iou, _ in pairs), 4) if pairs else None,
            "mean_abs_score_delta": round(statistics.fmean(delta for _, delta in pairs), 4) if pairs else None,
            "median_s": round(statistics.median(seconds[name]), 3),
            "speedup": round(reference_s / statistics.median(seconds[name]), 2),
        }
    return report


def _detector_inputs(settings: Settings, paths: list[Path], images: list[Image.Image]) -> list[dict[str, str]]:
    """Per image, the size the processor resizes it to and the exported size it runs at (larger: padded)."""
    from shared.detector_geometry import resized_size, smallest_holding

    detection = settings.detection
    cap = detection.detection_short_side * 1333 // 800
    rows = []
    for path, image in zip(paths, images, strict=True):
        resized = resized_size(image.height, image.width, detection.detection_short_side, cap)
        ran_at = smallest_holding(detection.export_sizes(), resized) or resized
        rows.append({"image": path.name, "resized": "x".join(map(str, resized)), "ran_at": "x".join(map(str, ran_at))})
    return rows


def _match(reference: list[Detection], found: list[Detection]) -> list[tuple[float, float]]:
    """For each reference box, the best same-label box found (IoU >= 0.5): (IoU, score difference)."""
    pairs = []
    for box in reference:
        candidates = [(iou(box.box, other.box), other) for other in found if other.label == box.label]
        if candidates:
            best_iou, best = max(candidates, key=lambda candidate: candidate[0])
            if best_iou >= 0.5:
                pairs.append((best_iou, abs(box.score - best.score)))
    return pairs


def _caption_prefix(sides: _Sides, facts: dict, repeats: int) -> dict[str, float]:
    reused = [sides.captioner.caption(facts) for _ in range(repeats)]
    whole = [sides.captioner.caption(facts, reuse_prefix=False) for _ in range(repeats)]
    return {
        "ttft_ms_prefix_reused": statistics.median(o.ttft_ms for o in reused),
        "ttft_ms_whole_prompt": statistics.median(o.ttft_ms for o in whole),
        "tokens_per_s": round(statistics.median(o.tokens_per_s for o in reused + whole), 1),
        "prompt_tokens": reused[0].prompt_tokens,
    }


def _variant_seconds(settings: Settings, image_path: Path, repeats: int) -> dict[str, float]:
    from shared.contracts import AnnotationRequest, ImageRef, ImageTask
    from shared.models.variants import load_generator
    from shared.pipeline.dependencies import Dependencies
    from shared.pipeline.variants_task import run_variant_job
    from shared.storage.objects import store_for

    deps = Dependencies(store_for, settings.image_limits, generator=load_generator(settings.variants))
    timings = {}
    for size in (256, 512):
        variants = {"prompt": "the same picture as a watercolor painting", "size": size, "seed": 1}
        job = ImageTask(
            batch_id="b-" + "0" * 20,
            request=AnnotationRequest(prompt="cat.", variants=variants),
            image=ImageRef(image_id="0" * 16, source_uri=str(image_path)),
            results_uri=str(Path(settings.model_cache_dir) / "bench-variants"),
        )
        runs = [run_variant_job(job, deps).images[0].seconds for _ in range(repeats)]
        timings[f"seconds_per_variant_{size}px"] = round(statistics.median(runs), 2)
    return timings


def run_bench(options: BenchOptions, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Run the benchmark and write ``bench.json`` and ``bench.md`` under ``options.out_dir``."""
    from shared.models.captioning import image_facts
    from tools.models.tiny_models import build_named_models

    settings = bench_settings(options)
    steps = list(STEP_LOADERS)
    progress("building and loading the models (once per machine: random weights, ONNX exports)")
    build_named_models(settings, variants=options.variants, masks=True)
    sides = _Sides(settings)  # before the cold starts, so that they measure loading, not building
    progress("cold starts (a fresh process per step)")
    cold = _cold_starts(steps, settings, options.images[0])
    images = [Image.open(path).convert("RGB") for path in options.images]
    request = AnnotationRequest(prompt="dog. cat.")
    work = []
    for image in images:
        boxes = grid_boxes(image, options.crops)
        crops = [image.crop((b.box.x0, b.box.y0, b.box.x1, b.box.y1)) for b in boxes]
        work.append((image, crops, image_facts(request, image.width, image.height, boxes), boxes))
    for image, crops, facts, boxes in work[:1]:  # warm both sides: lazy initialisation is not what is measured
        for step in steps:
            sides.pipeline_step(step, image, crops, facts, boxes)
            sides.reference_step(step, image, crops, facts, boxes)
    sides.transformers_pipeline_detect(work[0][0])
    timings: dict[str, dict[str, list[float]]] = {step: {"pipeline": [], "reference": []} for step in steps}
    transformers_pipeline: list[float] = []
    for repeat in range(options.repeats):
        progress(f"repeat {repeat + 1} of {options.repeats}")
        for image, crops, facts, boxes in work:
            for step in steps:
                order = ("pipeline", "reference") if repeat % 2 == 0 else ("reference", "pipeline")
                for side in order:
                    run = sides.pipeline_step if side == "pipeline" else sides.reference_step
                    timings[step][side].append(_timed(run, step, image, crops, facts, boxes))
                if step == "detect":
                    transformers_pipeline.append(_timed(sides.transformers_pipeline_detect, image))
    results = {
        step: {
            "pipeline_median_s": round(statistics.median(sides_["pipeline"]), 4),
            "reference_median_s": round(statistics.median(sides_["reference"]), 4),
            "speedup": round(statistics.median(sides_["reference"]) / statistics.median(sides_["pipeline"]), 2),
            **cold[step],
        }
        for step, sides_ in timings.items()
    }
    # an image as a request with the defaults runs it (masks, an option, beside it)
    pipeline_image = sum(results[step.value]["pipeline_median_s"] for step in DEFAULT_MODEL_STEPS)
    reference_image = sum(results[step.value]["reference_median_s"] for step in DEFAULT_MODEL_STEPS)
    progress("detector drift (lossy options), caption prefix, variants")
    report: dict[str, Any] = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": _cores(),
            "python": platform.python_version(),
        },
        "options": json.loads(options.model_dump_json()),
        "models": {
            "detector": settings.detector_model,
            "classifier": settings.classifier_model,
            "tagger": (settings.tagger_models or [""])[0],
            "caption": settings.caption_model,
        },
        "steps": results,
        "detect_against_transformers_pipeline": {
            "transformers_pipeline_median_s": round(statistics.median(transformers_pipeline), 4),
            "speedup": round(statistics.median(transformers_pipeline) / results["detect"]["pipeline_median_s"], 2),
        },
        "whole_image": {
            "pipeline_s": round(pipeline_image, 3),
            "reference_s": round(reference_image, 3),
            "speedup": round(reference_image / pipeline_image, 2),
            "pipeline_images_per_minute": round(60 / pipeline_image, 1),
            "reference_images_per_minute": round(60 / reference_image, 1),
            # masks for the image's boxes, over the image's seconds without them
            "masks_added": round(results["segment"]["pipeline_median_s"] / pipeline_image, 3),
        },
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "detector_drift": _detection_drift(settings, images, options),
        "detector_inputs": _detector_inputs(settings, options.images, images),
        "caption_prefix": _caption_prefix(sides, work[0][2], options.repeats),
        "segmenter": settings.segment_model,
    }
    _write(report, options.out_dir)  # before the optional parts: a long run keeps what it measured
    _optional_parts(report, settings, options, progress)
    return report


def _optional_parts(
    report: dict[str, Any], settings: Settings, options: BenchOptions, progress: Callable[[str], None]
) -> None:
    """Variants, and the caption that sees the image: each written as soon as it is measured."""
    if options.variants:
        report["variants"] = _variant_seconds(settings, options.images[0], max(1, options.repeats - 2))
        _write(report, options.out_dir)
    if options.vision_caption:
        from tools.bench.vision_caption import vision_caption_seconds

        progress("the caption that sees the image, beside the text-only one")
        report["vision_caption"] = vision_caption_seconds(settings, options.images[0], options.repeats)
        _write(report, options.out_dir)


def _write(report: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "bench.md").write_text(markdown_report(report))


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


def _detect_cold_starts(detect: dict[str, Any]) -> list[str]:
    if "cold_start_compiling_s" not in detect:
        return []
    return [
        "",
        "Detect's cold start column loads its first image's size from OpenVINO's compiled cache (a machine that has "
        f"compiled it before); compiling that size instead (a new CPU, a Lambda environment with no snapshot) took "
        f"{detect['cold_start_compiling_s']:.1f} s (peak {detect['cold_peak_rss_compiling_mb']:.0f} MB), and "
        f"compiling every size (what Detect's SnapStart init does before the snapshot) "
        f"{detect['cold_start_all_sizes_s']:.1f} s (peak {detect['cold_peak_rss_all_sizes_mb']:.0f} MB).",
    ]


def vision_caption_table(measured: dict[str, Any]) -> list[str]:
    """The caption that sees the image beside the text-only one, as measured."""
    rows = [
        "| caption | model | caption s | first token ms | tokens/s | prompt tokens | cold start s | cold peak MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for side, model in (("text_only", measured["text_model"]), ("vision", measured["vision_model"])):
        r = measured[side]
        rows.append(
            f"| {side.replace('_', '-')} | {model} | {r['caption_median_s']:.2f} | {r['ttft_median_ms']:.0f} | "
            f"{r['tokens_per_s_median']:.1f} | {r['prompt_tokens']} | {r['cold_start_s']:.1f} | "
            f"{r['cold_peak_rss_mb']:.0f} |"
        )
    return [
        "The caption that sees the image (SmolVLM-256M-Instruct's architecture, random weights, Q8_0, one 512-pixel "
        f"image) beside the text-only one, on the same image and facts: {measured['vision_over_text']:.2f}x its "
        f"seconds (measured {measured.get('measured_at', '')}, llama.cpp threads: {measured.get('threads', '')}; "
        "the first token waits for the image's encoding).",
        "",
        *rows,
    ]


def markdown_report(report: dict[str, Any]) -> str:
    lines = [
        f"Measured {report['measured_at']} on {report['machine']['cores']} cores; medians of "
        f"{report['options']['repeats']} alternating runs over {len(report['options']['images'])} images, "
        f"{report['options']['crops']} boxes each; cold starts: medians of 3 fresh processes; models: "
        f"{', '.join(report['models'].values())}.",
        "",
        "| step | pipeline s | reference s | speedup | cold start s | cold peak RSS MB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for step, r in report["steps"].items():
        lines.append(
            f"| {step} | {r['pipeline_median_s']:.3f} | {r['reference_median_s']:.3f} | {r['speedup']:.2f}x | "
            f"{r['cold_start_s']:.1f} | {r['cold_peak_rss_mb']:.0f} |"
        )
        if step == "detect" and "detect_against_transformers_pipeline" in report:
            other = report["detect_against_transformers_pipeline"]
            lines.append(
                f'| detect, against `pipeline("zero-shot-object-detection")` (a forward per phrase) | '
                f"{r['pipeline_median_s']:.3f} | {other['transformers_pipeline_median_s']:.3f} | "
                f"{other['speedup']:.2f}x | | |"
            )
    whole = report["whole_image"]
    lines += [
        f"| **whole image** | **{whole['pipeline_s']:.2f}** | **{whole['reference_s']:.2f}** | "
        f"**{whole['speedup']:.2f}x** | | |",
        "",
        f"The whole image is what a request with the defaults runs; masks (segment, {report.get('segmenter', '')}) "
        f"add {100 * whole.get('masks_added', 0):.0f}% to its seconds where a request asks for them"
        + (
            f" (segment's row measured {report['segment_measured_at']} in a run of its own, beside that run's "
            f"other steps: the share is that run's)."
            if "segment_measured_at" in report
            else "."
        ),
        "",
        f"Images per minute: pipeline {whole['pipeline_images_per_minute']}, reference "
        f"{whole['reference_images_per_minute']}. Peak RSS of the benchmark process (both sides loaded): "
        f"{report['peak_rss_mb']:.0f} MB.",
        *_detect_cold_starts(report["steps"].get("detect", {})),
        "",
        "",
        "Detector, each way against torch eager fp32 (the model card's) on the same images:",
        "",
        "| detector | boxes found again | mean IoU | mean score delta | median s | speedup |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {name} | {d['boxes_found_again']} | {d['mean_matched_iou']} | {d['mean_abs_score_delta']} | "
            f"{d['median_s']:.3f} | {d['speedup']:.2f}x |"
            for name, d in report["detector_drift"].items()
        ),
        "",
        "The exported detector's input per image (resized as the model card's processor does; run unpadded where "
        "an export has that size, else padded, with a pixel mask): "
        + "; ".join(f"{i['image']} {i['resized']} at {i['ran_at']}" for i in report.get("detector_inputs", []))
        + ".",
        "",
        f"Caption prefix: {json.dumps(report['caption_prefix'])}.",
    ]
    if "variants" in report:
        lines.append(f"Variants (img2img, 2 steps): {json.dumps(report['variants'])}.")
    if "vision_caption" in report:
        lines += ["", *vision_caption_table(report["vision_caption"])]
    return "\n".join(lines) + "\n"
