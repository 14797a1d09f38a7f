"""SQL over the local ``images`` and ``detections`` tables with DuckDB."""

from __future__ import annotations

import csv
import io
import json
from enum import StrEnum
from pathlib import Path

import duckdb
import pyarrow as pa

from shared.tables import PARTITION_COLUMN, SCHEMAS, TABLES_PREFIX


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"
    CSV = "csv"


def connect_local(data_dir: Path) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with views ``images`` and ``detections`` over the Parquet files under ``data_dir``.

    A table with no files yet is an empty view of the right schema, so queries work before the first run.
    """
    connection = duckdb.connect()
    for name, schema in SCHEMAS.items():
        table_root = data_dir.resolve() / TABLES_PREFIX / name
        if any(table_root.glob(f"{PARTITION_COLUMN}=*/*.parquet")):
            pattern = str(table_root / f"{PARTITION_COLUMN}=*" / "*.parquet").replace("'", "''")
            connection.execute(
                f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{pattern}', hive_partitioning = true, "
                f"hive_types = {{'{PARTITION_COLUMN}': VARCHAR}}, union_by_name = true)"
            )
        else:
            empty = schema.append(pa.field(PARTITION_COLUMN, pa.string())).empty_table()
            connection.register(f"{name}_empty", empty)
            connection.execute(f"CREATE VIEW {name} AS SELECT * FROM {name}_empty")
    return connection


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
