"""`annotate bench-search`: what finding images by meaning costs in time.

- What an image's embedding adds: the Tag step and the whole image in one process (the bulk lane, the API, local),
  each with the request's embeddings none, image and boxes, alternating, on full-size random-weight models (CLIP
  ViT-B/32); the medians of the pairs' differences (same sample, same repeat: the machine is noisy): image over none,
  and boxes (the boxes' vectors kept too, at most 8 boxes) over image.
- A search's latency on DuckDB over 10,000 and 100,000 images' rows (synthetic unit vectors of 512 values, in files
  of 1,000 images), the ranking alone and with a ``--where`` over the detections; and annotate duplicates over 10,000.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tools.bench.models import FULL_SIZE_RANDOM

EMBEDDING = "the embedding adds (median of pairs)"
BOXES = "the boxes' vectors add (median of pairs, over image)"
SEARCH_SIZES = (10_000, 100_000)
SEARCH_VALUES = 512  # CLIP ViT-B/32's
SYNTHETIC_REVISION = "synthetic"  # the synthetic rows' and their query's: random vectors, no weights
IMAGES_PER_FILE = 1_000


def _image_seconds(path: Path, settings: Any, results: str, embeddings: str) -> dict[str, float]:
    """One sample through the Tag step and through one process, with the request's ``embeddings``."""
    from shared.contracts import AnnotationRequest, DescribeInput, ImageTask
    from shared.pipeline import steps
    from shared.pipeline.batches import image_ref
    from shared.pipeline.dependencies import Dependencies, Step, build_dependencies
    from shared.pipeline.one_image import annotate_image
    from shared.storage.objects import local_uri

    uri = local_uri(path)
    task = ImageTask(
        batch_id="b-" + "0" * 20,
        request=AnnotationRequest(prompt="dog. cat.", embeddings=embeddings),
        image=image_ref(uri, embeddings),  # each setting's result document apart
        results_uri=results,
    )
    deps: dict[Step, Dependencies] = {
        step: build_dependencies(step, settings) for step in Step if step != Step.VARIANTS
    }
    detection = steps.detect(task, deps[Step.DETECT])
    described = DescribeInput(task=task, detections=detection.detections)
    started = time.perf_counter()
    steps.tag(described, deps[Step.TAG])
    tag_s = time.perf_counter() - started
    started = time.perf_counter()
    annotate_image(task, deps.__getitem__)
    return {"Tag step": tag_s, "one process (bulk lane, API, local)": time.perf_counter() - started}


def embedding_seconds(
    samples: list[Path], repeats: int, progress: Callable[[str], None]
) -> dict[str, dict[str, float]]:
    from shared.settings import Profile, Settings
    from tools.models.tiny_models import build_named_models

    settings = Settings(profile=Profile.TINY, max_detections=8, detector_load_all_sizes=True, **FULL_SIZE_RANDOM)
    progress("building the models (once per machine: random weights, ONNX exports)")
    build_named_models(settings, variants=False)
    runs: dict[str, list[dict[str, float]]] = {"none": [], "image": [], "boxes": []}
    with tempfile.TemporaryDirectory(prefix="annotate-search-") as folder:
        results = Path(folder).as_uri()
        _image_seconds(samples[0], settings, results, "image")  # every model loaded and warm
        for repeat in range(repeats):
            for path in samples:
                for embeddings in runs:  # alternating: the machine is noisy
                    progress(f"{path.name}, embeddings {embeddings} ({repeat + 1}/{repeats})")
                    runs[embeddings].append(_image_seconds(path, settings, results, embeddings))
    names = list(runs["image"][0])

    def added(without: str, with_: str) -> dict[str, float]:
        pairs = list(zip(runs[without], runs[with_], strict=True))
        return {name: statistics.median(on[name] - off[name] for off, on in pairs) for name in names}

    medians = {
        f"embeddings {setting}": {name: statistics.median(run[name] for run in measured) for name in names}
        for setting, measured in runs.items()
    }
    return medians | {EMBEDDING: added("none", "image"), BOXES: added("image", "boxes")}


def _synthetic_tables(images: int, data_dir: Path) -> None:
    """``images`` images' rows in the images, detections and embeddings tables, in files of
    :data:`IMAGES_PER_FILE`: a unit vector each, a detection each (half cats, half dogs)."""
    import numpy as np
    import pyarrow as pa

    from shared.storage.tables import (
        DETECTIONS_SCHEMA,
        EMBEDDINGS_SCHEMA,
        IMAGES_SCHEMA,
        parquet_bytes,
        table_file_uris,
    )

    rng = np.random.default_rng(images)
    now = datetime.now(UTC)
    for start in range(0, images, IMAGES_PER_FILE):
        count = min(IMAGES_PER_FILE, images - start)
        ids = [f"{start + i:016d}" for i in range(count)]
        keys = {"image_id": ids, "source_uri": [f"s3://in/{i}.jpg" for i in ids], "batch_id": ["b-1"] * count}
        vectors = rng.normal(size=(count, SEARCH_VALUES)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        rows = [dict(zip(keys, row, strict=True)) | {"processed_at": now} for row in zip(*keys.values(), strict=True)]
        tables = {
            "images": pa.Table.from_pylist(
                [row | {"status": "succeeded", "prompt": "cat. dog."} for row in rows], schema=IMAGES_SCHEMA
            ),
            "detections": pa.Table.from_pylist(
                [
                    row | {"detection_index": 0, "label": "cat" if i % 2 else "dog", "score": 0.5}
                    for i, row in enumerate(rows)
                ],
                schema=DETECTIONS_SCHEMA,
            ),
            "embeddings": pa.table(
                keys
                | {
                    "model": ["random:clip-vit-b-32"] * count,
                    "model_revision": [SYNTHETIC_REVISION] * count,
                    "vector": pa.array(list(vectors), type=pa.list_(pa.float32())),
                    "processed_at": pa.array([now] * count, type=pa.timestamp("ms", tz="UTC")),
                },
                schema=EMBEDDINGS_SCHEMA,
            ),
        }
        uris = table_file_uris(str(data_dir), f"b-1-g-{start:06d}", now)
        for name, table in tables.items():
            path = Path(uris[name])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(parquet_bytes(table))


def search_seconds(repeats: int, progress: Callable[[str], None]) -> dict[str, dict[str, float]]:
    import numpy as np

    from tools.results.query import connect_local
    from tools.results.search import QueryVector, duplicate_groups, search

    measured: dict[str, dict[str, float]] = {}
    for images in SEARCH_SIZES:
        with tempfile.TemporaryDirectory(prefix="annotate-search-") as folder:
            progress(f"{images:,} images' rows")
            _synthetic_tables(images, Path(folder))
            vector = np.random.default_rng(0).normal(size=SEARCH_VALUES).astype(np.float32)
            query = QueryVector("random:clip-vit-b-32", SYNTHETIC_REVISION, vector / np.linalg.norm(vector))
            row: dict[str, float] = {}
            for name, where in (("search, top 10", None), ("search, top 10, --where label = 'cat'", "label = 'cat'")):
                seconds = []
                for _ in range(repeats):
                    started = time.perf_counter()
                    search(connect_local(Path(folder)), query, where, 10)
                    seconds.append(time.perf_counter() - started)
                row[name] = statistics.median(seconds)
            if images <= 10_000:
                started = time.perf_counter()
                duplicate_groups(connect_local(Path(folder)), 0.95)
                row["duplicates"] = time.perf_counter() - started
            measured[f"{images:,} images"] = row
    return measured


def run_search_bench(samples: list[Path], repeats: int, out_dir: Path, progress: Callable[[str], None]) -> dict:
    report = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "samples": [str(path) for path in samples],
        "repeats": repeats,
        "embedding": embedding_seconds(samples, repeats, progress),
        "search": search_seconds(repeats, progress),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "search.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "search.md").write_text(markdown_report(report))
    return report


def markdown_report(report: dict[str, Any]) -> str:
    """Two tables: an image's seconds with its embeddings none, image and boxes, and a search's on DuckDB by the
    rows' count."""
    embedding = report["embedding"]
    names = list(embedding[EMBEDDING])
    lines = ["| stage | " + " | ".join(embedding) + " | share |", "|---|" + "---:|" * (len(embedding) + 1)]
    for name in names:
        cells = [f"{columns[name]:.3f} s" for columns in embedding.values()]
        share = embedding[EMBEDDING][name] / embedding["embeddings image"][name]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {share:.1%} |")
    one_process = next(name for name in names if name.startswith("one process"))
    tag_added, image_s = embedding[EMBEDDING]["Tag step"], embedding["embeddings image"][one_process]
    lines += [
        "",
        f"The embedding adds {tag_added:.3f} s to the Tag step, {tag_added / image_s:.1%} of an image's "
        f"{image_s:.2f} s in one process (whose own difference, on and off, is within its run-to-run noise: the "
        "caption's and the detector's seconds vary more than that). The share is of the image's seconds with its "
        f"embedding. Keeping the boxes' vectors too (at most 8 boxes an image here) changes the Tag step by "
        f"{embedding[BOXES]['Tag step']:+.3f} s: no forward, their values written as a document.",
    ]
    searched = report["search"]
    stages = list(dict.fromkeys(stage for row in searched.values() for stage in row))
    lines += ["", "| rows | " + " | ".join(stages) + " |", "|---|" + "---:|" * len(stages)]
    for rows, row in searched.items():
        lines.append(f"| {rows} | " + " | ".join(f"{row[s]:.3f} s" if s in row else "" for s in stages) + " |")
    return "\n".join(lines) + "\n"
