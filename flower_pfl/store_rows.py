"""Rows of float values in memory or in a file, read whole or in column blocks.

Pure numpy; no Flower.  The storage layer of :mod:`flower_pfl.model_store` and the float32
row matrices a round computes (cloud models, a round's uploads: :class:`RowMatrix`, in
memory or in a scratch file).  A file is a raw C-order array of row slots
(``np.memmap(path, dtype, "r", shape=(slots, d))`` opens it); a checkpoint pins the slots
it holds and a row written later goes to a free slot (copy on write).

Open choice: the file is read and written with positional I/O (``os.preadv``/``os.pwrite``),
not through a mapping: the touched pages of a mapping count in the process's resident set
until unmapped, while pages read with ``pread`` stay in the kernel's page cache, which the
kernel reclaims.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, overload

import numpy as np


class Plan(Protocol):
    """What a :class:`RowMatrix` reads of :class:`flower_pfl.model_store.Plan`."""

    @property
    def backend(self) -> str: ...

    @property
    def block_bytes(self) -> int: ...

    @property
    def output_bytes(self) -> int: ...


class StoreFileError(RuntimeError):
    """The store's file does not hold what the checkpoint says (missing, changed, truncated)."""


class MemoryRows:
    """Rows in one numpy array (untouched rows cost no memory: zero pages)."""

    def __init__(self, num_rows: int, dim: int, dtype: Any) -> None:
        self.data = np.zeros((num_rows, dim), dtype=dtype)

    dtype = property(lambda self: self.data.dtype)

    def write(self, i: int, values: np.ndarray) -> None:
        self.data[i] = values

    def read(self, i: int) -> np.ndarray:
        return self.data[i]

    def read_block(self, rows: np.ndarray, c0: int, c1: int, out: np.ndarray) -> None:
        out[...] = self.data[rows, c0:c1]  # (np.take would copy all n rows' columns first)

    def write_block(self, c0: int, c1: int, block: np.ndarray) -> None:
        self.data[:, c0:c1] = block

    def pin(self) -> None:
        pass

    def close(self, delete: bool = False) -> None:
        pass


class DiskRows:
    """Rows in slots of a raw file; ``slot[i]`` is row i's slot (-1: never written).

    ``pins`` are slot maps of checkpoints: a slot in a pin is never overwritten (a row
    written again goes to a free slot).  ``identity``: row k is slot k (scratch outputs)."""

    def __init__(self, path: str | Path, num_rows: int, dim: int, dtype: Any,
                 identity: bool = False) -> None:
        self.path, self.dim, self.dtype = Path(path), int(dim), np.dtype(dtype)
        self.row_bytes = self.dim * self.dtype.itemsize
        self.slot = np.arange(num_rows) if identity else np.full(num_rows, -1, np.int64)
        self.slots = num_rows if identity else 0
        self.pins: list[np.ndarray] = []
        self._free: list[int] | None = None
        self._fd: int | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k not in ("_fd", "_free", "pins")}

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _fd=None, _free=None, pins=[state["slot"].copy()])

    def fd(self) -> int:
        if self._fd is None:
            if not self.path.is_file():
                raise StoreFileError(f"model store file {self.path} is missing")
            self._fd = os.open(self.path, os.O_RDWR)
            self.slots = max(self.slots, os.fstat(self._fd).st_size // self.row_bytes)
        return self._fd

    def _take_slot(self) -> int:
        if self._free is None:
            used = np.concatenate([self.slot, *self.pins])
            self._free = sorted(set(range(self.slots)) - set(used[used >= 0].tolist()),
                                reverse=True)
        if self._free:
            return self._free.pop()
        self.slots += 1
        return self.slots - 1

    def write(self, i: int, values: np.ndarray) -> None:
        fd, s = self.fd(), int(self.slot[i])
        if s < 0 or any(int(p[i]) == s for p in self.pins):
            s = self._take_slot()  # copy on write: a checkpoint's slot keeps its row
            self.slot[i] = s
        buf = np.ascontiguousarray(values, dtype=self.dtype).data.cast("B")
        done = 0
        while done < len(buf):
            done += os.pwrite(fd, buf[done:], s * self.row_bytes + done)

    def _read_into(self, out: np.ndarray, offset: int) -> None:
        got = os.preadv(self.fd(), [out.data.cast("B")], offset)
        if got != out.nbytes:
            raise StoreFileError(f"model store file {self.path} is truncated (read {got} of "
                                 f"{out.nbytes} bytes at offset {offset})")

    def read(self, i: int) -> np.ndarray:
        out = np.empty(self.dim, self.dtype)
        self._read_into(out, int(self.slot[i]) * self.row_bytes)
        return out

    def read_block(self, rows: np.ndarray, c0: int, c1: int, out: np.ndarray) -> None:
        offset = c0 * self.dtype.itemsize
        for k, i in enumerate(rows):
            self._read_into(out[k], int(self.slot[i]) * self.row_bytes + offset)

    def write_block(self, c0: int, c1: int, block: np.ndarray) -> None:
        fd, offset = self.fd(), c0 * self.dtype.itemsize
        for k in range(block.shape[0]):
            buf = np.ascontiguousarray(block[k], dtype=self.dtype).data.cast("B")
            done = 0
            while done < len(buf):
                done += os.pwrite(fd, buf[done:], int(self.slot[k]) * self.row_bytes + offset
                                  + done)

    def pin(self) -> None:
        """fsync, then keep the current slot of every row until :meth:`release_old_pins`."""
        os.fsync(self.fd())
        self.pins.append(self.slot.copy())
        self._free = None

    def release_old_pins(self) -> None:
        self.pins, self._free = self.pins[-1:], None

    def close(self, delete: bool = False) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if delete:
            self.path.unlink(missing_ok=True)


class RowMatrix:
    """m float32 rows (memory or a scratch file): whole rows, column blocks, or an array."""

    def __init__(self, num_rows: int, dim: int, plan: Plan, scratch: Path | None = None,
                 data: np.ndarray | None = None) -> None:
        """``data``: the rows, an (m x d) float32 array computed in memory, held as is."""
        self.shape = (int(num_rows), int(dim))
        self.block_bytes = plan.block_bytes
        big = num_rows * dim * 4 > plan.output_bytes and plan.backend == "disk"
        self.rows: MemoryRows | DiskRows = (
            DiskRows(scratch, num_rows, dim, np.float32, identity=True)
            if big and scratch is not None and data is None
            else MemoryRows(num_rows, dim, np.float32))
        if data is not None:
            assert isinstance(self.rows, MemoryRows)  # data given: the rows are in memory
            self.rows.data = np.asarray(data, dtype=np.float32).reshape(self.shape)

    def write(self, k: int, vector: np.ndarray) -> None:
        self.rows.write(k, vector)

    def row(self, k: int) -> np.ndarray:
        return self.rows.read(k)

    def blocks(self, dtype: Any = np.float32) -> Iterator[tuple[int, int, np.ndarray]]:
        """Column blocks as ``dtype``; the width leaves room for two temporaries of it."""
        m, d = self.shape
        extra = 0 if np.dtype(dtype) == np.float32 else 2 * np.dtype(dtype).itemsize
        width = max(1, min(d, self.block_bytes // max(1, (4 + extra) * m)))
        for c0, c1, block in column_blocks(self.rows, np.arange(m), d, width):
            yield c0, c1, block.astype(dtype, copy=False)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.empty(self.shape, np.float32)
        self.rows.read_block(np.arange(self.shape[0]), 0, self.shape[1], out)
        return out if dtype is None else out.astype(dtype, copy=False)

    def close(self) -> None:
        self.rows.close(delete=True)


def column_blocks(source: MemoryRows | DiskRows, rows: np.ndarray, dim: int, width: int
                  ) -> Iterator[tuple[int, int, np.ndarray]]:
    """(c0, c1, block) with block[k] = columns c0:c1 of row rows[k]; ONE buffer, reused."""
    raw = np.empty((len(rows), width), source.dtype)
    for c0 in range(0, dim, width):
        c1 = min(dim, c0 + width)
        view = raw[:, :c1 - c0]
        source.read_block(rows, c0, c1, view)
        yield c0, c1, view


class LazyArrays(Sequence[np.ndarray]):
    """A client's upload kept serialised, each array decoded when it is read: a round's
    uploads are then held once (as the transport's bytes), not a second time decoded."""

    def __init__(self, blobs: Sequence[bytes], decode: Callable[[bytes], np.ndarray]) -> None:
        self.blobs, self.decode = blobs, decode

    def __len__(self) -> int:
        return len(self.blobs)

    @overload
    def __getitem__(self, i: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, i: slice) -> list[np.ndarray]: ...

    def __getitem__(self, i: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(i, slice):
            return [self.decode(b) for b in self.blobs[i]]
        return self.decode(self.blobs[i])
