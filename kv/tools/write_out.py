"""How the `raftkv` commands print: etcdctl's -w/--write-out (simple, table, json), tables on
stdout and progress bars on stderr, both drawn by rich. rich draws for a terminal and writes plain
text to a file or a pipe: no colours or cursor moves, and a progress bar only its last state, once
(no `\\r` frames in a log file)."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

# rich is imported where it draws: importing it takes ~0.1 s, which every `raftkv get` (and
# `raftkv serve`) would otherwise pay for nothing.
if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, ProgressColumn

SIMPLE, TABLE, JSON = "simple", "table", "json"
WRITE_OUT = (SIMPLE, TABLE, JSON)
# A table written to a file or a pipe keeps each row on one line, however long (rich would wrap
# cells to 80 columns, which breaks `grep` and `awk`).
UNWRAPPED_WIDTH = 1 << 16


def add_write_out(parser: argparse.ArgumentParser, default: str, simple: str, table: str | None, json: str) -> None:
    """-w/--write-out with etcdctl's three forms, described for this command, and --json as the
    documented alias of `-w json`. `table` None: the command has no table form (as etcdctl's txn)."""
    forms = WRITE_OUT if table is not None else (SIMPLE, JSON)
    described = [f"{SIMPLE}: {simple}"] + ([f"{TABLE}: {table}"] if table is not None else []) + [f"{JSON}: {json}"]
    parser.add_argument("-w", "--write-out", choices=forms, default=default, metavar="FORMAT",
                        help=f"{'; '.join(described)} (default: {default})")
    parser.add_argument("--json", dest="write_out", action="store_const", const=JSON, default=argparse.SUPPRESS,
                        help="the same as -w json")


def stdout_console() -> Console:
    """A console on the current sys.stdout (made when printing: tests and callers swap stdout)."""
    from rich.console import Console

    console = Console(file=sys.stdout, highlight=False)
    if not console.is_terminal:
        console.width = UNWRAPPED_WIDTH
    return console


def print_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> int:
    """One table, the look of every raftkv table: a rule under the header, no frame. Cells are
    plain text (a key holding `[bold]` is not markup). Returns how many rows it printed."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for header in headers:
        table.add_column(header)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    stdout_console().print(table)
    return table.row_count


@contextmanager
def byte_progress(enabled: bool = True) -> Iterator[Progress]:
    """Bars for transfers of bytes on stderr: size done, speed, time left."""
    from rich.progress import DownloadColumn, TimeRemainingColumn, TransferSpeedColumn

    yield from _progress(enabled, DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())


@contextmanager
def row_progress(enabled: bool = True) -> Iterator[Progress]:
    """Bars for rows on stderr: rows done of all, percent, time so far."""
    from rich.progress import MofNCompleteColumn, TaskProgressColumn, TimeElapsedColumn

    yield from _progress(enabled, MofNCompleteColumn(), TaskProgressColumn(), TimeElapsedColumn())


def _progress(enabled: bool, *columns: ProgressColumn) -> Iterator[Progress]:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    progress = Progress(TextColumn("{task.description}"), BarColumn(), *columns, console=Console(file=sys.stderr),
                        disable=not enabled)
    progress.start()
    try:
        yield progress
    except BaseException:
        # A failed command's stderr is its one error line: the bar leaves nothing behind (erased
        # on a terminal, never written to a file; Progress.stop would add an empty line to a file).
        progress.live.transient = True
        progress.live.stop()
        raise
    progress.stop()
