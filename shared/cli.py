"""The `annotate` command: run the workflow locally and query its results."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from shared.settings import Profile, use_settings

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
out = Console()
err = Console(stderr=True)

DataDir = Annotated[Path, typer.Option("--data-dir", help="Local results folder")]


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(code)


def _validation_message(error: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'input'}: {e['msg']}" for e in error.errors())


@app.command()
def run(
    paths: Annotated[list[str], typer.Argument(help="Image files or folders (local mode)")],
    prompt: Annotated[str, typer.Option(help="Phrases to detect, separated by periods: 'dog. cat.'")],
    data_dir: DataDir = Path("annotate-data"),
    profile: Annotated[Profile, typer.Option(help="default: real checkpoints; tiny: offline")] = Profile.DEFAULT,
    box_threshold: Annotated[float, typer.Option(help="Lowest box score kept")] = 0.35,
    text_threshold: Annotated[float, typer.Option(help="Lowest phrase score for a box")] = 0.25,
    attribute: Annotated[
        list[str] | None,
        typer.Option(help="An attribute vocabulary, NAME=VALUE,VALUE,... (repeatable; replaces color and pattern)"),
    ] = None,
    top_k: Annotated[int, typer.Option(help="Classes kept per box")] = 3,
    caption: Annotated[bool, typer.Option(help="Write a caption with the LLM")] = True,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the structured logs")] = False,
) -> None:
    """Annotate images through the real workflow definition, executed on this machine."""
    from shared.batches import plan_batches
    from shared.contracts import PromptMessage

    _quiet_logs(verbose)
    settings = use_settings(profile=profile, data_dir=data_dir)
    options: dict[str, Any] = {
        "box_threshold": box_threshold,
        "text_threshold": text_threshold,
        "top_k": top_k,
        "caption": caption,
    }
    if attribute:
        options["attributes"] = _vocabularies(attribute)
    try:
        message = PromptMessage(prompt=prompt, images=paths, **options)
    except ValidationError as error:
        raise _fail(_validation_message(error)) from None
    manifests = plan_batches(message, settings, settings.results_root)
    if not manifests:
        raise _fail("no images found in " + ", ".join(paths))
    succeeded, failed = _run_batches(manifests)
    out.print(f"{succeeded} succeeded, {failed} failed", highlight=False)
    out.print(f"results in {settings.results_root}; query them with: annotate query --data-dir {data_dir} 'SQL'")
    raise typer.Exit(1 if failed else 0)


def _vocabularies(options: list[str]) -> dict[str, list[str]]:
    vocabularies: dict[str, list[str]] = {}
    for option in options:
        name, separator, values = option.partition("=")
        if not separator:
            raise _fail(f"--attribute {option!r} must look like NAME=VALUE,VALUE")
        vocabularies[name.strip()] = [value.strip() for value in values.split(",") if value.strip()]
    return vocabularies


def _run_batches(manifests: list) -> tuple[int, int]:
    from shared.local_runner import local_workflow
    from shared.query import run_local_query

    total = sum(len(manifest.images) for manifest in manifests)
    succeeded = failed = 0
    columns = (TextColumn("annotating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task("images", total=total)

        def on_invocation(function: str, payload: dict, error: BaseException | None) -> None:
            if function == "write_result":
                progress.advance(task)

        with local_workflow(on_invocation) as run_batch:
            for manifest in manifests:
                result = run_batch(manifest)
                if result.summary is None:
                    err.print(f"[red]batch {manifest.batch_id} failed:[/red] {result.error}", highlight=False)
                    failed += len(manifest.images)
                    continue
                succeeded += result.summary.succeeded
                failed += result.summary.failed
    if failed:
        ids = ", ".join(f"'{manifest.batch_id}'" for manifest in manifests)
        rows = run_local_query(
            f"SELECT source_uri, failed_step, error FROM images WHERE status = 'failed' AND batch_id IN ({ids}) "
            "ORDER BY source_uri",
            Path(manifests[0].results_uri),
        )
        _print_table(rows, title="failed images")
    return succeeded, failed


@app.command()
def query(
    sql: Annotated[str, typer.Argument(help="SQL over the tables `images` and `detections`")],
    data_dir: DataDir = Path("annotate-data"),
    output: Annotated[str, typer.Option("--format", help="table, json or csv")] = "table",
) -> None:
    """Run SQL over the local results with DuckDB."""
    import duckdb

    from shared.query import OutputFormat, format_rows, run_local_query

    try:
        output_format = OutputFormat(output)
    except ValueError:
        raise _fail(f"--format must be one of {[f.value for f in OutputFormat]}") from None
    try:
        rows = run_local_query(sql, data_dir)
    except duckdb.Error as error:
        raise _fail(str(error)) from None
    if output_format is OutputFormat.TABLE:
        _print_table(rows)
    else:
        sys.stdout.write(format_rows(rows, output_format) + "\n")


def _print_table(rows, title: str | None = None) -> None:
    table = Table(title=title, show_lines=False)
    for name in rows.column_names:
        table.add_column(name, overflow="fold")
    for row in rows.to_pylist():
        table.add_row(*("" if value is None else str(value) for value in row.values()))
    out.print(table)
    out.print(f"{rows.num_rows} row{'s' if rows.num_rows != 1 else ''}", highlight=False)


def _quiet_logs(verbose: bool) -> None:
    from shared.observability import logger

    logger.setLevel("INFO" if verbose else "WARNING")
