"""Reading a run's folder: its JSON files and its CSV tables (or a slimmed cell's
compressed series).  Standard library only, below everything else in reporting/: the
results writer, the coverage record, compare and the bench tables read through it."""

from __future__ import annotations

import csv
import io
import json
import zipfile
from pathlib import Path
from typing import Any


def read_json(path: Path) -> Any | None:
    """A JSON file's content; None where it is missing or not (yet) whole JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``summary.json`` (None: none yet)."""
    return read_json(Path(run_dir) / "summary.json")


def read_values(run_dir: Path) -> dict[str, Any]:
    """The run's configuration values (dotted keys) from ``config.json``; {} without one
    (a results folder copied by hand)."""
    conf = read_json(Path(run_dir) / "config.json")
    return dict(conf.get("values", {})) if isinstance(conf, dict) else {}


# A slimmed cell (docs/results/) keeps its per-round series in this one compressed file.
SERIES = "series.zip"


def read_rows(run_dir: Path, name: str) -> list[dict[str, str]]:
    """The rows of ``<name>.csv`` (rounds, clients, fit, server, ...) as strings, or of that
    member of the cell's SERIES archive; [] without either."""
    path = Path(run_dir) / f"{name}.csv"
    if not path.is_file():
        archive = Path(run_dir) / SERIES
        if not archive.is_file():
            return []
        with zipfile.ZipFile(archive) as zf:
            if f"{name}.csv" not in zf.namelist():
                return []
            text = zf.read(f"{name}.csv").decode()
        return list(csv.DictReader(io.StringIO(text)))
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))
