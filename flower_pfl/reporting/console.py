"""What ``flower-pfl run`` and ``flower-pfl bench`` print while a federation runs.

Every line of ``flwr run --stream`` (the ServerApp's Flower log, ANSI coloured; Ray's and
Python's warnings; Flower's notices) goes to ``<results>/flwr-run.log`` unchanged
(:func:`flower_pfl.running.procs.stream_run`); :class:`RunConsole` shows a researcher's view:
one line per evaluated round (the strategy's ``[flower-pfl] round N: ...`` line,
:func:`parse_round`, written short by :func:`format_round`: personalized mean, worst-10%,
top-10%, best so far, the global model's mean; elapsed and ETA without a bar), on a
terminal a rich progress bar (round k/N, elapsed, ETA; :class:`BenchConsole`: cell k/N
and the round inside the cell), one line when the federation starts, every
WARNING/ERROR line and every line it does not recognise (a traceback), and a closing
summary from ``summary.json`` (:func:`summary_lines`) whose last lines are the final and
best numbers.  Hidden (:func:`classify`): Flower's INFO chatter and end-of-run History
dump, "Flower configuration not found", the "default simulated SuperNodes changed from
10 to 2" warning (not our count: ``flower-pfl run`` sets ``num-supernodes``), Ray's
accelerator FutureWarning, "Manually terminating ClientAppActor"; flwr-datasets'
"Classes ... will NOT be used" becomes one short note (:func:`translate_warning`).
``verbose``: every line as written.  Colour only on a terminal without ``NO_COLOR``.

Choices: accuracies in percent (the tables' unit), the synthetic task's squared error as it
is; ETA = rounds left x mean duration of the rounds after the first (which includes Ray's
start).
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator, Sequence

from flower_pfl.reporting.results import metric_of, read_summary, read_values

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LOG_LINE = re.compile(r"^(?P<actor>\([^)]*pid=\d+[^)]*\)\s*)?"
                      r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*:\s?(?P<text>.*)$")
ROUND_LINE = re.compile(r"\[flower-pfl\] round (?P<round>\d+): personalized (?P<metric>\w+) "
                        r"mean (?P<mean>\S+) weighted (?P<weighted>\S+) std \S+ "
                        r"worst10% (?P<worst10>\S+) top10% (?P<top10>\S+) min \S+ "
                        r"\| best mean (?P<best>\S+)"
                        r"(?: \| global \w+ mean (?P<global_>\S+))?"
                        r" \| (?P<answered>\d+) clients answered, (?P<missing>\d+) did not"
                        r"(?: \| devices (?P<devices>.*))?")
# our own INFO lines the console replaces (round lines, the summary); a checkpoint line
# stays (where a stopped run resumes from)
OURS_HIDDEN = re.compile(r"\[flower-pfl\] (strategy=|final per-round table|per-client table)")
# lines that are never worth a researcher's attention (all of them stay in flwr-run.log)
NOISE = re.compile(
    r"Flower configuration not found|Using SuperLink:|Successfully installed |"
    r"default simulated SuperNodes changed|Manually terminating ClientAppActor|"
    r"FutureWarning: Tip: In future versions of Ray|RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO|"
    r"^\s*warnings\.warn\($")
CLASSES_UNUSED = re.compile(r"Classes: (\[[^\]]*\]) will NOT be used")
STARTED = re.compile(r"Successfully started run (\d+)")
ROUND_START = re.compile(r"\[ROUND (\d+)\]")


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def translate_warning(text: str) -> str | None:
    """A known warning as one short line of ours (None: not a known one)."""
    m = CLASSES_UNUSED.search(text)
    if m:
        return (f"note: the pathological partition gives classes {m.group(1)} to no client "
                f"(clients x classes-per-client does not cover every class)")
    return None


def classify(line: str) -> tuple[str, str]:
    """(kind, text) of one raw output line; kind is one of ``round`` (our per-round line),
    ``round-start`` (Flower's ``[ROUND n]``), ``started`` (the run was submitted),
    ``ours`` (another ``[flower-pfl]`` line), ``warning`` (WARNING/ERROR/CRITICAL),
    ``note`` (a known warning, translated), ``other`` (unrecognised: shown) or ``hidden``;
    text is the line without ANSI codes and Flower's level prefix."""
    plain = strip_ansi(line).rstrip("\n").rstrip()
    m = LOG_LINE.match(plain)
    if m is None:
        if not plain.strip():
            return "hidden", ""
        note = translate_warning(plain)
        if note:
            return "note", note
        started = STARTED.search(plain)
        if started:
            return "started", started.group(1)
        if NOISE.search(plain):
            return "hidden", plain
        return "other", plain
    level, text = m.group("level"), m.group("text").strip()
    if level in ("WARNING", "ERROR", "CRITICAL"):
        if NOISE.search(text):
            return "hidden", text
        return "warning", f"{level}: {text}"
    if level == "DEBUG":
        return "hidden", text
    if ROUND_LINE.search(text):
        return "round", text
    if ROUND_START.fullmatch(text):
        return "round-start", text
    if text.startswith("[flower-pfl]") and not OURS_HIDDEN.search(text):
        return "ours", text
    return "hidden", text


@dataclass
class RoundInfo:
    round: int
    metric: str
    mean: float
    worst10: float
    top10: float
    best: float
    global_: float | None
    answered: int
    missing: int
    devices: str


def parse_round(text: str) -> RoundInfo | None:
    """The numbers of the strategy's ``[flower-pfl] round N: ...`` line (None: not one)."""
    m = ROUND_LINE.search(strip_ansi(text))
    if m is None:
        return None
    g = m.groupdict()
    return RoundInfo(int(g["round"]), g["metric"], float(g["mean"]), float(g["worst10"]),
                     float(g["top10"]), float(g["best"]),
                     None if g["global_"] is None else float(g["global_"]),
                     int(g["answered"]), int(g["missing"]), (g["devices"] or "").strip())


def fmt_s(seconds: float | None) -> str:
    """``1h02m03s`` / ``2m03s`` / ``3s``; ``unknown`` for None or not finite."""
    if seconds is None or not math.isfinite(seconds):
        return "unknown"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def fmt_metric(value: float | None, metric: str) -> str:
    """Accuracy in percent, an error (mse) as it is."""
    if value is None or not math.isfinite(value):
        return "–"
    return f"{100 * value:.2f}%" if metric == "accuracy" else f"{value:.4f}"


def format_round(r: RoundInfo, total: int, timing: str = "", devices: bool = False) -> str:
    """One console line for an evaluated round."""
    f = lambda v: fmt_metric(v, r.metric)  # noqa: E731
    what = "" if r.metric == "accuracy" else f" {r.metric}"  # accuracy: the % says it
    line = (f"round {r.round:>{len(str(total))}}/{total}  personalized{what} {f(r.mean)}  "
            f"worst-10% {f(r.worst10)}  top-10% {f(r.top10)}  best {f(r.best)}")
    if r.global_ is not None:
        line += f" | global {f(r.global_)}"
    if r.missing:
        line += f" | {r.missing} client(s) did not answer"
    if devices and r.devices:
        line += f" | devices {r.devices}"
    return line + (f" | {timing}" if timing else "")


def summary_lines(results_dir: Path, wall_s: float | None = None,
                  tensorboard: Path | None = None) -> list[str]:
    """The closing summary of a finished run, from its ``summary.json``; the last lines
    give the final and the best personalized (and global) numbers."""
    results_dir = Path(results_dir)
    summary = read_summary(results_dir) or {}
    rounds = summary.get("rounds") or []
    wall = f" in {fmt_s(wall_s)}" if wall_s is not None else ""
    lines = [f"[flower-pfl] run {summary.get('status', 'ended')}: {len(rounds)} evaluated "
             f"round(s){wall}",
             f"  results: {results_dir}/ (rounds.csv, clients.csv, summary.json, curves.png, "
             f"flwr-run.log)"]
    if tensorboard is not None:
        lines.append(f"  TensorBoard: tensorboard --logdir {tensorboard}")
    if not rounds:
        return lines
    metric = metric_of(read_values(results_dir))
    pick = min if metric == "mse" else max
    last = rounds[-1]
    for model in ("personal", "global"):
        key = f"{model}_mean"
        if key not in last:
            continue
        best = pick((r for r in rounds if key in r), key=lambda r: r[key])
        name = "personalized" if model == "personal" else "global model"
        worst = fmt_metric(last.get(f"{model}_worst10_mean"), metric)
        lines.append(f"  {name} {metric}: final {fmt_metric(last[key], metric)} (round "
                     f"{last['round']}), best {fmt_metric(best[key], metric)} (round "
                     f"{best['round']}), worst-10% {worst}")
    return lines


def use_color(stream: IO) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


# --------------------------------------------------------------------------- output
class _Output:
    """Lines to a stream, with a rich progress bar above which they print when the stream
    is a terminal (``bar``), plain text otherwise."""

    def __init__(self, stream: IO | None = None, bar: bool | None = None) -> None:
        self.stream = stream or sys.stdout
        self.color = use_color(self.stream)
        self.bar = self.color if bar is None else bar
        self.progress = None
        self.tasks: dict[str, Any] = {}

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

            self.progress.console.print(Text.from_ansi(text) if ansi and self.color else
                                        Text(strip_ansi(text), style=style if self.color
                                             else None))
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


class _RoundTracker:
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
        """Seconds left: rounds left x mean duration of the rounds after the first."""
        now = time.time() if now is None else now
        if self.first is None or not self.done or self.first_done_t is None:
            return None
        left = self.total - self.done
        after = self.done - self.first  # rounds completed after the first one
        if after > 0:
            per = (now - self.first_done_t) / after
        else:
            per = self.first_done_t - self.started
        return left * per


class RunConsole:
    """The console of one ``flower-pfl run``: feed it every output line (``on_line``)."""

    def __init__(self, rounds: int, clients: int | None = None, actors: int | None = None,
                 verbose: bool = False, quiet: bool = False, stream: IO | None = None,
                 bar: bool | None = None) -> None:
        self.out = _Output(stream, bar=False if (verbose or quiet) else bar)
        self.verbose, self.quiet = verbose, quiet
        self.rounds, self.clients, self.actors = rounds, clients, actors
        self.track = _RoundTracker(rounds)
        self.notes: set[str] = set()

    def __enter__(self) -> "RunConsole":
        self.out.start([("round", "starting the SuperLink", self.rounds)])
        return self

    def __exit__(self, *exc) -> None:
        self.out.stop()

    def print(self, text: str, style: str | None = None) -> None:
        self.out.print(text, style)

    def phase(self, text: str) -> None:
        """What is happening now (the bar's label; nothing without a bar)."""
        self.out.update("round", description=text)

    def start_line(self, run_id: str) -> str:
        who = f"{self.clients} clients" if self.clients else "the clients"
        actors = f", {self.actors} at a time" if self.actors else ""
        return (f"[flower-pfl] run {run_id}: starting Ray with {who}{actors}; round 1 is the "
                f"slowest")

    def feed(self, line: str) -> None:
        """One raw line of ``flwr run`` output."""
        if self.verbose:
            self.out.raw(line)
            return
        kind, text = classify(line)
        t = self.track
        if kind == "started":
            if not self.quiet:
                self.print(self.start_line(text))
            self.phase("starting Ray and the client actors")
        elif kind == "round-start":
            n = int(ROUND_START.search(text).group(1))
            if t.started_round(n):
                self.out.update("round", completed=n - 1)
            self.phase(f"round {n}/{self.rounds}" + (" (Ray actors starting)"
                                                     if n == t.first else ""))
        elif kind == "round" and (info := parse_round(text)) is not None:
            eta = t.finished(info)
            self.out.update("round", completed=info.round,
                            eta=f"ETA {fmt_s(eta)}" if eta is not None else "")
            show_devices = info.devices != t.devices
            t.devices = info.devices
            timing = "" if self.out.progress is not None else \
                f"{fmt_s(time.time() - t.started)}, ETA {fmt_s(eta)}"
            if not self.quiet:
                self.print(format_round(info, self.rounds, timing, devices=show_devices))
            if info.round >= self.rounds:
                self.phase("stopping the federation (Ray, SuperLink)")
        elif kind == "ours":
            if not self.quiet:
                self.print(text)
        elif kind == "warning":
            self.print(text, style="bold red" if text.startswith(("ERROR", "CRITICAL"))
                       else "yellow")
        elif kind == "note":
            if text not in self.notes:
                self.notes.add(text)
                self.print(text, style="dim")
        elif kind == "other":
            self.print(text)

    @contextmanager
    def own_warnings(self) -> Iterator[None]:
        """Python warnings raised in this process (e.g. flwr-datasets' while the launcher
        checks the partition) go through the same filter; verbose: left alone."""
        if self.verbose:
            yield
            return
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
        for w in caught:
            self.feed(f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}")

    def summary(self, results_dir: Path, wall_s: float | None,
                tensorboard: Path | None = None) -> None:
        self.out.stop()
        for text in summary_lines(results_dir, wall_s, tensorboard):
            self.print(text, style="bold" if text.startswith(("  personalized", "  global"))
                       else None)


class BenchConsole:
    """The console of ``flower-pfl bench``: the bench's own lines (``log``), and on a
    terminal a bar for the cells (k/N) and one for the round inside the current cell;
    ``verbose`` echoes every cell's Flower log as it is."""

    def __init__(self, cells: int, verbose: bool = False, stream: IO | None = None,
                 bar: bool | None = None) -> None:
        self.out = _Output(stream, bar=False if verbose else bar)
        self.verbose = verbose
        self.cells = cells
        self.track = _RoundTracker(1)
        self.key = ""

    def __enter__(self) -> "BenchConsole":
        self.out.start([("cells", "cells", self.cells), ("round", "", 1)])
        return self

    def __exit__(self, *exc) -> None:
        self.out.stop()

    def log(self, text: str, **_: Any) -> None:
        """The bench's ``log`` (``flush=`` accepted as print's)."""
        self.out.print(text, style="yellow" if ": failed" in text or "invalid" in text
                       else None)

    def cell(self, k: int, key: str, rounds: int) -> None:
        """Cell ``k`` (of ``cells``) starts: ``rounds`` rounds."""
        self.key = key
        self.track = _RoundTracker(rounds)
        self.out.update("cells", completed=k - 1, description=f"cell {k}/{self.cells}")
        self.out.reset("round", total=rounds, description=f"{key}: starting", eta="")

    def cells_done(self, k: int, eta: float | None) -> None:
        self.out.update("cells", completed=k,
                        eta="" if eta is None else f"ETA {fmt_s(eta)}")

    def feed(self, line: str) -> None:
        """One raw line of the current cell's ``flwr run`` output."""
        if self.verbose:
            self.out.raw(line)
            return
        kind, text = classify(line)
        t = self.track
        if kind == "round-start":
            n = int(ROUND_START.search(text).group(1))
            t.started_round(n)
            self.out.update("round", description=f"{self.key}: round {n}/{t.total}")
        elif kind == "round" and (info := parse_round(text)) is not None:
            eta = t.finished(info)
            self.out.update("round", completed=info.round,
                            eta="" if eta is None else f"ETA {fmt_s(eta)}")
        elif kind == "warning" and text.startswith(("ERROR", "CRITICAL")):
            self.out.print(f"[bench]   {self.key}: {text}", style="red")
