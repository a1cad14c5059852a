"""Run results on disk: ``<output-dir>/<run-name>/``.

* ``config.json``   -- the validated configuration of the run
* ``rounds.csv``    -- one row per evaluation round: statistics of the personalized (and,
                       where the strategy has one, global) accuracies over ALL clients
* ``clients.csv``   -- one row per client per evaluation round
* ``server.csv``    -- per-round server-side quantities a strategy logs (e.g. FedACS delta)
* ``summary.json``  -- everything above plus BMTA, rewritten after every round so that a
                       crash loses nothing already measured
* ``<name>.npy/.png`` -- matrices a strategy saves (FedAMP attention, FedACS mask)

Everything is appended/rewritten as it happens, not only at the end.
"""

from __future__ import annotations

import csv
import json
import os
import struct
import time
import zlib
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from flower_pfl.metrics import STAT_KEYS, best_mean


class ResultsWriter:
    def __init__(self, out_dir: Path, config: Mapping[str, Any]) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rounds: list[dict[str, Any]] = []
        self.server_rows: list[dict[str, Any]] = []
        self.started = time.time()
        self.status = "running"
        self.lower_is_better = False
        _write_json(self.dir / "config.json", config)
        self._write_summary()

    def log_round(self, server_round: int, personal: Mapping[str, float],
                  global_: Mapping[str, float] | None, clients: Sequence[Mapping[str, Any]],
                  lower_is_better: bool = False) -> None:
        row: dict[str, Any] = {"round": server_round,
                               "elapsed_s": round(time.time() - self.started, 3)}
        row.update({f"personal_{k}": personal[k] for k in STAT_KEYS})
        if global_ is not None:
            row.update({f"global_{k}": global_[k] for k in STAT_KEYS})
        self.rounds.append(row)
        self.lower_is_better = lower_is_better
        row["personal_bmta"] = self._best("personal_mean")
        _append_csv(self.dir / "rounds.csv", row)
        _append_csv(self.dir / "clients.csv", [{"round": server_round, **c} for c in clients])
        self._write_summary()

    def _best(self, key: str) -> float:
        """BMTA: best per-round mean so far (max; min for an error metric such as mse)."""
        values = [{"mean": -r[key] if self.lower_is_better else r[key]} for r in self.rounds]
        best = best_mean(values)
        return -best if self.lower_is_better else best

    def log_server(self, server_round: int, values: Mapping[str, Any]) -> None:
        row = {"round": server_round, **values}
        self.server_rows.append(row)
        _append_csv(self.dir / "server.csv", row)

    def log_table(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Append rows to ``<name>.csv`` (e.g. FedACS' peers per client per round)."""
        _append_csv(self.dir / f"{name}.csv", rows)

    def save_matrix(self, name: str, matrix: np.ndarray, labels: Sequence[int] | None = None
                    ) -> None:
        np.save(self.dir / f"{name}.npy", np.asarray(matrix))
        if labels is not None:
            np.save(self.dir / f"{name}_ids.npy", np.asarray(labels))
        write_heatmap_png(self.dir / f"{name}.png", np.asarray(matrix, dtype=np.float64))

    def finish(self, status: str) -> None:
        self.status = status
        self._write_summary()

    def _write_summary(self) -> None:
        summary: dict[str, Any] = {"status": self.status, "rounds": self.rounds,
                                   "server": self.server_rows,
                                   "elapsed_s": round(time.time() - self.started, 3)}
        if self.rounds:
            last = self.rounds[-1]
            summary["final"] = {k: v for k, v in last.items() if k != "round"}
            summary["bmta"] = self._best("personal_mean")
            if "global_mean" in last:
                summary["global_bmta"] = self._best("global_mean")
        _write_json(self.dir / "summary.json", summary)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_jsonable))
    os.replace(tmp, path)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


def _append_csv(path: Path, rows: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
    """Append row(s) in one write. Missing columns stay empty; only a NEW column (e.g. a
    metric that appears later) makes the file be rewritten with the union of columns."""
    rows = [dict(rows)] if isinstance(rows, Mapping) else [dict(r) for r in rows]
    if not rows:
        return
    header: list[str] = []
    if path.exists():
        with path.open() as fh:
            header = next(csv.reader(fh), [])
    fields = list(dict.fromkeys(header + [k for r in rows for k in r]))
    if header and fields != header:
        with path.open() as fh:
            rows = list(csv.DictReader(fh)) + rows
        header = []
    with path.open("a" if header else "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields, restval="")
        if not header:
            w.writeheader()
        w.writerows(rows)


# A few anchors of the viridis colour map, interpolated linearly.
_VIRIDIS = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]],
                    dtype=np.float64)


def write_heatmap_png(path: Path, matrix: np.ndarray, cell: int = 0) -> None:
    """Write ``matrix`` as a colour heatmap PNG (min -> dark purple, max -> yellow).

    Dependency-free (zlib + struct).  ``cell`` pixels per entry; 0 picks a size that makes
    the image roughly 400-800 pixels wide.
    """
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2 or m.size == 0:
        raise ValueError("heatmap needs a non-empty 2-D matrix")
    cell = cell or max(1, 600 // max(m.shape))
    lo, hi = np.nanmin(m), np.nanmax(m)
    t = np.zeros_like(m) if hi <= lo else (m - lo) / (hi - lo)
    pos = np.nan_to_num(t) * (len(_VIRIDIS) - 1)
    i0 = np.clip(np.floor(pos).astype(int), 0, len(_VIRIDIS) - 2)
    frac = (pos - i0)[..., None]
    rgb = (_VIRIDIS[i0] * (1 - frac) + _VIRIDIS[i0 + 1] * frac).astype(np.uint8)
    rgb = np.repeat(np.repeat(rgb, cell, axis=0), cell, axis=1)
    height, width = rgb.shape[:2]
    raw = b"".join(b"\x00" + rgb[r].tobytes() for r in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))

    png = (b"\x89PNG\r\n\x1a\n"
           + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
    Path(path).write_bytes(png)
