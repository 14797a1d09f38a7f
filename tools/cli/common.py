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


# A column keeps this many characters however narrow the terminal (a status, a count, a score stay whole)
KEPT_WIDTH = 10


def print_table(rows, title: str | None = None) -> None:
    """``rows`` as a table that fits the terminal: a row a line; where the rows are wider than the terminal, a path
    is shown by its file name, then the widest cells are cut with an ellipsis (and said so), never a short one."""
    cells = [[_cell_text(value) for value in row.values()] for row in rows.to_pylist()]
    widths = [max([len(name), *(len(row[i]) for row in cells)]) for i, name in enumerate(rows.column_names)]
    if _table_width(widths) > out.width:
        cells = [[_file_name(cell) for cell in row] for row in cells]
        widths = [max([len(name), *(len(row[i]) for row in cells)]) for i, name in enumerate(rows.column_names)]
    table = Table(title=title, show_lines=False)
    for name, width in zip(rows.column_names, _fitted(widths, out.width), strict=True):
        table.add_column(name, overflow="ellipsis", no_wrap=True, width=width)
    for row in cells:
        table.add_row(*row)
    out.print(table)
    cut = _table_width(widths) > out.width
    out.print(
        f"{rows.num_rows} row{'s' if rows.num_rows != 1 else ''}"
        + ("; cells cut to fit: --format csv or json gives them whole" if cut else ""),
        highlight=False,
    )


def _cell_text(value: object) -> str:
    return "" if value is None else " ".join(str(value).split())


def _file_name(cell: str) -> str:
    """A path or URI as its file name (``…/cat.jpg``): what tells the rows apart on a narrow terminal."""
    if cell.startswith(("/", "s3://", "file://")) and "/" in cell.rstrip("/")[1:]:
        return "…/" + cell.rstrip("/").rsplit("/", 1)[1]
    return cell


def _table_width(widths: list[int]) -> int:
    return sum(width + 3 for width in widths) + 1


def _fitted(widths: list[int], terminal: int) -> list[int]:
    """Each column's width within ``terminal``: every column keeps up to KEPT_WIDTH characters, and the room left
    goes to the columns that need it, the narrowest need first, shared evenly among the rest (rich would shrink
    every column alike, a count's to nothing)."""
    fitted = [min(width, KEPT_WIDTH) for width in widths]
    room = terminal - _table_width(fitted)
    order = sorted(range(len(widths)), key=lambda index: widths[index])
    for done, index in enumerate(order):
        extra = max(0, min(widths[index] - fitted[index], room // (len(order) - done)))
        fitted[index] += extra
        room -= extra
    return fitted


def quiet_logs(verbose: bool, quietest: str = "ERROR") -> None:
    """The structured logs are Lambda's: a command says what happened in its own lines, and shows the logs when
    asked (--verbose), or an error's record (a server, whose logs are its account of each call: ``quietest``)."""
    from shared.observability import logger

    logger.setLevel("INFO" if verbose else quietest)
