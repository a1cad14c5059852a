"""Data per site: each client machine holds only its own shard, not the whole dataset.

A *shard* is one client's local data exactly as the simulation splits it
(:func:`~flower_pfl.learning.data.load_pooled` +
:func:`~flower_pfl.learning.partitions.get_partition`): its train
and test images as the pooled arrays hold them (uint8 ``(N, C, H, W)``, int64 labels), so
a client that loads its shard gets bit-identical tensors through the same normalisation
(:func:`flower_pfl.learning.data.to_tensor`).  ``flower-pfl partition --config FILE --out DIR``
writes one folder per client, ``DIR/<partition-id>/``, holding

* ``shard.npz``: the arrays ``x_train``, ``y_train``, ``x_test``, ``y_test``;
* ``manifest.json``: ``partition-id``, ``num-partitions``, ``dataset``, ``num-classes``,
  ``counts`` (``train``/``test``), ``label-histogram`` (``train``/``test``, one count per
  class), ``settings-hash`` (:func:`~.partitions.partition_key` of the configuration),
  ``settings`` (the values of :data:`~.partitions.PARTITION_KEYS` the hash is made of,
  for a human to read), ``shard-sha256`` (a checksum of ``shard.npz``) and ``command``
  (how the shard was made).

Both files are written atomically (:func:`flower_pfl.atomic.atomic_write`); the manifest
last, so a folder with a manifest always has a complete shard.

A SuperNode started with ``--node-config 'data-root="<DIR>/<i>" ...'`` loads that shard
(:func:`~.client_data.load_client_data` sees the manifest and calls :func:`load_shard`)
and never the pooled dataset.  The check: the shard is refused, with a message naming
both hashes, every differing setting (``key: shard value vs run value``) and the command
that remakes it, when its ``settings-hash`` is not the run's, when its ``partition-id``
is not the node's, or when ``shard.npz`` does not match its manifest (checksum, counts).
``synthetic-gaussian`` has no data files, so it has no shards either.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sys
import zipfile
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from flower_pfl.atomic import atomic_write, atomic_write_text
from flower_pfl.learning import data, own_data, partitions

MANIFEST = "manifest.json"
SHARD_FILE = "shard.npz"
FORMAT = 1
ARRAYS = ("x_train", "y_train", "x_test", "y_test")
_HIST = re.compile(r"\[\s+([\d,\s]+?)\s+\]")


class ShardError(data.DataError):
    """A shard folder cannot serve this node in this run; the message says how to fix it."""


def settings_of(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The data settings a shard depends on (those :func:`partitions.partition_key` hashes:
    :data:`~.partitions.LATER_KEYS` where they differ from their first value)."""
    later = {k: cfg.get(k, v) for k, v in partitions.LATER_KEYS.items() if cfg.get(k, v) != v}
    return {**{k: cfg[k] for k in partitions.PARTITION_KEYS}, **later}


def is_shard_folder(path: str | os.PathLike[str] | None) -> bool:
    """Whether ``path`` is a folder holding a shard's ``manifest.json``."""
    if not path:
        return False
    return (Path(path).expanduser() / MANIFEST).is_file()


# ------------------------------------------------------------------------- writing
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_shards(cfg: Mapping[str, Any], out_dir: str | os.PathLike[str], command: str = "",
                 on_shard: Callable[[Path, dict[str, Any]], None] | None = None
                 ) -> list[dict[str, Any]]:
    """Write every client's shard of ``cfg`` to ``out_dir/<partition-id>/``; return the
    manifests.  ``command`` is recorded in each manifest (how to remake it);
    ``on_shard(folder, manifest)`` is called after each shard is written."""
    dataset = cfg["data.dataset"]
    if dataset == "synthetic-gaussian":
        raise data.DataError("data.dataset = synthetic-gaussian: no shards are needed (each "
                             "client generates its samples from the run's settings)")
    x, y = data.load_pooled(dataset, cfg["data.root"], cfg.get("cache-dir"),
                            own_data.settings_of(cfg))
    part = partitions.get_partition(cfg, y)
    num_classes = data.NUM_CLASSES[dataset]
    settings = settings_of(cfg)
    key = partitions.partition_key(cfg)
    out = Path(out_dir).expanduser()
    manifests = []
    for pid, (tr, te) in enumerate(zip(part.train, part.test)):
        folder = out / str(pid)
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {"x_train": x[tr], "y_train": y[tr], "x_test": x[te], "y_test": y[te]}
        atomic_write(folder / SHARD_FILE, partial(np.savez_compressed, **arrays), mode="wb")
        manifest = {
            "format": FORMAT,
            "partition-id": pid,
            "num-partitions": int(cfg["clients"]),
            "dataset": dataset,
            "num-classes": num_classes,
            "counts": {"train": int(len(tr)), "test": int(len(te))},
            "label-histogram": {
                "train": np.bincount(y[tr], minlength=num_classes).tolist(),
                "test": np.bincount(y[te], minlength=num_classes).tolist()},
            "settings-hash": key,
            "settings": settings,
            "shard-file": SHARD_FILE,
            "shard-sha256": _sha256(folder / SHARD_FILE),
            "command": command,
        }
        if dataset not in data.POOLED_SIZE:  # your own source: what a site needs of it
            manifest["source"] = dataclasses.asdict(own_data.info(dataset))
        text = _HIST.sub(lambda m: "[" + " ".join(m.group(1).split()) + "]",
                         json.dumps(manifest, indent=2)) + "\n"  # a histogram on one line
        atomic_write_text(folder / MANIFEST, text)
        manifests.append(manifest)
        if on_shard is not None:
            on_shard(folder, manifest)
    return manifests


def stale_folders(out_dir: str | os.PathLike[str], num_partitions: int) -> list[str]:
    """Shard folders in ``out_dir`` that a partition into ``num_partitions`` does not write
    (left from a run with more clients)."""
    out = Path(out_dir).expanduser()
    if not out.is_dir():
        return []
    return sorted((p.name for p in out.iterdir()
                   if p.name.isdigit() and int(p.name) >= num_partitions and is_shard_folder(p)),
                  key=int)


def partition_command(cfg: Mapping[str, Any], out_dir: str | os.PathLike[str],
                      config_path: str = "", overrides: Sequence[str] = (),
                      echo: Callable[[str], None] = print) -> int:
    """``flower-pfl partition``: write the shards, print one line each and the total.
    Returns the exit status (2: nothing to write, or the data cannot be partitioned)."""
    words = ["flower-pfl partition", *(["--config", str(config_path)] if config_path else []),
             *(f"--set {o}" for o in overrides), "--out", str(out_dir)]
    command = " ".join(words)
    if cfg["data.dataset"] == "synthetic-gaussian":
        print("flower-pfl: partition is not needed for data.dataset = synthetic-gaussian (each "
              "client generates its samples from the run's settings; start its SuperNode "
              "without a shard)", file=sys.stderr)
        return 2

    def line(folder: Path, m: dict[str, Any]) -> None:
        echo(f"shard {m['partition-id']}: {m['counts']['train']} train, "
             f"{m['counts']['test']} test -> {folder}")

    try:
        manifests = write_shards(cfg, out_dir, command, on_shard=line)
    except data.DataError as exc:
        print(f"flower-pfl: cannot partition: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"flower-pfl: cannot write the shards to {out_dir}: {exc}", file=sys.stderr)
        return 2
    train = sum(m["counts"]["train"] for m in manifests)
    test = sum(m["counts"]["test"] for m in manifests)
    echo(f"flower-pfl: wrote {len(manifests)} shards ({train} train + {test} test samples, "
         f"{cfg['data.dataset']}/{cfg['data.partition']}, settings-hash "
         f"{partitions.partition_key(cfg)}) to {Path(out_dir).expanduser()}. Copy "
         f"{Path(out_dir) / '<i>'} to client machine i and start its SuperNode with "
         f"`flower-pfl supernode ... --partition-id i --data <that folder>`; on one machine: "
         f"`flower-pfl deploy ... --data-root {out_dir}`.")
    stale = stale_folders(out_dir, len(manifests))
    if stale:
        echo(f"note: {out_dir} also holds shard folders of other settings ({', '.join(stale)}); "
             f"a run with these settings refuses them")
    return 0


# ------------------------------------------------------------------------- loading
def read_manifest(folder: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(folder).expanduser() / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ShardError(f"{path} cannot be read as a shard manifest ({exc}); remake the "
                         f"shards with `flower-pfl partition --config ... --out ...`") from exc
    if not isinstance(manifest, dict):
        raise ShardError(f"{path} is not a shard manifest (a JSON object); remake the shards "
                         f"with `flower-pfl partition --config ... --out ...`")
    return manifest


_MISSING = object()


def _show(value: Any) -> str:
    return "<missing>" if value is _MISSING else json.dumps(value)


def check_shard(manifest: Mapping[str, Any], cfg: Mapping[str, Any], partition_id: int,
                folder: str | os.PathLike[str]) -> None:
    """Raise :class:`ShardError` unless the shard in ``folder`` (its ``manifest``) is this
    run's (same settings hash) and this node's (same partition-id)."""
    problems = []
    shard_pid = manifest.get("partition-id")
    if shard_pid != partition_id:
        problems.append(f"it holds partition-id {shard_pid} but this node is partition-id "
                        f"{partition_id}: point data-root at the folder <out>/{partition_id} "
                        f"that `flower-pfl partition` wrote")
    run_key, shard_key = partitions.partition_key(cfg), manifest.get("settings-hash")
    if shard_key != run_key:
        shard_settings = manifest.get("settings")
        shard_settings = shard_settings if isinstance(shard_settings, dict) else {}
        diff = [f"{k}: {_show(shard_settings.get(k, _MISSING))} vs {_show(v)}"
                for k, v in settings_of(cfg).items()
                if _show(shard_settings.get(k, _MISSING)) != _show(v)]
        made = f" (it was made by `{manifest['command']}`)" if manifest.get("command") else ""
        problems.append(
            f"it was made with other data settings than this run's (settings-hash {shard_key} "
            f"in the shard, {run_key} for the run; differing, shard vs run: "
            f"{'; '.join(diff) or 'none listed'}). Remake the shards with the run's settings: "
            f"`flower-pfl partition --config <the run's YAML> [--set ...] --out <DIR>`{made}, "
            f"and give this machine <DIR>/{partition_id}")
    if problems:
        raise ShardError(f"data-root {folder} is refused: " + "; and ".join(problems))


def load_shard(folder: str | os.PathLike[str], cfg: Mapping[str, Any], partition_id: int
               ) -> data.ClientData:
    """The client data of the shard in ``folder`` (checked with :func:`check_shard` and
    against its manifest), as :func:`flower_pfl.learning.client_data.load_client_data` gives it from
    the pooled set."""
    import torch

    folder = Path(folder).expanduser()
    manifest = read_manifest(folder)
    check_shard(manifest, cfg, partition_id, folder)
    path = folder / SHARD_FILE
    remake = "copy it again or remake it with `flower-pfl partition --config ... --out ...`"
    if not path.is_file():
        raise ShardError(f"{path} is missing (the manifest names it); {remake}")
    if manifest.get("shard-sha256") and _sha256(path) != manifest["shard-sha256"]:
        raise ShardError(f"{path} does not match the checksum in its manifest (changed or "
                         f"truncated); {remake}")
    try:
        with np.load(path) as z:
            arrays = {name: z[name] for name in ARRAYS}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise ShardError(f"{path} cannot be read ({type(exc).__name__}: {exc}); {remake}"
                         ) from exc
    counts = {"train": len(arrays["y_train"]), "test": len(arrays["y_test"])}
    if counts != manifest.get("counts"):
        raise ShardError(f"{path} holds {counts} samples but its manifest says "
                         f"{manifest.get('counts')}; {remake}")
    dataset = cfg["data.dataset"]
    if isinstance(manifest.get("source"), dict):  # your own source: no pool at this site
        source: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                                  for k, v in manifest["source"].items()}
        own_data.register(dataset, own_data.SourceInfo(**source))
    return data.ClientData(data.to_tensor(arrays["x_train"], dataset),
                           torch.from_numpy(arrays["y_train"]),
                           data.to_tensor(arrays["x_test"], dataset),
                           torch.from_numpy(arrays["y_test"]), data.NUM_CLASSES[dataset])
