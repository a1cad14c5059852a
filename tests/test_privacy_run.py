"""Client-level DP in real (in-process) federations on FMNIST: ε recorded, the budget stop,
resume continuing the same ε."""

from __future__ import annotations

import csv
import json

import pytest

from flower_pfl import config
from flower_pfl.running.inprocess import TRY, run
from flower_pfl.strategies.base import ResumeError

pytestmark = pytest.mark.slow

DP = {"privacy.mode": "client-level", "privacy.clip-norm": 0.5,
      "privacy.noise-multiplier": 2.0, "fraction-fit": 0.5, "checkpoint-every": 1}


def cfg(**over):
    return config.validate(config.merge(TRY, {"strategy": "fedavg", **DP, **over}))


def rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_budget_stop_and_resume_reach_the_uninterrupted_epsilon(tmp_path, caplog):
    caplog.set_level("INFO")
    # target between the ε of 2 and of 3 rounds (4 clients, 2 per round, z 2, δ 1e-5)
    whole = run(cfg(rounds=2), tmp_path / "whole")
    eps2 = whole.dp.epsilon()
    server = rows(tmp_path / "whole" / "server.csv")
    assert [float(r["epsilon"]) for r in server][-1] == pytest.approx(eps2, abs=1e-6)
    assert float(rows(tmp_path / "whole" / "rounds.csv")[-1]["epsilon"]) == \
        pytest.approx(eps2, abs=1e-6)
    # stopped after 1 round, resumed to 2: the same ε
    run(cfg(rounds=1), tmp_path / "resumed")
    resumed = run(cfg(rounds=2), tmp_path / "resumed", resume=True)
    assert resumed.dp.epsilon() == eps2
    # the same accountant, but for who took part: under client-level DP the sample is drawn
    # from the OS's entropy, so the two runs' schedules differ (2 of 4 clients a round)
    state, again = whole.dp.state(), resumed.dp.state()
    assert {**again["accountant"], "taken_part": {}} == {**state["accountant"], "taken_part": {}}
    assert again["clip"] == state["clip"]
    for part in (state, again):
        assert sum(map(len, part["accountant"]["taken_part"].values())) == 4  # 2 rounds x 2
    # the budget: 5 rounds asked, a target the third round would exceed
    target = (eps2 + whole.dp.accountant.epsilon((2, 2.0))) / 2
    capped = run(cfg(rounds=5, **{"privacy.target-epsilon": target}), tmp_path / "capped")
    summary = json.loads((tmp_path / "capped" / "summary.json").read_text())
    assert summary["status"] == "budget-exhausted"
    assert [r["round"] for r in summary["rounds"]] == [1, 2]
    assert summary["privacy"]["epsilon"] == pytest.approx(eps2, abs=1e-6)
    assert summary["privacy"]["after_round"] == 2 and eps2 <= target
    assert capped.dp.epsilon() <= target
    assert f"ε = {eps2:.4g} at δ = 1e-05 after round 2" in caplog.text  # the closing line
    with pytest.raises(ResumeError, match="spent its privacy budget"):  # no round past it
        run(cfg(rounds=5, **{"privacy.target-epsilon": target}), tmp_path / "capped",
            resume=True)
