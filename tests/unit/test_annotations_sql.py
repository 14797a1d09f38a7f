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
            "result_uri": "s3://out/results/b/a.json",
            "prompt": "dog.",
            "content_sha256": None,
        }
        return pa.Table.from_pylist([row] if len(asked) == 1 else [])

    [image] = read_annotated_images(athena, "status = 'succeeded'", engine="athena")

    assert image.boxes == [] and len(asked) == 4
    for sql in asked:
        sqlglot.parse_one(sql, read="athena")  # raises on anything Athena's dialect would not read
        assert "status = 'succeeded'" in sql
    assert "UNNEST(d.attributes) AS t(name, value, score)" in asked[2]  # Athena unnests a row's fields


def test_the_sources_label_studio_names_are_selected_by_uri_and_by_file_name_quoted_in_either_engine() -> None:
    from tools.results.annotations import annotated_sources

    asked: list[str] = []

    def athena(sql: str) -> pa.Table:
        asked.append(sql)
        return pa.table({})

    uris, names = ["s3://in/it's.jpg"], ["50%_off.jpg", "o'neil.png"]
    assert annotated_sources(athena, uris, names, engine="athena") == []
    by_uri, by_name = asked
    for sql in asked:
        sqlglot.parse_one(sql, read="athena")
    assert "source_uri IN ('s3://in/it''s.jpg')" in by_uri
    assert "regexp_extract(source_uri, '[^/]*$') IN ('50%_off.jpg', 'o''neil.png')" in by_name
    assert annotated_sources(athena, [], [], engine="athena") == [] and len(asked) == 2


def test_a_page_of_ten_thousand_names_is_asked_in_queries_athena_takes() -> None:
    from tools.results.annotations import annotated_sources

    asked: list[str] = []
    names = [f"IMG_{number:04d}-{'x' * 30}.HEIC" for number in range(10_000)]
    annotated_sources(lambda sql: asked.append(sql) or pa.table({}), [], names, engine="athena")
    assert 1 < len(asked) < 10 and all(len(sql.encode()) < 262_144 for sql in asked)
    assert sum(sql.count(".HEIC'") for sql in asked) == 10_000
