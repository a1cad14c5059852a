"""Functions of ours put in the place of Flower's, in one process, undoably: the piece every
replacement of :mod:`flower_pfl.tuned` is built on.

A replacement declares one :class:`Replaced` with its places -- ``"module:Owner.name"``, as
a :class:`~flower_pfl.tuned.gate.Need` names them -- and what goes in each: ours, or a
:class:`From` (ours made of Flower's own object, e.g. a wrapper).  It binds its module's
``install`` / ``installed`` / ``uninstall`` / ``flowers_own`` to that object's methods, which
the switch (:mod:`flower_pfl.tuned.switch`) and the tests call.  :meth:`Replaced.install`
imports the owners (Flower's modules: never at import), sets each place once and remembers
Flower's own object as it stood in its owner's namespace (``vars(owner)[name]``: a plain
function, a property, a module), so that ours can call Flower's, tests can put Flower's back
(:meth:`Replaced.undo`) and compare against it (:meth:`Replaced.flowers`), installed or not.
(:mod:`.pull_backoff` changes the keyword defaults of Flower's functions, which stay in
place: it keeps its own three functions.)  :func:`kept` reads a replacement's measurement
override (``FLOWER_PFL_FLOWER_*=1``: that one replacement left out); :func:`say` writes one
line to Flower's log.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from flower_pfl.tuned.gate import locate


def kept(keep_flower_env: str) -> bool:
    """True when ``keep_flower_env`` is set to 1: that replacement keeps Flower's own."""
    return os.environ.get(keep_flower_env) == "1"


def say(level: int, text: str) -> None:
    """``text`` as one line of Flower's log (``flwr-run.log``, a node's log; WARNING and
    above on the console too)."""
    from flwr.common.logger import log

    log(level, "%s", text)


@dataclass(frozen=True)
class From:
    """What goes in a place, made of Flower's own object there when installed."""

    make: Callable[[Any], Any]


class Replaced:
    """What is put in Flower's place: ``places`` (``"module:Owner.name"`` -> ours or a
    :class:`From`), installed by :meth:`install`; ``saved``: name -> (owner, Flower's own
    object)."""

    def __init__(self, places: Mapping[str, Any] | None = None) -> None:
        self.places = dict(places or {})
        self.saved: dict[str, tuple[Any, Any]] = {}

    def __bool__(self) -> bool:
        return bool(self.saved)

    def put(self, owner: Any, name: str, ours: Any) -> None:
        """``owner.name = ours``, remembering Flower's own the first time."""
        if name not in self.saved:
            self.saved[name] = (owner, vars(owner)[name])
        setattr(owner, name, ours)

    def install(self) -> None:
        """Put ours in every place, in order (once: a second call changes nothing; the
        caller, :func:`flower_pfl.tuned.switch.install`, checked the replacement's needs)."""
        if self.saved:
            return
        for where, ours in self.places.items():
            owner, name = locate(where)
            self.put(owner, name, ours.make(vars(owner)[name]) if isinstance(ours, From)
                     else ours)

    def installed(self) -> bool:
        """True while ours is in Flower's place."""
        return bool(self.saved)

    def flowers(self, name: str, owner: Any = None) -> Any:
        """Flower's own ``name`` of ``owner`` (default: the owner of the place of that name;
        ``KeyError`` for a name no place has), replaced or not."""
        if name in self.saved:
            return self.saved[name][1]
        if owner is None:
            owner = next((o for o, n in map(locate, self.places) if n == name), None)
            if owner is None:
                raise KeyError(name)
        return vars(owner)[name]

    def undo(self) -> None:
        """Put Flower's own objects back."""
        for name, (owner, original) in self.saved.items():
            setattr(owner, name, original)
        self.saved.clear()
