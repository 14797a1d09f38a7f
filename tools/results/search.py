"""Find images by meaning: the images whose CLIP embedding (the ``embeddings`` table) is nearest a text's or an
image's, filtered with the other tables' columns; and the groups of near-duplicate images.

Every vector is unit length, so the cosine similarity is the dot product; a vector is compared only with vectors of
its own model and revision (a search whose model the rows do not have is refused, never ranked).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from shared.contracts import MAX_SEARCH_TEXT_CHARS
from shared.errors import RequestRejected

if TYPE_CHECKING:
    import duckdb
    import numpy as np
    import pyarrow as pa

    from shared.settings import Settings

# A resized or re-encoded copy of an image, or a burst of one scene: cosine similarity at least this, the threshold
# commonly used with CLIP ViT-B/32 (unmeasured here: no real checkpoint). The tiny random-weight CLIP the tests run
# puts every image near every other (the samples' different images at 0.989, their copies at 0.9999 and above,
# tests/e2e/test_search.py): there, 0.999 separates them.
DUPLICATE_THRESHOLD = 0.95


@dataclass(frozen=True)
class QueryVector:
    """What a search compares the rows with: a unit vector, and the model (its name and weights' revision) that
    made it."""

    model: str
    revision: str
    vector: np.ndarray  # float32


# Each (model, revision) the rows' embeddings are of: how many rows, and its vectors' length.
EmbeddedModels = dict[tuple[str, str], tuple[int, int]]


@dataclass(frozen=True)
class Ranked:
    """What a search ranks: images (their vectors in ``embeddings``) or boxes (their crops' in ``box_embeddings``)."""

    table: str
    noun: str
    nouns: str
    fix: str  # what to run where no row has one


IMAGES = Ranked(
    "embeddings",
    "image",
    "images",
    "annotate them again (every request embeds its images unless its embeddings is none)",
)
BOXES = Ranked(
    "box_embeddings", "box", "boxes", "annotate them again with embeddings boxes (annotate run --embeddings boxes)"
)


def text_vector(text: str, settings: Settings) -> QueryVector:
    """The CLIP text tower's embedding of ``text`` as written.

    Raises:
        RequestRejected: the text is empty or too long.
    """
    from shared.models.tagging import load_tagger

    text = text.strip()
    if not text:
        raise RequestRejected("the search text is empty: say what to look for ('a dog on a beach')")
    if len(text) > MAX_SEARCH_TEXT_CHARS:
        raise RequestRejected(f"the search text is {len(text):,} characters; at most {MAX_SEARCH_TEXT_CHARS:,}")
    tagger = load_tagger(settings.describe)
    return QueryVector(tagger.name, tagger.revision, tagger.embed_texts([text])[0])


def image_vector(uri: str, settings: Settings) -> QueryVector:
    """The CLIP image tower's embedding of the image at ``uri`` (a path or an ``s3://`` location), read and decoded
    as the pipeline reads it, annotated or not.

    Raises:
        ImageRejected: it cannot be read as an image (missing, too large, not an image).
    """
    from shared.models.tagging import load_tagger
    from shared.storage.images import load_image
    from shared.storage.objects import store_for

    image = load_image(uri, store_for, settings.image_limits)
    tagger = load_tagger(settings.describe)
    return QueryVector(tagger.name, tagger.revision, tagger.embed_images([image.pixels])[0])


def _models_sql(ranked: Ranked, length: str) -> str:
    """Each model and revision of the latest images' rows in ``ranked``'s table, with its rows and vectors' length
    (``length``: DuckDB's or Athena's name for a list's length)."""
    return (
        f"SELECT e.model, e.model_revision, count(*) AS images, min({length}(e.vector)) AS length "
        f"FROM {ranked.table} e JOIN images_latest img ON img.image_id = e.image_id AND img.batch_id = e.batch_id "
        "GROUP BY e.model, e.model_revision"
    )


def embedded_models(connection: duckdb.DuckDBPyConnection, ranked: Ranked = IMAGES) -> EmbeddedModels:
    """Each model and revision the latest rows' embeddings are of: how many rows, and its vectors' length."""
    rows = connection.execute(_models_sql(ranked, "len")).fetchall()
    return {(model, revision): (int(images), int(length)) for model, revision, images, length in rows}


def comparable_model(
    connection: duckdb.DuckDBPyConnection,
    model: str | None,
    length: int | None = None,
    revision: str | None = None,
    ranked: Ranked = IMAGES,
) -> tuple[str, str]:
    """The model and revision whose rows a search or a duplicates run compares (:func:`checked_model`, on the local
    tables)."""
    models = embedded_models(connection, ranked)
    images = 0 if models else int(connection.execute("SELECT count(*) FROM images_latest").fetchall()[0][0])
    return checked_model(models, images, model, length, revision, ranked)


def checked_model(
    models: EmbeddedModels,
    images: int,
    model: str | None,
    length: int | None,
    revision: str | None = None,
    ranked: Ranked = IMAGES,
) -> tuple[str, str]:
    """``model`` and ``revision`` (a query vector's, of ``length``) or, where none is given, the only model and
    revision of ``models`` (those the rows are of); ``images``: how many images there are, where none has an
    embedding.

    Raises:
        RequestRejected: no row has an embedding; the rows have none of ``model``'s, or of its ``revision`` (the
            same name, other weights), or vectors of another length; the rows have several models or revisions and
            the call does not say which.
    """
    if not models:
        raise RequestRejected(
            f"no {ranked.noun} here has an embedding ({images} image{'s' if images != 1 else ''} lack one): "
            + ranked.fix
        )
    found = ", ".join(
        f"{name} revision {rev} ({count} {ranked.nouns})" for (name, rev), (count, _) in sorted(models.items())
    )
    named = [key for key in models if model is None or key[0] == model]
    if not named:
        raise RequestRejected(
            f"this search's vector is {model}'s but the embeddings here are {found}: vectors of different models "
            "cannot be compared (search with the model that made them: ANNOTATE_TAGGER_MODELS)"
        )
    if revision is not None and (model, revision) not in models:
        raise RequestRejected(
            f"this search's vector is {model} revision {revision}, the embeddings here are {found}: the same name "
            "with other weights, whose vectors cannot be compared (annotate the images again with this model, or "
            "search with the export that made them)"
        )
    if revision is None and len(named) > 1:
        fix = "name one with --model" if model is None else "annotate them again with one"
        raise RequestRejected(f"the embeddings here are of several models or revisions, {found}: {fix}")
    chosen = (model, revision) if model is not None and revision is not None else named[0]
    if length is not None and models[chosen][1] != length:
        raise RequestRejected(f"this search's vector has {length} values, the rows' {models[chosen][1]}")
    return chosen


def _filter(where: str | None) -> str:
    """The rows a ``--where`` keeps: an image any of whose rows (its ``images`` row, joined with each of its
    ``detections`` rows) satisfies it. A column both tables have is named with its table: i. or d."""
    if not where:
        return "TRUE"
    return (
        "EXISTS (SELECT 1 FROM images_latest i LEFT JOIN detections d "
        "ON d.image_id = i.image_id AND d.batch_id = i.batch_id "
        f"WHERE i.image_id = img.image_id AND i.batch_id = img.batch_id AND ({where}))"
    )


# Where DuckDB's SQL and Athena's (Trino's) differ, in the ranking: the dot product of two arrays, and a list's text.
_DIALECT = {
    "duckdb": {
        "score": "list_dot_product(e.vector, CAST({vector} AS FLOAT[]))",
        "labels": "string_agg(DISTINCT d.label, ', ' ORDER BY d.label)",
    },
    "athena": {
        "score": "reduce(zip_with(e.vector, {vector}, (a, b) -> a * b), 0.0E0, (s, x) -> s + x, s -> s)",
        "labels": "array_join(array_sort(array_distinct(array_agg(d.label))), ', ')",
    },
}


def search_sql(
    where: str | None,
    dialect: str = "duckdb",
    vector: str = "$vector",
    model: str = "$model",
    revision: str = "$revision",
    limit: str = "$limit",
    ranked: Ranked = IMAGES,
) -> str:
    """The ranking: the latest row of each image embedded by the query's model and revision, best first (ties by
    source), with its labels and caption; or of each box, with its label, class and corners. DuckDB's takes the
    parameters $model, $revision, $vector and $limit; Athena's, the values written in (:func:`athena_search_sql`)."""
    words = _DIALECT[dialect]
    if ranked is BOXES:
        # each box of the latest images with the box's own detection row: --where sees only the documented i. and
        # d. (an unqualified label is the box's), never the vectors' table, whose columns share those names
        return f"""
SELECT e.source_uri, e.detection_index, b.label, b.class_label,
       {words["score"].format(vector=vector)} AS score,
       b.x0, b.y0, b.x1, b.y1, b.caption
FROM box_embeddings e
JOIN (SELECT d.image_id, d.batch_id, d.detection_index, d.label, d.class_label, d.x0, d.y0, d.x1, d.y1, i.caption
      FROM images_latest i JOIN detections d ON d.image_id = i.image_id AND d.batch_id = i.batch_id
      WHERE ({where or "TRUE"})) b
  ON e.image_id = b.image_id AND e.batch_id = b.batch_id AND e.detection_index = b.detection_index
WHERE e.model = {model} AND e.model_revision = {revision}
ORDER BY score DESC, e.source_uri, e.detection_index
LIMIT {limit}
"""
    return f"""
SELECT img.source_uri,
       {words["score"].format(vector=vector)} AS score,
       (SELECT {words["labels"]} FROM detections d
        WHERE d.image_id = img.image_id AND d.batch_id = img.batch_id) AS labels,
       img.caption
FROM images_latest img
JOIN embeddings e ON e.image_id = img.image_id AND e.batch_id = img.batch_id
 AND e.model = {model} AND e.model_revision = {revision}
WHERE {_filter(where)}
ORDER BY score DESC, img.source_uri
LIMIT {limit}
"""


def athena_search_sql(query: QueryVector, where: str | None, limit: int, ranked: Ranked = IMAGES) -> str:
    """The ranking in Athena's SQL, the model, its revision and the vector written in (Athena's parameters are
    scalars): each value a double literal, exactly the float32's. A 1,024-value vector makes about 18 kB of SQL,
    within Athena's "maximum allowed query string length is 262144 bytes" (Athena service quotas;
    tests/unit/test_search.py)."""
    values = ", ".join(f"{float(value):.9e}" for value in query.vector)
    model, revision = ("'" + text.replace("'", "''") + "'" for text in (query.model, query.revision))
    return search_sql(where, "athena", f"ARRAY[{values}]", model, revision, str(int(limit)), ranked)


def search(
    connection: duckdb.DuckDBPyConnection,
    query: QueryVector,
    where: str | None = None,
    limit: int = 10,
    ranked: Ranked = IMAGES,
) -> pa.Table:
    """The ``limit`` images nearest ``query``, best first: source_uri, score (cosine similarity), labels, caption;
    or boxes: source_uri, detection_index, label, class_label, score, x0, y0, x1, y1, caption.

    Raises:
        RequestRejected: the rows cannot be compared with ``query`` (:func:`comparable_model`).
        duckdb.Error: ``where`` is not SQL the tables answer.
    """
    model, revision = comparable_model(connection, query.model, len(query.vector), query.revision, ranked)
    parameters = {"model": model, "revision": revision, "vector": query.vector.tolist(), "limit": limit}
    return connection.sql(search_sql(where, ranked=ranked), params=parameters).to_arrow_table()


def duplicate_groups(
    connection: duckdb.DuckDBPyConnection, threshold: float = DUPLICATE_THRESHOLD, model: str | None = None
) -> list[list[str]]:
    """The groups of images whose embeddings are within ``threshold`` of each other (cosine similarity at least
    it; a group holds every image linked to another by a pair so close), each group's sources sorted, the groups by
    their first source.

    Raises:
        RequestRejected: no embeddings, or several models and none named (:func:`comparable_model`).
    """
    import numpy as np

    rows = connection.execute(
        "SELECT img.source_uri, e.vector FROM images_latest img JOIN embeddings e "
        "ON e.image_id = img.image_id AND e.batch_id = img.batch_id AND e.model = ? AND e.model_revision = ? "
        "ORDER BY img.source_uri",
        list(comparable_model(connection, model)),
    ).fetchall()
    sources = [source for source, _ in rows]
    vectors = np.array([vector for _, vector in rows], dtype=np.float32)
    parent = list(range(len(sources)))

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    for start in range(0, len(sources), 1024):  # a block of rows against all: memory stays at 1024 x n
        close = vectors[start : start + 1024] @ vectors.T >= threshold
        for row, column in zip(*np.nonzero(close), strict=True):
            if start + row < column:
                parent[root(int(column))] = root(start + int(row))
    groups: dict[int, list[str]] = {}
    for index, source in enumerate(sources):
        groups.setdefault(root(index), []).append(source)
    return sorted((sorted(group) for group in groups.values() if len(group) > 1), key=lambda group: group[0])


def athena_models(run: Callable[[str], pa.Table], ranked: Ranked = IMAGES) -> tuple[EmbeddedModels, int]:
    """The deployed tables' embedding models and revisions (images, vectors' length each) and, where there are none,
    how many images there are: :func:`checked_model`'s inputs, from Athena (``run`` a query)."""
    rows = run(_models_sql(ranked, "cardinality")).to_pylist()
    models = {(str(row["model"]), str(row["model_revision"])): (int(row["images"]), int(row["length"])) for row in rows}
    images = 0 if models else int(run("SELECT count(*) AS n FROM images_latest").to_pylist()[0]["n"])
    return models, images


def search_on_athena(
    run: Callable[[str], pa.Table],
    query: QueryVector,
    where: str | None = None,
    limit: int = 10,
    models: tuple[EmbeddedModels, int] | None = None,
    ranked: Ranked = IMAGES,
) -> pa.Table:
    """:func:`search` over the deployed tables, in Athena's SQL; ``models``: :func:`athena_models`' answer, where the
    caller asked already (each query is billed).

    Raises:
        RequestRejected: the rows cannot be compared with ``query``, or Athena refused the query (its reason).
    """
    checked_model(*(models or athena_models(run, ranked)), query.model, len(query.vector), query.revision, ranked)
    return run(athena_search_sql(query, where, limit, ranked))


def local_similar(data_dir: Path) -> Callable[[str, str, list[float], int], list[dict[str, object]]]:
    """The API's search (``POST /v1/search``, annotate serve) over the tables under ``data_dir``."""

    def find(model: str, revision: str, vector: list[float], limit: int) -> list[dict[str, object]]:
        import numpy as np

        from tools.results.query import connect_local

        query = QueryVector(model, revision, np.array(vector, dtype=np.float32))
        hits = search(connect_local(data_dir), query, None, limit)
        return list(hits.to_pylist())

    return find
