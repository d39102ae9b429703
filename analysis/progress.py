"""Progress of long analysis steps (counts, rate, ETA) on stderr, through ``rich.progress``.

Only a terminal sees it: when stderr is not a TTY (CI, a log file, a pipe)
nothing is printed, so captured output stays exactly the tables or figure
paths. Tests pass their own ``rich.console.Console``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any


def _no_op(advance: int = 1) -> None:
    del advance


def stderr_console() -> Any | None:
    """A rich Console on stderr when stderr is a terminal, else None (stay quiet)."""
    isatty = getattr(sys.stderr, "isatty", None)
    if not (isatty and isatty()):
        return None
    from rich.console import Console

    return Console(stderr=True)


@contextlib.contextmanager
def progress(description: str, total: int, *, unit: str = "items",
             console: Any | None = None) -> Iterator[Callable[[int], None]]:
    """Shows ``description``: a bar, done/total, items per second, elapsed time and ETA.

    Yields ``advance(n=1)``. The bar is drawn as soon as the block starts (the
    elapsed time ticks even before the first item finishes), and is left on
    screen at the end. ``console``: where to draw (default: stderr, only if it
    is a terminal).
    """
    console = console if console is not None else stderr_console()
    if console is None or total <= 0:
        yield _no_op
        return
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console, refresh_per_second=4) as bar:
        task = bar.add_task(description, total=total, rate=f"? {unit}/s")

        def advance(n: int = 1) -> None:
            bar.advance(task, n)
            speed = next(t.speed for t in bar.tasks if t.id == task)  # rich's moving average per second
            bar.update(task, rate=f"{speed:.2f} {unit}/s" if speed else f"? {unit}/s")

        yield advance
