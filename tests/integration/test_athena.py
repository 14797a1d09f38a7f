"""`annotate query --athena` on moto's Athena: the same output formats as the local query."""

from __future__ import annotations

import json
from collections.abc import Iterator

import boto3
import pytest
from moto import mock_aws
from typer.testing import CliRunner

from shared.errors import RequestRejected
from shared.settings import Settings
from tools.aws.moto_internals import QueryResults, athena_backends
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


def _queue(columns: list[tuple[str, str]], rows: list[list[str | None]]) -> None:
    info = [{"Name": name, "Type": kind} for name, kind in columns]
    data = [{"Data": [{"VarCharValue": name} for name, _ in columns]}]
    data += [{"Data": [{} if value is None else {"VarCharValue": value} for value in row]} for row in rows]
    athena_backends["123456789012"][REGION].query_results_queue.append(QueryResults(data, info))


def test_label_studio_s_tasks_are_found_among_a_deployed_stack_s_rows(athena: object) -> None:
    """`annotate serve --stack`: the backend reads what the stack annotated (its images, boxes and attributes)."""
    from tools.results.annotations import athena_annotated_sources

    athena_backends["123456789012"][REGION].query_results_queue.clear()  # the fixture's rows are another query's
    image = [
        "a1",
        "s3://in/cat.jpg",
        "b-1",
        "succeeded",
        "64",
        "48",
        "A cat.",
        None,
        None,
        "2026-12-05",
        None,
        "cat.",
        "0" * 64,
    ]
    _queue(
        [
            (name, "integer" if name in ("width", "height") else "varchar")
            for name in (
                "image_id",
                "source_uri",
                "batch_id",
                "status",
                "width",
                "height",
                "caption",
                "annotated_uri",
                "error",
                "processed_at",
                "result_uri",
                "prompt",
                "content_sha256",
            )
        ],
        [image],
    )
    box = ["a1", "b-1", "0", "cat", "0.9", "1", "2", "30", "40", "tabby", "0.5"]
    _queue(
        [("image_id", "varchar"), ("batch_id", "varchar"), ("detection_index", "integer"), ("label", "varchar")]
        + [(name, "double") for name in ("score", "x0", "y0", "x1", "y1")]
        + [("class_label", "varchar"), ("class_score", "double")],
        [box],
    )
    _queue(
        [
            ("image_id", "varchar"),
            ("batch_id", "varchar"),
            ("detection_index", "integer"),
            ("name", "varchar"),
            ("value", "varchar"),
        ],
        [["a1", "b-1", "0", "color", "gray"]],
    )
    [found] = athena_annotated_sources(Settings().athena)(["s3://in/cat.jpg"], ["cat.jpg"])
    assert (found.source_uri, found.caption, found.prompt) == ("s3://in/cat.jpg", "A cat.", "cat.")
    assert found.content_sha256 == "0" * 64
    [cat] = found.boxes
    assert (cat.label, cat.box.x1, cat.class_label, cat.attributes) == ("cat", 30.0, "tabby", {"color": "gray"})
