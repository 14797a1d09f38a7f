"""Measurements: `annotate bench` and its siblings (ingest, the API, the bulk lane, Detect as Lambda runs it),
`chaos` (AWS's faults and quotas played against the local workflow) and `cost` (a month priced from them)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from shared.errors import validation_reason
from tools.cli.common import err, fail, out, quiet_logs

commands = typer.Typer()
REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "samples"
# The committed bench reports: `annotate cost` prices from them wherever it is run
BENCH_REPORT = REPO / "bench" / "bench.json"


@commands.command()
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
    vision_caption: Annotated[
        bool, typer.Option(help="Also time the vision-language caption beside the text-only one (full-size SmolVLM)")
    ] = True,
    out_dir: Annotated[Path, typer.Option(help="Where bench.json and bench.md go")] = Path("bench"),
) -> None:
    """Time this pipeline against the straightforward way, side by side, and write the report."""
    from tools.bench.models import BenchOptions, run_bench

    quiet_logs(False)
    try:
        options = BenchOptions(
            images=images or [SAMPLES / "chelsea-the-cat.jpg", SAMPLES / "coffee.webp"],
            repeats=repeats,
            threads=threads,
            short_side=short_side,
            crops=crops,
            models=models,
            lossy_short_side=lossy_short_side,
            lossy_queries=lossy_queries,
            variants=variants,
            vision_caption=vision_caption,
            out_dir=out_dir,
        )
    except ValidationError as error:
        raise fail(validation_reason(error)) from None
    report = run_bench(options, progress=lambda text: err.print(f"[dim]{text}[/dim]"))
    out.print((out_dir / "bench.md").read_text(), highlight=False, soft_wrap=True)
    out.print(f"whole image: {report['whole_image']['speedup']}x the reference; written to {out_dir}/")


@commands.command("bench-photo")
def bench_photo(
    images: Annotated[list[Path] | None, typer.Argument(help="Samples to make phone photos of (default: two)")] = None,
    repeats: Annotated[int, typer.Option(min=1, max=20, help="Alternating runs per image and size")] = 3,
    out_dir: Annotated[Path, typer.Option(help="Where photo.json and photo.md go")] = Path("bench"),
) -> None:
    """Time a phone's 12 MP photo through each lane's steps beside the sample's own size, each stage apart."""
    from PIL import Image

    from tools.bench.photo import run_photo_bench

    quiet_logs(False)
    samples = images or [SAMPLES / "chelsea-the-cat.jpg", SAMPLES / "coffee.webp"]
    if missing := [str(path) for path in samples if not path.is_file()]:
        raise fail(f"not files: {', '.join(missing)}")
    for path in samples:
        try:
            with Image.open(path) as opened:
                opened.verify()
        except Exception as error:  # Pillow's ways of saying it is no image it reads
            raise fail(f"{path} is not an image Pillow reads: {error}") from None
    run_photo_bench(samples, repeats, out_dir, progress=lambda text: err.print(f"[dim]{text}[/dim]"))
    out.print((out_dir / "photo.md").read_text(), highlight=False, soft_wrap=True)


@commands.command("bench-search")
def bench_search(
    repeats: Annotated[int, typer.Option(min=1, max=20, help="Alternating runs per sample")] = 3,
    out_dir: Annotated[Path, typer.Option(help="Where search.json and search.md go")] = Path("bench"),
) -> None:
    """Time what an image's embedding adds (side by side, on and off) and a search on DuckDB at 10,000 and
    100,000 images' rows; write the report."""
    from tools.bench.search import run_search_bench

    quiet_logs(False)
    samples = [SAMPLES / "chelsea-the-cat.jpg", SAMPLES / "coffee.webp"]
    run_search_bench(samples, repeats, out_dir, progress=lambda text: err.print(f"[dim]{text}[/dim]"))
    out.print((out_dir / "search.md").read_text(), highlight=False, soft_wrap=True)


@commands.command("bench-ingest")
def bench_ingest(
    objects: Annotated[int, typer.Option(help="Objects under the prefix ingest plans")] = 100_000,
    out_dir: Annotated[Path, typer.Option(help="Where ingest.json and ingest.md go")] = Path("bench"),
) -> None:
    """Time ingest planning a large S3 prefix (moto), and its memory, beside a HEAD per object; write the report."""
    from tools.bench.ingest import run_ingest_bench

    quiet_logs(False)
    run_ingest_bench(objects, out_dir, progress=lambda text: err.print(f"[dim]{text}[/dim]"))
    out.print((out_dir / "ingest.md").read_text(), highlight=False, soft_wrap=True)


@commands.command("bench-api")
def bench_api(
    image: Annotated[Path | None, typer.Argument(help="The image to answer (default: a sample)")] = None,
    repeats: Annotated[int, typer.Option(help="Alternating runs of each side")] = 7,
    out_dir: Annotated[Path, typer.Option(help="Where api.json and api.md go")] = Path("bench"),
) -> None:
    """Time the synchronous API (annotate serve) against the same work in-process, and write the report."""
    from tools.bench.api import markdown_report, run_api_bench

    quiet_logs(False)
    image = image or SAMPLES / "chelsea-the-cat.jpg"
    if not image.is_file():
        raise fail(f"{image} is not a file: name an image to answer")
    report = run_api_bench(image, repeats, out_dir)
    out.print(markdown_report(report), highlight=False)


@commands.command("bench-bulk")
def bench_bulk(
    images: Annotated[list[Path] | None, typer.Argument(help="Images to run on (default: two samples)")] = None,
    copies: Annotated[int, typer.Option(help="Copies of each image (distinct files)")] = 5,
    repeats: Annotated[int, typer.Option(help="Alternating runs of each side")] = 3,
    out_dir: Annotated[Path, typer.Option(help="Where bulk.json and bulk.md go")] = Path("bench"),
    models: Annotated[str, typer.Option(help="random: full-size architectures; tiny: a quick check")] = "random",
) -> None:
    """Time the bulk worker against the same images one at a time, and write the report."""
    from tools.bench.bulk import markdown_report, run_bulk_bench

    quiet_logs(False)
    missing = [str(path) for path in images or [] if not path.is_file()]
    if missing:
        raise fail(f"not files: {', '.join(missing)}")
    if models not in ("random", "tiny"):
        raise fail(f"--models is random or tiny, not {models}")
    report = run_bulk_bench(
        images or [SAMPLES / "chelsea-the-cat.jpg", SAMPLES / "coffee.webp"],
        copies,
        repeats,
        out_dir,
        "tiny" if models == "tiny" else "random",
    )
    out.print(markdown_report(report), highlight=False)


@commands.command("bench-flops")
def bench_flops(
    repeats: Annotated[int, typer.Option(min=1, max=20, help="Runs per size, product and profile")] = 3,
    models: Annotated[str, typer.Option(help="random (the full-size architecture) or tiny")] = "random",
    out_dir: Annotated[Path, typer.Option(help="Where flops.json and flops.md go")] = Path("bench"),
) -> None:
    """Detect against this CPU's limit: its FLOPs at each exported size, the fp32 rate of its own products here, how
    far its seconds are from the floor that allows, and OpenVINO's per-operation profile; write the report."""
    from tools.bench.flops import write_report

    quiet_logs(False)
    if models not in ("random", "tiny"):
        raise fail(f"--models is random or tiny, not {models}")
    out.print(write_report(models == "random", repeats, out_dir), highlight=False, soft_wrap=True)


@commands.command("bench-detectors")
def bench_detectors(
    repeats: Annotated[int, typer.Option(min=1, max=20, help="Warm runs per detector")] = 3,
    out_dir: Annotated[Path, typer.Option(help="Where detectors.json and detectors.md go")] = Path("bench"),
) -> None:
    """The detectors a user may pick, side by side (full-size architectures, random weights): each export held to
    its torch, its warm seconds at a phone photo's size, a fresh process's first answer and peak memory, and its
    published accuracy; annotate cost then prices a million photos with each. Write the report."""
    from tools.bench.detectors import write_report

    quiet_logs(False)
    out.print(write_report(repeats, out_dir), highlight=False, soft_wrap=True)


@commands.command("bench-lambda-detect")
def bench_lambda_detect(
    image: Annotated[Path, typer.Option(exists=True, dir_okay=False)] = Path("samples/chelsea-the-cat.jpg"),
    out_dir: Annotated[Path, typer.Option(help="Where lambda-detect.json and lambda-detect.md go")] = Path("bench"),
) -> None:
    """Time Detect and measure its peak memory as a Lambda environment without SnapStart runs it, on OpenVINO and
    ONNX Runtime (the full-size model, random weights); write the report."""
    from tools.bench.lambda_detect import write_report

    quiet_logs(False)
    out.print(write_report(image, out_dir), highlight=False, soft_wrap=True)


@commands.command()
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
    batches: Annotated[int, typer.Option(min=1, max=10, help="Messages sent, whose batches overlap")] = 1,
    message_interval: Annotated[
        float,
        typer.Option(min=0, max=60, help="Seconds between the messages: the later ones reach Ingest while batches run"),
    ] = 0.0,
    bulk_images: Annotated[int, typer.Option(min=0, max=200, help="Images of a bulk-lane message sent with them")] = 0,
    fargate_vcpus: Annotated[
        int | None, typer.Option(min=1, help="The Batch queue's Fargate Spot vCPUs (a new account's quota may be 6)")
    ] = None,
    spot_shortage: Annotated[
        float, typer.Option(min=0, max=600, help="Seconds Fargate Spot has no capacity, from the first Spot job")
    ] = 0.0,
    function_memory: Annotated[
        int | None, typer.Option(min=128, max=10240, help="The account's largest function memory in MB (3008)")
    ] = None,
) -> None:
    """Annotate generated images through the local workflow with AWS faults injected; account for every image.

    Exits 1 when an image has no row or more than one, or one other than the hung image is recorded as failed.
    """
    from tools.local.chaos import run_chaos
    from tools.local.chaos_faults import MODEL_STEPS, Faults

    if hang not in {*MODEL_STEPS, "write_result", "none"}:
        raise fail(f"--hang must be one of {sorted({*MODEL_STEPS, 'write_result', 'none'})}")
    quiet_logs(False)
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
        message_interval_s=message_interval,
        bulk_images=bulk_images,
        fargate_vcpus=fargate_vcpus,
        spot_shortage_s=spot_shortage,
        function_memory_mb=function_memory,
    )
    # Each line whole, at any width: a program reads the last one
    out.print(faults.account(), highlight=False, soft_wrap=True)
    if over := faults.functions_over_memory():
        raise fail(f"the stack does not fit the account's function memory: {', '.join(over)}")
    out.print(faults.describe(), highlight=False, soft_wrap=True)
    report = run_chaos(images, faults)
    out.print(f"Lambda invocations at once: {report.most_in_flight} at the most", highlight=False, soft_wrap=True)
    if bulk_images or variants_images:
        jobs = (
            f"Fargate vCPUs at once: {report.most_fargate_vcpus:g} at the most; "
            f"{report.on_demand_jobs} job attempts on on-demand Fargate"
        )
        out.print(jobs, highlight=False, soft_wrap=True)
    ingest = (
        f"Ingest: {report.ingest_throttled} invocations throttled (their messages came back), "
        f"{report.dead_lettered} messages dead-lettered"
    )
    out.print(ingest, highlight=False, soft_wrap=True)
    out.print(report.timing, highlight=False, soft_wrap=True)
    for row in report.failed:
        failed = f"recorded as failed: {row['source_uri']} ({row['failed_step']}): {row['error']}"
        out.print(failed, highlight=False, soft_wrap=True)
    injected = "injected: " + ", ".join(f"{name} {n}" for name, n in sorted(report.injected.items()))
    out.print(injected, highlight=False, soft_wrap=True)
    out.print(report.line, highlight=False, soft_wrap=True)
    if report.lost or report.duplicated or report.unexpected_failures:
        raise typer.Exit(1)


@commands.command("exactly-once")
def exactly_once(
    runs: Annotated[int, typer.Option(min=1, max=100_000, help="Runs, each a seeded list of steps")] = 40,
    steps: Annotated[int, typer.Option(min=1, max=500, help="Steps a run")] = 20,
    seed: Annotated[int, typer.Option(help="The first run's seed (the n-th: seed + n)")] = 1,
) -> None:
    """Drive Ingest, the gatherer and their claims over moto while AWS delivers twice, kills functions at any call,
    holds one while others run and lets time pass; check that every image dropped starts exactly once. A broken run
    is printed with its seed and its fewest steps. Exits 1 when one is broken."""
    from tools.local.exactly_once import check_exactly_once

    report = check_exactly_once(runs, steps, seed, say=lambda line: out.print(line, highlight=False, soft_wrap=True))
    out.print(report.line, highlight=False)
    if report.broken:
        raise typer.Exit(1)


@commands.command()
def cost(
    bench_file: Annotated[
        Path, typer.Option("--bench", help="A bench.json written by annotate bench (default: the checkout's)")
    ] = BENCH_REPORT,
    prices_file: Annotated[Path | None, typer.Option("--prices", help="Prices (default: tools/bench/data)")] = None,
    out_dir: Annotated[Path, typer.Option(help="Where cost.md, cost.json and cost.png go")] = Path("bench"),
) -> None:
    """Cost per 1,000 images and per month for the original study's scenarios, from measured seconds."""
    import json

    from pydantic import ValidationError

    from tools.bench.cost import (
        api_costs,
        api_line,
        bulk_line,
        detectors_table,
        gathered_line,
        gathered_table,
        graviton_line,
        lanes_table,
        markdown_table,
        masks_line,
        vision_caption_line,
        write_chart,
    )
    from tools.bench.cost_inputs import (
        ApiSeconds,
        BenchSeconds,
        BulkSeconds,
        LambdaDetectSeconds,
        load_prices,
        read_report,
    )
    from tools.bench.cost_lanes import with_lambda_cold_start
    from tools.bench.cost_months import cost_table
    from tools.bench.photo import PHOTO_LINE, at_photo_size, sizes_table
    from tools.bench.storage import measured_bytes_per_image, network_table, search_line, storage_table

    if not bench_file.exists():
        raise fail(f"{bench_file} does not exist: run annotate bench to measure one, or pass --bench FILE")
    if not bench_file.is_file() or bench_file.stat().st_size > 10_000_000:
        raise fail(f"{bench_file} is not a bench report (a JSON file annotate bench writes)")
    lambda_detect = bench_file.with_name("lambda-detect.json")  # annotate bench-lambda-detect's, where it ran
    api_bench = bench_file.with_name("api.json")  # annotate bench-api's
    bulk_bench = bench_file.with_name("bulk.json")  # annotate bench-bulk's
    photo_bench = bench_file.with_name("photo.json")  # annotate bench-photo's: priced at a 12 MP photo's seconds
    try:
        prices = load_prices(prices_file)
        bench = read_report(BenchSeconds, bench_file)
        if lambda_detect.is_file():
            bench = with_lambda_cold_start(bench, read_report(LambdaDetectSeconds, lambda_detect))
        bulk = read_report(BulkSeconds, bulk_bench) if bulk_bench.is_file() else None
        photo = json.loads(photo_bench.read_text()) if photo_bench.is_file() else None
        bench_at_its_size, bulk_at_its_size = bench, bulk
        if photo:
            bench, bulk = at_photo_size(bench, bulk, photo)
        rows = cost_table(bench, prices, bulk)
        report = markdown_table(rows, prices, bench)
        if api_bench.is_file():
            report += "\n" + api_line(api_costs(read_report(ApiSeconds, api_bench), prices)) + "\n"
        per_image = measured_bytes_per_image(sorted(SAMPLES.iterdir()))
        report += "\n" + storage_table(per_image, prices) + "\n" + search_line(per_image, prices) + "\n"
        if bulk:
            report += "\n" + bulk_line(bench, bulk, prices) + "\n\n" + lanes_table(bench, bulk, prices)
            report += "\n" + masks_line(bench, bulk, prices) + "\n"
            report += "\n" + vision_caption_line(bench, bulk, prices) + "\n"
            report += "\n" + network_table(bench, bulk, prices, per_image)
            flops_report = bench_file.with_name("flops.json")  # annotate bench-flops's
            flops = json.loads(flops_report.read_text()) if flops_report.is_file() else None
            report += "\n" + graviton_line(bench, bulk, prices, flops) + "\n"
            detectors_report = bench_file.with_name("detectors.json")  # annotate bench-detectors's
            if detectors_report.is_file():
                detectors = json.loads(detectors_report.read_text())
                report += "\n" + detectors_table(bench, bulk, prices, detectors)
            report += "\n" + gathered_line(bench, bulk, prices) + "\n\n" + gathered_table(bench, bulk, prices)
        if photo and bulk_at_its_size:
            report += "\n" + PHOTO_LINE + "\n\n" + sizes_table(bench_at_its_size, bulk_at_its_size, photo, prices)[0]
    except (KeyError, TypeError, ValueError) as error:  # a ValidationError is a ValueError: say its first field
        first = error.errors()[0] if isinstance(error, ValidationError) else None
        message = f"{'.'.join(map(str, first['loc']))}: {first['msg']}" if first else repr(error)
        raise fail(f"{bench_file} or the prices file is not what annotate bench writes: {message}") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "cost.json").write_text(json.dumps([row.model_dump() for row in rows], indent=2) + "\n")
    (out_dir / "cost.md").write_text(report)
    write_chart(rows, out_dir / "cost.png")
    out.print(report, highlight=False, soft_wrap=True)
    out.print(f"written to {out_dir}/cost.md, cost.json and cost.png")
