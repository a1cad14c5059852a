"""Checkpoint and resume of a strategy (docs/reliability.md), written once.

Every ``checkpoint-every`` rounds (:meth:`Checkpointing.checkpoint_before`, at the start of
the next round) :meth:`Checkpointing.save_checkpoint` writes, atomically
(:mod:`flower_pfl.reliability.checkpoints`), the round, the configuration's identity, the
strategy's state and the results state; :meth:`Checkpointing.after_round` also writes one after the
run's last round and after a round at whose end ``flower-pfl run`` asked it to stop (status
``stopped``; or, under client-level DP, ``budget-exhausted`` before a round that would take ε
past ``privacy.target-epsilon``).  The DP accountant's state goes with the strategy's
(:data:`PRIVACY_STATE`).  :meth:`Checkpointing.resume` continues from the newest one, rewinding the
results files so that no round is written twice; only the configuration keys that cannot
change the past (``checkpoints.RESUME_FREE_KEYS``: ``rounds`` extends a run) may differ.

The strategy's state is an allow-list: each class names the attributes it saves in a
class attribute ``checkpointed`` (a tuple of names), and a checkpoint holds the union of
those names along the class's MRO (:func:`checkpointed_names`) -- the base's (the global
model, the whole ``ClientStore``, the sampling RNG, the metric history, the run's id)
and each subclass's own (FedAMP's store lives in the ``ClientStore``; Self-FL's sigma_0^2,
SCAFFOLD's c, pFedHN's hypernetwork, ...).  An attribute not named is not saved: caches,
connections, the configuration, per-round scratch and warnings already given are rebuilt
by ``__init__`` and ``initialize_parameters``.  ``checkpoint_state``/``restore_state``
remain the hooks for state kept outside ``self``.  A mixin of ``PersonalizedStrategy``:
it uses ``self.cfg``, ``self.hyper``, ``self.results`` and ``self.client_state_dir``.
"""

from __future__ import annotations

import time
from logging import INFO
from pathlib import Path
from typing import Any

from flwr.common.logger import log

from flower_pfl.privacy.fields import client_delta
from flower_pfl.reliability import checkpoints
from flower_pfl.reliability.stop import stop_requested
from flower_pfl.strategies.federation import ResumeError
from flower_pfl.strategies.state import StrategyState

#: the status of a run that stopped before the round that would exceed its target ε
BUDGET_EXHAUSTED = "budget-exhausted"
#: the checkpoint entry holding client-level DP's accountant (privacy/accountant.py)
PRIVACY_STATE = "privacy-accountant"


class Checkpointing(StrategyState):
    """save_checkpoint / resume and the state they carry (see the module docstring)."""

    #: what this class saves (see the module docstring); subclasses add their own names
    checkpointed: tuple[str, ...] = ()

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything needed to continue after the last finished round: the attributes
        named by :func:`checkpointed_names` (a named attribute that is missing is an
        error, not a silent gap in the checkpoint).  Override (call super) to add state
        kept outside ``self``."""
        missing = [name for name in checkpointed_names(type(self)) if not hasattr(self, name)]
        if missing:
            raise AttributeError(f"{type(self).__name__} names {missing} in 'checkpointed' "
                                 f"but has no such attribute(s)")
        state = {name: getattr(self, name) for name in checkpointed_names(type(self))}
        dp = getattr(self, "dp", None)
        if dp is not None:  # client-level DP's accountant: a resumed run continues its ε
            state[PRIVACY_STATE] = dp.state()
        return state

    def restore_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`checkpoint_state` (default: set the named attributes back)."""
        for name in checkpointed_names(type(self)):
            if name in state:
                setattr(self, name, state[name])
        dp = getattr(self, "dp", None)
        if dp is not None:
            if PRIVACY_STATE not in state:
                raise ResumeError("the checkpoint holds no privacy accountant state but "
                                  "privacy.mode is client-level: its ε cannot be continued")
            dp.restore(state[PRIVACY_STATE])

    # -------------------------------------------------------------- checkpoint/resume
    def checkpoint_before(self, server_round: int) -> None:
        """At the start of round ``server_round``: every ``checkpoint-every`` rounds, the
        checkpoint of the state after round ``server_round - 1`` (none in the run's, or the
        resumed process's, first round)."""
        every = int(self.cfg.values.get("checkpoint-every", 0) or 0)
        if every and server_round > self.start_round and (server_round - 1) % every == 0:
            self.save_checkpoint(server_round - 1)  # the state after round server_round - 1

    def save_checkpoint(self, server_round: int) -> Path:
        """Atomic checkpoint of the state after ``server_round`` (reliability.checkpoints)."""
        started = time.perf_counter()
        state = {"version": 1, "round": server_round, "config": self._config_identity(),
                 "strategy": self.checkpoint_state(),
                 "results": {"rounds": self.results.rounds, "server": self.results.server_rows,
                             "elapsed_s": time.time() - self.results.started,
                             "lower_is_better": self.results.lower_is_better,
                             "resumed_after": self.results.extra.get("resumed_after", [])}}
        folder = checkpoints.write_checkpoint(self.results.dir, server_round, state,
                                              self.client_state_dir)
        log(INFO, "[flower-pfl] checkpoint after round %d written: %s (%.2f s)", server_round,
            folder, time.perf_counter() - started)
        return folder

    def after_round(self, server_round: int, last_round: int) -> bool:
        """Called by the round loop after each round; True: end the run now.  The last
        round ends it ``completed``; a stop asked for by ``flower-pfl run`` (its stop file
        in the results folder, :func:`flower_pfl.reliability.stop.request_stop`) ends it
        ``stopped`` after the round in progress.  Either way that round is checkpointed."""
        status = "completed" if server_round >= last_round else \
            BUDGET_EXHAUSTED if self.budget_exhausted_after(server_round) else \
            "stopped" if stop_requested(self.results.dir) else None
        if status is None:
            return False
        self.end_after(server_round, status)
        line = privacy_line(self.cfg.values, self.results.server_rows)
        if line:
            log(INFO, "[flower-pfl] %s", line)
        return True

    def budget_exhausted_after(self, server_round: int) -> bool:
        """Whether client-level DP's next round would take ε past ``privacy.target-epsilon``
        (docs/privacy.md): the run then ends after ``server_round`` with status
        ``budget-exhausted`` (False without DP or a target, and after the last round)."""
        dp = getattr(self, "dp", None)
        return dp is not None and server_round < int(self.cfg["rounds"]) \
            and dp.next_round_exceeds()

    def end_after(self, server_round: int, status: str) -> Path | None:
        """The run ends after ``server_round`` (``completed``, or ``stopped`` on request):
        checkpoint that round whatever ``checkpoint-every`` says (so a stopped run resumes
        there and a finished one can be extended), and write the final status.  Nothing
        is written with ``checkpoint-every`` 0 (the clients' state is not mirrored then)."""
        folder = None
        if int(self.cfg.values.get("checkpoint-every", 0) or 0) > 0:
            folder = self.save_checkpoint(server_round)
        if status != "completed":  # a completed run's status was set with its last round
            if self.results.status != status:  # (budget-exhausted: set by its evaluation)
                self.results.finish(status)
            log(INFO, "[flower-pfl] run %s after round %d of %d", status, server_round,
                self.cfg["rounds"])
        return folder

    def _config_identity(self) -> dict[str, Any]:
        return {"values": dict(self.cfg.values), "hyper": dict(self.hyper)}

    def resume(self, results_dir: str | Path | None = None) -> int:
        """Load the newest checkpoint of the results folder; returns its round.

        Must be called before ``initialize_parameters``.  The results files are rewound to
        that round (no round is written twice) and, in simulation, the clients' state folder
        is replaced by the checkpoint's snapshot.
        """
        folder = checkpoints.latest_checkpoint(results_dir or self.results.dir)
        if folder is None:
            raise ResumeError(f"no checkpoint in {results_dir or self.results.dir} (a run writes "
                              f"one every 'checkpoint-every' rounds; 0 disables them)")
        state = checkpoints.read_checkpoint(folder)
        mine, theirs = self._config_identity(), state["config"]
        diff = checkpoints.config_differences(theirs["values"], theirs["hyper"],
                                              mine["values"], mine["hyper"])
        if diff:
            raise ResumeError(f"{folder.parent.parent} was written by a different configuration "
                              f"(differs in: {', '.join(diff)}); resume it with its own "
                              f"configuration (only {', '.join(checkpoints.RESUME_FREE_KEYS)} "
                              f"may change) or start a new run")
        r = int(state["round"])
        if r >= int(self.cfg["rounds"]):
            raise ResumeError(f"{folder.parent.parent} has run {r} round(s) already; set "
                              f"rounds above {r} to extend it")
        self.restore_state(state["strategy"])
        if self.budget_exhausted_after(r):
            raise ResumeError(f"{folder.parent.parent} has spent its privacy budget: one more "
                              f"round would take ε past privacy.target-epsilon = "
                              f"{self.cfg.values['privacy.target-epsilon']} (docs/privacy.md)")
        res = state["results"]
        self.results.rounds = list(res["rounds"])
        self.results.server_rows = list(res["server"])
        self.results.lower_is_better = bool(res["lower_is_better"])
        self.results.started = time.time() - float(res["elapsed_s"])
        # a resumed process's first round also holds its start-up: s/round leaves it out
        self.results.extra["resumed_after"] = [*res.get("resumed_after", []), r]
        for csv_path in sorted(self.results.dir.glob("*.csv")):
            checkpoints.rewind_csv(csv_path, r)
        self.results.status = "running"
        self.results.write_summary()
        if self.client_state_dir is not None:
            checkpoints.restore_client_state(folder, self.client_state_dir)
        self.start_round = r + 1
        self._restored = True
        log(INFO, "[flower-pfl] resuming %s from the checkpoint after round %d (%s)",
            self.cfg.strategy, r, folder)
        return r


def privacy_line(values: Any, server_rows: list[dict[str, Any]]) -> str | None:
    """The run's closing privacy line (None without DP): client-level ε at its δ, or
    sample-level's largest per-client ε, after the last round that recorded it."""
    mode = values.get("privacy.mode", "none")
    key = {"client-level": "epsilon", "sample-level": "epsilon_max"}.get(mode)
    rows = [r for r in server_rows if key and key in r]
    if key is None or not rows:
        return None
    if mode == "client-level":
        delta = client_delta(values)
        known = rows[-1].get("epsilon_known_schedule")
        known_text = "" if known in (None, "") else (
            f"; to whoever knows who trained when (fit.csv), up to "
            f"ε = {float(known):.4g}")
        return (f"privacy: client-level DP, noise on the {values['privacy.noise']}, "
                f"ε = {float(rows[-1][key]):.4g} at δ = {delta:.3g} after round "
                f"{rows[-1]['round']}{known_text} (docs/privacy.md)")
    return (f"privacy: sample-level DP-SGD, largest per-client ε = {float(rows[-1][key]):.4g} "
            f"(each at its δ: fit.csv dp_delta) after round {rows[-1]['round']} "
            f"(docs/privacy.md)")


def checkpointed_names(cls: type) -> tuple[str, ...]:
    """The attributes a checkpoint of ``cls`` holds: the ``checkpointed`` names of every
    class along its MRO, base classes first, each once."""
    names: dict[str, None] = {}
    for klass in reversed(cls.__mro__):
        names.update(dict.fromkeys(vars(klass).get("checkpointed", ())))
    return tuple(names)
