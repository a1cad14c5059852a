"""The run's initial model, built once before a run and handed to its ServerApp.

Every strategy starts from ``learning.models.initial_arrays(values)``: the configured model,
initialised from the run's seed.  Building it imports torch, which the ServerApp's process
avoids (importing this CUDA build costs a process ~280 MB of private memory), so the
ServerApp builds it in a short-lived child process (``server_app.initial_arrays_apart``).
``flower-pfl run`` already starts one such child before the run -- the preflight check,
which builds the same model to check it against the data -- so that child also writes the
arrays (:func:`write`), and the ServerApp reads them (:func:`read`, numpy only) instead of
importing torch a second time at the busiest moment of a run's start.

The file names the configuration it was built for (the validated values, as JSON); a
ServerApp whose configuration differs (a resumed run with more rounds, say), a file that is
not there (``flwr run`` without the launcher, a ServerApp on another machine) or one that
cannot be read gets None and builds the arrays in its child as before.  Either way the
arrays are bit for bit the same (tests/test_sim_memory.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from flower_pfl.atomic import atomic_write

#: the file's entry naming the configuration its arrays were built for
CONFIG_KEY = "configuration"
#: where ``flower-pfl run`` has the preflight child write it: in the run's results folder,
#: removed when the run ends
FILE = ".initial-arrays.npz"
#: what the ServerApp logs (flwr-run.log) when it read the file, and when it built the arrays
READ = "read from the preflight check's file"
BUILT = "built in a child process"


def fingerprint(values: Mapping[str, Any]) -> str:
    """The configuration ``values`` as one canonical JSON text."""
    return json.dumps(dict(values), sort_keys=True, default=str)


def write(path: str | os.PathLike[str], values: Mapping[str, Any]) -> None:
    """Build ``initial_arrays(values)`` (imports torch) and save them with their
    configuration in ``path`` (.npz), whole or not at all."""
    from flower_pfl.learning.models import initial_arrays

    arrays = {f"arr_{i}": a for i, a in enumerate(initial_arrays(dict(values)))}
    arrays[CONFIG_KEY] = np.array(fingerprint(values))
    # allow_pickle=False: float arrays and one str array, read back with allow_pickle=False
    atomic_write(path, lambda fh: np.savez(fh, allow_pickle=False, **arrays), mode="wb")


def read(path: str | os.PathLike[str] | None, values: Mapping[str, Any]
         ) -> list[np.ndarray] | None:
    """The arrays :func:`write` saved in ``path`` for this configuration ``values``; None
    when there is no such file, it was built for another configuration, or it cannot be
    read."""
    if not path or not Path(path).is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if CONFIG_KEY not in z.files or str(z[CONFIG_KEY]) != fingerprint(values):
                return None
            return [z[f"arr_{i}"] for i in range(len(z.files) - 1)]
    except (OSError, ValueError, KeyError):
        return None
