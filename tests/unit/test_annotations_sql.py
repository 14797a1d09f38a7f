"""The queries behind export and gallery, in each engine's SQL: run on DuckDB elsewhere; here Athena's parse."""

from __future__ import annotations

import pyarrow as pa
import sqlglot

from tools.results.annotations import read_annotated_images


def test_the_athena_queries_parse_as_athena_sql_and_select_by_the_condition() -> None:
    asked: list[str] = []

    def athena(sql: str) -> pa.Table:
        asked.append(sql)
        row = {
            "image_id": "a",
            "source_uri": "s3://in/a.jpg",
            "batch_id": "b",
            "status": "succeeded",
            "width": 4,
            "height": 3,
            "caption": None,
            "annotated_uri": None,
            "error": None,
            "processed_at": "2026-11-30",
            "prompt": "dog.",
        }
        return pa.Table.from_pylist([row] if len(asked) == 1 else [])

    [image] = read_annotated_images(athena, "status = 'succeeded'", engine="athena")

    assert image.boxes == [] and len(asked) == 3
    for sql in asked:
        sqlglot.parse_one(sql, read="athena")  # raises on anything Athena's dialect would not read
        assert "status = 'succeeded'" in sql
    assert "UNNEST(d.attributes) AS t(name, value, score)" in asked[2]  # Athena unnests a row's fields
