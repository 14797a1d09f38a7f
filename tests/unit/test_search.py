"""annotate search's ranking and annotate duplicates' groups (tools/results/search.py) on vectors written as the
pipeline writes them, against numpy's exact cosine ranking."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from shared.contracts import Box, BoxEmbeddings, Detection, ImageEmbedding, ImageResult, Status, float32_values
from shared.errors import RequestRejected
from shared.storage.objects import store_for
from shared.storage.tables import write_table_files
from tools.results.query import connect_local
from tools.results.search import BOXES, QueryVector, duplicate_groups, search, search_sql

DAY = datetime(2026, 12, 5, tzinfo=UTC)
MODEL, REVISION = "tiny:clip", "3f0c5e9a1b2d4c6e"


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


def result(
    index: int,
    vector: np.ndarray | None,
    label: str = "cat",
    model: str = MODEL,
    at: datetime = DAY,
    revision: str = REVISION,
) -> ImageResult:
    embedding = None if vector is None else ImageEmbedding(model=model, revision=revision, vector=vector.tolist())
    box = Detection(label=label, score=0.5 + index % 5 / 10, box=Box(x0=0, y0=0, x1=10, y1=10))
    return ImageResult(
        image_id=f"{index:016d}",
        source_uri=f"s3://in/{index:04d}.jpg",
        batch_id="b-1",
        status=Status.SUCCEEDED,
        prompt="cat. dog.",
        detections=[box],
        embedding=embedding,
        processed_at=at,
    )


def written(tmp_path: Path, results: list[ImageResult], stem: str = "b-1-g-000000") -> Path:
    write_table_files(results, str(tmp_path), stem, DAY, store_for)
    return tmp_path


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    return unit(np.random.default_rng(7).normal(size=(300, 32)))


def test_the_ranking_sql_gives_numpy_s_exact_cosine_top_k(tmp_path: Path, vectors: np.ndarray) -> None:
    # GIVEN 300 images' vectors as the pipeline writes them, half labelled dog
    results = [result(i, v, "dog" if i % 2 else "cat") for i, v in enumerate(vectors)]
    connection = connect_local(written(tmp_path, results))
    query = unit(np.random.default_rng(8).normal(size=32))
    # WHEN searched, THEN the top 20 are numpy's, in its order, with its scores
    hits = search(connection, QueryVector(MODEL, REVISION, query), limit=20).to_pylist()
    expected = np.argsort(-(vectors @ query), kind="stable")[:20]
    assert [hit["source_uri"] for hit in hits] == [results[i].source_uri for i in expected]
    assert [hit["score"] for hit in hits] == pytest.approx((vectors @ query)[expected], abs=1e-5)
    # AND --where keeps the images with a row where it holds, still in numpy's order
    dogs = search(
        connection, QueryVector(MODEL, REVISION, query), "label = 'dog' AND d.score > 0.7", limit=20
    ).to_pylist()
    kept = [i for i in np.argsort(-(vectors @ query), kind="stable") if i % 2 and results[i].detections[0].score > 0.7]
    assert [hit["source_uri"] for hit in dogs] == [results[i].source_uri for i in kept[:20]]
    assert {hit["labels"] for hit in dogs} == {"dog"}


def test_an_image_searched_with_its_own_vector_ranks_first_at_one(tmp_path: Path, vectors: np.ndarray) -> None:
    connection = connect_local(written(tmp_path, [result(i, v) for i, v in enumerate(vectors[:50])]))
    [first, *_] = search(connection, QueryVector(MODEL, REVISION, vectors[17])).to_pylist()
    assert first["source_uri"] == "s3://in/0017.jpg" and first["score"] == pytest.approx(1.0, abs=1e-5)


def test_only_an_image_s_latest_row_is_ranked(tmp_path: Path, vectors: np.ndarray) -> None:
    written(tmp_path, [result(0, vectors[0])])
    later = result(0, vectors[1], at=DAY + timedelta(hours=1))
    connection = connect_local(written(tmp_path, [later.model_copy(update={"batch_id": "b-2"})], "b-2-g-000000"))
    [hit] = search(connection, QueryVector(MODEL, REVISION, vectors[0])).to_pylist()
    assert hit["score"] == pytest.approx(float(vectors[1] @ vectors[0]), abs=1e-5)


def test_a_vector_of_another_model_or_length_is_refused_never_ranked(tmp_path: Path, vectors: np.ndarray) -> None:
    connection = connect_local(written(tmp_path, [result(i, v) for i, v in enumerate(vectors[:3])]))
    with pytest.raises(
        RequestRejected, match=rf"vector is other's but the embeddings here are tiny:clip revision {REVISION} \(3"
    ):
        search(connection, QueryVector("other", REVISION, vectors[0]))
    with pytest.raises(
        RequestRejected, match=r"vector is tiny:clip revision 0000, .* the same name with other weights"
    ):
        search(connection, QueryVector(MODEL, "0000", vectors[0]))
    with pytest.raises(RequestRejected, match="this search's vector has 16 values, the rows' 32"):
        search(connection, QueryVector(MODEL, REVISION, vectors[0][:16]))


def test_images_without_embeddings_are_counted_and_the_fix_said(tmp_path: Path) -> None:
    connection = connect_local(written(tmp_path, [result(i, None) for i in range(4)]))
    with pytest.raises(RequestRejected, match=r"no image here has an embedding \(4 images lack one\): annotate them"):
        search(connection, QueryVector(MODEL, REVISION, unit(np.ones(32))))


def test_sql_that_fails_is_the_database_s_error(tmp_path: Path, vectors: np.ndarray) -> None:
    import duckdb

    connection = connect_local(written(tmp_path, [result(0, vectors[0])]))
    with pytest.raises(duckdb.Error, match="labl"):
        search(connection, QueryVector(MODEL, REVISION, vectors[0]), "labl = 'dog'")
    # a column both tables have must say its table
    with pytest.raises(duckdb.Error, match=r"[Aa]mbiguous"):
        search(connection, QueryVector(MODEL, REVISION, vectors[0]), "processed_at > DATE '2026-01-01'")
    assert "$vector" in search_sql(None) and "$model" in search_sql(None)


def test_copies_group_together_and_different_images_apart(tmp_path: Path, vectors: np.ndarray) -> None:
    # GIVEN three images, a copy of the first (its vector moved a little) and two of the second
    rng = np.random.default_rng(9)
    copies = [
        unit(vectors[0] + rng.normal(scale=0.01, size=32)),
        *(unit(vectors[1] + rng.normal(scale=0.01, size=32)) for _ in range(2)),
    ]
    results = [result(i, v) for i, v in enumerate([*vectors[:3], *copies])]
    groups = duplicate_groups(connect_local(written(tmp_path, results)), threshold=0.99)
    assert groups == [
        ["s3://in/0000.jpg", "s3://in/0003.jpg"],
        ["s3://in/0001.jpg", "s3://in/0004.jpg", "s3://in/0005.jpg"],
    ]


def test_duplicates_over_several_models_need_one_named(tmp_path: Path, vectors: np.ndarray) -> None:
    results = [result(0, vectors[0]), result(1, vectors[0], model="other")]
    connection = connect_local(written(tmp_path, results))
    with pytest.raises(RequestRejected, match=r"several models or revisions, other revision .*, tiny:clip revision"):
        duplicate_groups(connection)
    assert duplicate_groups(connection, model="other") == []


def test_rows_of_one_model_s_two_revisions_are_never_compared(tmp_path: Path, vectors: np.ndarray) -> None:
    # GIVEN the same name's rows from two exports of different weights (a checkpoint pushed again)
    results = [result(0, vectors[0]), result(1, vectors[0], revision="0000"), result(2, vectors[0])]
    connection = connect_local(written(tmp_path, results))
    # THEN a search ranks its own revision's rows only, and duplicates asks for the images embedded again
    hits = search(connection, QueryVector(MODEL, "0000", vectors[0])).to_pylist()
    assert [hit["source_uri"] for hit in hits] == ["s3://in/0001.jpg"]
    with pytest.raises(RequestRejected, match=r"several models or revisions, .*: annotate them again with one"):
        duplicate_groups(connection, model=MODEL)


def test_athena_s_ranking_is_duckdb_s_where_the_dialects_agree(tmp_path: Path, vectors: np.ndarray) -> None:
    import sqlglot

    from tools.results.search import _DIALECT, athena_search_sql

    # GIVEN the rows, and a query's ranking in Athena's SQL (the model and the vector written in)
    results = [result(i, v, "dog" if i % 2 else "cat") for i, v in enumerate(vectors)]
    connection = connect_local(written(tmp_path, results))
    query = QueryVector(MODEL, REVISION, unit(np.random.default_rng(11).normal(size=32)))
    athena = athena_search_sql(query, "label = 'dog'", 5)
    sqlglot.parse_one(athena, read="athena")  # Athena's (Trino's) syntax
    largest = QueryVector(MODEL, REVISION, unit(np.random.default_rng(12).normal(size=1024)))
    assert len(athena_search_sql(largest, "label = 'dog'", 10).encode()) < 262_144  # Athena's query string quota
    assert (
        "reduce(zip_with(e.vector, ARRAY[" in athena
        and f"e.model = 'tiny:clip' AND e.model_revision = '{REVISION}'" in athena
        and "LIMIT 5" in athena
    )
    # WHEN its two Athena-only expressions (the dot product, the labels' list) become DuckDB's, and it runs there
    vector = "ARRAY[" + athena.split("ARRAY[", 1)[1].split("]", 1)[0] + "]"
    athena_words, duckdb_words = _DIALECT["athena"], _DIALECT["duckdb"]
    as_duckdb = athena.replace(
        athena_words["score"].format(vector=vector), duckdb_words["score"].format(vector=vector)
    ).replace(athena_words["labels"], duckdb_words["labels"])
    hits = connection.sql(as_duckdb).to_arrow_table().to_pylist()
    # THEN it ranks as numpy does: the vector's literals are its float32 values exactly
    order = [i for i in np.argsort(-(vectors @ query.vector), kind="stable") if i % 2][:5]
    assert [hit["source_uri"] for hit in hits] == [results[i].source_uri for i in order]
    assert [hit["score"] for hit in hits] == pytest.approx((vectors @ query.vector)[order], abs=1e-6)


def test_a_search_on_athena_checks_the_rows_model_before_it_ranks() -> None:
    import pyarrow as pa

    from tools.results.search import athena_search_sql, search_on_athena

    sent: list[str] = []

    def run(sql: str) -> pa.Table:
        sent.append(sql)
        if "GROUP BY e.model" in sql:
            return pa.table({"model": [MODEL], "model_revision": [REVISION], "images": [3], "length": [32]})
        return pa.table({"source_uri": ["s3://in/a.jpg"], "score": [0.9], "labels": ["cat"], "caption": [None]})

    query = QueryVector(MODEL, REVISION, unit(np.ones(32)))
    assert search_on_athena(run, query, limit=3).column("source_uri").to_pylist() == ["s3://in/a.jpg"]
    assert sent[-1] == athena_search_sql(query, None, 3)
    with pytest.raises(RequestRejected, match="vector is other's"):
        search_on_athena(run, QueryVector("other", REVISION, query.vector))
    assert len(sent) == 3  # the refused search sent its check only


def test_boxes_are_ranked_by_their_crops_vectors_as_numpy_ranks_them(tmp_path: Path, vectors: np.ndarray) -> None:
    import sqlglot

    from tools.results.search import _DIALECT, athena_search_sql

    # GIVEN 100 images, each with a dog's box and a cat's (a vector each) and a box that had no crop
    corners = Box(x0=0, y0=0, x1=10, y1=10)
    boxes = [Detection(label=label, score=0.9, box=corners) for label in ("dog", "cat", "cat")]
    results = [
        result(i, vectors[i]).model_copy(
            update={
                "detections": boxes,
                "box_embeddings": BoxEmbeddings(
                    model=MODEL,
                    revision=REVISION,
                    vectors=[float32_values(vectors[100 + 2 * i]), float32_values(vectors[101 + 2 * i]), None],
                ),
            }
        )
        for i in range(100)
    ]
    connection = connect_local(written(tmp_path, results))
    query = QueryVector(MODEL, REVISION, unit(np.random.default_rng(13).normal(size=32)))
    # WHEN the boxes are searched, the cats only
    hits = search(connection, query, "d.label = 'cat'", limit=10, ranked=BOXES).to_pylist()
    # THEN the cats' boxes come in numpy's order, with its scores; no box without a vector is ranked
    cats = vectors[101:300:2]
    expected = np.argsort(-(cats @ query.vector), kind="stable")[:10]
    assert [(hit["source_uri"], hit["detection_index"]) for hit in hits] == [
        (results[i].source_uri, 1) for i in expected
    ]
    assert [hit["score"] for hit in hits] == pytest.approx((cats @ query.vector)[expected], abs=1e-5)
    assert {hit["label"] for hit in hits} == {"cat"} and hits[0]["x1"] == 10
    # AND Athena's SQL for it, its dot product swapped for DuckDB's, ranks them alike
    athena = athena_search_sql(query, "d.label = 'cat'", 10, BOXES)
    sqlglot.parse_one(athena, read="athena")
    vector = "ARRAY[" + athena.split("ARRAY[", 1)[1].split("]", 1)[0] + "]"
    as_duckdb = athena.replace(
        _DIALECT["athena"]["score"].format(vector=vector), _DIALECT["duckdb"]["score"].format(vector=vector)
    )
    assert connection.sql(as_duckdb).to_arrow_table().to_pylist() == hits


def test_boxes_without_embeddings_are_refused_with_what_to_run(tmp_path: Path, vectors: np.ndarray) -> None:
    connection = connect_local(written(tmp_path, [result(i, v) for i, v in enumerate(vectors[:3])]))
    with pytest.raises(
        RequestRejected, match=r"no box here has an embedding \(3 images lack one\): .* --embeddings boxes"
    ):
        search(connection, QueryVector(MODEL, REVISION, vectors[0]), ranked=BOXES)
