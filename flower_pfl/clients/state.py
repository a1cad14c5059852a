"""A client's personal state in ``context.state``, kept only when the server accepts.

:class:`ClientState` gives typed access (arrays, small value dicts) to ``context.state``,
which survives rounds in simulation and deployment (module globals do not).  With a disk
folder (the node's ``state-dir``, or the run's client-state folder in simulation) every
write also goes to disk, whole or not at all (:func:`flower_pfl.atomic.atomic_write`), and a
key missing from memory is read back from there: a restarted SuperNode or a resumed run
gets its personal state back.

A fit's writes are a transaction: staged under ``pending-<key>``, they become the state
only when the server says it accepted that round's upload (``accepted-round`` in the next
message); a rejected upload, a fit that raised and a reply that never arrived leave the
state exactly as it was.  Open choice: a later accepted round also commits an earlier
stage (``accepted >= staged``).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any, Callable, Mapping, Sequence, TypedDict

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, ConfigRecordValues, RecordDict

from flower_pfl.atomic import atomic_write


class _Txn(TypedDict):
    """An open fit's stage: its server round and the keys it wrote (in order)."""

    round: int
    keys: list[str]


class ClientState:
    """Typed access to ``context.state`` (a RecordDict): arrays and small value dicts.

    With ``disk`` (the node's ``state-dir``, or in simulation the run's client-state
    folder, per partition) every write also goes to disk and a key missing from
    ``context.state`` is read back from there -- so a restarted SuperNode (or a resumed
    run) gets its personal state back instead of a fresh model.

    Transactions: ``begin(round)`` ... ``end()`` around a fit stage every write (the fit
    reads its own writes); the stage becomes the state only once the server says it
    ACCEPTED that round's upload (``resolve(accepted_round)`` at the start of the next
    message).  An upload the server rejected, a fit that raised and a reply that never
    arrived therefore leave the personal state exactly as it was.
    """

    PENDING = "pending-"
    TXN = "txn"

    def __init__(self, record_dict: RecordDict, disk_dir: str | Path | None = None) -> None:
        self.records = record_dict
        self.disk = Path(disk_dir) if disk_dir else None
        self._txn: _Txn | None = None

    # -- storage (memory first, then disk)
    def _restore(self, key: str) -> bool:
        if self.disk is None:
            return False
        arrays, values = self.disk / f"{key}.npz", self.disk / f"{key}.json"
        if arrays.is_file():
            with np.load(arrays) as z:
                self.records[key] = ArrayRecord([z[f"a{i}"] for i in range(len(z.files))])
            return True
        if values.is_file():
            self.records[key] = ConfigRecord(OrderedDict(json.loads(values.read_text())))
            return True
        return False

    def _write(self, key: str, suffix: str, write: Callable[[IO[Any]], object],
               mode: str) -> None:
        if self.disk is None:
            return
        self.disk.mkdir(parents=True, exist_ok=True)
        atomic_write(self.disk / f"{key}{suffix}", write, mode)  # a crash leaves the old copy

    def _has(self, key: str) -> bool:
        return key in self.records or self._restore(key)

    def _drop(self, key: str) -> None:
        if key in self.records:
            del self.records[key]
        if self.disk is not None:
            for suffix in (".npz", ".json"):
                (self.disk / f"{key}{suffix}").unlink(missing_ok=True)

    def _rename(self, src: str, dst: str) -> None:
        if not self._has(src):
            return
        self.records[dst] = self.records[src]
        del self.records[src]
        if self.disk is not None:
            for suffix in (".npz", ".json"):
                # (no file: already committed on disk by a message whose in-memory state
                # Flower then discarded because the message failed)
                if (self.disk / f"{src}{suffix}").is_file():
                    os.replace(self.disk / f"{src}{suffix}", self.disk / f"{dst}{suffix}")

    def _key(self, key: str, writing: bool) -> str:
        """The record a read/write goes to: the staged copy inside a transaction."""
        if self._txn is None:
            return key
        if writing:
            if key not in self._txn["keys"]:
                self._txn["keys"].append(key)
            return self.PENDING + key
        return self.PENDING + key if key in self._txn["keys"] else key

    # -- transactions
    def begin(self, server_round: int) -> None:
        self._txn = {"round": int(server_round), "keys": []}

    def end(self) -> None:
        """Close the stage; it waits for the server's verdict (``resolve``)."""
        txn, self._txn = self._txn, None
        if txn is not None and txn["keys"]:
            self.set_values(self.TXN, {"round": txn["round"], "keys": json.dumps(txn["keys"])})

    def abort(self) -> None:
        """Throw away what the current transaction wrote."""
        txn, self._txn = self._txn, None
        for key in txn["keys"] if txn is not None else []:
            self._drop(self.PENDING + key)

    def resolve(self, accepted_round: int) -> None:
        """Commit a staged fit whose round the server accepted; discard it otherwise."""
        meta = self.get_values(self.TXN)
        if not meta:
            return
        keys = json.loads(str(meta["keys"]))
        accepted = int(accepted_round) >= int(meta["round"])
        for key in keys:
            if accepted:
                self._rename(self.PENDING + key, key)
            else:
                self._drop(self.PENDING + key)
        self._drop(self.TXN)

    # -- typed access
    def get_arrays(self, key: str) -> list[np.ndarray] | None:
        key = self._key(key, writing=False)
        if not self._has(key):
            return None
        record = self.records[key]
        if not isinstance(record, ArrayRecord):
            raise TypeError(f"context.state['{key}'] holds a {type(record).__name__}, not arrays")
        return [a.copy() for a in record.to_numpy_ndarrays()]

    def set_arrays(self, key: str, arrays: Sequence[np.ndarray]) -> None:
        key = self._key(key, writing=True)
        arrays = [np.ascontiguousarray(a) for a in arrays]
        self.records[key] = ArrayRecord(arrays)
        named = {f"a{i}": a for i, a in enumerate(arrays)}  # _restore reads a0, a1, ...
        # numpy's stub: a **dict[str, ndarray] might name savez's allow_pickle: bool
        self._write(key, ".npz", lambda fh: np.savez(fh, **named), "wb")  # type: ignore[arg-type]

    def get_values(self, key: str) -> dict[str, Any] | None:
        """The values stored under ``key`` (ConfigRecord values: scalars or lists of them;
        typed Any so that a caller's ``int(meta["fit-rounds"])`` reads as written)."""
        key = self._key(key, writing=False)
        if not self._has(key):
            return None
        record = self.records[key]
        if not isinstance(record, ConfigRecord):
            raise TypeError(f"context.state['{key}'] holds a {type(record).__name__}, not values")
        return dict(record)

    def set_values(self, key: str, values: Mapping[str, ConfigRecordValues]) -> None:
        key = self._key(key, writing=True)
        self.records[key] = ConfigRecord(OrderedDict(values))
        self._write(key, ".json", lambda fh: fh.write(json.dumps(dict(values))), "w")

    def __contains__(self, key: str) -> bool:
        return self._has(self._key(key, writing=False))
