"""SQL over the deployed tables with Amazon Athena, returned like the local DuckDB query."""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa

from shared.errors import RequestRejected, TransientError
from shared.settings import AthenaSettings

_ARROW_TYPES = {
    "boolean": pa.bool_(),
    "tinyint": pa.int64(),
    "smallint": pa.int64(),
    "integer": pa.int64(),
    "bigint": pa.int64(),
    "float": pa.float64(),
    "real": pa.float64(),
    "double": pa.float64(),
    "decimal": pa.float64(),
}
_TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def run_athena_query(sql: str, settings: AthenaSettings, client: Any = None, poll_seconds: float = 0.5) -> pa.Table:
    """Run ``sql`` in the stack's workgroup and database; numbers and booleans come back typed, the rest text.

    Raises:
        RequestRejected: the query failed (syntax, a scan over the workgroup's limit); the reason is Athena's.
    """
    import boto3

    if not settings.athena_workgroup or not settings.athena_database:
        raise RequestRejected("set ANNOTATE_ATHENA_WORKGROUP and ANNOTATE_ATHENA_DATABASE (the stack's outputs)")
    athena = client or boto3.client("athena")
    execution_id = athena.start_query_execution(
        QueryString=sql,
        WorkGroup=settings.athena_workgroup,
        QueryExecutionContext={"Database": settings.athena_database},
    )["QueryExecutionId"]
    deadline = time.monotonic() + settings.athena_timeout_s
    while (status := athena.get_query_execution(QueryExecutionId=execution_id)["QueryExecution"]["Status"])[
        "State"
    ] not in _TERMINAL:
        if time.monotonic() > deadline:
            athena.stop_query_execution(QueryExecutionId=execution_id)
            raise TransientError(f"Athena query {execution_id} ran past {settings.athena_timeout_s} s; stopped")
        time.sleep(poll_seconds)
    if status["State"] != "SUCCEEDED":
        raise RequestRejected(f"Athena query {status['State'].lower()}: {status.get('StateChangeReason', '')}")
    return _results_table(athena, execution_id)


def _results_table(athena: Any, execution_id: str) -> pa.Table:
    columns: list[dict[str, str]] = []
    rows: list[list[str | None]] = []
    for page_number, page in enumerate(
        athena.get_paginator("get_query_results").paginate(QueryExecutionId=execution_id)
    ):
        result_set = page["ResultSet"]
        columns = columns or result_set["ResultSetMetadata"]["ColumnInfo"]
        page_rows = [[cell.get("VarCharValue") for cell in row["Data"]] for row in result_set["Rows"]]
        rows.extend(page_rows[1:] if page_number == 0 else page_rows)  # the first row repeats the header
    arrays = {}
    for index, column in enumerate(columns):
        arrow_type = _ARROW_TYPES.get(column["Type"].lower(), pa.string())
        values = [row[index] for row in rows]
        if arrow_type == pa.bool_():
            arrays[column["Name"]] = pa.array([None if v is None else v.lower() == "true" for v in values])
        else:
            arrays[column["Name"]] = pa.array(values, type=pa.string()).cast(arrow_type)
    return pa.table(arrays)
