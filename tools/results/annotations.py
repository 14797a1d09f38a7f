"""The annotated images a query selects, read from the tables (DuckDB locally, Athena on AWS), for exports and
the gallery: one record per source image, its boxes with their classes and attributes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa

from shared.contracts import Box, BoxMask
from shared.serving.label_studio import LabelledBox

# SQL in, rows out: tools.results.query.run_local_query or tools.results.athena.run_athena_query, bound to their
# settings.
Query = Callable[[str], pa.Table]
Engine = Literal["duckdb", "athena"]

# A box's attributes (a list of structs) as rows: the one place where DuckDB's SQL and Athena's differ here.
_ATTRIBUTE_ROWS: dict[Engine, tuple[str, str]] = {
    "duckdb": ("a.name, a.value", "CROSS JOIN UNNEST(d.attributes) AS t(a)"),
    "athena": ("t.name, t.value", "CROSS JOIN UNNEST(d.attributes) AS t(name, value, score)"),
}


@dataclass(frozen=True)
class AnnotatedImage:
    image_id: str
    source_uri: str
    batch_id: str
    status: str
    width: int | None
    height: int | None
    caption: str | None
    annotated_uri: str | None
    error: str | None
    processed_at: Any
    result_uri: str | None = None
    prompt: str | None = None
    content_sha256: str | None = None
    boxes: list[LabelledBox] = field(default_factory=list)

    @property
    def labels(self) -> list[str]:
        return sorted({box.label for box in self.boxes})


_IMAGE_COLUMNS = (
    "image_id, source_uri, batch_id, status, width, height, caption, annotated_uri, error, "
    "CAST(processed_at AS VARCHAR) AS processed_at, result_uri, prompt, content_sha256"
)


def read_annotated_images(query: Query, where: str | None = None, engine: Engine = "duckdb") -> list[AnnotatedImage]:
    """Each source image the ``where`` condition (SQL over ``images``' columns) selects, once: its latest row.

    Four queries: the images, their boxes, the boxes' attributes, their masks.
    """
    condition = f"({where})" if where else "TRUE"
    rows = _latest_per_image(query(f"SELECT {_IMAGE_COLUMNS} FROM images WHERE {condition}").to_pylist())
    if not rows:
        return []
    selected = (
        f"JOIN (SELECT image_id, batch_id FROM images WHERE {condition}) s "
        "ON d.image_id = s.image_id AND d.batch_id = s.batch_id"
    )
    boxes = query(
        "SELECT d.image_id, d.batch_id, d.detection_index, d.label, d.score, d.x0, d.y0, d.x1, d.y1, d.class_label, "
        f"d.class_score FROM detections d {selected}"
    ).to_pylist()
    columns, unnest = _ATTRIBUTE_ROWS[engine]
    attributes = query(
        f"SELECT d.image_id, d.batch_id, d.detection_index, {columns} FROM detections d {selected} {unnest}"
    ).to_pylist()
    masks = {
        (row["image_id"], row["batch_id"], int(row["detection_index"])): BoxMask(
            counts=row["counts"],
            height=int(row["height"]),
            width=int(row["width"]),
            area=int(row["area"]),
            score=float(row["score"]),
        )
        for row in query(
            "SELECT d.image_id, d.batch_id, d.detection_index, d.counts, d.height, d.width, d.area, d.score "
            f"FROM masks d {selected}"
        ).to_pylist()
    }
    values: dict[tuple[str, str, int], dict[str, str]] = defaultdict(dict)
    for row in attributes:
        values[(row["image_id"], row["batch_id"], int(row["detection_index"]))][row["name"]] = row["value"]
    per_image: dict[tuple[str, str], list[tuple[int, LabelledBox]]] = defaultdict(list)
    for row in boxes:
        key = (row["image_id"], row["batch_id"], int(row["detection_index"]))
        box = LabelledBox(
            label=row["label"],
            score=float(row["score"]),
            box=Box(**{corner: float(row[corner]) for corner in ("x0", "y0", "x1", "y1")}),
            class_label=row["class_label"],
            class_score=None if row["class_score"] is None else float(row["class_score"]),
            attributes=values.get(key, {}),
            mask=masks.get(key),
        )
        per_image[key[:2]].append((key[2], box))
    return [
        AnnotatedImage(
            **{name: row[name] for name in _FIELDS},
            boxes=[box for _, box in sorted(per_image.get((row["image_id"], row["batch_id"]), []))],
        )
        for row in rows
    ]


_FIELDS = [name for name in AnnotatedImage.__dataclass_fields__ if name != "boxes"]


def _latest_per_image(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per source image (a batch run again with other options adds a row), the latest, by source."""
    latest: dict[str, dict[str, Any]] = {}
    for row in rows:
        row = {**row, "width": _int(row["width"]), "height": _int(row["height"])}
        kept = latest.get(row["source_uri"])
        if kept is None or str(row["processed_at"]) > str(kept["processed_at"]):  # one format per source
            latest[row["source_uri"]] = row
    return sorted(latest.values(), key=lambda row: row["source_uri"])


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def sql_text(value: str) -> str:
    """``value`` as an SQL string literal (DuckDB's and Athena's alike: quotes doubled)."""
    return "'" + value.replace("'", "''") + "'"


# Athena takes a query string of at most 262,144 bytes (Athena User Guide, "Service Quotas": query string
# length): a page of thousands of tasks names its sources in several queries, each well under it
MAX_LISTED_CHARS = 150_000


def annotated_sources(
    query: Query, uris: Sequence[str], names: Sequence[str], engine: Engine = "duckdb"
) -> list[AnnotatedImage]:
    """The latest annotation of each source that is one of ``uris``, or whose file is named one of ``names``: a
    lookup of each (a set membership), in as few queries as Athena's query length allows."""
    found: list[AnnotatedImage] = []
    for column, values in (("source_uri", uris), (f"regexp_extract(source_uri, {sql_text('[^/]*$')})", names)):
        for chunk in _chunks([sql_text(value) for value in dict.fromkeys(values)], MAX_LISTED_CHARS):
            found += read_annotated_images(query, f"{column} IN ({', '.join(chunk)})", engine)
    return found


def _chunks(items: list[str], max_chars: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    size = 0
    for item in items:
        if chunk and size + len(item) > max_chars:
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += len(item) + 2
    if chunk:
        yield chunk


def local_annotated_sources(data_dir: Path) -> Callable[[Sequence[str], Sequence[str]], list[AnnotatedImage]]:
    """:func:`annotated_sources` over the local tables in ``data_dir`` (what `annotate serve` answers Label Studio
    from)."""
    import duckdb

    from shared.errors import RequestRejected
    from tools.results.query import connect_local

    def find(uris: Sequence[str], names: Sequence[str]) -> list[AnnotatedImage]:
        try:
            connection = connect_local(data_dir)  # one for the queries: each connection lists the tables' files
            return annotated_sources(lambda sql: connection.sql(sql).to_arrow_table(), uris, names)
        except duckdb.Error as error:
            raise RequestRejected(f"the tables in {data_dir} could not be read: {error}") from None

    return find


def batch_requests(images: list[AnnotatedImage], results_root: str, store_for: Any) -> list[Any]:
    """The requests of the batches ``images`` came from (each batch's input, as ingest kept it), in batch order;
    a batch whose input is gone has none."""
    from shared.contracts import BatchInput
    from shared.errors import ImageRejected
    from shared.storage import layout

    requests = []
    for batch_id in sorted({image.batch_id for image in images}):
        uri = layout.batch_input(results_root, batch_id)
        try:
            requests.append(BatchInput.model_validate_json(store_for(uri).read_bytes(uri)).request)
        except (ImageRejected, ValueError):
            continue
    return requests


def athena_annotated_sources(settings: Any) -> Callable[[Sequence[str], Sequence[str]], list[AnnotatedImage]]:
    """:func:`annotated_sources` over a deployed stack's tables, with Athena (``settings``: its AthenaSettings)."""
    from tools.results.athena import run_athena_query

    def find(uris: Sequence[str], names: Sequence[str]) -> list[AnnotatedImage]:
        return annotated_sources(lambda sql: run_athena_query(sql, settings), uris, names, "athena")

    return find
