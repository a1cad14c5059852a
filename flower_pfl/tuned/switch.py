"""``engine: tuned | stock``: every replacement of Flower's code, installed in one call.

The ServerApp's ``main`` calls :func:`install` first thing, with the run's ``engine`` (the
YAML key; ``flower-pfl run --engine``), before it builds its strategy and before Flower's
simulation engine, starting Ray in the same process meanwhile, builds its actor pool and
starts its threads.  Importing this package replaces nothing.  What :func:`install` decides,
in this order, each ending in exactly one log line:

1. ``engine: stock``: nothing replaced (Flower as released);
2. which of Flower's processes this is (``process``, :data:`SETS`): the simulation's
   ServerApp (:data:`REPLACEMENTS`), a deployment's ServerApp (:data:`DEPLOYED_SERVERAPP`:
   its 3-s reply polling), a SuperNode (:data:`SUPERNODE`: its 3-s idle wait, its SuperExec
   started through our entry) or that SuperExec (:data:`SUPEREXEC`: ClientApp processes
   forked warm); the last two installed by :mod:`flower_pfl.tuned.entry`; the three
   deployment processes also shorten the 1-s first wait for an object not there yet;
3. the version gate (:func:`flower_pfl.tuned.gate.outside_tested`): a Flower (or Ray)
   outside the release series the replacements were tested on -- Flower as released, and
   a WARNING line naming the versions;
4. every :data:`~flower_pfl.tuned.gate.Need` of every replacement checked
   (:func:`flower_pfl.tuned.gate.unmet`: the private names each touches, the signatures,
   the Flower bodies ours re-implements): one unmet -- Flower as released, and a WARNING
   line naming each unmet need;
5. else every replacement of :data:`REPLACEMENTS` put in Flower's place but those left out
   by their measurement override (``FLOWER_PFL_FLOWER_LOOKUP`` / ``_TICK`` / ``_POOL`` =1).

The replacements (docs/engine.md lists the Flower functions each stands in for):
:mod:`~flower_pfl.tuned.linkstate_lookup`, :mod:`~flower_pfl.tuned.engine_wakeup`,
:mod:`~flower_pfl.tuned.actor_queue` (simulation); :mod:`~flower_pfl.tuned.grid_poll`
and :mod:`~flower_pfl.tuned.array_packing` (a deployment's ServerApp; the ClientApp's
mod follows it), :mod:`~flower_pfl.tuned.node_waits` and
:mod:`~flower_pfl.tuned.superexec_start` (a SuperNode),
:mod:`~flower_pfl.tuned.warm_clientapp` (its SuperExec), :mod:`~flower_pfl.tuned.pull_backoff`
(all three, and the ClientApps forked warm).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from logging import INFO, WARNING
from types import ModuleType
from typing import Any, Callable

from flower_pfl.tuned import (
    actor_queue,
    array_packing,
    engine_wakeup,
    gate,
    grid_poll,
    linkstate_lookup,
    node_waits,
    pull_backoff,
    superexec_start,
    warm_clientapp,
)
from flower_pfl.tuned.patch import kept

#: the module of Flower's simulation engine; loaded only in the process that runs it
ENGINE_MODULE = "flwr.server.superlink.fleet.vce.vce_api"
#: every replacement of the simulation's process: a module with NEEDS, KEEP_FLOWER_ENV,
#: install, installed, uninstall
REPLACEMENTS: tuple[ModuleType, ...] = (linkstate_lookup, engine_wakeup, actor_queue)
#: those of a deployment's ServerApp process (``flwr-serverapp``)
DEPLOYED_SERVERAPP: tuple[ModuleType, ...] = (grid_poll, pull_backoff, array_packing)
#: those of a SuperNode process (``flower-supernode``, started through entry)
SUPERNODE: tuple[ModuleType, ...] = (node_waits, superexec_start, pull_backoff)
#: those of a SuperNode's SuperExec (``flower-superexec``, started through entry; its
#: pull_backoff reaches the ClientApps it forks)
SUPEREXEC: tuple[ModuleType, ...] = (warm_clientapp, pull_backoff)
#: process -> (what the one line calls its engine, its replacements)
SETS: dict[str, tuple[str, tuple[ModuleType, ...]]] = {
    "simulation": ("simulation engine", REPLACEMENTS),
    "serverapp": ("deployment engine (ServerApp)", DEPLOYED_SERVERAPP),
    "supernode": ("deployment engine (SuperNode)", SUPERNODE),
    "superexec": ("deployment engine (SuperExec)", SUPEREXEC),
}
#: every replacement of every process (undone by :func:`uninstall`)
EVERY: tuple[ModuleType, ...] = tuple(dict.fromkeys(
    REPLACEMENTS + DEPLOYED_SERVERAPP + SUPERNODE + SUPEREXEC))
#: the values of the ``engine`` key
ENGINES = ("tuned", "stock")
#: how the one line starts where Flower runs as released although ``tuned`` was asked for
FALLBACK = "[flower-pfl] engine: stock --"


def name(module: ModuleType) -> str:
    """``engine_wakeup``: a replacement's short name."""
    return module.__name__.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Installed:
    """What :func:`install` did: ``engine`` (``"tuned"`` where anything of ours is in
    Flower's place, else ``"stock"``), the replacements put in place and those left out by
    their override (short names, :data:`REPLACEMENTS`' order), and the one ``line`` it
    logged at ``level``."""

    engine: str
    replaced: tuple[str, ...]
    kept: tuple[str, ...]
    line: str
    level: int = INFO


_last: tuple[tuple[Any, ...], Installed] | None = None  # (the request, what it did)


def in_simulation(grid: Any) -> bool:
    """True in the process that runs Flower's simulation engine: its module is loaded and
    the ServerApp's grid is the in-memory one (``pull_interval``); a deployment's
    ServerApp talks to its SuperLink over gRPC."""
    return ENGINE_MODULE in sys.modules and hasattr(grid, "pull_interval")


def where(simulation: bool, process: str | None) -> str:
    """The key of :data:`SETS` for this process: ``process`` if given, else
    ``"simulation"`` or ``"serverapp"`` (a deployment's).  Raises ``ValueError`` for a
    ``process`` not in :data:`SETS`."""
    if process is None:
        return "simulation" if simulation else "serverapp"
    if process not in SETS:
        raise ValueError(f"process must be one of {list(SETS)}, not {process!r}")
    return process


def decide(engine: str, *, simulation: bool = False, process: str | None = None,
           version_of: Callable[[str], str | None] = gate.installed_version) -> Installed:
    """What :func:`install` does (nothing replaced, nothing logged) in the process
    ``process`` (:func:`where`).  Raises ``ValueError`` for an ``engine`` not in
    :data:`ENGINES` or a ``process`` not in :data:`SETS`."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {list(ENGINES)}, not {engine!r}")
    label, replacements = SETS[where(simulation, process)]
    if engine == "stock":
        return Installed("stock", (), (), f"[flower-pfl] {label}: stock (engine: stock): "
                                          f"Flower as released")
    outside = gate.outside_tested(version_of)
    if outside is not None:
        tested = ", ".join(f"{d} {s}.x" for d, s in gate.TESTED.items())
        return Installed("stock", (), (), f"{FALLBACK} {outside} is outside what the tuned "
                         f"engine was tested on ({tested}): Flower runs as released",
                         WARNING)
    wanted = [m for m in replacements if not kept(m.KEEP_FLOWER_ENV)]
    left = tuple(name(m) for m in replacements if m not in wanted)
    unmet = gate.unmet([need for m in wanted for need in m.NEEDS])
    if unmet:
        return Installed("stock", (), (), f"{FALLBACK} this Flower lacks what the tuned "
                         f"engine touches: {'; '.join(unmet)} (flower_pfl/tuned): Flower "
                         f"runs as released", WARNING)
    replaced = tuple(name(m) for m in wanted)
    overrides = "".join(f"; {name(m)} kept Flower's ({m.KEEP_FLOWER_ENV}=1)"
                        for m in replacements if m not in wanted)
    return Installed("tuned" if replaced else "stock", replaced, left,
                     f"[flower-pfl] {label}: tuned on flwr {version_of('flwr')}: "
                     f"{', '.join(replaced) or 'nothing'} in Flower's place{overrides}")


def install(engine: str, *, simulation: bool = False, process: str | None = None,
            version_of: Callable[[str], str | None] = gate.installed_version,
            log: Callable[..., None] | None = None) -> Installed:
    """Decide (:func:`decide`: every check made before anything is replaced), put the
    chosen replacements in Flower's place, log the one line (``log(level, fmt, text)``;
    default Flower's logger) and say what was done.  A second call with the same request
    returns the first's answer and logs nothing; another request undoes the first's
    replacements first (between runs, never during one).  Raises ``ValueError`` for an
    ``engine`` not in :data:`ENGINES` or a ``process`` not in :data:`SETS`."""
    global _last
    request = (engine, where(simulation, process), version_of)
    if _last is not None and _last[0] == request:
        return _last[1]
    done = decide(engine, simulation=simulation, process=process, version_of=version_of)
    uninstall()
    for module in EVERY:
        if name(module) in done.replaced:
            module.install()
    if log is None:
        from flwr.common.logger import log as flower_log

        log = flower_log
    log(done.level, "%s", done.line)
    _last = (request, done)
    return done


def uninstall() -> None:
    """Put Flower's own back everywhere (tests; between in-process runs)."""
    global _last
    for module in EVERY:
        module.uninstall()
    _last = None
