"""The Parquet tables: ``images`` (one row per input image), ``detections`` (one row per box), ``embeddings``
(one row per image embedded: its CLIP vector, which ``annotate search`` and ``annotate duplicates`` compare),
``box_embeddings`` (one row per box embedded, where a request asked) and ``masks`` (one row per box segmented, where a
request asked).

All are partitioned by ``dt=YYYY-MM-DD`` (the day ingest planned the batch) and hold one file per group of images,
named by the batch and group, so running a batch again replaces its rows instead of adding a second copy.
"""

from __future__ import annotations

import json
from datetime import datetime

import pyarrow as pa
import pyarrow.parquet as pq

from shared.contracts import DEFAULT_ATTRIBUTES, CaptionOutput, Detection, ImageResult
from shared.storage import layout
from shared.storage.objects import StoreFor

CLASS_SCORE_STRUCT = pa.struct([("label", pa.string()), ("score", pa.float64())])
ATTRIBUTE_STRUCT = pa.struct([("name", pa.string()), ("value", pa.string()), ("score", pa.float64())])
BOX_FIELDS = [(name, pa.float64()) for name in ("x0", "y0", "x1", "y1")]

# A box and its class: in each `images` row's detections, and the columns of a `detections` row.
DETECTION_FIELDS = [
    ("label", pa.string()),
    ("score", pa.float64()),
    *BOX_FIELDS,
    ("class_label", pa.string()),
    ("class_score", pa.float64()),
]
DETECTION_STRUCT = pa.struct(
    [
        *DETECTION_FIELDS,
        ("top_k", pa.list_(CLASS_SCORE_STRUCT)),
        ("attributes", pa.list_(ATTRIBUTE_STRUCT)),
        ("skipped", pa.string()),
    ]
)

# The default attributes get a column each in `detections` (value and score); every attribute, the request's
# own vocabularies included, is also in its `attributes` list.
FLAT_ATTRIBUTES = tuple(DEFAULT_ATTRIBUTES)

# The caption and its measurements: a column per field of CaptionOutput, `caption` and `caption_<field>`.
_ARROW_TYPES: dict[object, pa.DataType] = {
    str: pa.string(),
    float: pa.float64(),
    int: pa.int32(),
    float | None: pa.float64(),
    list[str]: pa.list_(pa.string()),
}
CAPTION_FIELDS = [
    (name if name == "caption" else f"caption_{name}", _ARROW_TYPES[field.annotation])
    for name, field in CaptionOutput.model_fields.items()
]

# The steps whose model a row names, and its column: detector_model, classifier_model, tagger_model.
# (storage sits below the pipeline, so this is written out: tests/unit/test_step_registry.py holds it to STEP_PORTS)
MADE_BY_ROLES = {"detect": "detector", "classify": "classifier", "tag": "tagger", "segment": "segmenter"}

# Which image a row is about: the first columns of every table.
IMAGE_KEY_FIELDS = [("image_id", pa.string()), ("source_uri", pa.string()), ("batch_id", pa.string())]

IMAGES_SCHEMA = pa.schema(
    [
        *IMAGE_KEY_FIELDS,
        ("job_id", pa.string()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("failed_step", pa.string()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("content_sha256", pa.string()),
        ("prompt", pa.string()),
        ("detections", pa.list_(DETECTION_STRUCT)),
        # What each step took for this image (caption_ms is with the caption's columns, variants_ms with theirs)
        ("detect_ms", pa.float64()),
        ("classify_ms", pa.float64()),
        ("tag_ms", pa.float64()),
        ("segment_ms", pa.float64()),
        # Which models made the row, and their steps' settings that change output (JSON: {step: {setting: value}})
        *((f"{role}_model", pa.string()) for role in MADE_BY_ROLES.values()),
        ("output_settings", pa.string()),
        *CAPTION_FIELDS,
        ("variants_model", pa.string()),
        ("variant_uris", pa.list_(pa.string())),
        ("variant_seeds", pa.list_(pa.int64())),
        ("variants_ms", pa.float64()),
        ("annotated_uri", pa.string()),
        ("result_uri", pa.string()),
        ("processed_at", pa.timestamp("ms", tz="UTC")),
    ]
)

DETECTIONS_SCHEMA = pa.schema(
    [
        *IMAGE_KEY_FIELDS,
        ("detection_index", pa.int32()),
        *DETECTION_FIELDS,
        *(
            (column, type_)
            for name in FLAT_ATTRIBUTES
            for column, type_ in ((name, pa.string()), (f"{name}_score", pa.float64()))
        ),
        ("attributes", pa.list_(ATTRIBUTE_STRUCT)),
        ("skipped", pa.string()),
        ("processed_at", pa.timestamp("ms", tz="UTC")),
    ]
)

# A vector is comparable only with vectors of its model and revision (its weights' identity): every query filters on
# both (tools/results/search.py).
EMBEDDING_MODEL_FIELDS = [("model", pa.string()), ("model_revision", pa.string())]
EMBEDDINGS_SCHEMA = pa.schema(
    [
        *IMAGE_KEY_FIELDS,
        *EMBEDDING_MODEL_FIELDS,
        ("vector", pa.list_(pa.float32())),
        ("processed_at", pa.timestamp("ms", tz="UTC")),
    ]
)

# A box's crop embedding, where its request asked (embeddings: boxes): the box is its image's detection_index.
BOX_EMBEDDINGS_SCHEMA = pa.schema(
    [
        *IMAGE_KEY_FIELDS,
        ("detection_index", pa.int32()),
        ("label", pa.string()),
        *EMBEDDING_MODEL_FIELDS,
        ("vector", pa.list_(pa.float32())),
        ("processed_at", pa.timestamp("ms", tz="UTC")),
    ]
)

# A box's mask, where its request asked (masks: true): COCO's compressed run-length encoding (pycocotools reads
# `counts` with the image's height and width), within the box; the box is its image's detection_index.
MASKS_SCHEMA = pa.schema(
    [
        *IMAGE_KEY_FIELDS,
        ("detection_index", pa.int32()),
        ("label", pa.string()),
        ("counts", pa.string()),
        ("height", pa.int32()),
        ("width", pa.int32()),
        ("area", pa.int64()),
        ("score", pa.float64()),
        *EMBEDDING_MODEL_FIELDS,
        ("processed_at", pa.timestamp("ms", tz="UTC")),
    ]
)

SCHEMAS = {
    "images": IMAGES_SCHEMA,
    "detections": DETECTIONS_SCHEMA,
    "embeddings": EMBEDDINGS_SCHEMA,
    "box_embeddings": BOX_EMBEDDINGS_SCHEMA,
    "masks": MASKS_SCHEMA,
}

# `annotate evaluate`'s rows: per label (and for every label together, ``label`` null), how the pipeline's boxes
# compared with labels a person reviewed; written beside the other tables, one file per evaluation.
EVALUATIONS_SCHEMA = pa.schema(
    [
        ("evaluated_at", pa.timestamp("ms", tz="UTC")),
        ("truth_file", pa.string()),
        ("prompt", pa.string()),
        ("threshold", pa.float64()),
        ("images", pa.int32()),
        ("label", pa.string()),
        ("truth_boxes", pa.int32()),
        ("predicted_boxes", pa.int32()),
        ("ap", pa.float64()),
        ("ap50", pa.float64()),
        ("precision", pa.float64()),
        ("recall", pa.float64()),
        ("f1", pa.float64()),
        ("best_threshold", pa.float64()),
        ("best_f1", pa.float64()),
        ("mask_ap", pa.float64()),
        ("mask_ap50", pa.float64()),
        ("class_accuracy", pa.float64()),
        ("caption_word_f1", pa.float64()),
    ]
)
# Every table `annotate query` and Athena read: the pipeline's two and the evaluations
QUERIED_SCHEMAS = SCHEMAS | {"evaluations": EVALUATIONS_SCHEMA}
PARTITION_COLUMN = "dt"


def _detection_row(detection: Detection) -> dict[str, object]:
    return {**detection.model_dump(exclude={"box"}), **detection.box.model_dump()}


def _flat_attributes(detection: Detection) -> dict[str, object]:
    found = {a.name: a for a in detection.attributes}
    columns: dict[str, object] = {}
    for name in FLAT_ATTRIBUTES:
        columns[name] = found[name].value if name in found else None
        columns[f"{name}_score"] = found[name].score if name in found else None
    return columns


def _caption_columns(result: ImageResult) -> dict[str, object]:
    """The caption and its measurements, as ``caption`` and ``caption_<field>`` columns."""
    fields = result.caption.model_dump() if result.caption else {}
    return {"caption": fields.pop("caption", None), **{f"caption_{name}": value for name, value in fields.items()}}


def _variant_columns(result: ImageResult) -> dict[str, object]:
    variants = result.variants
    return {
        "variants_model": variants.model if variants else None,
        "variant_uris": [v.uri for v in variants.images] if variants else [],
        "variant_seeds": [v.seed for v in variants.images] if variants else [],
        "variants_ms": variants.ms if variants else None,
    }


def _made_by_columns(result: ImageResult) -> dict[str, object]:
    made_by = result.made_by
    settings = {step: made.settings for step, made in made_by.items() if made.settings}
    return {
        **{f"{role}_model": made_by[step].model if step in made_by else None for step, role in MADE_BY_ROLES.items()},
        "output_settings": json.dumps(settings, sort_keys=True) if settings else None,
    }


def images_table(results: list[ImageResult]) -> pa.Table:
    rows = [
        {
            **result.model_dump(exclude={"detections", "caption", "variants", "made_by", "embedding"}),
            **_made_by_columns(result),
            "detections": [_detection_row(d) for d in result.detections],
            **_caption_columns(result),
            **_variant_columns(result),
        }
        for result in results
    ]
    return pa.Table.from_pylist(rows, schema=IMAGES_SCHEMA)


def _image_key(result: ImageResult) -> dict[str, str]:
    return {name: getattr(result, name) for name, _ in IMAGE_KEY_FIELDS}


def detections_table(results: list[ImageResult]) -> pa.Table:
    rows = [
        {
            **_image_key(result),
            "detection_index": index,
            **_detection_row(detection),
            **_flat_attributes(detection),
            "processed_at": result.processed_at,
        }
        for result in results
        for index, detection in enumerate(result.detections)
    ]
    return pa.Table.from_pylist(rows, schema=DETECTIONS_SCHEMA)


def embeddings_table(results: list[ImageResult]) -> pa.Table:
    rows = [
        {
            **_image_key(result),
            "model": result.embedding.model,
            "model_revision": result.embedding.revision,
            "vector": result.embedding.vector,
            "processed_at": result.processed_at,
        }
        for result in results
        if result.embedding is not None
    ]
    return pa.Table.from_pylist(rows, schema=EMBEDDINGS_SCHEMA)


def box_embeddings_table(results: list[ImageResult]) -> pa.Table:
    rows = [
        {
            **_image_key(result),
            "detection_index": index,
            "label": detection.label,
            "model": result.box_embeddings.model,
            "model_revision": result.box_embeddings.revision,
            "vector": vector,
            "processed_at": result.processed_at,
        }
        for result in results
        if result.box_embeddings is not None
        for index, (detection, vector) in enumerate(zip(result.detections, result.box_embeddings.vectors, strict=True))
        if vector is not None
    ]
    return pa.Table.from_pylist(rows, schema=BOX_EMBEDDINGS_SCHEMA)


def masks_table(results: list[ImageResult]) -> pa.Table:
    rows = [
        {
            **_image_key(result),
            "detection_index": index,
            "label": detection.label,
            **mask.model_dump(),
            "model": result.masks.model,
            "model_revision": result.masks.revision,
            "processed_at": result.processed_at,
        }
        for result in results
        if result.masks is not None
        for index, (detection, mask) in enumerate(zip(result.detections, result.masks.masks, strict=True))
        if mask is not None
    ]
    return pa.Table.from_pylist(rows, schema=MASKS_SCHEMA)


TABLE_ROWS = {
    "images": images_table,
    "detections": detections_table,
    "embeddings": embeddings_table,
    "box_embeddings": box_embeddings_table,
    "masks": masks_table,
}


def table_file_uris(results_root: str, file_stem: str, day: datetime) -> dict[str, str]:
    """Where a group's (or a batch's unfinished groups') rows go in each table: one file per day and name."""
    partition = f"{PARTITION_COLUMN}={day:%Y-%m-%d}"
    return {name: layout.table_file(results_root, name, partition, file_stem) for name in SCHEMAS}


def parquet_bytes(table: pa.Table) -> bytes:
    """``table`` as a Parquet file, as every table's files are written: zstd, and dictionaries for every column but
    the embeddings' vectors (unique float32 values, which a dictionary makes a fifth larger)."""
    sink = pa.BufferOutputStream()
    dictionary = [name for name in table.column_names if name != "vector"]
    pq.write_table(table, sink, compression="zstd", use_dictionary=dictionary)
    return bytes(sink.getvalue().to_pybytes())


# Tables a group writes only where its request asks for what they hold: a request without masks writes no empty
# `masks` file (a PUT a group saved; the same batch run again has the same request, so no older file is left over).
OPTIONAL_TABLES = {"masks"}


def tables_written(masks: bool) -> list[str]:
    """The tables a group's rows go to, for a request that does (or does not) ask for masks."""
    return [name for name in SCHEMAS if masks or name not in OPTIONAL_TABLES]


def write_table_files(
    results: list[ImageResult],
    results_root: str,
    file_stem: str,
    day: datetime,
    store_for: StoreFor,
    tables: list[str] | None = None,
) -> dict[str, str]:
    """Write ``results``' rows of each table (of ``tables``: by default all) under ``file_stem``, replacing an
    earlier copy; returns their URIs.

    The day is the batch's planning day, so the same batch run again writes the same files.
    """
    uris = table_file_uris(results_root, file_stem, day)
    for name, rows_of in TABLE_ROWS.items():
        if tables is not None and name not in tables:
            continue
        store_for(uris[name]).write_bytes(uris[name], parquet_bytes(rows_of(results)), "application/vnd.apache.parquet")
    return uris
