"""Say a thing once: the one "warn once" of the project.

A mechanism that is switched off (FedAMP's peer mass, HeurFedAMP's flat attention,
FedACS's selection, Self-FL's collapsing sigma_0^2) is checked every round but named in
the log once per run.  The memory of what was said is a plain ``set`` that its owner
keeps -- a strategy's ``self.warned`` (set in ``PersonalizedStrategy.__init__``), a
console's notes -- never a module global: several runs in one process (the tests, the
in-process engine) each warn for themselves.  It is not checkpointed: a resumed run
starts with nothing said and says it again.  No Flower import at module level, so
:func:`first_time` suits code that runs before Flower is loaded (the console's notes);
:func:`warn_once` logs to Flower's logger.
"""

from __future__ import annotations

from logging import WARNING
from typing import Hashable, MutableSet, TypeVar

#: what a set remembers: a key of the owner's choosing (the console's: the line itself)
K = TypeVar("K", bound=Hashable)


def first_time(given: MutableSet[K], key: K) -> bool:
    """True the first time ``key`` is seen in ``given`` (and remembers it), False after."""
    if key in given:
        return False
    given.add(key)
    return True


def warn_once(given: MutableSet[K], key: K, message: str, *args: object) -> bool:
    """Log ``message % args`` as a WARNING the first time ``key`` is seen in ``given``;
    returns whether it was logged."""
    if not first_time(given, key):
        return False
    from flwr.common.logger import log

    log(WARNING, message, *args)
    return True


def record_every_warning() -> None:
    """Inside ``warnings.catch_warnings(record=True)``: record every warning each time
    (``always``) except the deprecations that libraries raise about each other (typer's
    about click when Flower's CLI is imported, ...): a user can act on none of them, and
    Python hides them by default.  A deprecation attributed to flower_pfl is kept."""
    import warnings

    warnings.simplefilter("always")
    for category in (DeprecationWarning, PendingDeprecationWarning):
        warnings.filterwarnings("ignore", category=category)
        warnings.filterwarnings("always", category=category, module=r"flower_pfl(\.|$)")
