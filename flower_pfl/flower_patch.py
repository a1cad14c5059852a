"""Functions of ours put in the place of Flower's, in one process, undoably.

``linkstate_lookup``, ``engine_wakeup`` and ``actor_queue`` each replace a few of Flower's
functions or methods in the process that runs its simulation engine.  Each keeps one
:class:`Replaced`: it sets the attribute and remembers Flower's own object as it stood in
its owner's namespace (``vars(owner)[name]``: a plain function, or a property), so that
ours can call Flower's, tests can put Flower's back (:meth:`Replaced.undo`) and compare
against it (:meth:`Replaced.flowers`), installed or not.  :func:`wanted` is the check all
three make first: not switched off by their ``FLOWER_PFL_FLOWER_*`` variable, and -- where
asked -- only in a process where Flower's simulation engine is loaded.
"""

from __future__ import annotations

import os
import sys
from typing import Any

#: the module of Flower's simulation engine; loaded only in the process that runs it
ENGINE_MODULE = "flwr.server.superlink.fleet.vce.vce_api"


def wanted(keep_flower_env: str, engine_loaded_only: bool = False) -> bool:
    """False when ``keep_flower_env`` is set to 1 (keep Flower's own), or with
    ``engine_loaded_only`` in a process where Flower's simulation engine is not loaded."""
    if os.environ.get(keep_flower_env) == "1":
        return False
    return not engine_loaded_only or ENGINE_MODULE in sys.modules


class Replaced:
    """What was put in Flower's place: name -> (owner, Flower's own object)."""

    def __init__(self) -> None:
        self.saved: dict[str, tuple[Any, Any]] = {}

    def __bool__(self) -> bool:
        return bool(self.saved)

    def put(self, owner: Any, name: str, ours: Any) -> None:
        """``owner.name = ours``, remembering Flower's own the first time."""
        if name not in self.saved:
            self.saved[name] = (owner, vars(owner)[name])
        setattr(owner, name, ours)

    def flowers(self, name: str, owner: Any) -> Any:
        """Flower's own ``name`` of ``owner``, replaced or not."""
        return self.saved[name][1] if name in self.saved else vars(owner)[name]

    def undo(self) -> None:
        """Put Flower's own objects back."""
        for name, (owner, original) in self.saved.items():
            setattr(owner, name, original)
        self.saved.clear()
