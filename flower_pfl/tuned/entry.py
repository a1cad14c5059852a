"""``python -m flower_pfl.tuned.entry PROGRAM ARGS``: one of Flower's node-side programs,
with the tuned engine's replacements for that process in place.

Flower's console scripts ``flower-supernode`` and ``flower-superexec`` each call one
function that reads ``sys.argv``.  To put anything of ours in those processes, the
launchers (``flower-pfl deploy``, ``flower-pfl supernode``;
:func:`flower_pfl.tuned.programs.command`) start this
module instead of ``flower-supernode`` when the run's ``engine`` is ``tuned`` (Flower's own
binary when it is ``stock``), and the SuperNode, once tuned, starts this module in place of
``flower-superexec`` (:mod:`flower_pfl.tuned.warm_clientapp`).  :func:`main` installs the
process' replacements (:func:`flower_pfl.tuned.switch.install` with ``process=`` the
program's entry of :data:`PROGRAMS`: the version gate, every need checked, one log line; on
a mismatch Flower runs as released), then hands the arguments to Flower's function
unchanged.  The first argument names the program it stands for, so the process list
still shows ``flower-supernode`` / ``flower-superexec``.
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable, Sequence

from flower_pfl.tuned.programs import PROGRAMS


def main(argv: Sequence[str] | None = None,
         run: Callable[[], object] | None = None) -> object:
    """Install the replacements of ``argv[0]``'s process, then run Flower's function for it
    (``run``, default the one :data:`PROGRAMS` names) with ``sys.argv = argv``.  ``argv``
    (default ``sys.argv[1:]``) must start with a program of :data:`PROGRAMS`;
    ``SystemExit(2)`` otherwise.  Returns what ``run`` returns."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in PROGRAMS:
        print(f"usage: python -m {__name__} {{{','.join(PROGRAMS)}}} [its arguments]",
              file=sys.stderr)
        raise SystemExit(2)
    from flower_pfl.tuned import switch

    process, target = PROGRAMS[argv[0]]
    switch.install("tuned", process=process)
    if run is None:
        module, _, name = target.partition(":")
        run = getattr(importlib.import_module(module), name)
    sys.argv = argv
    return run()


if __name__ == "__main__":
    # Flower's program functions return None or an exit status; sys.exit passes either on
    sys.exit(main())  # type: ignore[arg-type]  # typeshed: sys.exit takes a str | int | None
