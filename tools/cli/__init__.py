"""The `annotate` command: run the workflow locally and query its results.

One module per group of commands; this one only puts them in the order `annotate --help` lists them."""

from __future__ import annotations

import typer

from tools.cli import bench, models, results, run, search

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0])
app.add_typer(run.commands)
app.add_typer(results.commands)
app.add_typer(search.commands)
app.add_typer(bench.commands)
app.add_typer(models.models, name="models")
