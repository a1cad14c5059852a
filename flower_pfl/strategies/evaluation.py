"""Evaluation of all clients and its per-round report, written once.

A mixin of ``PersonalizedStrategy``: every ``eval-every`` rounds (and in the last round)
:meth:`EvaluationReporting.configure_evaluate` asks ALL connected clients to evaluate
their personalized model (and the global model where there is one, ``eval-global``),
each sent what :meth:`EvaluationReporting.eval_payload` gives (a subclass hook; default
the global model);
:meth:`EvaluationReporting.aggregate_evaluate` turns the answers into the statistics of
:mod:`flower_pfl.learning.metrics` over clients and writes them to the results folder
(``rounds.csv``, ``clients.csv``, ``summary.json``: :class:`~flower_pfl.reporting.results.
ResultsWriter`) and Flower's log, with the devices the clients trained on
(:mod:`flower_pfl.learning.devices`; string metrics, kept out of every numeric summary).
A client that did not answer is named; fewer than ``min-eval-answers`` answers stop the
run (:class:`~flower_pfl.strategies.federation.RoundError`).

The per-client metric (``self.metric``: accuracy, or the synthetic task's mse, an error)
and whether lower is better (``self.lower_is_better``) are decided once, in the base's
``__init__`` (:func:`flower_pfl.reporting.results.metric_of`).  There is no centralised
test set: :meth:`evaluate` returns None.

Clients that never trained (no accepted upload yet: ``fit-rounds`` 0) evaluate a model
they never trained a round on: what the server sent them, part of it, or their initial
model, as such or after the local steps their strategy takes at evaluation (FedAvg-FT's
fine-tuning, Per-FedAvg's personal steps).  Each says which (its ``evaluated`` metric,
``PFLClient.evaluated_model``); their ``clients.csv`` rows say ``trained`` 0;
``personal_*`` stay over ALL clients that answered (the papers' metric, comparable with
every earlier run), and ``personal_trained_*`` are the same statistics over the trained
clients only (docs/reliability.md, "Clients that never trained").  In the last round one
line names how many never trained and what they evaluated, one line per strategy says how
often its own mechanism ran (strategies/mechanism.py), and a WARNING says how many clients
the numbers cover where that is fewer than all (:mod:`flower_pfl.reporting.coverage`).
"""

from __future__ import annotations

from logging import INFO, WARNING
from typing import Any, Mapping

import numpy as np
from flwr.common import EvaluateIns, EvaluateRes, Parameters, Scalar, ndarrays_to_parameters
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from flower_pfl.instructions import EvaluateInstruction, NewcomerEval, NewcomerReply
from flower_pfl.learning import devices
from flower_pfl.learning.metrics import summarize
from flower_pfl.learning.splits import UNSEEN_KEY
from flower_pfl.newcomers import is_newcomer_round, newcomer_stats
from flower_pfl.reporting.coverage import coverage_line
from flower_pfl.strategies.federation import RoundError, TaggedProxy
from flower_pfl.strategies.state import StrategyState


class EvaluationReporting(StrategyState):
    """configure_evaluate / aggregate_evaluate over all clients (see the module docstring)."""

    def eval_payload(self, pid: int, server_round: int
                     ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        """Arrays and config for evaluation (default: the global model and
        :meth:`eval_config`)."""
        return self.global_arrays or [], self.eval_config(pid, server_round)

    def eval_config(self, pid: int, server_round: int) -> Mapping[str, Scalar]:
        """The paper's instruction for client ``pid``'s evaluation (e.g. FedAvg-FT's
        fine-tuning steps).  Default: none."""
        return {}

    def newcomer_payload(self, pid: int, server_round: int
                         ) -> tuple[list[np.ndarray], Mapping[str, Scalar]]:
        """What held-out newcomer ``pid`` is sent for its rule (``adapt_newcomer``, its
        client): :meth:`eval_payload` (the model the server would give it) and
        :meth:`newcomer_config` (the rule's parameters), with its :class:`NewcomerEval`."""
        arrays, extra = self.eval_payload(pid, server_round)
        budget = self.cfg.values.get("newcomers.budget-steps") or 0
        return arrays, {**extra, **self.newcomer_config(pid, server_round),
                        **NewcomerEval(newcomer=True, budget_steps=int(budget)).to_config()}

    def newcomer_config(self, pid: int, server_round: int) -> Mapping[str, Scalar]:
        """The paper's values a newcomer's rule reads beyond :meth:`eval_config` (Ditto's
        lambda).  Default: none."""
        return {}

    def evaluated_now(self, server_round: int) -> set[int]:
        """The partition-ids this evaluation round asks: the participants, and the held-out
        newcomers in their rounds (``newcomers.every``, the last round)."""
        held = set(self.newcomers)
        out = set(range(self.num_clients)) - held
        return out | held if is_newcomer_round(self.cfg.values, server_round) else out

    def configure_evaluate(self, server_round: int, parameters: Parameters,
                           client_manager: ClientManager) -> list[tuple[ClientProxy, EvaluateIns]]:
        if not self.is_eval_round(server_round):
            return []
        self.handshake(client_manager)
        instructions: list[tuple[ClientProxy, EvaluateIns]] = []
        eval_global = bool(self.cfg["eval-global"] and self.has_global_model)
        asked, held = self.evaluated_now(server_round), set(self.newcomers)
        for pid in sorted(p for p in self.proxies if p in asked):
            arrays, extra = (self.newcomer_payload if pid in held else
                             self.eval_payload)(pid, server_round)
            config = self.base_config(
                server_round, {**EvaluateInstruction(eval_global).to_config(), **extra}, pid)
            instructions.append((TaggedProxy(self.proxies[pid], pid),
                                 EvaluateIns(ndarrays_to_parameters(arrays), config)))
        return instructions

    def aggregate_evaluate(self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]],
                           failures: list[Any]) -> tuple[float | None, dict[str, Scalar]]:
        failed = self.record_failures(server_round, "evaluate", list(failures))
        held = set(self.newcomers)
        newcomer_rows = sorted((newcomer_row(res, self.metric) for _, res in results
                                if int(res.metrics["partition-id"]) in held),
                               key=lambda r: r["partition-id"])
        answered = {client_row(res, self.metric)["partition-id"] for _, res in results}
        missing = sorted(self.evaluated_now(server_round) - answered - {p for p, _ in failed})
        results = [(p, r) for p, r in results if int(r.metrics["partition-id"]) not in held]
        if missing and self.is_eval_round(server_round):
            log(WARNING, "[flower-pfl] round %d: partition-id(s) %s not connected; evaluation "
                "statistics are over the %d client(s) that answered", server_round, missing,
                len(answered))
        minimum = int(self.cfg.values.get("min-eval-answers", 1))
        if self.is_eval_round(server_round) and len(results) < minimum:
            raise RoundError(f"round {server_round}: {len(results)} evaluation answer(s), fewer "
                             f"than min-eval-answers = {minimum}; failures: "
                             + "; ".join(f"partition-id {p}: {r}" for p, r in failed[:10]))
        if not results:
            return None, {}
        m, lower_is_better = self.metric, self.lower_is_better
        rows = sorted((client_row(res, m) for _, res in results),
                      key=lambda r: r["partition-id"])
        personal = summarize([r[m] for r in rows], [r["num-test"] for r in rows],
                             lower_is_better)
        global_ = None
        if all(f"global_{m}" in r for r in rows):
            global_ = summarize([r[f"global_{m}"] for r in rows], [r["num-test"] for r in rows],
                                lower_is_better)
        self.eval_history.append(personal)
        trained = [r for r in rows if r["trained"]]
        trained_stats = (summarize([r[m] for r in trained], [r["num-test"] for r in trained],
                                   lower_is_better) if trained else None)
        newcomers = None
        if newcomer_rows:
            newcomers = newcomer_stats(personal["mean"],
                                       [r["newcomer_before"] for r in newcomer_rows],
                                       [r["newcomer_after"] for r in newcomer_rows])
        self.results.log_round(server_round, personal, global_, rows + newcomer_rows,
                               trained=trained_stats, trained_clients=len(trained),
                               newcomers=newcomers)
        if any("unseen-classes" in res.metrics for _, res in results):  # docs/own-data.md
            self.results.set_summary(UNSEEN_KEY, sum(
                int(res.metrics.get("unseen-classes", 0)) > 0 for _, res in results))
        best = (min if lower_is_better else max)(h["mean"] for h in self.eval_history)
        log(INFO, "[flower-pfl] round %d: personalized %s mean %.4f weighted %.4f std %.4f "
            "worst10%% %.4f top10%% %.4f min %.4f | best mean %.4f%s | %d clients answered, "
            "%d did not | devices %s", server_round, m, personal["mean"],
            personal["weighted_mean"], personal["std"], personal["worst10_mean"],
            personal["top10_mean"], personal["min"], best,
            f" | global {m} mean {global_['mean']:.4f}" if global_ else "", len(rows),
            self.num_clients - len(held) - len(rows), devices.describe(rows))
        if newcomers:
            log(INFO, "[flower-pfl] round %d: newcomers (%d held out) %s before "
                "%.4f after %.4f (%s) | participants %.4f | participation gap %+.4f | "
                "adaptation gain %+.4f", server_round, len(newcomer_rows), m,
                newcomers["newcomers_before_mean"], newcomers["newcomers_after_mean"],
                f"{self.entry.newcomer.rule}" if self.entry.newcomer else "its rule",
                personal["mean"], newcomers["participation_gap"], newcomers["adaptation_gain"])
        exhausted = self.budget_exhausted_after(server_round)  # privacy: no next round
        if server_round >= self.cfg["rounds"] or exhausted:
            self.report_run_end(rows, trained_stats, {
                int(res.metrics["partition-id"]): str(res.metrics["evaluated"])
                for _, res in results if "evaluated" in res.metrics})
            self.results.finish("budget-exhausted" if exhausted else "completed")
            log(INFO, "[flower-pfl] final per-round table: %s", self.results.dir / "rounds.csv")
            log(INFO, "[flower-pfl] per-client table: %s", self.results.dir / "clients.csv")
        metrics: dict[str, Scalar] = {f"personal_{k}": v for k, v in personal.items()}
        metrics["personal_bmta"] = best
        metrics["eval_answered"] = len(rows)
        metrics["eval_missing"] = self.num_clients - len(held) - len(rows)
        if newcomers:
            metrics.update(newcomers)
        if global_:
            metrics.update({f"global_{k}": v for k, v in global_.items()})
        loss = float(np.average([r["loss"] for r in rows], weights=[r["num-test"] for r in rows]))
        return loss, metrics

    def report_run_end(self, rows: list[dict[str, Any]], trained: dict[str, float] | None,
                       evaluated: dict[int, str] | None = None) -> None:
        """The last round: the clients that never trained and what they evaluated
        (``evaluated``: partition-id -> the client's own phrase), the mechanism's count
        (WARNING when it never ran), in the log and in summary.json; a WARNING where the
        numbers cover fewer than all clients."""
        m, untrained = self.metric, [r for r in rows if not r["trained"]]
        what = untrained_evaluated(untrained, evaluated or {})
        if untrained:
            log(WARNING, "[flower-pfl] %d of %d clients never trained (partition-id(s) %s): "
                "their %s is %s (clients.csv: trained 0); personalized mean over the %d "
                "trained clients %s, over all %.4f",
                len(untrained), len(rows), [r["partition-id"] for r in untrained][:20], m,
                "; ".join(what if len(what) == 1 else [f"{k} (partition-id(s) {v[:20]})"
                                                       for k, v in what.items()]),
                len(rows) - len(untrained),
                f"{trained['mean']:.4f}" if trained else "n/a (none trained)",
                self.eval_history[-1]["mean"])
        self.results.set_summary("untrained_clients",
                                 sorted(r["partition-id"] for r in untrained))
        self.results.set_summary("untrained_evaluated", what)
        line = coverage_line(self.results.coverage())
        if line:
            log(WARNING, "[flower-pfl] %s", line)
        if self.mechanism is not None:
            count = self.mechanism_count
            log(WARNING if count.used == 0 else INFO, "[flower-pfl] %s",
                count.line(self.mechanism))
            self.results.set_summary("mechanism", count.summary(self.mechanism))

    def evaluate(self, server_round: int, parameters: Parameters
                 ) -> tuple[float, dict[str, Scalar]] | None:
        return None  # no centralised test set: pFL is evaluated on each client's own split

    def is_eval_round(self, server_round: int) -> bool:
        """Every ``eval-every`` rounds, and the last round (also the last one a privacy
        budget allows: ``budget_exhausted_after``)."""
        return server_round % self.cfg["eval-every"] == 0 or server_round >= self.cfg["rounds"] \
            or self.budget_exhausted_after(server_round)


def untrained_evaluated(untrained: list[dict[str, Any]], said: dict[int, str]
                        ) -> dict[str, list[int]]:
    """What the never-trained clients evaluated -> their partition-ids (a client that did
    not say: named as such, never guessed)."""
    out: dict[str, list[int]] = {}
    for r in untrained:
        pid = int(r["partition-id"])
        out.setdefault(said.get(pid, "a model it never trained a round on (its client does "
                                     "not say which)"), []).append(pid)
    return out


def client_row(res: EvaluateRes, metric: str) -> dict[str, Any]:
    """One client's evaluation answer as a ``clients.csv`` row."""
    m = res.metrics
    row: dict[str, Any] = {"partition-id": int(m["partition-id"]), metric: float(m[metric]),
                           "loss": float(res.loss), "num-test": int(res.num_examples),
                           "num-train": int(m.get("num-train", 0)),
                           "fit-rounds": int(m.get("fit-rounds", 0))}
    # 0: never trained -- its metric is of a model it never trained a round on (``evaluated``)
    row["trained"] = int(row["fit-rounds"] > 0)
    if f"global_{metric}" in m:
        row[f"global_{metric}"] = float(m[f"global_{metric}"])
        row["global_loss"] = float(m["global_loss"])
    row.update(devices.select(m))  # the device of its last fit (flower_pfl.learning.devices)
    return row


def newcomer_row(res: EvaluateRes, metric: str) -> dict[str, Any]:
    """A held-out newcomer's answer as a ``clients.csv`` row: ``newcomer`` 1, its metric
    before and after its rule (the metric column: after) and the steps the rule took."""
    sent = NewcomerReply.from_config(res.metrics)
    return {"partition-id": int(res.metrics["partition-id"]), metric: sent.newcomer_after,
            "loss": float(res.loss), "num-test": int(res.num_examples),
            "num-train": int(res.metrics.get("num-train", 0)), "fit-rounds": 0,
            "trained": 0, "newcomer": 1, "newcomer_before": sent.newcomer_before,
            "newcomer_after": sent.newcomer_after, "newcomer_steps": sent.newcomer_steps,
            **devices.select(res.metrics)}
