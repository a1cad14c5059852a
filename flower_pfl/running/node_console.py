"""A deployment command's foreground process: Flower's output shown the project's way.

:func:`foreground` runs one Flower process (a SuperLink, a SuperNode, ``flwr run``) until it
exits or the command is stopped, copying its output to the console and a log through
:func:`pump`; :class:`NodeConsole` decides what a SuperNode's console shows (a ClientApp's
traceback becomes one line).  Used by :mod:`flower_pfl.running.sites`.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Mapping, Sequence

from flower_pfl.reporting.log_lines import strip_ansi
from flower_pfl.running.procs import LaunchError, ProcessSet, Terminated, spawn, stop_on_signals

EXIT_HINTS = {  # flwr.supercore.exit.ExitCode
    302: "the node key is not a valid private key (make one with `flower-pfl node-key`)",
    305: "the SuperLink could not be reached: check the address, and that --ca is the CA of "
         "the server's certificate (which must name that host: `flower-pfl certs --host`)",
}


def say(text: str) -> None:
    """One line of a deployment command's own output (``flower-pfl: ...``)."""
    print(f"flower-pfl: {text}", flush=True)


LEVEL = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*:")  # a Flower log line
CLIENTAPP_RAISED = re.compile(r"^ERROR\s*:\s*ClientApp raised an exception")
TASK_EXIT_800 = re.compile(r"^ERROR\s*:\s*Exit Code: 800\b")
RECEIVING = re.compile(r"Receiving: (\S+) message")
ROUND = re.compile(r"\[RUN \d+, ROUND (\d+)\]")
EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*)(: (.*))?$")


class NodeConsole:
    """What a SuperNode's console shows of Flower's output: every line, except that a
    ClientApp's exception -- Flower logs its traceback and then the task's ``Exit Code:
    800`` for every message -- becomes ONE line naming the message and the error (the
    server gets the same reason in ``failures.csv``); the full text stays in the log.

    With ``hold`` (a retry after a refused activation) nothing is shown until the node is
    connected: a refused retry's output (Flower's exit-code block) stays in the log.

    :meth:`feed` takes one line without ANSI codes and returns what to print: a list of
    lines, where ``None`` stands for the line itself."""

    def __init__(self, log_path: Path | None = None, hold: bool = False) -> None:
        self.log_path = log_path
        self.held: list[str] | None = [] if hold else None  # lines not shown yet
        self.refused = False
        self.state = "pass"  # "trace": in a ClientApp traceback; "exit": in its exit-800 block
        self.message: str = "a"  # the message being handled (Flower's log) and its round
        self.round: int | None = None
        self.exc: list[str] = []  # the exception's text (the last one of a chain)
        self.in_frames = False
        self.last_error: str | None = None
        self.repeats = 0
        self.summarised = False

    def feed(self, line: str) -> list[str | None]:
        text = line.rstrip("\n")
        if self.held is not None:
            self.refused = self.refused or "Failed to activate SuperNode" in text
            if "SuperNode ID:" not in text:
                self.held.append(text)
                return []
            held, self.held = self.held, None
            return held + [None]
        is_log = LEVEL.match(text) is not None
        if self.state != "pass" and not is_log:
            if self.state == "trace":
                self._trace(text)
            return []  # kept in the log only
        out: list[str | None] = [self._summary()] if self.state == "trace" else []
        self.state = "pass"
        if CLIENTAPP_RAISED.match(text):
            self.state, self.exc, self.in_frames = "trace", [], False
            return out
        if TASK_EXIT_800.match(text) and self.summarised:
            self.state, self.summarised = "exit", False  # the same failure, said already
            return out
        match = ROUND.search(text)
        if match:
            self.round = int(match.group(1))
        match = RECEIVING.search(text)
        if match:  # a new message: an exit code after it is its own (the reply's lines, e.g.
            self.message, self.summarised = match.group(1), False  # "Sending", may come first)
        return out + [None]

    def close(self) -> list[str]:
        """At the end of the output: a traceback still open is summarised; held lines are
        shown unless the node was refused again."""
        if self.held is not None:
            return [] if self.refused else self.held
        return [self._summary()] if self.state == "trace" else []

    def _trace(self, text: str) -> None:
        if text.startswith("Traceback (most recent call last)"):
            self.exc, self.in_frames = [], True  # a chain: the outermost comes last
        elif text.startswith((" ", "\t")):
            self.in_frames = True
        elif text.startswith(("During handling of the above exception",
                              "The above exception was the direct cause")):
            self.in_frames = False
        elif text.strip():
            if self.in_frames:
                self.exc, self.in_frames = [], False
            self.exc.append(text.strip())

    def _summary(self) -> str:
        self.state, self.summarised = "pass", True
        error = " ".join(self.exc) or "(no exception text)"
        match = EXC_LINE.match(self.exc[0]) if self.exc else None
        if match:  # flower_pfl.learning.shards.ShardError: ... -> ShardError: ...
            error = match.group(1).rsplit(".", 1)[-1] + (
                f": {' '.join([match.group(3), *self.exc[1:]])}" if match.group(2) else "")
        what = f"the {self.message} message" + (f" of round {self.round}" if self.round else "")
        if error == self.last_error:
            self.repeats += 1
            return (f"flower-pfl: {what} failed on this node with the same error "
                    f"({self.repeats} messages so far)")
        self.last_error, self.repeats = error, 1
        where = f"; the traceback is in {self.log_path}" if self.log_path else ""
        return (f"flower-pfl: {what} failed on this node: {error} (the server records this "
                f"reason in failures.csv{where})")


def pump(proc: subprocess.Popen[str], log_path: Path | None, on_line: Callable[[str], None],
          console: NodeConsole | None = None) -> None:
    """Copy the process' output to our stdout and a log, calling ``on_line`` per line
    (without ANSI codes). Flower colours its log whatever its output is: the log file
    never gets the colour codes, our stdout only on a terminal; ``console`` decides what
    of it our stdout shows."""
    log = open(log_path, "a") if log_path else None
    tty = sys.stdout.isatty()

    def show(lines: Sequence[str | None], line: str, plain: str) -> None:
        for shown in lines:
            sys.stdout.write((line if tty else plain) if shown is None else shown + "\n")
        sys.stdout.flush()

    assert proc.stdout is not None, "started with stdout=PIPE (foreground)"
    try:
        for line in proc.stdout:
            plain = strip_ansi(line)
            if log:
                log.write(plain)
                log.flush()
            show([None] if console is None else console.feed(plain), line, plain)
            on_line(plain)
        if console is not None:
            show(console.close(), "", "")
    finally:
        if log:
            log.close()


def foreground(cmd: list[str], env: Mapping[str, str], what: str,
               on_line: Callable[[str], None], log_path: Path | None = None,
               ready: Callable[[subprocess.Popen[str]], None] | None = None,
               explain: Callable[[], bool] = lambda: True,
               console: NodeConsole | None = None) -> int:
    """Run ``cmd`` until it exits or we are stopped (Ctrl-C, SIGTERM, SIGHUP); every process
    it started is stopped by PID on the way out. ``ready(proc)`` runs once it started;
    ``explain()`` says whether to name a failure's exit code (False: the caller does)."""
    procs = ProcessSet()
    flower_code: list[int] = []  # the exit code Flower names in its log (its docs explain it)

    def watch(line: str) -> None:
        match = re.search(r"Exit Code: (\d+)", line)
        if match:
            flower_code.append(int(match.group(1)))
        on_line(line)

    stop_on_signals()
    try:
        proc = spawn(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                     stdin=subprocess.DEVNULL, text=True)
        procs.procs.append(proc)
        pumping = threading.Thread(target=pump, args=(proc, log_path, watch, console),
                                   daemon=True)
        pumping.start()
        if ready is not None:
            ready(proc)
        code = proc.wait()
        pumping.join(timeout=5)
    except LaunchError as exc:
        say(f"FAILED: {exc}")
        return 1
    except KeyboardInterrupt as exc:
        name = exc.args[0] if isinstance(exc, Terminated) else "interrupted"
        say(f"{name}: stopping the {what} and everything it started")
        return 128 + getattr(exc, "signum", signal.SIGINT)
    finally:
        procs.stop()
    if code != 0 and explain():
        hint = next((f" (Flower's exit code {c}: {EXIT_HINTS[c]})" for c in flower_code
                     if c in EXIT_HINTS), "")
        say(f"the {what} exited with code {code}{hint}")
    return code
