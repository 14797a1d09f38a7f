"""Annotating on this machine: `annotate run` (files and folders), `send` (a prompt message, as the queue gets it)
and `serve` (the API and the Label Studio backend)."""

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
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from shared.errors import validation_reason
from shared.settings import Profile, Settings, use_settings
from tools.cli.common import DataDir, err, fail, out, print_table, quiet_logs

commands = typer.Typer()


@commands.command()
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
    caption_vision: Annotated[
        bool, typer.Option(help="Caption with the profile's vision-language model, which sees the image")
    ] = False,
    variants: Annotated[int, typer.Option(help="Variants to generate per image (stable-diffusion.cpp)")] = 0,
    variant_prompt: Annotated[str, typer.Option(help="What the variants show")] = "",
    variant_mode: Annotated[str, typer.Option(help="img2img (from the image) or txt2img")] = "img2img",
    variant_strength: Annotated[float, typer.Option(help="img2img: how far from the image")] = 0.6,
    variant_steps: Annotated[int, typer.Option(help="Sampling steps")] = 2,
    variant_size: Annotated[int, typer.Option(help="Width and height of the variants")] = 512,
    variant_seed: Annotated[int | None, typer.Option(help="Seed of the first variant")] = None,
    embeddings: Annotated[
        str, typer.Option(help="image (each image's CLIP vector), boxes (and each box's: box_embeddings) or none")
    ] = "image",
    masks: Annotated[
        bool, typer.Option(help="A mask per box (EdgeTAM): the masks table, drawn in the pictures, in the exports")
    ] = False,
    lane: Annotated[
        str, typer.Option(help="lambda, bulk (a Fargate task's worker, here in this process) or auto (by batch size)")
    ] = "auto",
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the structured logs")] = False,
) -> None:
    """Annotate images through the real workflow definition, executed on this machine."""
    from shared.contracts import PromptMessage

    quiet_logs(verbose)
    settings = use_settings(profile=profile, data_dir=data_dir, caption_vision=caption_vision)
    options: dict[str, Any] = {
        "box_threshold": box_threshold,
        "text_threshold": text_threshold,
        "top_k": top_k,
        "caption": caption,
        "embeddings": embeddings,
        "masks": masks,
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
        raise fail(validation_reason(error)) from None
    _annotate(message, "annotate-run", settings)


@commands.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on; beyond this machine, an API key is required")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="Port to listen on")] = 8080,
    data_dir: DataDir = Path("annotate-data"),
    profile: Annotated[Profile, typer.Option(help="default: real checkpoints; tiny: offline")] = Profile.DEFAULT,
    stack: Annotated[
        str | None,
        typer.Option(help="A deployed stack: answer Label Studio from its tables (Athena), read its input bucket"),
    ] = None,
    caption_vision: Annotated[
        bool, typer.Option(help="Caption (and chat) with the profile's vision-language model, which sees the image")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the structured logs and each request")] = False,
) -> None:
    """Answer one image now, and OpenAI-compatible chat and images, on this machine's models: a playground at /,
    the API at /v1 (documented at /docs), Label Studio's ML backend at / (docs/labelling.md). Set ANNOTATE_API_KEY
    to require a key."""
    import ipaddress

    import uvicorn

    from shared.serving.api import serving_app
    from shared.serving.bounds import api_key
    from tools.results.annotations import athena_annotated_sources, local_annotated_sources
    from tools.results.search import local_similar

    quiet_logs(verbose, quietest="INFO")  # what /setup found, why a task got no prediction: a server's account
    deployed = _deployed(stack) if stack else {}
    settings = use_settings(
        profile=profile,
        data_dir=data_dir,
        preload_models=True,
        api_hosts=[host],
        caption_vision=caption_vision,
        **deployed,
    )
    try:
        local = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = False
    if caption_vision:
        from tools.models.tiny_models import build_vision_captioner

        build_vision_captioner(settings)
    if not local and not api_key(settings):
        raise fail(f"listening on {host} lets other machines call the models: set ANNOTATE_API_KEY first")
    out.print(f"Serving on http://{host}:{port}/ (the API's documentation at /docs); Ctrl-C stops", highlight=False)
    annotated = athena_annotated_sources(settings.athena) if stack else local_annotated_sources(settings.data_dir)
    app = serving_app(settings, find_annotated=annotated, find_similar=None if stack else local_similar(data_dir))
    uvicorn.run(app, host=host, port=port, log_level="info" if verbose else "warning")


def _deployed(stack: str) -> dict[str, Any]:
    """The settings that make a local server read a deployed stack's tables and input bucket."""
    from shared.errors import RequestRejected
    from tools.aws.stack_outputs import stack_outputs

    try:
        outputs = stack_outputs(stack, ("AthenaWorkGroupName", "GlueDatabaseName", "InputBucketName"))
    except RequestRejected as error:
        raise fail(str(error)) from None
    return {
        "athena_workgroup": outputs["AthenaWorkGroupName"],
        "athena_database": outputs["GlueDatabaseName"],
        "input_buckets": [outputs["InputBucketName"]],
    }


@commands.command()
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
    from shared.pipeline.ingest import dead_letter, parse_body
    from shared.storage.objects import store_for

    quiet_logs(verbose)
    settings = use_settings(profile=profile, data_dir=data_dir)
    body = message_file.read_text(encoding="utf-8", errors="replace")
    try:
        message = parse_body(body)
        if not isinstance(message, PromptMessage):
            raise RequestRejected("S3 events come from the input bucket; send a prompt message here")
    except RequestRejected as error:
        kept = dead_letter(body, str(error), str(message_file), settings.results_root, store_for)
        raise fail(f"{error}\nkept in {kept}") from None
    _annotate(message, f"annotate-send:{message_file.resolve()}", settings)


@commands.command()
def watch(
    folder: Annotated[Path, typer.Argument(help="The folder images are dropped into", exists=True, file_okay=False)],
    prompt: Annotated[str, typer.Option(help="Phrases to detect, separated by periods: 'dog. cat.'")],
    max_wait: Annotated[
        float, typer.Option("--max-wait", min=0.05, max=1440, help="Minutes a dropped image waits at most to start")
    ] = 15.0,
    data_dir: DataDir = Path("annotate-data"),
    profile: Annotated[Profile, typer.Option(help="default: real checkpoints; tiny: offline")] = Profile.DEFAULT,
    caption: Annotated[bool, typer.Option(help="Write a caption with the LLM")] = True,
    stop_after: Annotated[
        float | None, typer.Option(min=0, help="Minutes after which to run what waits and stop (default: Ctrl-C)")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the structured logs")] = False,
) -> None:
    """Annotate images as they are dropped into a folder, gathered as the stack's MaxWaitMinutes gathers them:
    every --max-wait minutes (sooner when a bulk task's worth waits) what was dropped runs as one batch, in the
    cheapest lane that ends within the wait. Ctrl-C or SIGTERM stops; what was dropped and not started is left for
    the next watch."""
    from datetime import UTC, datetime, timedelta

    from shared.contracts import PromptMessage
    from shared.pipeline.batches import gathered_lane
    from tools.local.watch import FolderDrops, annotated_image_ids, watch_folder

    quiet_logs(verbose)
    settings = use_settings(profile=profile, data_dir=data_dir)
    try:  # the prompt's bounds, said before the first drop
        PromptMessage(prompt=prompt, images=["-"])
    except ValidationError as error:
        raise fail(validation_reason(error)) from None
    results: list[tuple[Any, Any]] = []

    def run_gathered(paths: list[Path], choice: Any, why: str) -> None:
        err.print(f"gathered {len(paths)} ({why}): {choice.lane} lane, {choice.reason}", highlight=False)
        message = PromptMessage(prompt=prompt, images=[str(path) for path in paths], caption=caption, lane=choice.lane)
        delivery = f"annotate-watch:{folder.resolve()}:{datetime.now(UTC).isoformat()}"
        results.extend(_run_locally(message, delivery, settings, stop.requested, choice))

    until = datetime.now(UTC) + timedelta(minutes=stop_after) if stop_after is not None else None
    _ready_to_run(settings)
    out.print(f"watching {folder} (every {max_wait:g} min); Ctrl-C stops", highlight=False)
    drops = FolderDrops(
        folder, settings.data_dir, annotated_image_ids(settings.data_dir), settings.image_limits.max_image_pixels
    )
    with _stopped_by_signals() as stop, _disk_full_said(settings.data_dir):
        left = watch_folder(drops, settings.ingest, max_wait * 60, run_gathered, stop.requested, until=until)
        if stop.requested.is_set():
            _say_stopped([batch for batch, _ in results], settings)
            if left:
                out.print(f"{len(left)} dropped images not started: the next watch gathers them", highlight=False)
            stop.exit()
        left = drops.not_gathered()
        if left:
            run_gathered(left, gathered_lane(len(left), settings.ingest, max_wait * 60), "the watch ends")
    _summarize(results, False, settings)


def _ready_to_run(settings: Settings) -> None:
    """The models built and the local workflow started once before the watch's first look, so that a drop's batch
    is planned within its wait, not after the set-up a first batch pays (its first start alone takes 2.5 s here:
    moto's state machine service; 0.45 s each time after)."""
    from shared.errors import ModelUnavailable
    from tools.local.runner import local_workflow
    from tools.models.tiny_models import build_named_models

    try:
        build_named_models(settings)
    except ModelUnavailable as error:
        raise fail(str(error)) from None
    with local_workflow():
        pass


def _refuse_remote_locations(locations: list[str]) -> None:
    elsewhere = [location for location in locations if "://" in location and not location.startswith("file://")]
    if elsewhere:
        raise fail(
            f"{elsewhere[0]}: the local mode reads files and folders (or file:// URIs); s3:// locations are the "
            "deployed stack's: send the message to its prompts queue"
        )


def _annotate(message: Any, delivery: str, settings: Settings) -> None:
    """Start the message's batches on the local workflow, show progress, print the summary and exit. Ctrl-C or
    SIGTERM stops it between images: what is under way ends, the rest is left for the same command to finish."""
    with _stopped_by_signals() as stop, _disk_full_said(settings.data_dir):
        results = _run_locally(message, delivery, settings, stop.requested)
        if stop.requested.is_set():
            _say_stopped([batch for batch, _ in results], settings)
            stop.exit()
    _summarize(results, message.variants is not None, settings)


def _run_locally(
    message: Any, delivery: str, settings: Settings, stopping: Any, choice: Any = None
) -> list[tuple[Any, Any]]:
    """The message's batches (in ``choice``'s lane, if given) on the local workflow, with progress: each batch and
    its execution's result."""
    from shared.errors import ModelUnavailable, RequestRejected
    from shared.pipeline.ingest import start_batches
    from shared.storage.objects import store_for
    from tools.local.runner import ExecutionResult, LocalStarter, local_workflow
    from tools.models.tiny_models import build_named_models

    _refuse_remote_locations(message.images)
    try:
        build_named_models(settings, variants=message.variants is not None, masks=message.masks)
    except ModelUnavailable as error:
        raise fail(str(error)) from None

    columns = (TextColumn("annotating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task("images", total=0)

        def on_invocation(function: str, payload: dict, error: BaseException | None) -> None:
            if function in ("write_result", "bulk"):  # an image ended, in either lane
                progress.advance(task)

        with local_workflow(on_invocation, stopping=stopping) as run_batch:

            def run_counted(batch: Any, name: str) -> ExecutionResult:
                progress.update(task, total=(progress.tasks[0].total or 0) + batch.images)
                err.print(f"batch {batch.batch_id}: execution {name}", highlight=False)
                return run_batch(batch, name)

            starter = LocalStarter(run_counted, settings.data_dir, delivery, stopping)
            try:
                start_batches(message, delivery, settings.ingest, starter, store_for, choice=choice)
            except RequestRejected as error:
                raise fail(str(error)) from None
    return list(starter.results)


def _summarize(results: list[Any], variants: bool, settings: Settings) -> None:
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
    if variants:
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

    from tools.results.query import run_local_query

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
        raise fail(_disk_full(data_dir)) from None


def _print_batch_rows(title: str, select: str, batch_ids: list[str], data_dir: Path) -> list[dict[str, Any]]:
    """``select`` (a query over ``images`` ending in WHERE ...) for these batches only, as a table; its rows."""
    from tools.results.query import run_local_query

    ids = ", ".join(f"'{batch_id}'" for batch_id in batch_ids)  # batch ids are b-<hex>: no quoting needed
    table = run_local_query(select.format(batches=f"batch_id IN ({ids})"), data_dir)
    print_table(table, title=title)
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
            raise fail(f"--attribute {option!r} must look like NAME=VALUE,VALUE")
        vocabularies[name.strip()] = [value.strip() for value in values.split(",") if value.strip()]
    return vocabularies
