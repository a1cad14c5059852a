"""One model per client on the server, in memory or on disk, with its Gram matrix.

Pure numpy; no Flower.  FedAMP, HeurFedAMP and FedACS keep the latest model w_i of every
client and need pairwise quantities (``||w_i - w_j||^2 = G_ii + G_jj - 2 G_ij``, cosines
``G_ij / sqrt(G_ii G_jj)``) and weighted sums ``U = Xi W``.  :class:`ModelStore` keeps

* the rows centred at the reference r (the initial model): ``Xc = X - r``, ``Gc = Xc Xc^T``.
  Distances are shift-invariant and do not cancel catastrophically for close models far
  from 0; raw Gram entries come back as ``G = Gc + b 1^T + 1 b^T + ||r||^2``, ``b = Xc r``;
  ``Xi W = Xi Xc + (Xi 1) r^T``.  A client that never uploaded is r itself (a zero row);
* only the Gram rows of the rows written since the last :meth:`ModelStore.refresh`
  recomputed: O(s n d) for s uploads, not O(n^2 d); a query while rows are stale raises;
* the rows in memory (:class:`MemoryRows`) or in a file (:class:`DiskRows`, positional
  I/O), as float32 or float16 (a per-row scale: its largest |value| is stored as 2^15).

Open choices: float32 rows in memory (the default below the budget) compute the Gram rows
and ``U`` as ONE product each over all n rows (``one_product``), the rows in write order;
every other store reads the rows in column blocks of at most ``Plan.block_bytes`` (float32
products summed in float64, which rounds differently), so its memory is bounded whatever
n x d is.  :func:`plan_store` chooses memory or disk from the budget (YAML
``server.model-store``, ``server.store-dtype``, ``server.memory-budget-mb`` override it).
Checkpoints: the file is the checkpoint of the rows; :meth:`ModelStore.pin` fsyncs it and
pins every row's slot (a later write goes to a free slot), the pickle holds the slot map,
each row's CRC-32, the Gram matrix and r; :meth:`ModelStore.attach` checks the CRCs.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from flower_pfl.store_rows import (  # noqa: F401 - re-exported
    DiskRows,
    LazyArrays,
    MemoryRows,
    RowMatrix,
    StoreFileError,
    column_blocks,
)

BACKENDS = ("auto", "memory", "disk")
DTYPES = ("float32", "float16")
MIN_BLOCK_BYTES = 64 * 1024
MAX_BLOCK_BYTES = 512 * 2**20
ROW_BLOCK = 1024  # rows per block of the (rows x cols) pairwise quantities
F16_TOP = 32768.0  # a float16 row's largest |value| is stored as this
#: row numbers (the clients'), as a list or an integer array
Rows = Sequence[int] | np.ndarray
#: (row numbers r, column numbers c, their block g of the centred Gram) -> the pairwise values
Fill = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


class StaleGramError(RuntimeError):
    """Rows were written but their Gram rows not refreshed: a pairwise value would be stale."""


def default_budget_bytes() -> int:
    """Half of the machine's physical memory."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // 2
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


@dataclass(frozen=True)
class Plan:
    """Where the rows live and how much memory the store's buffers may take."""

    backend: str  # "memory" | "disk"
    dtype: str
    budget_bytes: int
    reason: str = ""

    @property
    def block_bytes(self) -> int:
        """Column-block buffers of one pass over the rows."""
        return int(min(MAX_BLOCK_BYTES, max(MIN_BLOCK_BYTES, self.budget_bytes // 16)))

    @property
    def output_bytes(self) -> int:
        """Computed rows (cloud models, a round's uploads) kept in memory; more goes to disk."""
        return int(max(MIN_BLOCK_BYTES, self.budget_bytes // 8))


def plan_store(num_rows: int, dim: int, dtype: str = "float32", budget_bytes: int | None = None,
               requested: str = "auto") -> Plan:
    """``requested`` memory/disk as given; ``auto``: memory when rows + Gram + buffers fit."""
    if requested not in BACKENDS or dtype not in DTYPES:
        raise ValueError(f"model store {requested!r}/{dtype!r}: expected one of {BACKENDS} and "
                         f"one of {DTYPES}")
    budget = int(budget_bytes) if budget_bytes else default_budget_bytes()
    plan = Plan("memory", dtype, budget)
    rows = num_rows * dim * np.dtype(dtype).itemsize
    # in memory, float32 rows are combined in one product (``one_product``): its copy of
    # the round's rows is at most the rows themselves
    copy = rows if dtype == "float32" else 0
    # the buffers are never larger than the rows they hold
    need = (rows + copy + 4 * num_rows * num_rows + min(plan.block_bytes, rows)
            + min(plan.output_bytes, rows))
    gb = 2.0**30
    if requested != "auto":
        why = f"server.model-store: {requested} (set in the configuration)"
        backend = requested
    else:
        backend = "memory" if need <= budget else "disk"
        why = (f"rows {num_rows} x {dim} {dtype} = {rows / gb:.2f} GiB, with the Gram matrix, "
               f"buffers and copies {need / gb:.2f} GiB {'<=' if backend == 'memory' else '>'} the "
               f"budget {budget / gb:.2f} GiB (server.memory-budget-mb; server.model-store "
               f"overrides the choice)")
    return Plan(backend, dtype, budget, why)


def plan_from_config(values: Mapping[str, Any], num_rows: int, dim: int) -> Plan:
    """The plan for a run's ``server.*`` keys (absent keys: auto, float32, half the RAM)."""
    mb = values.get("server.memory-budget-mb")
    return plan_store(num_rows, dim, str(values.get("server.store-dtype") or "float32"),
                      None if mb is None else int(float(mb) * 2**20),
                      str(values.get("server.model-store") or "auto"))


# ------------------------------------------------------------------------- the store
class ModelStore:
    """n client models (rows) centred at a reference, with an incrementally kept Gram matrix.

    ``update`` (write rows, then refresh), ``sq_distances``, ``cosine``, ``raw_gram``,
    ``drift``, ``combine``, ``model``, ``seen``; ``write``/``refresh`` (one row at a time,
    then one pass), ``combine_rows`` (large outputs) and the checkpoint hooks."""

    #: float32 rows in memory: the Gram rows and Xi W as ONE product over all rows each, as
    #: the results were made with (bit for bit); False: column blocks, as on disk
    one_product = True

    def __init__(self, num_rows: int, reference: np.ndarray, plan: Plan | None = None,
                 folder: str | Path | None = None) -> None:
        self.reference = np.asarray(reference, dtype=np.float32).copy()
        self.ref_sq = float(np.dot(self.reference.astype(np.float64),
                                   self.reference.astype(np.float64)))
        d = self.reference.shape[0]
        self.plan = plan or plan_store(num_rows, d, "float32", None, "memory")
        self.dtype = np.dtype(self.plan.dtype)
        self.folder = None if folder is None else Path(folder)
        if self.plan.backend == "disk":
            if self.folder is None:
                raise ValueError("a disk model store needs a folder for its file")
            self.rows: MemoryRows | DiskRows = DiskRows(
                self.folder / f"model-store-{self.plan.dtype}.bin", num_rows, d, self.dtype)
        else:
            self.rows = MemoryRows(num_rows, d, self.dtype)
        self.gram_c = np.zeros((num_rows, num_rows), dtype=np.float32)  # Xc Xc^T
        self.cross = np.zeros(num_rows, dtype=np.float64)  # b = Xc r
        self.seen = np.zeros(num_rows, dtype=bool)  # written at least once
        self.dirty = np.zeros(num_rows, dtype=bool)  # written, Gram rows not refreshed
        self.dirty_order: list[int] = []  # the dirty rows in the order they were written
        self.scale = np.ones(num_rows, dtype=np.float32)  # float16 rows: value * scale
        self.crc = np.zeros(num_rows, dtype=np.uint32)  # CRC-32 of each stored row (disk)
        self.row_round = np.zeros(num_rows, dtype=np.int64)  # round each row was written

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"dirty_order": [], **state})  # (checkpoints from before it)

    num_rows = property(lambda self: self.gram_c.shape[0])
    dim = property(lambda self: self.reference.shape[0])

    # ------------------------------------------------------------------ rows in, out
    def write(self, i: int, vector: np.ndarray, server_round: int = 0) -> None:
        """Store row i (the model, uncentred); its Gram row is stale until :meth:`refresh`."""
        centred = np.asarray(vector, dtype=np.float32).reshape(self.dim) - self.reference
        if self.dtype == np.float16:
            top = float(np.max(np.abs(centred))) if centred.size else 0.0
            self.scale[i] = top / F16_TOP if top > 0 else 1.0
            centred = (centred / self.scale[i]).astype(np.float16)
        if isinstance(self.rows, DiskRows):
            self.crc[i] = zlib.crc32(np.ascontiguousarray(centred).data)
        self.rows.write(i, centred)
        if not self.dirty[i]:
            self.dirty_order.append(int(i))
        self.seen[i] = self.dirty[i] = True
        self.row_round[i] = server_round

    def update(self, rows: Rows, vectors: np.ndarray, server_round: int = 0) -> None:
        """Replace the models of ``rows``; refresh only their Gram rows/columns."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(np.unique(rows)) != len(rows):
            raise ValueError("duplicate rows in one update")
        vectors = np.asarray(vectors, dtype=np.float32).reshape(len(rows), self.dim)
        for i, vector in zip(rows, vectors):
            self.write(int(i), vector, server_round)
        self.refresh()

    def model(self, row: int) -> np.ndarray:
        """w_row, float32 (the reference for a client that never uploaded)."""
        if not self.seen[row]:
            return self.reference.copy()
        return self.rows.read(row).astype(np.float32) * self.scale[row] + self.reference

    def blocks(self, rows: np.ndarray, per_column_bytes: int = 0
               ) -> Iterator[tuple[int, int, np.ndarray]]:
        """(c0, c1, float32 block of the centred rows ``rows``, columns c0:c1), the width
        chosen so that the buffers (+ ``per_column_bytes`` of the caller's) fit the plan."""
        rows = np.asarray(rows, dtype=np.int64)
        per_col = len(rows) * (4 + (self.dtype.itemsize if self.dtype != np.float32 else 0))
        width = max(1, min(self.dim, self.plan.block_bytes // max(1, per_col + per_column_bytes)))
        if self.dtype == np.float32:
            yield from column_blocks(self.rows, rows, self.dim, width)
            return
        out = np.empty((len(rows), width), np.float32)
        scale = self.scale[rows][:, None]
        for c0, c1, raw in column_blocks(self.rows, rows, self.dim, width):
            view = out[:, :c1 - c0]
            np.multiply(raw, scale, out=view)
            yield c0, c1, view

    def in_one_product(self) -> bool:
        """Whether the Gram and Xi W are computed in one product (see ``one_product``)."""
        return (self.one_product and isinstance(self.rows, MemoryRows)
                and self.dtype == np.float32)

    # ---------------------------------------------------------------------- the Gram
    def refresh(self) -> None:
        """Recompute the Gram rows/columns of the rows written since the last refresh:
        one pass over the stored rows in column blocks, O(dirty x stored x d) (in memory:
        one product, :meth:`refresh_in_one_product`)."""
        rows = np.flatnonzero(self.dirty)
        if len(rows) == 0:
            return
        order, self.dirty_order = self.dirty_order, []
        if self.in_one_product():
            # in write order: BLAS rounds a row's products
            # according to its position in the operand
            written = [i for i in order if self.dirty[i]]
            rest = sorted(set(rows.tolist()) - set(written))  # (recompute(): every stored row)
            self.refresh_in_one_product(np.array(written + rest, dtype=np.int64))
            return
        stored = np.flatnonzero(self.seen)
        pos = np.searchsorted(stored, rows)
        acc = np.zeros((len(rows), len(stored)), dtype=np.float64)
        cross = np.zeros(len(rows), dtype=np.float64)
        for c0, c1, block in self.blocks(stored, per_column_bytes=4 * len(rows)):
            mine = block[pos]
            acc += mine @ block.T  # float32 products, float64 sum over the blocks
            cross += mine @ self.reference[c0:c1]
        self.gram_c[np.ix_(rows, stored)] = acc
        self.gram_c[np.ix_(stored, rows)] = acc.T
        self.cross[rows] = cross
        self.dirty[rows] = False

    def refresh_in_one_product(self, rows: np.ndarray) -> None:
        """The refreshed rows' Gram rows in one product over all n in-memory rows (unseen = 0)."""
        assert isinstance(self.rows, MemoryRows)  # in_one_product(): the rows are in memory
        x = self.rows.data
        if 2 * len(rows) >= self.num_rows:  # one symmetric X X^T (syrk): half the flops
            self.gram_c = x @ x.T
            self.cross = (x @ self.reference).astype(np.float64)
        else:
            changed = x[rows]
            block = changed @ x.T
            self.gram_c[rows, :] = block
            self.gram_c[:, rows] = block.T
            self.cross[rows] = changed @ self.reference
        self.dirty[rows] = False

    def recompute(self) -> None:
        """Full recomputation of the stored rows' Gram matrix (tests, benchmarks)."""
        self.dirty |= self.seen
        self.refresh()

    def _fresh(self) -> None:
        if self.dirty.any():
            raise StaleGramError(f"model store: row(s) {np.flatnonzero(self.dirty)[:10].tolist()}"
                                 f" were written but their Gram rows were not refreshed")

    def _pairwise(self, rows: Rows | None, cols: Rows | None, fill: Fill) -> np.ndarray:
        """(rows x cols) float64 filled ROW_BLOCK rows at a time by ``fill(r, c, g)``."""
        self._fresh()
        rows = np.arange(self.num_rows) if rows is None else np.asarray(rows, dtype=np.int64)
        cols = np.arange(self.num_rows) if cols is None else np.asarray(cols, dtype=np.int64)
        out = np.empty((len(rows), len(cols)), dtype=np.float64)
        for k in range(0, len(rows), ROW_BLOCK):
            r = rows[k:k + ROW_BLOCK]
            g = self.gram_c[np.ix_(r, cols)].astype(np.float64)
            out[k:k + ROW_BLOCK] = fill(r, cols, g)
        return out

    def sq_distances(self, rows: Rows | None = None, cols: Rows | None = None) -> np.ndarray:
        """``||w_i - w_j||^2`` for i in ``rows``, j in ``cols`` (all if None); >= 0."""
        diag = np.diagonal(self.gram_c).astype(np.float64)

        def fill(r: np.ndarray, c: np.ndarray, g: np.ndarray) -> np.ndarray:
            d = diag[r, None] + diag[None, c] - 2.0 * g
            d[r[:, None] == c[None, :]] = 0.0
            return np.maximum(d, 0.0)
        return self._pairwise(rows, cols, fill)

    def drift(self) -> np.ndarray:
        """``||w_i - r||`` of every row: its distance from the reference (initial) model."""
        self._fresh()
        return np.sqrt(np.maximum(np.diagonal(self.gram_c).astype(np.float64), 0.0))

    def raw_gram(self, rows: Rows | None = None, cols: Rows | None = None) -> np.ndarray:
        """``<w_i, w_j>`` of the uncentred models, float64."""
        return self._pairwise(rows, cols, lambda r, c, g: g + self.cross[r, None]
                              + self.cross[None, c] + self.ref_sq)

    def cosine(self, rows: Rows | None = None, cols: Rows | None = None) -> np.ndarray:
        """Cosine similarity of the uncentred models, rows x cols."""
        norms_sq = np.diagonal(self.gram_c).astype(np.float64) + 2 * self.cross + self.ref_sq
        norms = np.sqrt(np.maximum(norms_sq, 1e-30))

        def fill(r: np.ndarray, c: np.ndarray, g: np.ndarray) -> np.ndarray:
            raw = g + self.cross[r, None] + self.cross[None, c] + self.ref_sq
            return np.clip(raw / (norms[r, None] * norms[None, c]), -1.0, 1.0)
        return self._pairwise(rows, cols, fill)

    # ------------------------------------------------------------------ U = Xi W
    def combine_rows(self, weights: np.ndarray, scratch: Path | None = None) -> RowMatrix:
        """``weights @ W`` (m x n weights over all rows) as m float32 rows, in memory or
        -- store on disk, rows larger than ``Plan.output_bytes`` -- in ``scratch``.
        One pass over the stored rows with a non-zero weight: ``Xi W = Xi Xc + (Xi 1) r^T``."""
        weights = np.asarray(weights, dtype=np.float32)
        if self.in_one_product():  # one (m x n) @ (n x d) product
            assert isinstance(self.rows, MemoryRows)
            u = weights @ self.rows.data
            u += weights.sum(axis=1, dtype=np.float32)[:, None] * self.reference[None, :]
            return RowMatrix(u.shape[0], self.dim, self.plan, data=u)
        out = RowMatrix(weights.shape[0], self.dim, self.plan, scratch)
        cols = np.flatnonzero(self.seen & (weights != 0).any(axis=0))
        used = np.ascontiguousarray(weights[:, cols])
        total = weights.sum(axis=1, dtype=np.float32)[:, None]
        for c0, c1, block in self.blocks(cols, per_column_bytes=4 * weights.shape[0]):
            part = used @ block
            part += total * self.reference[None, c0:c1]
            out.rows.write_block(c0, c1, part)
        return out

    def combine(self, weights: np.ndarray) -> np.ndarray:
        """``weights @ W`` for a (m, n) weight matrix over all rows -> (m, d) float32."""
        rows = self.combine_rows(weights).rows
        assert isinstance(rows, MemoryRows)  # no scratch folder: the rows are in memory
        return rows.data

    def rows_per_output(self) -> int:
        """How many float32 model rows fit the plan's output share (blocks of clients)."""
        return max(1, self.plan.output_bytes // (4 * self.dim))

    # ------------------------------------------------------------- checkpoint/resume
    def pin(self) -> None:
        """Before a checkpoint is written: the rows reach the disk and keep their slots."""
        self.rows.pin()

    def release_old_pins(self) -> None:
        """After a checkpoint is written: slots of older checkpoints may be reused."""
        if isinstance(self.rows, DiskRows):
            self.rows.release_old_pins()

    def attach(self, folder: str | Path | None = None, verify: bool = True) -> str:
        """After a resume: reopen the file (in ``folder`` if it is there) and check the
        CRC-32 of every stored row against the checkpoint.  Returns a line for the log."""
        if not isinstance(self.rows, DiskRows):
            return "model store: in memory (rows restored from the checkpoint)"
        if folder is not None and (Path(folder) / self.rows.path.name).is_file():
            self.folder, self.rows.path = Path(folder), Path(folder) / self.rows.path.name
        bad = [int(i) for i in np.flatnonzero(self.seen) if verify
               and zlib.crc32(self.rows.read(int(i)).data) != int(self.crc[i])]
        if bad:
            raise StoreFileError(f"model store file {self.rows.path}: row(s) {bad[:10]} do not "
                                 f"hold what the checkpoint recorded (CRC-32); the file was "
                                 f"changed after the checkpoint")
        return (f"model store: {self.rows.path} ({self.plan.dtype}, {int(self.seen.sum())} "
                f"stored rows{', CRC-32 checked' if verify else ''})")

    def close(self) -> None:
        self.rows.close()
