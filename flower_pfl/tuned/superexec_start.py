"""A tuned SuperNode starts its SuperExec through :mod:`flower_pfl.tuned.entry`.

Flower 1.42's SuperNode (isolation ``subprocess``, the default) starts its SuperExec in
``start_client_internal`` (``flwr/supernode/start_client_internal.py``) with
``subprocess.Popen(["flower-superexec", ...TLS args, "--runtime-api-address", ADDR,
"--parent-pid", PID])``, found on ``PATH``.  The SuperExec starts a ``flwr-clientapp``
process per message (``SubprocessExecutor.launch``): to put our warm launcher
(:mod:`flower_pfl.tuned.warm_clientapp`) there, :func:`install` gives that module a
``subprocess`` of ours (:class:`SuperExecThroughEntry`) whose ``Popen`` starts
``python -m flower_pfl.tuned.entry flower-superexec ARGS`` in place of ``flower-superexec
ARGS``, the same arguments; any other command is Flower's.  The SuperExec process then
checks its own needs (a mismatch: Flower's launcher there, one line in the node's log).

Installed in the SuperNode's process with :mod:`.node_waits` (``engine: tuned``).
``FLOWER_PFL_FLOWER_SUPEREXEC=1`` keeps Flower's ``flower-superexec`` (and so its
per-message processes).  No Flower import at module level.
"""

from __future__ import annotations

import subprocess
from typing import Any

from flower_pfl.tuned.gate import Need
from flower_pfl.tuned.patch import Replaced

#: set to 1 to keep Flower's SuperExec (a new ClientApp process per message)
KEEP_FLOWER_ENV = "FLOWER_PFL_FLOWER_SUPEREXEC"

_SCI = "flwr.supernode.start_client_internal"
#: what of Flower's :func:`install` replaces (flower_pfl/tuned/gate.py)
NEEDS = [
    Need(f"{_SCI}:subprocess"),  # the module's name for ``subprocess``: ours goes there
    Need(f"{_SCI}:start_client_internal", "body", "9e89a6eb68fbec68"),  # its Popen: 1.42.0's
]
#: the program Flower starts, and what ours starts in its place
PROGRAM = "flower-superexec"


class SuperExecThroughEntry:
    """The ``subprocess`` module, but ``Popen([PROGRAM, *args], ...)`` starts
    ``[python, -m, flower_pfl.tuned.entry, PROGRAM, *args]``."""

    def Popen(self, args: Any, *rest: Any, **kwargs: Any) -> Any:  # noqa: N802
        if isinstance(args, list) and args and args[0] == PROGRAM:
            from flower_pfl.tuned import programs

            args = [*programs.command("tuned", program=PROGRAM), *args[1:]]
        return subprocess.Popen(args, *rest, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)


#: what :func:`install` puts in Flower's place (before ``flower_supernode()`` starts the
#: SuperExec; flower_pfl/tuned/patch.py)
_replaced = Replaced({f"{_SCI}:subprocess": SuperExecThroughEntry()})
install, installed, uninstall = _replaced.install, _replaced.installed, _replaced.undo
