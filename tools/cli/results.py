"""The results: `annotate query` (SQL), `export` (COCO, YOLO, Label Studio), `evaluate` (against reviewed labels),
`gallery` and `status` (what became of each image), over the local tables or a deployed stack's."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from shared.settings import AthenaSettings, IngestSettings, Settings
from tools.cli.common import DataDir, err, fail, out, print_table
from tools.results.search import DUPLICATE_THRESHOLD

commands = typer.Typer()


Where = Annotated[str | None, typer.Option(help="Which images: SQL over the images table's columns")]
Stack = Annotated[
    str | None, typer.Option(help="A deployed stack's name: its tables (Athena) and results instead of local ones")
]


def _stack_outputs(stack: str, *required: str) -> dict[str, str]:
    from shared.errors import RequestRejected
    from tools.aws.stack_outputs import stack_outputs

    try:
        return stack_outputs(stack, required)
    except RequestRejected as error:
        raise fail(str(error)) from None


def stack_athena(stack: str) -> AthenaSettings:
    """The stack's Athena workgroup and Glue database, from its outputs."""
    outputs = _stack_outputs(stack, "AthenaWorkGroupName", "GlueDatabaseName")
    return Settings(athena_workgroup=outputs["AthenaWorkGroupName"], athena_database=outputs["GlueDatabaseName"]).athena


def _results_root(data_dir: Path, stack: str | None) -> str:
    if stack:
        return f"s3://{_stack_outputs(stack, 'ResultsBucketName')['ResultsBucketName']}"
    return str(data_dir.resolve())


def _refuse_file_as_folder(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise fail(f"--out {out_dir} is a file: name a folder to write into")


def images_to_write(out_dir: Path, where: str | None, data_dir: Path, stack: str | None, verb: str) -> list[Any]:
    """The images an export or gallery writes into ``out_dir``: a folder, outside the data folder; none is a mistake."""
    from shared.storage import layout

    _refuse_file_as_folder(out_dir)
    if not stack and out_dir.resolve().is_relative_to(data_dir.resolve()):
        raise fail(f"--out {out_dir} is inside the data folder {data_dir}, which holds the results: write elsewhere")
    images = _annotated_images(where, data_dir, stack)
    if images:
        return images
    if stack:
        raise fail(f"nothing to {verb}: stack {stack} has no annotated images" + (f" where {where}" if where else ""))
    if not (data_dir / layout.TABLES).is_dir():
        raise fail(f"nothing to {verb}: {data_dir} holds no results (is --data-dir the folder annotate run wrote?)")
    raise fail(f"nothing to {verb}: no image in {data_dir}" + (f" where {where}" if where else ""))


@contextmanager
def writing_into(out_dir: Path) -> Iterator[None]:
    """A folder that cannot be written (a full disk, a path no folder can be made at), or that holds what the
    command did not write, said in a line."""
    from shared.errors import RequestRejected

    try:
        yield
    except RequestRejected as error:
        raise fail(str(error)) from None
    except OSError as error:
        where = f" ({error.filename})" if error.filename else ""
        raise fail(f"cannot write into {out_dir}: {error.strerror or error}{where}") from None


@commands.command()
def query(
    sql: Annotated[str, typer.Argument(help="SQL over the tables `images` and `detections`")],
    data_dir: DataDir = Path("annotate-data"),
    output: Annotated[str, typer.Option("--format", help="table, json or csv")] = "table",
    athena: Annotated[
        bool, typer.Option("--athena", help="Query the deployed tables with Athena (ANNOTATE_ATHENA_* settings)")
    ] = False,
) -> None:
    """Run SQL over the local results with DuckDB, or over the deployed ones with Athena."""
    import duckdb

    from shared.errors import RequestRejected, TransientError
    from tools.results.athena import run_athena_query
    from tools.results.query import OutputFormat, format_rows, run_local_query

    try:
        output_format = OutputFormat(output)
    except ValueError:
        raise fail(f"--format must be one of {[f.value for f in OutputFormat]}") from None
    try:
        rows = run_athena_query(sql, Settings().athena) if athena else run_local_query(sql, data_dir)
    except (duckdb.Error, RequestRejected, TransientError) as error:
        raise fail(str(error)) from None
    if output_format is OutputFormat.TABLE:
        print_table(rows)
    else:
        sys.stdout.write(format_rows(rows, output_format) + "\n")


def _annotated_images(where: str | None, data_dir: Path, stack: str | None) -> list[Any]:
    """The images ``where`` selects, from the local tables or, with ``stack``, the deployed ones (Athena)."""
    import duckdb

    from shared.errors import RequestRejected, TransientError
    from tools.results.annotations import read_annotated_images
    from tools.results.athena import run_athena_query
    from tools.results.query import run_local_query

    if stack:
        athena = stack_athena(stack)

    def query(sql: str) -> Any:
        return run_athena_query(sql, athena) if stack else run_local_query(sql, data_dir)

    try:
        return read_annotated_images(query, where, "athena" if stack else "duckdb")
    except (duckdb.Error, RequestRejected, TransientError) as error:
        raise fail(str(error)) from None


@commands.command("export")
def export_command(
    export_format: Annotated[str, typer.Option("--format", help="coco, yolo or labelstudio")],
    out_dir: Annotated[Path, typer.Option("--out", help="The folder to write the dataset into")],
    where: Where = None,
    data_dir: DataDir = Path("annotate-data"),
    stack: Stack = None,
    label_config: Annotated[
        Path | None,
        typer.Option(
            "--label-config", dir_okay=False, help="labelstudio: your project's label config; tasks use its names"
        ),
    ] = None,
    one_per_group: Annotated[
        bool,
        typer.Option(help="Of each group of near-duplicates (annotate duplicates), only its first image is written"),
    ] = False,
    threshold: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="--one-per-group: the similarity from which images are copies")
    ] = DUPLICATE_THRESHOLD,
) -> None:
    """Write the annotations as a COCO or YOLO dataset (with the pictures) or as Label Studio pre-annotations."""
    from shared.errors import RequestRejected
    from shared.serving.label_studio import MAX_LABEL_CONFIG_CHARS, read_label_config
    from shared.storage.objects import store_for
    from tools.results.annotations import batch_requests
    from tools.results.export import ExportFormat, export, label_studio_config
    from tools.results.truth import read_text_file

    try:
        chosen = ExportFormat(export_format)
    except ValueError:
        raise fail(f"--format must be one of {[f.value for f in ExportFormat]}") from None
    if label_config is not None and chosen is not ExportFormat.LABEL_STUDIO:
        raise fail("--label-config is a Label Studio project's: give it with --format labelstudio")
    try:
        config = read_text_file(label_config, MAX_LABEL_CONFIG_CHARS * 4, "label config") if label_config else ""
    except RequestRejected as error:
        raise fail(f"--label-config {error}") from None
    try:
        project = read_label_config(config) if config else None
    except RequestRejected as error:
        raise fail(f"--label-config {label_config}: {error}") from None
    images = images_to_write(out_dir, where, data_dir, stack, "export")
    if one_per_group:
        images = _one_per_group(images, data_dir, stack, threshold)
    if chosen is ExportFormat.LABEL_STUDIO and not config:
        config = label_studio_config(images, batch_requests(images, _results_root(data_dir, stack), store_for))
    for left in project.left_to_people if project else ():
        err.print(f"[yellow]left to people[/yellow] {left}", highlight=False)
    for choices in project.image_choices if project else ():
        err.print(
            f"[yellow]left to the backend[/yellow] Choices {choices.name!r}: CLIP chooses on the image", highlight=False
        )
    with writing_into(out_dir):
        report = export(images, chosen, out_dir, store_for, config)
    for source, reason in report.skipped.items():
        err.print(f"[yellow]skipped[/yellow] {source}: {reason}", highlight=False)
    out.print(f"{report.images} images, {report.boxes} boxes written to {out_dir} ({chosen})", highlight=False)


def _one_per_group(images: list[Any], data_dir: Path, stack: str | None, threshold: float) -> list[Any]:
    """``images`` without the near-duplicates of an image written before them: each group's first source stays."""
    from shared.errors import RequestRejected
    from tools.results.query import connect_local
    from tools.results.search import duplicate_groups

    if stack:
        raise fail("--one-per-group reads the local embeddings (annotate duplicates): leave out --stack")
    try:
        groups = duplicate_groups(connect_local(data_dir), threshold)
    except RequestRejected as error:
        raise fail(f"--one-per-group: {error}") from None
    # each group among the images being exported (not those deleted since, or outside --where): its first stays
    exported = {image.source_uri for image in images}
    groups = [members for group in groups if len(members := [source for source in group if source in exported]) > 1]
    left_out = {source for group in groups for source in group[1:]}
    err.print(
        f"{len(left_out)} near-duplicates left out, one image kept of each of {len(groups)} groups", highlight=False
    )
    return [image for image in images if image.source_uri not in left_out]


@commands.command()
def evaluate(
    truth: Annotated[
        Path,
        typer.Option("--truth", help="Reviewed labels: a COCO file, a Label Studio export, a YOLO data.yaml"),
    ],
    data_dir: DataDir = Path("annotate-data"),
    stack: Stack = None,
    output: Annotated[str, typer.Option("--format", help="table or json")] = "table",
    threshold: Annotated[
        float | None, typer.Option(min=0, max=1, help="Score threshold (default: the batches' box threshold)")
    ] = None,
) -> None:
    """How good the labels were: COCO mAP and AP50, precision, recall and the F1-best threshold per label, class and
    attribute accuracy on matched boxes, caption word F1. Kept in the evaluations table (annotate query)."""
    import json
    from datetime import UTC, datetime

    from shared.errors import RequestRejected
    from shared.storage.objects import store_for
    from tools.results.evaluate import (
        evaluate_labels,
        evaluation_table,
        request_threshold,
        write_evaluation,
    )
    from tools.results.truth import content_digest, read_truth

    if output not in {"table", "json"}:
        raise fail("--format must be one of ['table', 'json']")
    results_root = _results_root(data_dir, stack)
    images = _annotated_images(None, data_dir, stack)
    try:
        labelled = read_truth(truth)
        chosen = threshold if threshold is not None else request_threshold(images, results_root, store_for)
        evaluation = evaluate_labels(labelled, images, chosen, content_digest(store_for))
    except RequestRejected as error:
        raise fail(str(error)) from None
    prompts = sorted({image.prompt for image in images if image.prompt})
    evaluated_at = datetime.now(UTC)
    table = evaluation_table(evaluation, str(truth), " | ".join(prompts) or None, evaluated_at)
    uri = write_evaluation(table, results_root, evaluated_at, store_for)
    if output == "json":
        sys.stdout.write(json.dumps(evaluation.as_json() | {"table_uri": uri}) + "\n")
        return
    import pyarrow as pa

    shown = ["label", "truth_boxes", "predicted_boxes", "ap", "ap50", "precision", "recall", "f1", "best_threshold"]
    rows = [
        {name: round(value, 3) if isinstance(value, float) else value for name, value in row.items()}
        | {"label": row["label"] or "(all)"}
        for row in table.select(shown).to_pylist()
    ]
    print_table(
        pa.Table.from_pylist(rows), title=f"{evaluation.images} images, box scores from {evaluation.threshold:g}"
    )
    measures = {"class accuracy": evaluation.class_accuracy, "caption word F1": evaluation.caption_word_f1}
    measures |= {"mask mAP": evaluation.overall.mask_ap, "mask AP50": evaluation.overall.mask_ap50}
    measures |= {f"{name} accuracy": value for name, value in evaluation.attribute_accuracy.items()}
    said = [f"{name} {value:.3f}" for name, value in measures.items() if value is not None]
    if evaluation.captions_missing:
        said.append(f"no caption written for {evaluation.captions_missing} of the images people captioned")
    out.print("; ".join(said), highlight=False)
    out.print(f"written to {uri}", highlight=False)


@commands.command()
def gallery(
    out_dir: Annotated[Path, typer.Option("--out", help="The folder to write index.html (and its pictures) into")],
    where: Where = None,
    data_dir: DataDir = Path("annotate-data"),
    stack: Stack = None,
    expires: Annotated[int, typer.Option(help="With --stack: seconds the pictures' URLs stay valid")] = 3600,
) -> None:
    """One static page of the annotated pictures, their captions, boxes, classes, attributes and failures."""
    from shared.storage.objects import store_for
    from tools.results.gallery import write_gallery

    presign = None
    if stack:
        import boto3

        from shared.storage.objects import split_s3

        s3 = boto3.client("s3")

        def presign(uri: str) -> str:
            bucket, key = split_s3(uri)
            return str(s3.generate_presigned_url("get_object", {"Bucket": bucket, "Key": key}, ExpiresIn=expires))

    images = images_to_write(out_dir, where, data_dir, stack, "show")
    with writing_into(out_dir):
        index = write_gallery(images, out_dir, store_for, presign)
    out.print(f"{len(images)} images: open {index}", highlight=False)


@commands.command()
def status(
    what: Annotated[str | None, typer.Argument(help="A prompt message file (as sent), or a batch id (b-...)")] = None,
    last: Annotated[bool, typer.Option("--last", help="What was sent last")] = False,
    data_dir: DataDir = Path("annotate-data"),
    stack: Stack = None,
) -> None:
    """How many images of what was sent are done, failed (and why) and still running, and where the results are."""
    from botocore.exceptions import BotoCoreError, ClientError

    from shared.errors import AnnotateError
    from tools.results.status import BatchStatus

    if (what is None) == (not last):
        raise fail("give a message file or a batch id, or --last")
    try:
        statuses: list[BatchStatus] = _statuses(what, data_dir, stack)
    except (AnnotateError, ValueError, OSError, BotoCoreError, ClientError) as error:
        raise fail(f"{type(error).__name__}: {error}") from None
    for batch in statuses:
        out.print(
            f"batch {batch.batch_id}: {batch.state} ({batch.execution or 'no execution'}): {batch.images} images, "
            f"{batch.done} done, {batch.failed} failed, {batch.still_running} still running"
            + (
                f", {batch.missing} {'not annotated yet' if batch.state == 'ABORTED' else 'without a result'}"
                if batch.missing
                else ""
            )
            + f"; results in {batch.results}; {batch.lane} lane"
            + (f" ({batch.lane_reason})" if batch.lane_reason else ""),
            highlight=False,
            soft_wrap=True,
        )
        for failure in batch.failures:
            out.print(f"  failed {failure.source_uri}: {failure.reason}", highlight=False, soft_wrap=True)
        if batch.state == "ABORTED" and batch.missing:
            out.print("  stopped before it finished: run the same command again to annotate the rest", highlight=False)
    raise typer.Exit(0 if all(batch.all_done for batch in statuses) else 1)


def _statuses(what: str | None, data_dir: Path, stack: str | None) -> list[Any]:
    from shared.errors import RequestRejected
    from shared.storage.objects import store_for
    from tools.results import status

    settings = Settings(data_dir=data_dir)
    executions: list[dict[str, Any]] = []
    if stack:
        import boto3

        outputs = _stack_outputs(stack, "ResultsBucketName", "StateMachineArn")
        results_root = f"s3://{outputs['ResultsBucketName']}"
        executions = status.step_functions_executions(boto3.client("stepfunctions"), outputs["StateMachineArn"])
    else:
        results_root = settings.results_root
    if what is not None and what.startswith("b-") and not Path(what).exists():
        batch_ids = [what]
    elif what is not None:
        batch_ids = _planned_batches(Path(what), settings.ingest.model_copy(update={"results_root": results_root}))
    elif stack:
        if not executions:
            raise RequestRejected(f"stack {stack!r} has run no execution yet")
        batch_ids = [status.batch_of_execution(executions[0]["name"])]
    else:
        batch_ids = status.last_local_batches(data_dir)
    return [
        status.batch_status(
            batch_id,
            results_root,
            store_for,
            status.deployed_execution(executions, batch_id) if stack else status.local_execution(data_dir, batch_id),
        )
        for batch_id in batch_ids
    ]


def _planned_batches(message_file: Path, settings: IngestSettings) -> list[str]:
    """The batches the message plans, as ingest planned them: ids follow from the images' content and the request."""
    from shared.contracts import PromptMessage
    from shared.errors import RequestRejected
    from shared.pipeline.batches import plan_batches
    from shared.pipeline.ingest import parse_body
    from shared.storage.objects import store_for

    message = parse_body(message_file.read_text(encoding="utf-8", errors="replace"))
    if not isinstance(message, PromptMessage):
        raise RequestRejected(f"{message_file} is not a prompt message")
    return [batch.input.batch_id for batch in plan_batches(message, settings, store_for)]
