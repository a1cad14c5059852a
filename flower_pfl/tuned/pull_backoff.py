"""Flower's object pulls: an object not there yet looked for again within 0.05-0.2 s, not 1-10 s.

Flower 1.42 moves a message as a tree of objects (``flwr/supercore/inflatable``).  Whoever
receives one pulls each object with ``inflatable_utils.pull_objects``; an object its sender
has not stored yet (``ObjectUnavailableError``) is asked for again after a backoff that
starts at ``PULL_INITIAL_BACKOFF`` = 1 s and doubles up to 10 s (``initial_backoff`` /
``backoff_cap``, keyword defaults; no caller passes them).  On a deployment's message path
that happens twice per message, every time: the SuperNode stores a message and creates its
task *before* pulling its objects from the SuperLink (``_pull_and_store_message``), so the
ClientApp it starts finds them missing and waits 1 s (``pull_and_inflate_object_from_tree``
in ``run_clientapp.pull_task_input``); and the SuperNode itself often asks for objects the
ServerApp is still pushing, and waits 1 s too.  Traced (docs/deployment.md): 2-4 s of each
fit or evaluate step.

:func:`install` sets both functions' keyword defaults (``__kwdefaults__``):
``initial_backoff`` :data:`INITIAL_S`, ``backoff_cap`` :data:`CAP_S`, so a missing object is
looked for again after 0.05, 0.1, 0.2, 0.2, ...  s (traced: with Flower's doubling alone the
ClientApp's looks drifted to 1.6 s apart while its node was still pulling), and
``max_tries_per_object`` :data:`TRIES`, so that an object that never comes is given up after
about as long as Flower waits (its 500 tries wait 1 + 2 + 4 + 8 + 495 x 10 = 4,965 s between
them; ours 0.05 + 0.1 + 24,826 x 0.2 = 4,965 s); ``max_time`` and every request are
Flower's.  Where it applies: a SuperNode and a deployment's ServerApp (this process), and
the ClientApps a tuned SuperExec forks (:func:`fork_server_args`: the warm parent sets the
same defaults before it forks; the SuperExec itself pulls nothing).  Installed by
:func:`flower_pfl.tuned.switch.install` after :data:`NEEDS` are met (the ``body`` checks:
Flower 1.42.0's functions, whose defaults are the only place the backoff is set).
``FLOWER_PFL_FLOWER_PULL=1`` keeps Flower's 1-10 s.  No Flower import at module level.
"""

from __future__ import annotations

import importlib
from typing import Any

from flower_pfl.tuned.gate import Need

#: set to 1 to keep Flower's 1-s first backoff when an object is not there yet
KEEP_FLOWER_ENV = "FLOWER_PFL_FLOWER_PULL"

MODULE = "flwr.supercore.inflatable.inflatable_utils"
#: the functions whose ``initial_backoff`` default is shortened
FUNCTIONS = ("pull_objects", "pull_and_inflate_object_from_tree")
#: what of Flower's :func:`install` changes (flower_pfl/tuned/gate.py)
NEEDS = [
    Need(f"{MODULE}:pull_objects", "body", "31bb2de46b450e6a"),  # Flower 1.42.0's
    Need(f"{MODULE}:pull_and_inflate_object_from_tree", "body", "139811483a15e4a6"),
]
#: Flower's first wait for an object not there yet, and ours, in seconds
FLOWER_INITIAL_S, INITIAL_S = 1.0, 0.05
#: Flower's longest wait between two asks, and ours, in seconds
FLOWER_CAP_S, CAP_S = 10.0, 0.2
#: tries per object before giving up: Flower's 500, and ours (the same 4,965 s of waiting)
FLOWER_TRIES, TRIES = 500, 24828
#: the keyword defaults ours sets
OURS = {"initial_backoff": INITIAL_S, "backoff_cap": CAP_S, "max_tries_per_object": TRIES}

#: name -> (Flower's function, its keyword defaults)
_saved: dict[str, tuple[Any, dict[str, Any]]] = {}


def install() -> None:
    """Set :data:`OURS` in the keyword defaults of :data:`FUNCTIONS`, in this process (the
    switch checked :data:`NEEDS` first; a second call sets the same)."""
    module = importlib.import_module(MODULE)
    for name in FUNCTIONS:
        fn = getattr(module, name)
        if name not in _saved:
            _saved[name] = (fn, dict(fn.__kwdefaults__))
        fn.__kwdefaults__ = {**_saved[name][1], **OURS}


def installed() -> bool:
    """True while ours is in Flower's place."""
    return bool(_saved)


def uninstall() -> None:
    """Put Flower's keyword defaults back."""
    for fn, defaults in _saved.values():
        fn.__kwdefaults__ = defaults
    _saved.clear()


def fork_server_args() -> list[str]:
    """The warm parent's option that sets the same defaults in the ClientApps it forks
    (:mod:`.fork_server` ``--kwdefaults``); none while this is not installed."""
    if not installed():
        return []
    return ["--kwdefaults", ",".join(f"{MODULE}:{name}.{param}={value}"
                                     for name in FUNCTIONS for param, value in OURS.items())]
