"""Finding images by meaning: `annotate search` (a text or an image, by their CLIP embeddings) and `annotate
duplicates` (groups of near-duplicate images), over the local tables or, for search, a deployed stack's."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from shared.settings import Profile, use_settings
from tools.cli.common import DataDir, err, fail, out, print_table, quiet_logs
from tools.cli.results import Stack, images_to_write, stack_athena, writing_into
from tools.results.search import DUPLICATE_THRESHOLD

commands = typer.Typer()


@commands.command()
def search(
    text: Annotated[str | None, typer.Argument(help="What to look for, in words: 'a dog on a beach'")] = None,
    like: Annotated[
        str | None, typer.Option("--like", help="Or: the images nearest this one (a path or an s3:// location)")
    ] = None,
    where: Annotated[
        str | None,
        typer.Option(help="Only images with a row where this SQL holds: images (i.) and detections (d.) columns"),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="How many images (or boxes)")] = 10,
    boxes: Annotated[
        bool,
        typer.Option("--boxes", help="Rank boxes by their crops' vectors (box_embeddings; --where: the box's d. row)"),
    ] = False,
    output: Annotated[str, typer.Option("--format", help="table, json or csv")] = "table",
    gallery_dir: Annotated[Path | None, typer.Option("--gallery", help="Also write the hits as a gallery page")] = None,
    data_dir: DataDir = Path("annotate-data"),
    stack: Stack = None,
    profile: Annotated[Profile, typer.Option(help="The models the images were annotated with")] = Profile.DEFAULT,
) -> None:
    """The images nearest a text or an image by their CLIP embeddings, best first, with their labels and caption (or,
    --boxes, the boxes nearest by their crops'): locally on DuckDB, or with --stack on Athena (the query's vector made
    here, with the stack's model)."""
    import duckdb

    from shared.errors import ImageRejected, ModelUnavailable, RequestRejected, TransientError
    from tools.results.query import OutputFormat, format_rows

    try:
        output_format = OutputFormat(output)
    except ValueError:
        raise fail(f"--format must be one of {[f.value for f in OutputFormat]}") from None
    if (text is None) == (like is None):
        raise fail("say what to look for: a text, or --like an image (one of them)")
    if stack and gallery_dir is not None:
        raise fail("--gallery writes the local results' pictures: leave out --stack")
    quiet_logs(False)
    try:
        hits = _search_hits(text, like, where, limit, data_dir, stack, profile, boxes)
    except ImageRejected as error:
        raise fail(f"--like {like}: {error}") from None
    except (RequestRejected, ModelUnavailable, TransientError) as error:
        raise fail(str(error)) from None
    except duckdb.Error as error:
        raise fail(f"--where {where!r}: {str(error).splitlines()[0]}") from None
    if output_format is OutputFormat.TABLE:
        print_table(hits)
    else:
        sys.stdout.write(format_rows(hits, output_format) + "\n")
    if gallery_dir is not None and hits.num_rows:
        _write_hits_gallery(list(dict.fromkeys(hits.column("source_uri").to_pylist())), gallery_dir, data_dir)


def _search_hits(
    text: str | None,
    like: str | None,
    where: str | None,
    limit: int,
    data_dir: Path,
    stack: str | None,
    profile: Profile,
    boxes: bool,
) -> Any:
    """``search``'s hits: on the local tables, or on the stack's (Athena), the query's vector made here with the
    model the stack's rows are of (where its Tag function loaded it from)."""
    from tools.results.athena import run_athena_query
    from tools.results.query import connect_local
    from tools.results.search import (
        BOXES,
        IMAGES,
        athena_models,
        checked_model,
        comparable_model,
        image_vector,
        search,
        search_on_athena,
        text_vector,
    )

    ranked = BOXES if boxes else IMAGES
    chosen: dict[str, Any] = {}
    if stack:
        athena = stack_athena(stack)

        def run(sql: str) -> Any:
            return run_athena_query(sql, athena)

        models = athena_models(run, ranked)
        chosen["tagger_models"] = [checked_model(*models, None, None, None, ranked)[0]]
    else:
        # the rows name the model their vectors are of (whatever profile made them): the query's is made with it
        connection = connect_local(data_dir)
        chosen["tagger_models"] = [comparable_model(connection, None, ranked=ranked)[0]]
    settings = use_settings(profile=profile, data_dir=data_dir, **chosen)
    query = text_vector(text, settings) if text is not None else image_vector(str(like), settings)
    if stack:
        return search_on_athena(run, query, where, limit, models, ranked)
    return search(connection, query, where, limit, ranked)


def _write_hits_gallery(sources: list[str], out_dir: Path, data_dir: Path) -> None:
    from shared.storage.objects import store_for
    from tools.results.gallery import write_gallery

    listed = ", ".join("'" + source.replace("'", "''") + "'" for source in sources)
    images = images_to_write(out_dir, f"source_uri IN ({listed})", data_dir, None, "show")
    order = {source: rank for rank, source in enumerate(sources)}
    with writing_into(out_dir):
        index = write_gallery(sorted(images, key=lambda image: order[image.source_uri]), out_dir, store_for, None)
    err.print(f"{len(images)} images: open {index}", highlight=False)


@commands.command()
def duplicates(
    threshold: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Cosine similarity from which two images are copies")
    ] = DUPLICATE_THRESHOLD,
    model: Annotated[str | None, typer.Option(help="The embeddings' model, where the rows have several")] = None,
    output: Annotated[str, typer.Option("--format", help="table or json")] = "table",
    data_dir: DataDir = Path("annotate-data"),
) -> None:
    """Groups of near-duplicate images (a resized or re-encoded copy, a burst of one scene), by their embeddings."""
    import json

    from shared.errors import RequestRejected
    from tools.results.query import connect_local
    from tools.results.search import duplicate_groups

    if output not in ("table", "json"):
        raise fail("--format must be table or json")
    try:
        groups = duplicate_groups(connect_local(data_dir), threshold, model)
    except RequestRejected as error:
        raise fail(str(error)) from None
    if output == "json":
        sys.stdout.write(json.dumps(groups) + "\n")
        return
    for number, group in enumerate(groups, start=1):
        out.print(f"group {number}: " + ", ".join(group), highlight=False, soft_wrap=True)
    out.print(f"{len(groups)} group{'s' if len(groups) != 1 else ''} of near-duplicates at {threshold:g}")
