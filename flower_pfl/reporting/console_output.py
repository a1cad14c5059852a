"""The terminal side of the consoles: lines to a stream under an optional progress bar, and
one federation's round progress (the round it is in, the rounds done, the ETA).

:class:`Output` prints lines to a stream; on a terminal (``bar``) it keeps a rich progress
bar of named tasks below them, plain text otherwise; colour only on a terminal without
``NO_COLOR``.  :class:`RoundTracker` follows one federation's rounds from its output;
:func:`follow_round` is the one place a classified line moves the tracker and the ``round``
bar, for :class:`~flower_pfl.reporting.console.RunConsole` and
:class:`~flower_pfl.reporting.console.BenchConsole` alike.

Choices: ETA = rounds left x mean duration of the rounds after the first (the first one
includes Ray's start: no ETA is shown until a second round has finished); after a resume
the bar starts at the rounds already done.
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO, TYPE_CHECKING, Any, Sequence

from flower_pfl.reporting.log_lines import ROUND_START, RoundInfo, fmt_s, parse_round, strip_ansi

if TYPE_CHECKING:  # rich is imported when a bar starts (Output.start)
    from rich.progress import Progress, TaskID


def use_color(stream: IO[str]) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


class Output:
    """Lines to a stream, with a rich progress bar above which they print when the stream
    is a terminal (``bar``), plain text otherwise."""

    def __init__(self, stream: IO[str] | None = None, bar: bool | None = None) -> None:
        self.stream = stream or sys.stdout
        self.color = use_color(self.stream)
        self.bar = self.color if bar is None else bar
        self.progress: Progress | None = None
        self.tasks: dict[str, TaskID] = {}

    def start(self, tasks: Sequence[tuple[str, str, int]]) -> None:
        """Start the bar with (key, description, total) tasks (a no-op without a bar)."""
        if not self.bar or self.progress is not None:
            return
        try:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )
        except ImportError:  # rich comes with Flower (typer); without it: no bar
            self.bar = False
            return
        console = Console(file=self.stream, force_terminal=True, no_color=not self.color,
                          highlight=False)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("elapsed"),
                                 TimeElapsedColumn(), TextColumn("{task.fields[eta]}"),
                                 console=console, transient=True, redirect_stdout=False,
                                 redirect_stderr=False)
        for key, desc, total in tasks:
            self.tasks[key] = self.progress.add_task(desc, total=total, eta="")
        self.progress.start()

    def update(self, key: str, **fields: Any) -> None:
        if self.progress is not None and key in self.tasks:
            self.progress.update(self.tasks[key], **fields)

    def reset(self, key: str, **fields: Any) -> None:
        if self.progress is not None and key in self.tasks:
            self.progress.reset(self.tasks[key], **fields)

    def print(self, text: str, style: str | None = None, ansi: bool = False) -> None:
        """One line; ``ansi``: it carries Flower's colour codes (kept on a terminal only)."""
        text = text.rstrip("\n")
        if self.progress is not None:
            from rich.text import Text

            # no style: rich's own default, ""
            self.progress.console.print(Text.from_ansi(text) if ansi and self.color else
                                        Text(strip_ansi(text), style=(style or "")
                                             if self.color else ""))
            return
        self.stream.write((text if ansi and self.color else strip_ansi(text)) + "\n")
        self.stream.flush()

    def raw(self, line: str) -> None:
        """A line as Flower wrote it (verbose)."""
        self.print(line, ansi=True)

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


class RoundTracker:
    """What one federation's output says: the round it is in, the rounds done, the ETA."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.first: int | None = None  # the first round this run runs (> 1 after a resume)
        self.first_done_t: float | None = None  # when the first round's numbers came
        self.started = time.time()
        self.done = 0
        self.devices = ""

    def started_round(self, n: int) -> bool:
        """Flower's ``[ROUND n]``; True for the first round this run runs."""
        if self.first is not None:
            return False
        self.first, self.done = n, n - 1
        return True

    def finished(self, info: RoundInfo) -> float | None:
        """A round's numbers came; returns the ETA."""
        self.first = info.round if self.first is None else self.first
        self.first_done_t = time.time() if self.first_done_t is None else self.first_done_t
        self.done = info.round
        return self.eta()

    def eta(self, now: float | None = None) -> float | None:
        """Seconds left: rounds left x mean duration of the rounds after the first; None
        until one has finished (the first one's time is mostly start-up)."""
        now = time.time() if now is None else now
        if self.first is None or not self.done or self.first_done_t is None:
            return None
        left = self.total - self.done
        after = self.done - self.first  # rounds completed after the first one
        if left <= 0:
            return 0.0
        # the first round's time is mostly start-up (Ray, the actors): no ETA from it alone
        per = (now - self.first_done_t) / after if after > 0 else None
        return None if per is None else left * per


def follow_round(out: Output, track: RoundTracker, kind: str,
                 text: str) -> tuple[int | None, RoundInfo | None, float | None]:
    """A classified line's effect on the round progress: Flower's ``[ROUND n]`` moves the
    tracker (and the ``round`` bar to the rounds already done when it is the first), the
    strategy's round line moves both and sets the ETA.  Returns (n of a ``[ROUND n]``, the
    numbers of a round line, the ETA after it); all None for any other line."""
    if kind == "round-start":
        match = ROUND_START.search(text)
        assert match is not None, "classify() calls a line round-start where ROUND_START is"
        n = int(match.group(1))
        if track.started_round(n):
            out.update("round", completed=n - 1)
        return n, None, None
    if kind == "round" and (info := parse_round(text)) is not None:
        eta = track.finished(info)
        out.update("round", completed=info.round,
                   eta="" if eta is None else f"ETA {fmt_s(eta)}")
        return None, info, eta
    return None, None, None
