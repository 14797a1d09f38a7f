"""What every command shares: the consoles, one-line failures, tables, quiet logs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

out = Console()
err = Console(stderr=True)

DataDir = Annotated[Path, typer.Option("--data-dir", file_okay=False, help="Local results folder")]


def fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def print_table(rows, title: str | None = None) -> None:
    """``rows`` as a table that fits the terminal: a row a line, the widest cells cut with an ellipsis where the
    rows are wider than the terminal (and said so)."""
    table = Table(title=title, show_lines=False)
    for name in rows.column_names:
        table.add_column(name, overflow="ellipsis", no_wrap=True)
    cells = [
        ["" if value is None else " ".join(str(value).split()) for value in row.values()] for row in rows.to_pylist()
    ]
    for row in cells:
        table.add_row(*row)
    out.print(table)
    widths = [max([len(name), *(len(row[i]) for row in cells)]) for i, name in enumerate(rows.column_names)]
    cut = sum(width + 3 for width in widths) + 1 > out.width
    out.print(
        f"{rows.num_rows} row{'s' if rows.num_rows != 1 else ''}"
        + ("; cells cut to fit: --format csv or json gives them whole" if cut else ""),
        highlight=False,
    )


def quiet_logs(verbose: bool, quietest: str = "ERROR") -> None:
    """The structured logs are Lambda's: a command says what happened in its own lines, and shows the logs when
    asked (--verbose), or an error's record (a server, whose logs are its account of each call: ``quietest``)."""
    from shared.observability import logger

    logger.setLevel("INFO" if verbose else quietest)
