"""annotate bench-search's report and its synthetic rows (tools/bench/search.py), without models."""

from __future__ import annotations

from pathlib import Path

from tools.bench.search import BOXES, EMBEDDING, SYNTHETIC_REVISION, _synthetic_tables, markdown_report


def test_the_report_has_an_image_s_seconds_on_and_off_and_a_search_s_by_rows() -> None:
    report = {
        "embedding": {
            "embeddings none": {"Tag step": 0.2, "one process (bulk lane, API, local)": 5.0},
            "embeddings image": {"Tag step": 0.3, "one process (bulk lane, API, local)": 5.0},
            "embeddings boxes": {"Tag step": 0.32, "one process (bulk lane, API, local)": 5.1},
            EMBEDDING: {"Tag step": 0.1, "one process (bulk lane, API, local)": -0.05},
            BOXES: {"Tag step": 0.02, "one process (bulk lane, API, local)": 0.1},
        },
        "search": {"10,000 images": {"search": 0.01, "duplicates": 0.5}, "100,000 images": {"search": 0.1}},
    }
    lines = markdown_report(report).splitlines()
    header = f"| stage | embeddings none | embeddings image | embeddings boxes | {EMBEDDING} | {BOXES} | share |"
    assert lines[0] == header
    assert lines[2] == "| Tag step | 0.200 s | 0.300 s | 0.320 s | 0.100 s | 0.020 s | 33.3% |"
    assert (
        lines[3] == "| one process (bulk lane, API, local) | 5.000 s | 5.000 s | 5.100 s | -0.050 s | 0.100 s | -1.0% |"
    )
    assert lines[5].startswith("The embedding adds 0.100 s to the Tag step, 2.0% of an image's 5.00 s in one process")
    assert lines[5].endswith("changes the Tag step by +0.020 s: no forward, their values written as a document.")
    assert lines[-1] == "| 100,000 images | 0.100 s |  |"


def test_the_synthetic_rows_are_searched_as_the_pipeline_s_are(tmp_path: Path) -> None:
    import numpy as np

    from tools.results.query import connect_local
    from tools.results.search import QueryVector, search

    _synthetic_tables(2_500, tmp_path)
    connection = connect_local(tmp_path)
    assert connection.execute("SELECT count(*) FROM embeddings").fetchone() == (2_500,)
    [vector] = connection.execute("SELECT vector FROM embeddings WHERE image_id = '0000000000001234'").fetchone()
    query = QueryVector("random:clip-vit-b-32", SYNTHETIC_REVISION, np.array(vector, np.float32))
    hits = search(connection, query, "label = 'dog'")
    assert hits.column("source_uri")[0].as_py() == "s3://in/0000000000001234.jpg"
    assert set(hits.column("labels").to_pylist()) == {"dog"}
