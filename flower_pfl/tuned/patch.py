"""Functions of ours put in the place of Flower's, in one process, undoably.

Each replacement of :mod:`flower_pfl.tuned` keeps one :class:`Replaced`: it sets the
attribute and remembers Flower's own object as it stood in its owner's namespace
(``vars(owner)[name]``: a plain function, or a property), so that ours can call Flower's,
tests can put Flower's back (:meth:`Replaced.undo`) and compare against it
(:meth:`Replaced.flowers`), installed or not.  :func:`kept` reads a replacement's
measurement override (``FLOWER_PFL_FLOWER_*=1``: that one replacement left out).
"""

from __future__ import annotations

import os
from typing import Any


def kept(keep_flower_env: str) -> bool:
    """True when ``keep_flower_env`` is set to 1: that replacement keeps Flower's own."""
    return os.environ.get(keep_flower_env) == "1"


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
