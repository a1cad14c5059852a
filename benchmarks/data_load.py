"""Load + partition time and peak memory: an image folder vs the built-in Fashion-MNIST loader.

Usage (the full measurement for docs/BENCHMARKS.md; ~2-4 min, writes ~70,000 PNGs to a temp
folder first, removed at the end; run it on a quiet machine)::

    heavy .venv/bin/python benchmarks/data_load.py            # 70,000 images
    heavy .venv/bin/python benchmarks/data_load.py --images 5000 --clients 20   # a quick look

FMNIST's pooled images (the first ``--images`` of the 70,000) are exported once to
``<tmp>/fmnist-png/<label>/<row>.png`` (:mod:`flower_pfl.learning.export`; not timed).  Then
four fresh Python processes each load the pooled arrays and make the partition
(``data.partition: dirichlet``, ``--clients`` clients, the stratified split), each with its
wall time and peak resident memory (``ru_maxrss``, the whole process: Python, numpy,
torchvision, datasets):

* ``fmnist`` first run: an empty cache (IDX files unpacked, the ``.npy`` copy written);
* ``fmnist`` cached: the same cache (the ``.npy`` memory-mapped, the partition read);
* ``imagefolder`` first run: an empty cache (every PNG decoded by torchvision's
  ``ImageFolder`` + PIL, the ``.npy`` copy and the partition written);
* ``imagefolder`` cached: the same cache (the folder's files stat-ed for the fingerprint,
  then as the built-in one).

Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, resource, sys, time
start = time.perf_counter()
from flower_pfl import config
from flower_pfl.learning import data, own_data, partitions
args = json.loads(sys.argv[1])
tree = {"clients": args["clients"], "cache-dir": args["cache"], "seed": 0,
        "data": {"dataset": args["dataset"], "partition": "dirichlet", "subsample": None}}
values = config.validate(tree, source="bench").values
x, y = data.load_pooled(values["data.dataset"], None, values["cache-dir"],
                        own_data.settings_of(values))
part = partitions.get_partition(values, y)
seconds = time.perf_counter() - start
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": seconds, "peak_mb": peak_mb, "samples": int(len(y)),
                  "clients": len(part.train)}))
"""


def measure(dataset: str, cache: Path, clients: int) -> dict:
    """One fresh process: load + partition ``dataset``; its time and peak memory."""
    arg = json.dumps({"dataset": dataset, "cache": str(cache), "clients": clients})
    done = subprocess.run([sys.executable, "-c", CHILD, arg], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{dataset}: the child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=70_000)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--keep", help="keep the temporary folder here (a path)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from flower_pfl.learning import data, export

    tmp = Path(args.keep or tempfile.mkdtemp(prefix="flower-pfl-data-load-"))
    try:
        x, y = data.load_pooled("fmnist")
        folder = tmp / "fmnist-png"
        started = time.perf_counter()
        if not folder.is_dir():
            export.export_png(x, y, folder, range(min(args.images, len(y))))
        print(f"exported {min(args.images, len(y))} PNGs to {folder} in "
              f"{time.perf_counter() - started:.0f} s (not part of the timings)", flush=True)
        rows = []
        for name, dataset in (("fmnist (built-in)", "fmnist"),
                              ("image folder", f"imagefolder:{folder}")):
            cache = tmp / f"cache-{'fmnist' if dataset == 'fmnist' else 'folder'}"
            shutil.rmtree(cache, ignore_errors=True)
            for run in ("first run", "cached"):
                m = measure(dataset, cache, args.clients)
                rows.append((name, run, m))
                print(f"{name}, {run}: {m['seconds']:.1f} s, peak {m['peak_mb']:.0f} MB",
                      flush=True)
        print("\n| loader | run | samples | clients | load + partition | peak memory |")
        print("|---|---|---:|---:|---:|---:|")
        for name, run, m in rows:
            print(f"| {name} | {run} | {m['samples']:,} | {m['clients']} | "
                  f"{m['seconds']:.1f} s | {m['peak_mb']:.0f} MB |")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
