"""Atomic checkpoints, the resume's configuration check and the results rewind.

One folder per checkpointed round, ``<results>/checkpoint/round-00000R/``, holds
``state.pkl`` (the server's state) and, in simulation, ``client-state/`` (the clients'
personal state, hard-linked: the clients write every file by temporary file + rename,
so a link keeps the old content at no copy cost).  The folder is built under a temporary
name and renamed into place: a crash leaves the old or the new checkpoint, never half.

A resumed run may differ from the run it continues only in :data:`RESUME_FREE_KEYS`
(:func:`config_differences`).  On resume every ``*.csv`` with a ``round`` column drops
the rows of rounds after the checkpoint (:func:`rewind_csv`), so no round is duplicated.

Open choice: ``keep`` checkpoints are kept (default 1, the newest).
"""

from __future__ import annotations

import csv
import os
import pickle
import shutil
from pathlib import Path
from typing import IO, Any, Mapping, Sequence

from flower_pfl.atomic import atomic_write

CHECKPOINT_DIR = "checkpoint"
STATE_FILE = "state.pkl"
CLIENT_STATE = "client-state"


def checkpoint_root(results_dir: str | Path) -> Path:
    return Path(results_dir) / CHECKPOINT_DIR


def round_dir(results_dir: str | Path, server_round: int) -> Path:
    return checkpoint_root(results_dir) / f"round-{server_round:06d}"


def latest_checkpoint(results_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    root = checkpoint_root(results_dir)
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob("round-*") if (p / STATE_FILE).is_file()
                  and not p.name.endswith(".tmp"))
    return done[-1] if done else None


def link_tree(src: Path, dst: Path) -> None:
    """Copy a folder as hard links (a real copy where linking is not possible)."""
    for dirpath, _, files in os.walk(src):
        target = dst / Path(dirpath).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            if ".tmp" in name:
                continue  # a half-written temp file of a client that is still writing
            try:
                os.link(Path(dirpath) / name, target / name)
            except OSError:
                shutil.copy2(Path(dirpath) / name, target / name)


def write_checkpoint(results_dir: str | Path, server_round: int, state: Mapping[str, Any],
                     client_state_dir: Path | None = None, keep: int = 1) -> Path:
    """Atomically write ``state`` (+ a hard-link snapshot of ``client_state_dir``)."""
    final = round_dir(results_dir, server_round)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    atomic_write(tmp / STATE_FILE, lambda fh: pickle.dump(
        dict(state), fh, protocol=pickle.HIGHEST_PROTOCOL), mode="wb", fsync=True)
    if client_state_dir is not None and client_state_dir.is_dir():
        link_tree(client_state_dir, tmp / CLIENT_STATE)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)  # the checkpoint appears whole or not at all
    older = sorted(p for p in checkpoint_root(results_dir).glob("round-*")
                   if p != final and not p.name.endswith(".tmp"))
    for old in older[:max(0, len(older) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_checkpoint(folder: Path) -> dict[str, Any]:
    with open(folder / STATE_FILE, "rb") as fh:
        return pickle.load(fh)


def restore_client_state(folder: Path, client_state_dir: Path) -> None:
    """Replace the live client-state folder by the checkpoint's snapshot (as links)."""
    shutil.rmtree(client_state_dir, ignore_errors=True)
    client_state_dir.mkdir(parents=True, exist_ok=True)
    if (folder / CLIENT_STATE).is_dir():
        link_tree(folder / CLIENT_STATE, client_state_dir)


#: configuration keys a resumed run may set differently from the run it continues: none of
#: them changes a round already run -- how many rounds there are (``rounds``: extend a run,
#: or end a stopped one earlier), where results and caches go, what tracks them, and the
#: time limits and checkpoint interval of the rounds still to come.  Any other key (data,
#: model, strategy, hyper-parameters, seed, sampling, training) would make the continued
#: run a different experiment than its first rounds.
RESUME_FREE_KEYS = ("rounds", "output-dir", "run-name", "cache-dir", "tracking", "engine",
                    "tracking-dir", "checkpoint-every", "stall-timeout", "round-timeout")


def config_differences(saved_values: Mapping[str, Any], saved_hyper: Mapping[str, Any],
                       values: Mapping[str, Any], hyper: Mapping[str, Any],
                       free: Sequence[str] = RESUME_FREE_KEYS) -> list[str]:
    """The keys in which a resumed run's configuration (``values``, ``hyper``) differs from
    the one its checkpoint was written with, leaving out ``free`` keys; each differing
    hyper-parameter is named ``hyper.<name>``."""
    diff = sorted(k for k in set(saved_values) | set(values)
                  if k not in free and saved_values.get(k) != values.get(k))
    diff += sorted(f"hyper.{k}" for k in set(saved_hyper) | set(hyper)
                   if saved_hyper.get(k) != hyper.get(k))
    return diff


def rewind_csv(path: Path, last_round: int) -> int:
    """Drop rows with ``round > last_round``; returns how many rows were dropped."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        rows = list(reader)
    if "round" not in header:
        return 0
    keep = [r for r in rows if r["round"] == "" or int(float(r["round"])) <= last_round]
    if len(keep) == len(rows):
        return 0
    def write(fh: IO[str]) -> None:
        w = csv.DictWriter(fh, fieldnames=header, restval="")
        w.writeheader()
        w.writerows(keep)
    atomic_write(path, write)
    return len(rows) - len(keep)
