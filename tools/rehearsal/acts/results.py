"""The rows where Athena reads them: one per image of every batch, the views and the named queries run on them."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from shared.storage.tables import SCHEMAS
from tools.rehearsal.report import Report
from tools.rehearsal.stack import DeployedStack


def results_where_athena_reads_them(
    stack: DeployedStack, report: Report, dropped: int, batches: int, with_variants: bool
) -> None:
    """The rows are where the Glue tables' projection points, every image of every batch has exactly one, the named
    queries run on them (Athena's SQL through sqlglot on DuckDB)."""
    images = dropped * max(batches, 1)
    with tempfile.TemporaryDirectory(prefix="rehearsal-tables-") as folder:
        _download_todays_tables(stack, report, Path(folder))
        _check_rows(report, Path(folder), images, max(batches, 1), with_variants)
        _run_named_queries(stack, report, Path(folder))
        _query_the_views(stack, report, Path(folder), images)


def _download_todays_tables(stack: DeployedStack, report: Report, local: Path) -> None:
    import boto3

    glue = boto3.client("glue", region_name=stack.region)
    s3 = boto3.client("s3", region_name=stack.region)
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    for table in glue.get_tables(DatabaseName=stack.outputs["GlueDatabaseName"])["TableList"]:
        if table.get("TableType") == "VIRTUAL_VIEW" or table["Name"] not in SCHEMAS:
            continue  # a view, or the evaluations table, which annotate evaluate writes, not the stack
        location = table["Parameters"]["storage.location.template"].replace("${dt}", today)
        bucket, prefix = location.removeprefix("s3://").split("/", 1)
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])]
        report.check(bool(keys), f"no {table['Name']} files under {location}, where the Glue table reads today")
        for key in keys:
            target = local / key
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, key, str(target))


def _check_rows(report: Report, local: Path, images: int, batches: int, with_variants: bool) -> None:
    from tools.results.query import run_local_query

    rows = run_local_query(
        "SELECT source_uri, status, failed_step, error, variants_model, annotated_uri FROM images", local
    )
    rows = rows.to_pylist()
    per_image = Counter(r["source_uri"] for r in rows)
    report.check(len(rows) == images, f"{len(rows)} image rows for {images} images: {per_image}")
    failed = [r for r in rows if r["status"] == "failed"]
    report.check(
        [r["source_uri"].rsplit("/", 1)[-1] for r in failed] == ["truncated.jpg"] * batches,
        f"expected truncated.jpg, dropped and named in the messages, to be the only failures: {failed}",
    )
    if with_variants:
        report.check(any(r["variants_model"] for r in rows), f"no row carries variants: {rows}")
    # the configuration with everything on stores pictures (StorePictures=true); the default draws them when looked at
    pictures = {r["source_uri"]: r["annotated_uri"] for r in rows if r["status"] == "succeeded"}
    report.check(
        all(pictures.values()) if with_variants else not any(pictures.values()),
        f"stored pictures {'expected' if with_variants else 'not expected'}: {pictures}",
    )
    # the prompt message asked for its boxes' embeddings: Tag wrote them, WriteResult read them in
    boxes = run_local_query(
        "SELECT b.label, d.label AS detected FROM box_embeddings b JOIN detections d "
        "USING (image_id, batch_id, detection_index)",
        local,
    ).to_pylist()
    report.check(
        bool(boxes) and all(row["label"] == row["detected"] for row in boxes),
        f"the boxes' embeddings are not their detections' rows: {boxes}",
    )
    # and its masks: Segment wrote them (its role holds it to *.masks.json), WriteResult read them in
    masks = run_local_query(
        "SELECT m.area, d.label FROM masks m JOIN detections d USING (image_id, batch_id, detection_index)", local
    ).to_pylist()
    report.check(bool(masks), "the boxes' masks are not in the masks table")
    report.steps.append(f"{len(rows)} image rows ({len(failed)} failed) where the Glue tables' projection reads them")


def _query_the_views(stack: DeployedStack, report: Report, local: Path, images: int) -> None:
    """Each Glue view, decoded as Athena decodes it, runs on the deployed results; images_latest gives one row per
    source image."""
    import base64

    import boto3
    import sqlglot

    from tools.results.query import run_local_query

    glue = boto3.client("glue", region_name=stack.region)
    tables = glue.get_tables(DatabaseName=stack.outputs["GlueDatabaseName"])["TableList"]
    views = {t["Name"]: t for t in tables if t.get("TableType") == "VIRTUAL_VIEW"}
    report.check("images_latest" in views, f"no images_latest view in the Glue database: {sorted(views)}")
    for name, view in views.items():
        encoded = view["ViewOriginalText"].removeprefix("/* Presto View: ").removesuffix(" */")
        original_sql = json.loads(base64.b64decode(encoded))["originalSql"]
        [duckdb_sql] = sqlglot.transpile(original_sql, read="athena", write="duckdb")
        rows = run_local_query(f"SELECT source_uri FROM ({duckdb_sql})", local).column("source_uri").to_pylist()
        if name == "images_latest":
            report.check(len(rows) == len(set(rows)), f"images_latest repeats a source image: {rows}")
    report.steps.append(f"views ran on the deployed results: {', '.join(sorted(views))}")


def _run_named_queries(stack: DeployedStack, report: Report, local: Path) -> None:
    import boto3

    from tools.results.query import duckdb_of_athena, run_local_query

    athena = boto3.client("athena", region_name=stack.region)
    database, workgroup = stack.outputs["GlueDatabaseName"], stack.outputs["AthenaWorkGroupName"]
    ids = athena.list_named_queries(WorkGroup=workgroup)["NamedQueryIds"]
    report.check(bool(ids), f"the workgroup {workgroup} has no named queries")
    answered = []
    for query_id in ids:
        query = athena.get_named_query(NamedQueryId=query_id)["NamedQuery"]
        report.check(query["Database"] == database, f"named query {query['Name']} is not on {database}")
        try:
            answered.append(
                f"{query['Name']} ({run_local_query(duckdb_of_athena(query['QueryString']), local).num_rows} rows)"
            )
        except Exception as error:  # DuckDB's error types vary; any is a failed query
            report.failures.append(f"named query {query['Name']} failed on the deployed results: {error}")
    report.steps.append("named queries ran: " + ", ".join(answered))
