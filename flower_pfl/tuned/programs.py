"""The command line that starts one of Flower's node-side programs under an engine:
``python -m flower_pfl.tuned.entry PROGRAM`` (tuned) or Flower's own binary (stock).
Read by the launchers (:mod:`flower_pfl.running.deploy`, ``flower-pfl supernode``), by
:mod:`flower_pfl.tuned.superexec_start` and by :mod:`flower_pfl.tuned.entry` itself; it
imports nothing of Flower or of the switch.
"""

from __future__ import annotations

import sys

ENTRY_MODULE = "flower_pfl.tuned.entry"

#: Flower's program -> (the switch's process, Flower's function "module:name")
PROGRAMS: dict[str, tuple[str, str]] = {
    "flower-supernode": ("supernode", "flwr.supernode.cli:flower_supernode"),
    "flower-superexec": ("superexec", "flwr.supercore.cli:flower_superexec"),
}


def command(engine: str, flower_binary: str = "flower-supernode",
            program: str = "flower-supernode") -> list[str]:
    """The start of the command line of Flower's ``program`` for ``engine``: this module
    under this Python (``tuned``), or Flower's ``flower_binary`` (``stock``).  Raises
    ``ValueError`` for another ``engine`` or a ``program`` not in :data:`PROGRAMS`."""
    if program not in PROGRAMS:
        raise ValueError(f"program must be one of {list(PROGRAMS)}, not {program!r}")
    if engine == "tuned":
        return [sys.executable, "-m", ENTRY_MODULE, program]
    if engine == "stock":
        return [flower_binary]
    raise ValueError(f"engine must be one of ['tuned', 'stock'], not {engine!r}")
