"""SQL over the local ``images``, ``detections`` and ``evaluations`` tables with DuckDB."""

from __future__ import annotations

import csv
import io
import json
import re
from enum import StrEnum
from pathlib import Path

import duckdb
import pyarrow as pa

from shared.storage import layout
from shared.storage.tables import PARTITION_COLUMN, QUERIED_SCHEMAS, SCHEMAS

# One row per source image: its newest. The same SQL is the DuckDB view here and the Athena view in template.yaml
# (a Glue view, tested to hold this text).
IMAGES_LATEST_SQL = (
    "SELECT i.* FROM images i JOIN (SELECT source_uri, max(processed_at) AS newest FROM images GROUP BY source_uri) n "
    "ON i.source_uri = n.source_uri AND i.processed_at = n.newest"
)


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"
    CSV = "csv"


def connect_local(data_dir: Path) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with views ``images``, ``detections``, ``embeddings`` and ``evaluations`` over the
    Parquet files under ``data_dir``.

    A table with no files yet is an empty view of the right schema, so queries work before the first run.
    """
    import pyarrow.dataset as ds

    connection = duckdb.connect()
    for name, schema in QUERIED_SCHEMAS.items():
        table_root = Path(layout.table_folder(str(data_dir.resolve()), name))
        # The files are listed here and handed over by name: DuckDB would read a folder's *, ?, [ or { as a pattern
        files = sorted(str(path) for path in table_root.glob(f"{PARTITION_COLUMN}=*/*.parquet") if path.is_file())
        if files:
            partitioning = ds.partitioning(pa.schema([(PARTITION_COLUMN, pa.string())]), flavor="hive")
            dataset = ds.dataset(
                files,
                schema=schema.append(pa.field(PARTITION_COLUMN, pa.string())),  # older files: missing columns null
                format="parquet",
                partitioning=partitioning,
                partition_base_dir=str(table_root),
            )
            connection.register(f"{name}_files", dataset)
            connection.execute(f"CREATE VIEW {name} AS SELECT * FROM {name}_files")
        else:
            empty = schema.append(pa.field(PARTITION_COLUMN, pa.string())).empty_table()
            connection.register(f"{name}_empty", empty)
            connection.execute(f"CREATE VIEW {name} AS SELECT * FROM {name}_empty")
    connection.execute(f"CREATE VIEW images_latest AS {IMAGES_LATEST_SQL}")
    return connection


# Each Parquet scalar type's name in Glue's Hive DDL and in Athena's view definitions (Presto/Trino).
_SCALAR_TYPES = (
    (pa.types.is_string, "string", "varchar"),
    (pa.types.is_float64, "double", "double"),
    (pa.types.is_float32, "float", "real"),
    (pa.types.is_int32, "int", "integer"),
    (pa.types.is_int64, "bigint", "bigint"),
    (pa.types.is_timestamp, "timestamp", "timestamp(3)"),
)


def _column_type(arrow_type: pa.DataType, presto: bool) -> str:
    for is_type, hive, presto_name in _SCALAR_TYPES:
        if is_type(arrow_type):
            return presto_name if presto else hive
    if pa.types.is_list(arrow_type):
        inner = _column_type(arrow_type.value_type, presto)
        return f"array({inner})" if presto else f"array<{inner}>"
    if pa.types.is_struct(arrow_type):
        fields = [(field.name, _column_type(field.type, presto)) for field in arrow_type]
        if presto:
            return "row(" + ",".join(f"{name} {type_}" for name, type_ in fields) + ")"
        return "struct<" + ",".join(f"{name}:{type_}" for name, type_ in fields) + ">"
    raise TypeError(f"no column type for {arrow_type}")


def glue_type(arrow_type: pa.DataType) -> str:
    """The Glue/Athena (Hive DDL) type that reads a Parquet column of ``arrow_type``."""
    return _column_type(arrow_type, presto=False)


def presto_type(arrow_type: pa.DataType) -> str:
    """The type Athena's view definitions (Presto/Trino) name for a Parquet column of ``arrow_type``."""
    return _column_type(arrow_type, presto=True)


def images_latest_view(database: str) -> dict[str, object]:
    """The view as Athena stores it in Glue (``/* Presto View: <this, base64> */``)."""
    columns = [*SCHEMAS["images"], pa.field(PARTITION_COLUMN, pa.string())]
    return {
        "originalSql": IMAGES_LATEST_SQL,
        "catalog": "awsdatacatalog",
        "schema": database,
        "columns": [{"name": field.name, "type": presto_type(field.type)} for field in columns],
    }


# Athena's dot product of two arrays (Trino has no function for it), and DuckDB's: the one idiom of the project's
# Athena SQL that sqlglot does not carry over (tools/results/search.py writes it).
_ATHENA_DOT = re.compile(
    r"reduce\(zip_with\(([\w.]+), ([\w.]+), \(a, b\) -> a \* b\), 0\.0E0, \(s, x\) -> s \+ x, s -> s\)"
)


def duckdb_of_athena(athena_sql: str) -> str:
    """``athena_sql`` in DuckDB's dialect: sqlglot's transpilation, after the dot product of two columns."""
    import sqlglot

    [duckdb_sql] = sqlglot.transpile(
        _ATHENA_DOT.sub(r"list_dot_product(\1, \2)", athena_sql), read="athena", write="duckdb"
    )
    return str(duckdb_sql)


def run_local_query(sql: str, data_dir: Path) -> pa.Table:
    """Run ``sql`` over the local tables; DuckDB's errors (syntax, unknown column) propagate as they are."""
    relation = connect_local(data_dir).sql(sql)
    return relation.to_arrow_table() if relation is not None else pa.table({})


def format_rows(table: pa.Table, output: OutputFormat) -> str:
    """JSON (a list of objects) or CSV text of ``table``; the table format is drawn by the CLI."""
    rows = table.to_pylist()
    if output is OutputFormat.JSON:
        return json.dumps(rows, indent=2, default=str)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=table.column_names)
    writer.writeheader()
    writer.writerows({key: _cell(value) for key, value in row.items()} for row in rows)
    return buffer.getvalue()


def _cell(value: object) -> object:
    return json.dumps(value, default=str) if isinstance(value, list | dict) else value
