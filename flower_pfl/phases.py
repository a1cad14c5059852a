"""Opt-in phase timer: where a client message's and a server round's time goes.

Off unless ``FLOWER_PFL_PHASES`` names a folder when the ClientApp / ServerApp module is
imported; off, :func:`install` returns at once and nothing is wrapped (the product code runs
exactly as without this module).  On, :func:`install` replaces the named functions and
methods by timing wrappers that call the original with the same arguments and return its
result untouched (metrics are identical on or off: tests/test_phases.py).

Each wrapped call is charged its *own* time: its wall time minus the time of the wrapped
calls nested in it, so the phases of one record add up to the outermost call's wall time.
The outermost wrapped call (a ClientApp message, a server round's fit or evaluate step)
closes a record: one JSON line ``{"role", "pid", "kind", "round", "total_s", "end" (epoch
seconds), "phases": {name: seconds}}``
appended to ``<folder>/<role>-<pid>.jsonl``.  :func:`table` reads a folder back into the
per-phase means (benchmarks/message_phases.py prints them).
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable

ENV = "FLOWER_PFL_PHASES"


def folder() -> Path | None:
    value = os.environ.get(ENV, "")
    return Path(value) if value else None


class Recorder:
    """The open calls of this process (a stack: each frame [name, start, nested seconds])
    and the record being filled; single-threaded use per record (one message at a time)."""

    def __init__(self, out: Path, role: str) -> None:
        self.path = out / f"{role}-{os.getpid()}.jsonl"
        self.role = role
        self.stack: list[list[Any]] = []
        self.phases: dict[str, float] = {}
        self.originals: list[tuple[Any, str, Any]] = []  # (owner, attribute, original)

    def wrap(self, fn: Callable[..., Any], name: str,
             kind: Callable[..., dict[str, Any]] | None = None) -> Callable[..., Any]:
        """``fn`` timed as phase ``name``; ``kind(*args)`` tags the record an outermost call
        closes (e.g. ``{"kind": "train", "round": 3}``)."""
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            frame: list[Any] = [name, time.perf_counter(), 0.0]
            self.stack.append(frame)
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - frame[1]
                self.stack.pop()
                self.phases[name] = self.phases.get(name, 0.0) + elapsed - frame[2]
                if self.stack:
                    self.stack[-1][2] += elapsed
                else:
                    self.close(kind(*args, **kwargs) if kind else {"kind": name}, elapsed)

        # a marker on the function object (install() wraps once): functions take attributes
        timed.__wrapped_by_phases__ = True  # type: ignore[attr-defined]
        return timed

    def close(self, tags: dict[str, Any], total_s: float) -> None:
        record = {"role": self.role, "pid": os.getpid(), **tags, "total_s": total_s,
                  "end": time.time(), "phases": self.phases}
        self.phases = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")


#: a target: (owner object, attribute name, phase name[, record kind from the call's args])
Target = tuple[Any, ...]


def install(role: str, targets: Iterable[Target]) -> Recorder | None:
    """Wrap ``targets`` when :data:`ENV` is set (once per attribute); None when it is not."""
    out = folder()
    if out is None:
        return None
    rec = Recorder(out, role)
    for owner, attr, name, *kind in targets:
        fn = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        if getattr(fn, "__wrapped_by_phases__", False):
            continue
        rec.originals.append((owner, attr, fn))
        setattr(owner, attr, rec.wrap(fn, name, kind[0] if kind else None))
    return rec


def uninstall(rec: Recorder | None) -> None:
    """Put back what :func:`install` wrapped (tests; a process normally keeps it)."""
    for owner, attr, fn in reversed(rec.originals if rec else []):
        setattr(owner, attr, fn)


def read(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in sorted(Path(out).glob("*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]


def table(records: list[dict[str, Any]]) -> tuple[int, float, list[tuple[str, float, float]]]:
    """(records, mean total seconds, [(phase, mean seconds per record, share of the total)],
    biggest first) over ``records``."""
    n = max(len(records), 1)
    total = sum(r["total_s"] for r in records) / n
    names: dict[str, float] = {}
    for r in records:
        for k, v in r["phases"].items():
            names[k] = names.get(k, 0.0) + v
    rows = sorted(((k, v / n, (v / n) / total if total else 0.0) for k, v in names.items()),
                  key=lambda row: -row[1])
    return len(records), total, rows
