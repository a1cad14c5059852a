"""Every record tells the truth (issue 53, kind 1): a run that fails says ``failed`` and why;
a run whose numbers cover fewer than all clients says how many, the same way in
summary.json, rounds.csv, the console's closing lines and ``flower-pfl compare``; the
never-trained warning says what those clients evaluated, per strategy.

In-process runs (flower_pfl/running/inprocess.py: the real Strategy and ClientApp through
Flower's message path) on small real Fashion-MNIST subsets; failures injected in the
transport as tests/test_failures.py does.
"""

from __future__ import annotations

import csv
import json
import logging

import pytest

from flower_pfl import config as config_mod
from flower_pfl.cli import main
from flower_pfl.config import APP_DIR
from flower_pfl.reporting import compare as cmp
from flower_pfl.reporting import console
from flower_pfl.reporting.coverage import (
    _spans,
    client_failures,
    coverage_cell,
    coverage_line,
    coverage_record,
    run_coverage,
)
from flower_pfl.reporting.results import ResultsWriter, mark_failed
from flower_pfl.reporting.run_files import read_summary
from flower_pfl.running import inprocess
from flower_pfl.running.procs import LaunchError
from flower_pfl.strategies.base import RoundError
from tests.conftest import small_config

#: the issue's input: `flower-pfl run` with these --set on the shipped simulation.yaml
NAN_RUN = ["strategy=fedavg", "clients=4", "fraction-fit=1.0", "rounds=2", "model=dnn",
           "data.subsample=3000", "train.lr=1000000.0"]


def _csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


# ------------------------------------------------------------------ a run that fails
def test_the_nan_run_ends_failed_with_its_error_and_compare_says_so(tmp_path):
    cfg = config_mod.load(APP_DIR / "simulation.yaml", NAN_RUN)
    with pytest.raises(RoundError):
        inprocess.run(cfg, tmp_path / "nan")
    summary = read_summary(tmp_path / "nan")
    assert summary["status"] == "failed" and summary["rounds"] == []
    assert summary["error"]["type"] == "RoundError"
    message = summary["error"]["message"]
    assert message.startswith("round 1: 0 valid update(s) from 4 sampled client(s), fewer than "
                              "min-fit-answers = 1")
    assert "NaN/Inf" in message and "update rejected" in message
    lines = console.summary_lines(tmp_path / "nan")
    assert lines[0] == "[flower-pfl] run failed: 0 evaluated round(s)"
    assert lines[2] == f"  error: RoundError: {message}"
    with pytest.raises(cmp.CompareError) as info:
        cmp.compare([tmp_path / "nan"], tmp_path / "out", allow_unfinished=True)
    assert ("no evaluated round (status 'failed': RoundError: round 1: 0 valid update(s)"
            in str(info.value))
    # the launcher's own mark never replaces the ServerApp's precise error
    assert mark_failed(tmp_path / "nan", LaunchError("ended with status 'failed'")) is False
    assert read_summary(tmp_path / "nan")["error"]["type"] == "RoundError"


class AllNanFrom2(inprocess.InProcessProxy):
    """Every upload of round 2 and later is NaN (the rounds before are as they were)."""

    def fit(self, ins, timeout, group_id):
        res = super().fit(ins, timeout, group_id)
        if int(ins.config["round"]) >= 2:
            import numpy as np
            from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

            arrays = parameters_to_ndarrays(res.parameters)
            arrays[0] = np.full_like(arrays[0], np.nan)
            res.parameters = ndarrays_to_parameters(arrays)
        return res


def test_a_run_failing_after_a_round_is_compared_only_when_allowed_with_its_error(tmp_path):
    cfg = small_config(strategy="fedavg", rounds=3, clients=3, model="mclr",
                       **{"data.subsample": 1500})
    with pytest.raises(RoundError, match="round 2: 0 valid update"):
        inprocess.run(cfg, tmp_path / "r", manager=inprocess.make_federation(
            3, proxy_cls=AllNanFrom2))
    summary = read_summary(tmp_path / "r")
    assert summary["status"] == "failed" and [r["round"] for r in summary["rounds"]] == [1]
    with pytest.raises(cmp.CompareError, match=r"not a finished run: status 'failed' after "
                                               r"round 1 of 3: RoundError: round 2: 0 valid"):
        cmp.compare([tmp_path / "r"], tmp_path / "no")
    result = cmp.compare([tmp_path / "r"], tmp_path / "yes", allow_unfinished=True)
    assert "| 1/3 (failed) |" in result.table


def test_raised_after_the_last_round_is_failed_not_completed(tmp_path):
    cfg = small_config(strategy="fedavg", rounds=2, clients=3, model="mclr",
                       **{"data.subsample": 1500})
    seen = []

    def break_at_the_end(strategy, server_round):
        seen.append(strategy.results.status)
        if server_round == 2:  # completed was written with round 2's evaluation
            raise OSError("disk full")

    with pytest.raises(OSError):
        inprocess.run(cfg, tmp_path, on_round=break_at_the_end)
    assert seen == ["running", "completed"]
    summary = read_summary(tmp_path)
    assert summary["status"] == "failed"
    assert summary["error"] == {"type": "OSError", "message": "disk full"}


def test_the_launcher_marks_a_run_its_serverapp_left_running(tmp_path, monkeypatch, capsys):
    """`flower-pfl run` where the ServerApp never wrote an end (killed, timed out): the
    launcher's LaunchError goes into summary.json; another error of its own as well."""
    import flower_pfl.cli as cli

    monkeypatch.setattr(cli, "preflight_apart", lambda *a, **k: None)
    monkeypatch.setattr(cli.StopAfterRound, "install", lambda self: None)  # pytest's signals

    def started_then_lost(cfg, config_path, sets, results_dir, **kw):
        ResultsWriter(results_dir, {"values": dict(cfg.values)})  # summary: running
        raise LaunchError("run 7 ended with status 'finished:failed'; see flwr-run.log")

    monkeypatch.setattr(cli, "run_simulation", started_then_lost)
    args = ["run", "--quiet", "--set", "rounds=2", "--set", "clients=3", "--set",
            f"output-dir={tmp_path}", "--set"]
    assert main([*args, "run-name=lost"]) == 1
    summary = read_summary(tmp_path / "lost")
    assert summary["status"] == "failed" and summary["error"] == {
        "type": "LaunchError",
        "message": "run 7 ended with status 'finished:failed'; see flwr-run.log"}
    out = capsys.readouterr()
    assert "[flower-pfl] run failed: 0 evaluated round(s)" in out.out
    assert "flower-pfl: FAILED: run 7 ended" in out.err

    def broke(cfg, config_path, sets, results_dir, **kw):
        ResultsWriter(results_dir, {"values": dict(cfg.values)})
        raise FileNotFoundError("flwr")

    monkeypatch.setattr(cli, "run_simulation", broke)
    with pytest.raises(FileNotFoundError):
        main([*args, "run-name=broke"])
    assert read_summary(tmp_path / "broke")["error"]["type"] == "FileNotFoundError"


# ------------------------------------------------------------------------ coverage
def test_coverage_record_by_hand():
    fits = [{"round": 1, "sampled": 4, "fit_ok": 4, "fit_failed": 0},
            {"round": 2, "sampled": 4, "fit_ok": 2, "fit_failed": 2},
            {"round": 3, "sampled": 3, "fit_ok": 3, "fit_failed": 0}]
    rec = coverage_record(5, {1: 5, 3: 4, 2: 3}, [4, 0, 1, 3], fits)
    assert rec == {"clients": 5, "rounds_short": [2, 3], "fit_sampled": 11, "fit_accepted": 9,
                   "fit_failed": 2, "final_round": 3, "final_clients_covered": 4,
                   "final_missing": [2], "complete": False}
    assert coverage_cell(rec) == "4/5, fit 9/11"
    assert coverage_line(rec) == (
        "coverage: final metrics over 4 of 5 clients (partition-id(s) [2] missing); 2 "
        "evaluated round(s) over fewer than all 5 (rounds 2-3; rounds.csv clients_evaluated); "
        "9 of 11 sampled client fits accepted (2 failed: failures.csv)")
    full = coverage_record(2, {1: 2}, [1, 0], [{"sampled": 2, "fit_ok": 2, "fit_failed": 0}])
    assert full["complete"] and coverage_line(full) is None and coverage_cell(full) == "2/2"
    assert _spans([2, 3, 4, 7, 9, 10]) == "2-4, 7, 9-10" and _spans([5]) == "5"


class LostFrom2(inprocess.InProcessProxy):
    """Partition 2's node is gone from round 2 on: every message to it fails as Flower's
    grid reports a node that stopped sending heartbeats."""

    def _send(self, content, message_type, group_id):
        pid = int(self.context.node_config["partition-id"])
        config = content.config_records.get("fitins.config") or content.config_records.get(
            "evaluateins.config") or {}
        if pid == 2 and int(config.get("round", 0)) >= 2:
            raise ValueError("Message contains an Error (reason: Node Unavailable - the "
                             "destination node failed to report a heartbeat). It originated "
                             "during client-side execution of a message.")
        return super()._send(content, message_type, group_id)


@pytest.fixture(scope="module")
def lost_run(tmp_path_factory):
    """FedAvg, 4 clients all sampled, 3 rounds; partition 2 lost from round 2 on."""
    out = tmp_path_factory.mktemp("lost")
    cfg = small_config(strategy="fedavg", rounds=3, clients=4, model="mclr",
                       **{"data.subsample": 2000})
    inprocess.run(cfg, out, manager=inprocess.make_federation(4, proxy_cls=LostFrom2))
    return out


def test_a_lost_client_is_counted_per_round_and_in_the_final_metrics(lost_run):
    summary = read_summary(lost_run)
    assert summary["status"] == "completed"  # the run did its rounds: said, not hidden
    rows = _csv(lost_run / "rounds.csv")
    assert [(r["clients_evaluated"], r["fit_accepted"], r["fit_sampled"]) for r in rows] == [
        ("4", "4", "4"), ("3", "3", "4"), ("3", "3", "4")]
    cov = summary["coverage"]
    assert cov == {"clients": 4, "rounds_short": [2, 3], "fit_sampled": 12,
                   "fit_accepted": 10, "fit_failed": 2, "final_round": 3,
                   "final_clients_covered": 3, "final_missing": [2], "complete": False}
    assert run_coverage(lost_run) == cov  # read back from the CSVs: the same record
    assert summary["final"]["clients_evaluated"] == 3
    # the final mean is over the three that answered
    last = [r for r in _csv(lost_run / "clients.csv") if r["round"] == "3"]
    assert sorted(int(r["partition-id"]) for r in last) == [0, 1, 3]
    mean = sum(float(r["accuracy"]) for r in last) / 3
    assert summary["final"]["personal_mean"] == pytest.approx(mean)
    assert client_failures(lost_run) == ("2 failed client fit(s); 2 evaluation round(s) with "
                                         "fewer than all 4 clients")  # the bench: no number


def test_the_console_and_compare_say_the_same_coverage(lost_run, tmp_path):
    lines = console.summary_lines(lost_run)
    assert lines[0] == "[flower-pfl] run completed: 3 evaluated round(s)"
    assert lines[2] == ("  coverage: final metrics over 3 of 4 clients (partition-id(s) [2] "
                        "missing); 2 evaluated round(s) over fewer than all 4 (rounds 2-3; "
                        "rounds.csv clients_evaluated); 10 of 12 sampled client fits accepted "
                        "(2 failed: failures.csv)")
    assert lines[-2].startswith("  personalized accuracy: final ")  # the last lines: numbers
    result = cmp.compare([lost_run], tmp_path / "c")  # completed: compared, not refused
    assert result.runs[0].unfinished == ""
    assert "| 3/4, fit 10/12 |" in result.table
    assert lines[2].strip() in result.table  # the runs list gives the same sentence
    row = _csv(tmp_path / "c" / "table.csv")[0]
    assert (row["clients"], row["final_clients_covered"], row["fit_accepted"],
            row["fit_sampled"]) == ("3/4, fit 10/12", "3", "10", "12")


def test_a_run_with_every_client_says_so_without_a_warning(tmp_path, caplog):
    cfg = small_config(strategy="fedavg", rounds=2, clients=3, model="mclr",
                       **{"data.subsample": 1500})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        inprocess.run(cfg, tmp_path)
    cov = read_summary(tmp_path)["coverage"]
    assert cov["complete"] and cov["final_clients_covered"] == 3 and cov["fit_accepted"] == 6
    assert not [r for r in caplog.records if "coverage:" in r.getMessage()]
    assert not any("coverage" in ln for ln in console.summary_lines(tmp_path))
    assert "| 3/3 |" in cmp.compare([tmp_path], tmp_path / "c").table


def test_the_serverapp_log_warns_with_the_same_coverage_line(tmp_path, caplog):
    cfg = small_config(strategy="fedavg", rounds=2, clients=4, model="mclr",
                       **{"data.subsample": 2000})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        inprocess.run(cfg, tmp_path, manager=inprocess.make_federation(4, proxy_cls=LostFrom2))
    said = [r.getMessage() for r in caplog.records if "coverage:" in r.getMessage()]
    assert said == ["[flower-pfl] " + coverage_line(read_summary(tmp_path)["coverage"])]
    assert "final metrics over 3 of 4 clients" in said[0]


# ------------------------------------------------- what a never-trained client evaluated
def _untrained(strategy, tmp_path, caplog, model="mclr", **hyper):
    cfg = small_config(strategy=strategy, rounds=1, clients=4, model=model, **{
        "fraction-fit": 0.25, "min-fit-clients": 1, "data.subsample": 2000, **hyper})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        inprocess.run(cfg, tmp_path)
    summary = read_summary(tmp_path)
    said = [r.getMessage() for r in caplog.records if "never trained" in r.getMessage()]
    assert len(said) == 1 and len(summary["untrained_clients"]) == 3
    return summary["untrained_evaluated"], said[0]


def test_the_never_trained_sentence_is_true_for_fedavg_and_for_perfedavg(tmp_path, caplog):
    what, line = _untrained("fedavg", tmp_path / "a", caplog)
    sent = "the model the server sent, not a personalized one"
    assert list(what) == [sent] and len(what[sent]) == 3
    assert f"their accuracy is {sent} (clients.csv: trained 0)" in line
    caplog.clear()
    what, line = _untrained("perfedavg", tmp_path / "b", caplog,
                            **{"hyper.perfedavg.personal-steps": 3})
    adapted = ("the model the server sent after 3 local SGD step(s) on its own training data "
               "at evaluation (personalized there, though no fit of its was accepted)")
    assert list(what) == [adapted]
    assert f"their accuracy is {adapted} (clients.csv: trained 0)" in line
    assert "not a personalized one" not in line


@pytest.mark.parametrize("strategy, model, hyper, expected", [
    ("fedavg-ft", "mclr", {"hyper.fedavg-ft.finetune-steps": 4},
     "the model the server sent after 4 local SGD step(s) on its own training data at "
     "evaluation (personalized there, though no fit of its was accepted)"),
    ("local", "mclr", {}, "its initial model (the server sent none), not a personalized one"),
    ("fedrep", "dnn", {}, "the model the server sent (2 of its 4 arrays; the rest at their "
                          "initial values), not a personalized one"),
])
def test_what_other_strategies_untrained_clients_evaluate(strategy, model, hyper, expected,
                                                          tmp_path, caplog):
    what, line = _untrained(strategy, tmp_path, caplog, model=model, **hyper)
    assert list(what) == [expected] and f"their accuracy is {expected}" in line
    assert json.loads((tmp_path / "summary.json").read_text())["untrained_evaluated"] == what
