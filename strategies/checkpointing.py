"""Checkpoint and resume of a strategy (docs/reliability.md), written once.

Every ``checkpoint-every`` rounds :meth:`Checkpointing.save_checkpoint` writes, atomically
(:mod:`flower_pfl.reliability`), the round, the configuration's identity, every picklable
strategy attribute (``checkpoint_state``/``restore_state`` to customise) -- the global
model, the whole ``ClientStore``, the sampling RNG, the metric history -- and the results
state; :meth:`Checkpointing.resume` continues from the newest one, rewinding the results
files so that no round is written twice.  A mixin of ``PersonalizedStrategy``: it uses
``self.cfg``, ``self.hyper``, ``self.results`` and ``self.client_state_dir``.
"""

from __future__ import annotations

import time
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.common.logger import log

from flower_pfl import reliability
from flower_pfl.strategies.federation import ResumeError


class Checkpointing:
    """save_checkpoint / resume and the state they carry (see the module docstring)."""

    #: attributes a checkpoint never holds (connections, files, the configuration itself)
    NOT_CHECKPOINTED = frozenset({"cfg", "cfg_json", "hyper", "num_clients", "results",
                                  "proxies", "pid_of_cid", "client_state_dir", "start_round",
                                  "_federation_checked", "_restored", "_round_server_log",
                                  "_sent", "metric"})

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything needed to continue after the last finished round.

        Default: every attribute of the strategy that pickles, except plumbing
        (``NOT_CHECKPOINTED``) -- the ``ClientStore`` (model matrix, per-client values),
        global model, RNG, metric history and any attribute a subclass adds.  Override
        (call super) to drop something big that can be rebuilt, or to add state kept
        outside ``self``.
        """
        state, skipped = {}, []
        for name, value in vars(self).items():
            if name in self.NOT_CHECKPOINTED:
                continue
            if reliability.picklable(value):
                state[name] = value
            else:
                skipped.append(name)
        if skipped:
            log(WARNING, "[flower-pfl] checkpoint: attribute(s) %s cannot be pickled and are "
                "not saved; override checkpoint_state/restore_state if they matter", skipped)
        return state

    def restore_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`checkpoint_state` (default: set the attributes back)."""
        for name, value in state.items():
            setattr(self, name, value)

    # -------------------------------------------------------------- checkpoint/resume
    def save_checkpoint(self, server_round: int) -> Path:
        """Atomic checkpoint of the state after ``server_round`` (see flower_pfl.reliability)."""
        started = time.perf_counter()
        state = {"version": 1, "round": server_round, "config": self._config_identity(),
                 "strategy": self.checkpoint_state(),
                 "results": {"rounds": self.results.rounds, "server": self.results.server_rows,
                             "elapsed_s": time.time() - self.results.started,
                             "lower_is_better": self.results.lower_is_better}}
        folder = reliability.write_checkpoint(self.results.dir, server_round, state,
                                              self.client_state_dir)
        log(INFO, "[flower-pfl] checkpoint after round %d written: %s (%.2f s)", server_round,
            folder, time.perf_counter() - started)
        return folder

    def _config_identity(self) -> dict[str, Any]:
        return {"values": dict(self.cfg.values), "hyper": dict(self.hyper)}

    def resume(self, results_dir: str | Path | None = None) -> int:
        """Load the newest checkpoint of the results folder; returns its round.

        Must be called before ``initialize_parameters``.  The results files are rewound to
        that round (no round is written twice) and, in simulation, the clients' state folder
        is replaced by the checkpoint's snapshot.
        """
        folder = reliability.latest_checkpoint(results_dir or self.results.dir)
        if folder is None:
            raise ResumeError(f"no checkpoint in {results_dir or self.results.dir} (a run writes "
                              f"one every 'checkpoint-every' rounds; 0 disables them)")
        state = reliability.read_checkpoint(folder)
        mine, theirs = self._config_identity(), state["config"]
        if mine != theirs:
            diff = sorted(k for k in set(mine["values"]) | set(theirs["values"])
                          if mine["values"].get(k) != theirs["values"].get(k))
            if mine["hyper"] != theirs["hyper"]:
                diff.append("hyper")
            raise ResumeError(f"{folder.parent.parent} was written by a different configuration "
                              f"(differs in: {', '.join(diff)}); resume it with its own "
                              f"configuration or start a new run")
        r = int(state["round"])
        self.restore_state(state["strategy"])
        res = state["results"]
        self.results.rounds = list(res["rounds"])
        self.results.server_rows = list(res["server"])
        self.results.lower_is_better = bool(res["lower_is_better"])
        self.results.started = time.time() - float(res["elapsed_s"])
        for csv_path in sorted(self.results.dir.glob("*.csv")):
            reliability.rewind_csv(csv_path, r)
        self.results.status = "running"
        self.results._write_summary()
        if self.client_state_dir is not None:
            reliability.restore_client_state(folder, self.client_state_dir)
        self.start_round = r + 1
        self._restored = True
        log(INFO, "[flower-pfl] resuming %s from the checkpoint after round %d (%s)",
            self.cfg.strategy, r, folder)
        return r
