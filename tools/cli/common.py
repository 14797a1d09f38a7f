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
    table = Table(title=title, show_lines=False)
    for name in rows.column_names:
        table.add_column(name, overflow="fold")
    for row in rows.to_pylist():
        table.add_row(*("" if value is None else str(value) for value in row.values()))
    out.print(table)
    out.print(f"{rows.num_rows} row{'s' if rows.num_rows != 1 else ''}", highlight=False)


def quiet_logs(verbose: bool) -> None:
    """The structured logs are Lambda's: a command says what happened in its own lines, and shows the logs when
    asked (--verbose), or an error's record."""
    from shared.observability import logger

    logger.setLevel("INFO" if verbose else "ERROR")
