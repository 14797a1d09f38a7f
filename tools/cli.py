"""The `annotate` command: run the workflow locally and query its results."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from shared.errors import validation_reason
from shared.settings import IngestSettings, Profile, Settings, use_settings

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
out = Console()
err = Console(stderr=True)

DataDir = Annotated[Path, typer.Option("--data-dir", file_okay=False, help="Local results folder")]


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


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
    variants: Annotated[int, typer.Option(help="Variants to generate per image (stable-diffusion.cpp)")] = 0,
    variant_prompt: Annotated[str, typer.Option(help="What the variants show")] = "",
    variant_mode: Annotated[str, typer.Option(help="img2img (from the image) or txt2img")] = "img2img",
    variant_strength: Annotated[float, typer.Option(help="img2img: how far from the image")] = 0.6,
    variant_steps: Annotated[int, typer.Option(help="Sampling steps")] = 2,
    variant_size: Annotated[int, typer.Option(help="Width and height of the variants")] = 512,
    variant_seed: Annotated[int | None, typer.Option(help="Seed of the first variant")] = None,
    lane: Annotated[
        str, typer.Option(help="lambda, bulk (a Fargate task's worker, here in this process) or auto (by batch size)")
    ] = "auto",
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the structured logs")] = False,
) -> None:
    """Annotate images through the real workflow definition, executed on this machine."""
    from shared.contracts import PromptMessage

    _quiet_logs(verbose)
    settings = use_settings(profile=profile, data_dir=data_dir)
    options: dict[str, Any] = {
        "box_threshold": box_threshold,
        "text_threshold": text_threshold,
        "top_k": top_k,
        "caption": caption,
        "lane": lane,
    }
    if attribute:
        options["attributes"] = _vocabularies(attribute)
    if variants:
        options["variants"] = {
            "count": variants,
            "prompt": variant_prompt,
            "mode": variant_mode,
            "strength": variant_strength,
            "steps": variant_steps,
            "size": variant_size,
            "seed": variant_seed,
        }
    try:
        message = PromptMessage(prompt=prompt, images=paths, **options)
    except ValidationError as error:
        raise _fail(validation_reason(error)) from None
    _annotate(message, "annotate-run", settings)


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on; beyond this machine, an API key is required")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8080,
    data_dir: DataDir = Path("annotate-data"),
    profile: Annotated[Profile, typer.Option(help="default: real checkpoints; tiny: offline")] = Profile.DEFAULT,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the structured logs and each request")] = False,
) -> None:
    """Answer one image now, and OpenAI-compatible chat and images, on this machine's models: a playground at /,
    the API at /v1 (documented at /docs). Set ANNOTATE_API_KEY to require a key."""
    import ipaddress

    import uvicorn

    from shared.api import api_key, serving_app

    _quiet_logs(verbose)
    settings = use_settings(profile=profile, data_dir=data_dir, preload_models=True, api_hosts=[host])
    try:
        local = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = False
    if not local and not api_key(settings):
        raise _fail(f"listening on {host} lets other machines call the models: set ANNOTATE_API_KEY first")
    out.print(f"Serving on http://{host}:{port}/ (the API's documentation at /docs); Ctrl-C stops", highlight=False)
    uvicorn.run(serving_app(settings), host=host, port=port, log_level="info" if verbose else "warning")


@app.command()
def send(
    message_file: Annotated[
        Path,
        typer.Argument(help="A prompt message (JSON), as sent to the SQS prompts queue", exists=True, dir_okay=False),
    ],
    data_dir: DataDir = Path("annotate-data"),
    profile: Annotated[Profile, typer.Option(help="default: real checkpoints; tiny: offline")] = Profile.DEFAULT,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the structured logs")] = False,
) -> None:
    """Feed a prompt message through the ingest code and run its batches locally.

    A malformed message is kept in DATA_DIR/dead-letter/ with its reason, and the command exits 2.
    """
    from shared.contracts import PromptMessage
    from shared.errors import RequestRejected
    from shared.ingest import dead_letter, parse_body
    from shared.storage import store_for

    _quiet_logs(verbose)
    settings = use_settings(profile=profile, data_dir=data_dir)
    body = message_file.read_text(encoding="utf-8", errors="replace")
    try:
        message = parse_body(body)
        if not isinstance(message, PromptMessage):
            raise RequestRejected("S3 events come from the input bucket; send a prompt message here")
    except RequestRejected as error:
        kept = dead_letter(body, str(error), str(message_file), settings.results_root, store_for)
        raise _fail(f"{error}\nkept in {kept}") from None
    _annotate(message, f"annotate-send:{message_file.resolve()}", settings)


def _refuse_file_as_folder(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise _fail(f"--out {out_dir} is a file: name a folder to write into")


def _images_to_write(out_dir: Path, where: str | None, data_dir: Path, stack: str | None, verb: str) -> list[Any]:
    """The images an export or gallery writes into ``out_dir``: a folder, outside the data folder; none is a mistake."""
    from shared.tables import TABLES_PREFIX

    _refuse_file_as_folder(out_dir)
    if not stack and out_dir.resolve().is_relative_to(data_dir.resolve()):
        raise _fail(f"--out {out_dir} is inside the data folder {data_dir}, which holds the results: write elsewhere")
    images = _annotated_images(where, data_dir, stack)
    if images:
        return images
    if stack:
        raise _fail(f"nothing to {verb}: stack {stack} has no annotated images" + (f" where {where}" if where else ""))
    if not (data_dir / TABLES_PREFIX).is_dir():
        raise _fail(f"nothing to {verb}: {data_dir} holds no results (is --data-dir the folder annotate run wrote?)")
    raise _fail(f"nothing to {verb}: no image in {data_dir}" + (f" where {where}" if where else ""))


@contextmanager
def _writing_into(out_dir: Path) -> Iterator[None]:
    """A folder that cannot be written (a full disk, a path no folder can be made at), or that holds what the
    command did not write, said in a line."""
    from shared.errors import RequestRejected

    try:
        yield
    except RequestRejected as error:
        raise _fail(str(error)) from None
    except OSError as error:
        where = f" ({error.filename})" if error.filename else ""
        raise _fail(f"cannot write into {out_dir}: {error.strerror or error}{where}") from None


def _refuse_remote_locations(locations: list[str]) -> None:
    elsewhere = [location for location in locations if "://" in location and not location.startswith("file://")]
    if elsewhere:
        raise _fail(
            f"{elsewhere[0]}: the local mode reads files and folders (or file:// URIs); s3:// locations are the "
            "deployed stack's: send the message to its prompts queue"
        )


def _annotate(message: Any, delivery: str, settings: Settings) -> None:
    """Start the message's batches on the local workflow, show progress, print the summary and exit. Ctrl-C or
    SIGTERM stops it between images: what is under way ends, the rest is left for the same command to finish."""
    from shared.errors import ModelUnavailable, RequestRejected
    from shared.ingest import start_batches
    from shared.storage import store_for
    from tools.local_runner import ExecutionResult, LocalStarter, local_workflow
    from tools.tiny_models import build_named_models

    _refuse_remote_locations(message.images)

    try:
        build_named_models(settings, variants=message.variants is not None)
    except ModelUnavailable as error:
        raise _fail(str(error)) from None

    columns = (TextColumn("annotating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with (
        _stopped_by_signals() as stop,
        _disk_full_said(settings.data_dir),
        Progress(*columns, console=err, transient=True) as progress,
    ):
        task = progress.add_task("images", total=0)

        def on_invocation(function: str, payload: dict, error: BaseException | None) -> None:
            if function in ("write_result", "bulk"):  # an image ended, in either lane
                progress.advance(task)

        with local_workflow(on_invocation, stopping=stop.requested) as run_batch:

            def run_counted(batch: Any, name: str) -> ExecutionResult:
                progress.update(task, total=(progress.tasks[0].total or 0) + batch.images)
                err.print(f"batch {batch.batch_id}: execution {name}", highlight=False)
                return run_batch(batch, name)

            starter = LocalStarter(run_counted, settings.data_dir, delivery, stop.requested)
            try:
                start_batches(message, delivery, settings.ingest, starter, store_for)
            except RequestRejected as error:
                raise _fail(str(error)) from None
            if stop.requested.is_set():
                progress.stop()
                _say_stopped([batch for batch, _ in starter.results], settings)
                stop.exit()
    _summarize(starter.results, message, settings)


def _summarize(results: list[Any], message: Any, settings: Settings) -> None:
    """Each image: succeeded, failed (with its reason), or not annotated (its batch ended before it); then exit."""
    succeeded = failed = left = 0
    for batch, result in results:
        if result.summary is not None:
            succeeded += result.summary.succeeded
            failed += result.summary.failed
            continue
        reason = result.error or result.status
        if NO_SPACE in reason:
            reason = _disk_full(settings.data_dir)
        err.print(f"[red]batch {batch.batch_id} did not finish:[/red] {reason}", highlight=False, soft_wrap=True)
        rows = _rows_by_status(batch.batch_id, settings.data_dir)
        succeeded += rows.get("succeeded", 0)
        failed += rows.get("failed", 0)
        left += batch.images - sum(rows.values())
    batch_ids = [batch.batch_id for batch, _ in results]
    if failed:
        failures = _print_batch_rows(
            "failed images",
            "SELECT source_uri, failed_step, error FROM images WHERE status = 'failed' AND {batches} "
            "ORDER BY source_uri",
            batch_ids,
            settings.data_dir,
        )
        if any(NO_SPACE in (row["error"] or "") for row in failures):
            err.print(_disk_full(settings.data_dir), highlight=False, soft_wrap=True)
    if message.variants:
        _print_batch_rows(
            "variants",
            "SELECT source_uri, unnest(variant_uris) AS variant, unnest(variant_seeds) AS seed FROM images "
            "WHERE {batches} ORDER BY source_uri, variant",
            batch_ids,
            settings.data_dir,
        )
    out.print(f"{succeeded} succeeded, {failed} failed" + (f", {left} not annotated" if left else ""), highlight=False)
    if left:
        out.print("run the same command again to annotate the images not annotated; it skips those that are done")
    out.print(
        f"results in {settings.results_root}; query them with: annotate query --data-dir {settings.data_dir} 'SQL'; "
        f"ask what became of them with: annotate status --data-dir {settings.data_dir} --last"
    )
    raise typer.Exit(1 if failed or left else 0)


def _rows_by_status(batch_id: str, data_dir: Path) -> dict[str, int]:
    """How many of the batch's images have their row, by status (none when no table was written yet)."""
    import duckdb

    from tools.query import run_local_query

    select = f"SELECT status, count(*) AS n FROM images_latest WHERE batch_id = '{batch_id}' GROUP BY status"
    try:  # batch ids are b-<hex>: no quoting needed
        return {row["status"]: row["n"] for row in run_local_query(select, data_dir).to_pylist()}
    except duckdb.Error:
        return {}


def _say_stopped(batches: list[Any], settings: Settings) -> None:
    counts = [_rows_by_status(batch.batch_id, settings.data_dir) for batch in batches]
    done, failed = sum(c.get("succeeded", 0) for c in counts), sum(c.get("failed", 0) for c in counts)
    left = sum(batch.images for batch in batches) - done - failed
    out.print(
        f"stopped: {done} succeeded, {failed} failed, {left} not annotated yet; run the same command again to "
        f"annotate the rest (annotate status --data-dir {settings.data_dir} --last says what is left)",
        highlight=False,
        soft_wrap=True,
    )


class _SignalStop:
    """The first Ctrl-C (or SIGTERM) asks the run to stop; a second one ends the process at once."""

    def __init__(self) -> None:
        import threading

        self.requested = threading.Event()
        self.signal = 0

    def handle(self, signum: int, _: Any) -> None:
        if self.requested.is_set():
            self.exit(signum)
        self.signal = signum
        self.requested.set()
        err.print("stopping: the images under way finish, no other starts (again to stop at once)", highlight=False)

    def exit(self, signum: int | None = None) -> None:
        """End the process now, with the shell's code for the signal (130 for Ctrl-C, 143 for SIGTERM): not through
        the interpreter's exit, where native libraries' threads still running abort it ("terminate called...")."""
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + (signum or self.signal))


@contextmanager
def _stopped_by_signals() -> Iterator[_SignalStop]:
    import signal

    stop = _SignalStop()
    previous = {signum: signal.signal(signum, stop.handle) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def _disk_full_said(data_dir: Path) -> Iterator[None]:
    """A full disk, said in one line, whichever write met it."""
    try:
        yield
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        raise _fail(_disk_full(data_dir)) from None


def _print_batch_rows(title: str, select: str, batch_ids: list[str], data_dir: Path) -> list[dict[str, Any]]:
    """``select`` (a query over ``images`` ending in WHERE ...) for these batches only, as a table; its rows."""
    from tools.query import run_local_query

    ids = ", ".join(f"'{batch_id}'" for batch_id in batch_ids)  # batch ids are b-<hex>: no quoting needed
    table = run_local_query(select.format(batches=f"batch_id IN ({ids})"), data_dir)
    _print_table(table, title=title)
    return list(table.to_pylist())


# How an OSError for a full disk reads in an execution's cause or a failure row (ENOSPC's message)
NO_SPACE = os.strerror(errno.ENOSPC)


def _disk_full(data_dir: Path) -> str:
    return (
        f"the disk is full where results are written ({data_dir.resolve()}): free space there and run the same"
        " command again"
    )


def _vocabularies(options: list[str]) -> dict[str, list[str]]:
    vocabularies: dict[str, list[str]] = {}
    for option in options:
        name, separator, values = option.partition("=")
        if not separator:
            raise _fail(f"--attribute {option!r} must look like NAME=VALUE,VALUE")
        vocabularies[name.strip()] = [value.strip() for value in values.split(",") if value.strip()]
    return vocabularies


@app.command()
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
    from tools.athena import run_athena_query
    from tools.query import OutputFormat, format_rows, run_local_query

    try:
        output_format = OutputFormat(output)
    except ValueError:
        raise _fail(f"--format must be one of {[f.value for f in OutputFormat]}") from None
    try:
        rows = run_athena_query(sql, Settings().athena) if athena else run_local_query(sql, data_dir)
    except (duckdb.Error, RequestRejected, TransientError) as error:
        raise _fail(str(error)) from None
    if output_format is OutputFormat.TABLE:
        _print_table(rows)
    else:
        sys.stdout.write(format_rows(rows, output_format) + "\n")


@app.command()
def bench(
    images: Annotated[list[Path] | None, typer.Argument(help="Images to run on (default: two samples)")] = None,
    repeats: Annotated[int, typer.Option(help="Alternating runs per image and side")] = 3,
    threads: Annotated[int, typer.Option(help="torch and llama.cpp threads; 0 = every core")] = 0,
    short_side: Annotated[int, typer.Option(help="The pipeline's detection resolution")] = 800,
    crops: Annotated[int, typer.Option(help="Boxes per image for Classify and Tag")] = 8,
    models: Annotated[str, typer.Option(help="random (full-size architectures) or tiny")] = "random",
    lossy_short_side: Annotated[int, typer.Option(help="The lower detection resolution measured for drift")] = 512,
    lossy_queries: Annotated[int, typer.Option(help="The fewer decoder queries measured for drift")] = 300,
    variants: Annotated[bool, typer.Option(help="Also time variants at 256 and 512 px")] = True,
    out_dir: Annotated[Path, typer.Option(help="Where bench.json and bench.md go")] = Path("bench"),
) -> None:
    """Time this pipeline against the straightforward way, side by side, and write the report."""
    from tools.bench import BenchOptions, run_bench

    _quiet_logs(False)
    samples = Path(__file__).resolve().parent.parent / "samples"
    try:
        options = BenchOptions(
            images=images or [samples / "chelsea-the-cat.jpg", samples / "coffee.webp"],
            repeats=repeats,
            threads=threads,
            short_side=short_side,
            crops=crops,
            models=models,
            lossy_short_side=lossy_short_side,
            lossy_queries=lossy_queries,
            variants=variants,
            out_dir=out_dir,
        )
    except ValidationError as error:
        raise _fail(validation_reason(error)) from None
    report = run_bench(options, progress=lambda text: err.print(f"[dim]{text}[/dim]"))
    out.print((out_dir / "bench.md").read_text(), highlight=False, soft_wrap=True)
    out.print(f"whole image: {report['whole_image']['speedup']}x the reference; written to {out_dir}/")


@app.command("bench-ingest")
def bench_ingest(
    objects: Annotated[int, typer.Option(help="Objects under the prefix ingest plans")] = 100_000,
    out_dir: Annotated[Path, typer.Option(help="Where ingest.json and ingest.md go")] = Path("bench"),
) -> None:
    """Time ingest planning a large S3 prefix (moto), and its memory, beside a HEAD per object; write the report."""
    from tools.bench_ingest import run_ingest_bench

    _quiet_logs(False)
    run_ingest_bench(objects, out_dir, progress=lambda text: err.print(f"[dim]{text}[/dim]"))
    out.print((out_dir / "ingest.md").read_text(), highlight=False, soft_wrap=True)


@app.command("bench-api")
def bench_api(
    image: Annotated[Path | None, typer.Argument(help="The image to answer (default: a sample)")] = None,
    repeats: Annotated[int, typer.Option(help="Alternating runs of each side")] = 7,
    out_dir: Annotated[Path, typer.Option(help="Where api.json and api.md go")] = Path("bench"),
) -> None:
    """Time the synchronous API (annotate serve) against the same work in-process, and write the report."""
    from tools.api_bench import markdown_report, run_api_bench

    _quiet_logs(False)
    image = image or Path(__file__).resolve().parent.parent / "samples" / "chelsea-the-cat.jpg"
    if not image.is_file():
        raise _fail(f"{image} is not a file: name an image to answer")
    report = run_api_bench(image, repeats, out_dir)
    out.print(markdown_report(report), highlight=False)


@app.command("bench-bulk")
def bench_bulk(
    images: Annotated[list[Path] | None, typer.Argument(help="Images to run on (default: two samples)")] = None,
    copies: Annotated[int, typer.Option(help="Copies of each image (distinct files)")] = 5,
    repeats: Annotated[int, typer.Option(help="Alternating runs of each side")] = 3,
    out_dir: Annotated[Path, typer.Option(help="Where bulk.json and bulk.md go")] = Path("bench"),
    models: Annotated[str, typer.Option(help="random: full-size architectures; tiny: a quick check")] = "random",
) -> None:
    """Time the bulk worker against the same images one at a time, and write the report."""
    from tools.bulk_bench import markdown_report, run_bulk_bench

    _quiet_logs(False)
    samples = Path(__file__).resolve().parent.parent / "samples"
    missing = [str(path) for path in images or [] if not path.is_file()]
    if missing:
        raise _fail(f"not files: {', '.join(missing)}")
    if models not in ("random", "tiny"):
        raise _fail(f"--models is random or tiny, not {models}")
    report = run_bulk_bench(
        images or [samples / "chelsea-the-cat.jpg", samples / "coffee.webp"],
        copies,
        repeats,
        out_dir,
        "tiny" if models == "tiny" else "random",
    )
    out.print(markdown_report(report), highlight=False)


@app.command("bench-lambda-detect")
def bench_lambda_detect(
    image: Annotated[Path, typer.Option(exists=True, dir_okay=False)] = Path("samples/chelsea-the-cat.jpg"),
    out_dir: Annotated[Path, typer.Option(help="Where lambda-detect.json and lambda-detect.md go")] = Path("bench"),
) -> None:
    """Time Detect and measure its peak memory as a Lambda environment without SnapStart runs it, on OpenVINO and
    ONNX Runtime (the full-size model, random weights); write the report."""
    from tools.lambda_detect import write_report

    _quiet_logs(False)
    out.print(write_report(image, out_dir), highlight=False, soft_wrap=True)


@app.command()
def chaos(
    images: Annotated[int, typer.Option(min=3, max=5000, help="Generated images to annotate")] = 200,
    throttle: Annotated[float, typer.Option(min=0, max=0.5, help="Lambda TooManyRequests, per invocation")] = 0.05,
    snapstart_not_ready: Annotated[
        float, typer.Option(min=0, max=0.5, help="Lambda SnapStartNotReady, per model step invocation")
    ] = 0.02,
    service_error: Annotated[
        float, typer.Option(min=0, max=0.5, help="Lambda ServiceException, per invocation")
    ] = 0.02,
    s3_slowdown: Annotated[float, typer.Option(min=0, max=0.5, help="S3 503 SlowDown, per request")] = 0.03,
    s3_internal_error: Annotated[float, typer.Option(min=0, max=0.5, help="S3 500, per request")] = 0.01,
    hang: Annotated[str, typer.Option(help="The step that hangs past its timeout once (none: no hang)")] = "detect",
    variants_images: Annotated[
        int, typer.Option(min=0, max=20, help="Images of a second batch with variants, whose first Fargate task stops")
    ] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the images and the faults")] = 7,
    lambda_concurrency: Annotated[
        int | None, typer.Option(min=2, help="The account's Lambda concurrency quota (a new account's may be 10)")
    ] = None,
    snapstart_reinit: Annotated[
        float, typer.Option(min=0, max=120, help="Seconds an inactive SnapStart version re-initialises")
    ] = 0.0,
    batches: Annotated[int, typer.Option(min=1, max=10, help="Messages sent at once, whose batches overlap")] = 1,
    bulk_images: Annotated[int, typer.Option(min=0, max=200, help="Images of a bulk-lane message sent with them")] = 0,
    fargate_vcpus: Annotated[
        int | None, typer.Option(min=1, help="The account's Fargate vCPUs (a new account's may be 6)")
    ] = None,
    spot_shortage: Annotated[
        float, typer.Option(min=0, max=600, help="Seconds Fargate Spot has no capacity, from the first Spot task")
    ] = 0.0,
) -> None:
    """Annotate generated images through the local workflow with AWS faults injected; account for every image.

    Exits 1 when an image has no row or more than one, or one other than the hung image is recorded as failed.
    """
    from tools.chaos import MODEL_STEPS, Faults, run_chaos

    if hang not in {*MODEL_STEPS, "write_result", "none"}:
        raise _fail(f"--hang must be one of {sorted({*MODEL_STEPS, 'write_result', 'none'})}")
    _quiet_logs(False)
    faults = Faults(
        throttle=throttle,
        snapstart_not_ready=snapstart_not_ready,
        service_error=service_error,
        s3_slowdown=s3_slowdown,
        s3_internal_error=s3_internal_error,
        hang_step=None if hang == "none" else hang,
        variants_images=variants_images,
        seed=seed,
        lambda_concurrency=lambda_concurrency,
        snapstart_reinit_s=snapstart_reinit,
        batches=batches,
        bulk_images=bulk_images,
        fargate_vcpus=fargate_vcpus,
        spot_shortage_s=spot_shortage,
    )
    # Each line whole, at any width: a program reads the last one
    out.print(faults.account(), highlight=False, soft_wrap=True)
    out.print(faults.describe(), highlight=False, soft_wrap=True)
    report = run_chaos(images, faults)
    out.print(f"Lambda invocations at once: {report.most_in_flight} at the most", highlight=False, soft_wrap=True)
    if bulk_images:
        out.print(f"Fargate vCPUs at once: {report.most_fargate_vcpus:g} at the most", highlight=False, soft_wrap=True)
    out.print(report.timing, highlight=False, soft_wrap=True)
    for row in report.failed:
        failed = f"recorded as failed: {row['source_uri']} ({row['failed_step']}): {row['error']}"
        out.print(failed, highlight=False, soft_wrap=True)
    injected = "injected: " + ", ".join(f"{name} {n}" for name, n in sorted(report.injected.items()))
    out.print(injected, highlight=False, soft_wrap=True)
    out.print(report.line, highlight=False, soft_wrap=True)
    if report.lost or report.duplicated or report.unexpected_failures:
        raise typer.Exit(1)


@app.command()
def cost(
    bench_file: Annotated[Path, typer.Option("--bench", help="A bench.json written by annotate bench")] = Path(
        "bench/bench.json"
    ),
    prices_file: Annotated[Path | None, typer.Option("--prices", help="Prices (default: tools/data)")] = None,
    out_dir: Annotated[Path, typer.Option(help="Where cost.md, cost.json and cost.png go")] = Path("bench"),
) -> None:
    """Cost per 1,000 images and per month for the original study's scenarios, from measured seconds."""
    import json

    from tools.cost import (
        api_costs,
        api_line,
        bulk_line,
        cost_table,
        lanes_table,
        load_prices,
        markdown_table,
        with_lambda_cold_start,
        write_chart,
    )

    if not bench_file.is_file():
        raise _fail(f"{bench_file} does not exist: run annotate bench first")
    lambda_detect = bench_file.with_name("lambda-detect.json")  # annotate bench-lambda-detect's, where it ran
    api_bench = bench_file.with_name("api.json")  # annotate bench-api's
    bulk_bench = bench_file.with_name("bulk.json")  # annotate bench-bulk's
    try:
        prices = load_prices(prices_file)
        bench = json.loads(bench_file.read_text())
        if lambda_detect.is_file():
            bench = with_lambda_cold_start(bench, json.loads(lambda_detect.read_text()))
        rows = cost_table(bench, prices)
        report = markdown_table(rows, prices, bench)
        if api_bench.is_file():
            report += "\n" + api_line(api_costs(json.loads(api_bench.read_text()), prices)) + "\n"
        if bulk_bench.is_file():
            bulk = json.loads(bulk_bench.read_text())
            report += "\n" + bulk_line(bench, bulk, prices) + "\n\n" + lanes_table(bench, bulk, prices)
    except (KeyError, TypeError, ValueError) as error:
        raise _fail(f"{bench_file} or the prices file is not what annotate bench writes: {error!r}") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "cost.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out_dir / "cost.md").write_text(report)
    write_chart(rows, out_dir / "cost.png")
    out.print(report, highlight=False, soft_wrap=True)
    out.print(f"written to {out_dir}/cost.md, cost.json and cost.png")


Where = Annotated[str | None, typer.Option(help="Which images: SQL over the images table's columns")]
Stack = Annotated[
    str | None, typer.Option(help="A deployed stack's name: its tables (Athena) and results instead of local ones")
]


def _annotated_images(where: str | None, data_dir: Path, stack: str | None) -> list[Any]:
    """The images ``where`` selects, from the local tables or, with ``stack``, the deployed ones (Athena)."""
    import duckdb

    from shared.errors import RequestRejected, TransientError
    from tools.annotations import read_annotated_images
    from tools.athena import run_athena_query
    from tools.query import run_local_query

    if stack:
        outputs = _outputs(stack, "AthenaWorkGroupName", "GlueDatabaseName")
        athena = Settings(
            athena_workgroup=outputs["AthenaWorkGroupName"], athena_database=outputs["GlueDatabaseName"]
        ).athena

    def query(sql: str) -> Any:
        return run_athena_query(sql, athena) if stack else run_local_query(sql, data_dir)

    try:
        return read_annotated_images(query, where, "athena" if stack else "duckdb")
    except (duckdb.Error, RequestRejected, TransientError) as error:
        raise _fail(str(error)) from None


def _outputs(stack: str, *required: str) -> dict[str, str]:
    from shared.errors import RequestRejected
    from tools.aws_stack import stack_outputs

    try:
        return stack_outputs(stack, required)
    except RequestRejected as error:
        raise _fail(str(error)) from None


@app.command("export")
def export_command(
    export_format: Annotated[str, typer.Option("--format", help="coco, yolo or labelstudio")],
    out_dir: Annotated[Path, typer.Option("--out", help="The folder to write the dataset into")],
    where: Where = None,
    data_dir: DataDir = Path("annotate-data"),
    stack: Stack = None,
) -> None:
    """Write the annotations as a COCO or YOLO dataset (with the pictures) or as Label Studio pre-annotations."""
    from shared.storage import store_for
    from tools.export import ExportFormat, export

    try:
        chosen = ExportFormat(export_format)
    except ValueError:
        raise _fail(f"--format must be one of {[f.value for f in ExportFormat]}") from None
    images = _images_to_write(out_dir, where, data_dir, stack, "export")
    with _writing_into(out_dir):
        report = export(images, chosen, out_dir, store_for)
    for source, reason in report.skipped.items():
        err.print(f"[yellow]skipped[/yellow] {source}: {reason}", highlight=False)
    out.print(f"{report.images} images, {report.boxes} boxes written to {out_dir} ({chosen})", highlight=False)


@app.command()
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
    from shared.storage import store_for
    from tools.evaluate import evaluate_labels, evaluation_table, read_truth, request_threshold, write_evaluation

    if output not in {"table", "json"}:
        raise _fail("--format must be one of ['table', 'json']")
    results_root = f"s3://{_outputs(stack, 'ResultsBucketName')['ResultsBucketName']}" if stack else None
    results_root = results_root or str(data_dir.resolve())
    images = _annotated_images(None, data_dir, stack)
    try:
        labelled = read_truth(truth)
        chosen = threshold if threshold is not None else request_threshold(images, results_root, store_for)
        evaluation = evaluate_labels(labelled, images, chosen)
    except RequestRejected as error:
        raise _fail(str(error)) from None
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
    _print_table(
        pa.Table.from_pylist(rows), title=f"{evaluation.images} images, box scores from {evaluation.threshold:g}"
    )
    measures = {"class accuracy": evaluation.class_accuracy, "caption word F1": evaluation.caption_word_f1}
    measures |= {f"{name} accuracy": value for name, value in evaluation.attribute_accuracy.items()}
    out.print(
        "; ".join(f"{name} {value:.3f}" for name, value in measures.items() if value is not None) or "", highlight=False
    )
    out.print(f"written to {uri}", highlight=False)


@app.command()
def gallery(
    out_dir: Annotated[Path, typer.Option("--out", help="The folder to write index.html (and its pictures) into")],
    where: Where = None,
    data_dir: DataDir = Path("annotate-data"),
    stack: Stack = None,
    expires: Annotated[int, typer.Option(help="With --stack: seconds the pictures' URLs stay valid")] = 3600,
) -> None:
    """One static page of the annotated pictures, their captions, boxes, classes, attributes and failures."""
    from shared.storage import store_for
    from tools.gallery import write_gallery

    presign = None
    if stack:
        import boto3

        from shared.storage import split_s3

        s3 = boto3.client("s3")

        def presign(uri: str) -> str:
            bucket, key = split_s3(uri)
            return str(s3.generate_presigned_url("get_object", {"Bucket": bucket, "Key": key}, ExpiresIn=expires))

    images = _images_to_write(out_dir, where, data_dir, stack, "show")
    with _writing_into(out_dir):
        index = write_gallery(images, out_dir, store_for, presign)
    out.print(f"{len(images)} images: open {index}", highlight=False)


@app.command()
def status(
    what: Annotated[str | None, typer.Argument(help="A prompt message file (as sent), or a batch id (b-...)")] = None,
    last: Annotated[bool, typer.Option("--last", help="What was sent last")] = False,
    data_dir: DataDir = Path("annotate-data"),
    stack: Stack = None,
) -> None:
    """How many images of what was sent are done, failed (and why) and still running, and where the results are."""
    from botocore.exceptions import BotoCoreError, ClientError

    from shared.errors import AnnotateError
    from tools.status import BatchStatus

    if (what is None) == (not last):
        raise _fail("give a message file or a batch id, or --last")
    try:
        statuses: list[BatchStatus] = _statuses(what, data_dir, stack)
    except (AnnotateError, ValueError, OSError, BotoCoreError, ClientError) as error:
        raise _fail(f"{type(error).__name__}: {error}") from None
    for batch in statuses:
        out.print(
            f"batch {batch.batch_id}: {batch.state} ({batch.execution or 'no execution'}): {batch.images} images, "
            f"{batch.done} done, {batch.failed} failed, {batch.still_running} still running"
            + (
                f", {batch.missing} {'not annotated yet' if batch.state == 'ABORTED' else 'without a result'}"
                if batch.missing
                else ""
            )
            + f"; results in {batch.results}",
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
    from shared.storage import store_for
    from tools import status

    settings = Settings(data_dir=data_dir)
    executions: list[dict[str, Any]] = []
    if stack:
        import boto3

        outputs = _outputs(stack, "ResultsBucketName", "StateMachineArn")
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
    from shared.batches import plan_batches
    from shared.contracts import PromptMessage
    from shared.errors import RequestRejected
    from shared.ingest import parse_body
    from shared.storage import store_for

    message = parse_body(message_file.read_text(encoding="utf-8", errors="replace"))
    if not isinstance(message, PromptMessage):
        raise RequestRejected(f"{message_file} is not a prompt message")
    return [batch.input.batch_id for batch in plan_batches(message, settings, store_for)]


models = typer.Typer(help="Model files for the deployed stack")
app.add_typer(models, name="models")


@models.command("push")
def models_push(
    stack: Annotated[str, typer.Option(help="The deployed stack's name (sam deploy's stack_name)")],
    profile: Annotated[Profile, typer.Option(help="Which models to push")] = Profile.DEFAULT,
) -> None:
    """Upload the profile's models (from the Hugging Face cache, local folders or packages) to the stack.

    Where each goes is the stack's own outputs (DetectorModelUri, ...), so the stack's model parameters decide.
    The region is boto3's (AWS_REGION, or the profile's).
    """
    from shared.errors import ModelUnavailable, RequestRejected
    from tools.models_push import push_models, stack_model_uris

    _quiet_logs(False)
    try:
        pushed = push_models(use_settings(profile=profile), stack_model_uris(stack))
    except (ModelUnavailable, RequestRejected) as error:
        raise _fail(str(error)) from None
    for model in pushed:
        line = f"{model.output}: {model.source} -> {model.uri} ({model.files} files, {model.bytes / 1e6:.1f} MB)"
        out.print(line, soft_wrap=True, highlight=False)


@models.command("export")
def models_export(
    profile: Annotated[Profile, typer.Option(help="Whose models to export")] = Profile.DEFAULT,
    short_side: Annotated[int, typer.Option(help="The detection short side the detector is exported for")] = 800,
) -> None:
    """Export the profile's Grounding DINO (once per image size, see detector_aspect_ratios), ConvNeXt and CLIP
    to ONNX, into the model cache: what Detect, Classify and Tag run. `annotate models push` uploads them."""
    from shared.errors import ModelUnavailable
    from tools.tiny_models import build_named_models

    _quiet_logs(False)
    settings = use_settings(profile=profile, detection_short_side=short_side)
    try:
        build_named_models(settings)
    except ModelUnavailable as error:
        raise _fail(str(error)) from None
    sizes = ", ".join(f"{height}x{width}" for height, width in settings.detection.export_sizes())
    out.print(
        f"exported into {settings.model_cache_dir / 'onnx'}: {settings.detector_model} at {sizes}; "
        f"{settings.classifier_model}; {', '.join(settings.tagger_models or [])}",
        soft_wrap=True,
        highlight=False,
    )


@models.command("build")
def models_build(
    profile: Annotated[Profile, typer.Option(help="Whose tiny: and random: models to build")] = Profile.TINY,
    variants: Annotated[bool, typer.Option(help="The diffusion model too (0.85 GB at full size)")] = False,
) -> None:
    """Build the profile's random-weight models (tiny:, random:) into the model cache, offline."""
    from tools.tiny_models import build_named_models

    _quiet_logs(False)
    settings = use_settings(profile=profile)
    build_named_models(settings, variants=variants)
    out.print(f"built into {settings.model_cache_dir / 'tiny'}", highlight=False)


def _print_table(rows, title: str | None = None) -> None:
    table = Table(title=title, show_lines=False)
    for name in rows.column_names:
        table.add_column(name, overflow="fold")
    for row in rows.to_pylist():
        table.add_row(*("" if value is None else str(value) for value in row.values()))
    out.print(table)
    out.print(f"{rows.num_rows} row{'s' if rows.num_rows != 1 else ''}", highlight=False)


def _quiet_logs(verbose: bool) -> None:
    """The structured logs are Lambda's: a command says what happened in its own lines, and shows the logs when
    asked (--verbose), or an error's record."""
    from shared.observability import logger

    logger.setLevel("INFO" if verbose else "ERROR")
