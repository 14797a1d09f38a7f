"""`annotate query --athena` on moto's Athena: the same output formats as the local query."""

from __future__ import annotations

import json
from collections.abc import Iterator

import boto3
import pytest
from moto import mock_aws
from moto.athena.models import QueryResults, athena_backends
from typer.testing import CliRunner

from shared.errors import RequestRejected
from shared.settings import Settings
from tools.cli import app
from tools.results.athena import run_athena_query

REGION = "us-east-1"


@pytest.fixture
def athena(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    monkeypatch.setenv("ANNOTATE_ATHENA_WORKGROUP", "annotate-test")
    monkeypatch.setenv("ANNOTATE_ATHENA_DATABASE", "annotate_test")
    with mock_aws():
        client = boto3.client("athena", region_name=REGION)
        client.create_work_group(Name="annotate-test")
        columns = [{"Name": "status", "Type": "varchar"}, {"Name": "n", "Type": "bigint"}]
        rows = [{"Data": [{"VarCharValue": "status"}, {"VarCharValue": "n"}]}]
        rows += [{"Data": [{"VarCharValue": s}, {"VarCharValue": n}]} for s, n in (("failed", "4"), ("succeeded", "2"))]
        athena_backends["123456789012"][REGION].query_results_queue.append(QueryResults(rows, columns))
        yield client


def test_athena_rows_come_back_typed_and_in_the_local_formats(athena: object) -> None:
    result = CliRunner().invoke(
        app, ["query", "--athena", "--format", "json", "SELECT status, count(*) AS n FROM images GROUP BY status"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == [{"status": "failed", "n": 4}, {"status": "succeeded", "n": 2}]


def test_athena_needs_the_stack_outputs() -> None:
    with pytest.raises(RequestRejected, match="ANNOTATE_ATHENA_WORKGROUP"):
        run_athena_query("SELECT 1", Settings(athena_workgroup="", athena_database="").athena)
