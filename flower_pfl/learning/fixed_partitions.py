"""The partitions a user gives instead of drawing them: ``natural`` (a column names each
sample's client: a writer, a hospital, a device) and ``file`` (a JSON or CSV file lists each
client's samples).  Both are checked before anything starts; each refusal names its key.

``natural`` goes through flwr-datasets' ``NaturalIdPartitioner``: client ``i`` holds the
samples of the ``i``-th natural id in sorted order (numbers numerically, whole-number floats
as integers: :func:`natural_ids`); ``clients`` must equal the number of distinct ids, and a
row without an id is refused with the count of such rows.

``file`` (``data.partition-file``):

* JSON: ``{"clients": [[0, 5, 9], [1, 2], ...]}`` or ``{"0": [...], "1": [...]}`` (client
  ids ``0..clients-1``), optionally ``"overlap": true`` where a sample may be in several
  clients (otherwise refused);
* CSV: columns ``client,index`` (one row per sample and client); ``client,id`` instead
  maps ids through the source's ``path`` column (an image folder: the file's path relative
  to the folder, e.g. ``cat/001.png``) or ``data.partition-by``'s column.

Indices are rows of the pooled dataset (an image folder: sorted split, class, file
order; a table: row order; see :mod:`flower_pfl.learning.sources`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from flower_pfl.learning.data import DataError


def natural_ids(column: np.ndarray, key: str) -> np.ndarray:
    """A ``natural`` partition's client column as ids that sort as they read: integers (and
    floats that all hold whole numbers, as a CSV column with a gap is read: 1.0, 2.0, 10.0)
    as int64, other numbers as float64, anything else as text.  A missing id (NaN, None,
    empty text) is refused with its count and first rows (``key`` names the setting):
    such a row belongs to no client."""
    ids = np.asarray(column)
    if ids.dtype.kind in "iu":
        return ids.astype(np.int64)
    if ids.dtype.kind == "f":
        missing = np.isnan(ids)
    else:
        ids = np.array(["" if v is None else str(v).strip() for v in ids.tolist()], dtype=str)
        missing = np.isin(np.char.lower(ids), ["", "nan", "none"])
    if missing.any():
        rows = np.flatnonzero(missing)
        raise DataError(f"'{key}': {len(rows)} of {len(ids)} rows have no client id (empty "
                        f"or NaN; rows {rows[:5].tolist()}{' ...' if len(rows) > 5 else ''}); "
                        f"fill them or drop those rows from the data")
    if ids.dtype.kind == "f":
        return ids.astype(np.int64) if np.array_equal(ids, np.round(ids)) else ids
    return ids


def natural_partition(column: np.ndarray, num_clients: int, key: str) -> list[np.ndarray]:
    """Per-client row indices of a ``natural`` partition by ``column`` (one value per pooled
    sample; ``key`` names the column's setting for errors): client ``i`` holds the rows of
    the ``i``-th id of :func:`natural_ids` in sorted order (numbers numerically: ids 2 and
    10 are clients 0 and 1)."""
    from unittest import mock

    from datasets import Dataset
    from flwr_datasets.partitioner import NaturalIdPartitioner, natural_id_partitioner

    ids = natural_ids(column, key)
    distinct = len(np.unique(ids))
    if distinct != num_clients:
        raise DataError(f"'{key}' names {distinct} distinct clients but 'clients' = "
                        f"{num_clients}; set clients: {distinct}")
    part = NaturalIdPartitioner(partition_by="client")
    part.dataset = Dataset.from_dict({"client": ids.tolist(), "idx": list(range(len(ids)))})
    # flwr-datasets draws a progress bar over the rows (microseconds; even under quiet)
    with mock.patch.object(natural_id_partitioner, "tqdm", lambda rows, **_: rows):
        return [np.asarray(part.load_partition(i)["idx"], dtype=np.int64)
                for i in range(num_clients)]


def _read(path: Path, id_column: np.ndarray | None) -> tuple[dict[int, list[int]], bool]:
    """(client -> rows, overlap allowed) of a partition file."""
    key = "'data.partition-file'"
    if path.suffix.lower() == ".json":
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise DataError(f"{key} = {str(path)!r} cannot be read as JSON ({exc})") from exc
        overlap = bool(doc.get("overlap", False)) if isinstance(doc, dict) else False
        lists = doc.get("clients", doc) if isinstance(doc, dict) else doc
        if isinstance(lists, dict):
            lists = {k: v for k, v in lists.items() if k != "overlap"}
            try:
                table = {int(k): v for k, v in lists.items()}
            except ValueError as exc:
                raise DataError(f"{key}: client ids must be integers ({exc})") from exc
        elif isinstance(lists, list):
            table = dict(enumerate(lists))
        else:
            raise DataError(f"{key} = {str(path)!r}: expected {{\"clients\": [[...], ...]}} or "
                            f"{{\"0\": [...], ...}}")
        for client, rows in table.items():
            if not isinstance(rows, list) or not all(isinstance(r, int) for r in rows):
                raise DataError(f"{key}: client {client}'s samples must be a list of integer "
                                f"row indices")
        return table, overlap
    import pandas as pd

    try:
        frame = pd.read_csv(path)
    except Exception as exc:  # noqa: BLE001 - a file pandas cannot parse
        raise DataError(f"{key} = {str(path)!r} cannot be read as CSV ({exc})") from exc
    if "client" not in frame.columns or not ({"index", "id"} & set(frame.columns)):
        raise DataError(f"{key}: a CSV partition file needs the columns client and index (or "
                        f"client and id); it has {list(frame.columns)}")
    if "index" in frame.columns:
        rows = frame["index"].to_numpy()
    else:
        if id_column is None:
            raise DataError(f"{key}: an 'id' column needs the source's ids (an image folder's "
                            f"paths or data.partition-by's column); give row indices instead")
        where = {str(v): i for i, v in enumerate(id_column)}
        unknown = [v for v in frame["id"].astype(str) if v not in where]
        if unknown:
            raise DataError(f"{key}: id(s) {unknown[:5]} are not in the data")
        rows = np.array([where[v] for v in frame["id"].astype(str)])
    by_client: dict[int, list[int]] = {}
    for client, row in zip(frame["client"].to_numpy(), rows):
        by_client.setdefault(int(client), []).append(int(row))
    return by_client, False


def file_partition(path: str, pooled: int, num_clients: int,
                   id_column: np.ndarray | None = None) -> list[np.ndarray]:
    """Per-client rows from the partition file ``path`` (see the module docstring), checked:
    clients ``0..clients-1`` all present and non-empty, rows in ``[0, pooled)``, no row twice
    in a client, none in two clients unless the file allows overlap.  Raises DataError."""
    key = "'data.partition-file'"
    file = Path(path).expanduser()
    if not file.is_file():
        raise DataError(f"{key} = {path!r} does not exist")
    table, overlap = _read(file, id_column)
    if sorted(table) != list(range(num_clients)):
        extra = sorted(set(table) - set(range(num_clients)))
        missing = sorted(set(range(num_clients)) - set(table))
        raise DataError(f"{key} lists clients {sorted(table)[:10]}... but 'clients' = "
                        f"{num_clients}: " + "; ".join(
                            ([f"clients {missing[:10]} missing (every client needs samples)"]
                             if missing else []) +
                            ([f"clients {extra[:10]} outside 0..{num_clients - 1}"]
                             if extra else [])))
    parts = []
    owner: dict[int, int] = {}
    for client in range(num_clients):
        rows = np.asarray(table[client], dtype=np.int64)
        if len(rows) == 0:
            raise DataError(f"{key}: client {client} has no samples (every client needs some)")
        bad = rows[(rows < 0) | (rows >= pooled)]
        if len(bad):
            raise DataError(f"{key}: client {client} lists row(s) {bad[:5].tolist()} outside "
                            f"the data's 0..{pooled - 1}")
        if len(np.unique(rows)) != len(rows):
            raise DataError(f"{key}: client {client} lists a sample twice")
        if not overlap:
            for r in rows.tolist():
                if owner.setdefault(r, client) != client:
                    raise DataError(f"{key}: sample {r} is in clients {owner[r]} and {client} "
                                    f"(allow it with \"overlap\": true in a JSON file)")
        parts.append(rows)
    return parts


def file_digest(cfg: Mapping[str, Any]) -> str:
    """The partition file's size and modification time (part of the partition's cache key)."""
    path = cfg.get("data.partition-file")
    if cfg.get("data.partition") != "file" or not path:
        return ""
    st = Path(path).expanduser().stat() if Path(path).expanduser().is_file() else None
    return f"{Path(path).expanduser().resolve()}|{st.st_size}|{st.st_mtime_ns}" if st else "absent"
