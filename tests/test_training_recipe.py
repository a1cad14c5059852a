"""Every ``train.*`` key, for every registered strategy, is used or refused.

Used: one in-process round (2 real FMNIST clients, the Flower message path) with the key
changed uploads something else than the same round without it -- the arrays the client
returns, or, for a method that uploads nothing (Local), the personal model it keeps.
Refused: validation stops with the strategy's own reason (its catalog entry's
``refuses``).  The table of docs/training.md is the registry's (``training_table``).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from flower_pfl import config, registry
from flower_pfl.clients.base import PFLClient
from flower_pfl.clients.state import ClientState
from flower_pfl.reporting.results import ResultsWriter
from flower_pfl.running import inprocess
from tests.conftest import small_config

DOCS = Path(__file__).resolve().parent.parent / "docs" / "training.md"
# 2 clients, both sampled, one round of 3 steps, no evaluation round, no checkpoint
BASE = {"clients": 2, "fraction-fit": 1.0, "rounds": 1, "model": "dnn",
        "data.subsample": 300, "data.partition": "iid", "train.batch-size": 15,
        "train.epochs": 1, "train.steps": 3, "train.lr": 0.05,
        "eval-every": 2, "checkpoint-every": 0}
#: epochs drive the step count (the epochs and drop-last changes need it); batches of 15
#: leave a remainder on each client's training split
EPOCHS = {"train.steps": None}
#: train key -> (the settings that change it, the settings of the run it is compared with,
#: rounds): a value that differs from BASE and the default; a schedule acts from round 2 on,
#: an optimizer's or a schedule's parameter needs that optimizer or schedule on both sides
ADAM, EXP = {"train.optimizer": "adam"}, {"train.lr-schedule": "exponential"}
STEP, COS = {"train.lr-schedule": "step"}, {"train.lr-schedule": "cosine"}
CHANGED = {"train.epochs": ({**EPOCHS, "train.epochs": 2}, EPOCHS, 1),
           "train.steps": ({"train.steps": 5}, {}, 1),
           "train.batch-size": ({"train.batch-size": 24}, {}, 1),
           "train.lr": ({"train.lr": 0.02}, {}, 1),
           "train.momentum": ({"train.momentum": 0.9}, {}, 1),
           "train.weight-decay": ({"train.weight-decay": 0.05}, {}, 1),
           "train.drop-last": ({**EPOCHS, "train.drop-last": True}, EPOCHS, 1),
           "train.optimizer": (ADAM, {}, 1),
           "train.betas": ({**ADAM, "train.betas": [0.5, 0.9]}, ADAM, 1),
           "train.eps": ({**ADAM, "train.eps": 0.1}, ADAM, 1),
           "train.lr-schedule": (EXP, {}, 2),
           "train.lr-gamma": ({**EXP, "train.lr-gamma": 0.5}, EXP, 2),
           "train.lr-step-rounds": ({**STEP, "train.lr-step-rounds": 1}, STEP, 2),
           "train.lr-min": ({**COS, "train.lr-min": 0.01}, COS, 2),
           "train.lr-horizon": ({**COS, "train.lr-horizon": 10}, COS, 2)}
#: the acceptance's keys and the optimizer run in the fast tier (one round each); the rest,
#: the schedule's two-round runs among them, in the slow tier (the schedule's fast checks:
#: tests/test_training.py, by hand and in fit.csv across a stop and resume)
FAST = ("train.momentum", "train.weight-decay", "train.optimizer")
CASES = [pytest.param(name, key, marks=() if key in FAST else pytest.mark.slow)
         for name in sorted(registry.REGISTRY) for key in config.train_keys()]


def test_every_train_key_has_a_changed_value():
    assert set(CHANGED) == set(config.train_keys())
    for key, (changed, base, _) in CHANGED.items():
        assert changed[key] != config.FIELDS[key].default and changed[key] != BASE.get(key), key
        assert key not in base and {k: v for k, v in changed.items() if k != key} == base, key


def _uploads(name, tmp_path, monkeypatch, rounds=1, **changed):
    """partition-id -> (uploaded arrays, the arrays the fit wrote to its state) of one
    in-process round of ``name``."""
    got: dict[int, list[np.ndarray]] = {}
    kept: dict[int, list[np.ndarray]] = {}
    fit, set_arrays = PFLClient.fit, ClientState.set_arrays

    def spy_fit(self, parameters, cfg):
        arrays, n, metrics = fit(self, parameters, cfg)
        got[self.pid] = [np.array(a, copy=True) for a in arrays]
        return arrays, n, metrics

    def spy_set(self, key, arrays):
        kept.setdefault(-1, []).extend(np.array(a, copy=True) for a in arrays)
        return set_arrays(self, key, arrays)

    monkeypatch.setattr(PFLClient, "fit", spy_fit)
    monkeypatch.setattr(ResultsWriter, "write_curves", lambda *a, **k: None)  # no plot
    monkeypatch.setattr(ClientState, "set_arrays", spy_set)
    cfg = small_config(strategy=name, **{**BASE, "rounds": rounds, **changed})
    inprocess.run(cfg, tmp_path / f"run-{len(list(tmp_path.iterdir()))}")
    monkeypatch.undo()
    assert sorted(got) == [0, 1], got.keys()
    return got, kept.get(-1, [])


def _differ(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    if len(a) != len(b):
        return float("inf")
    return max((float(np.abs(x.astype(np.float64) - y).max()) if x.shape == y.shape
                else float("inf") for x, y in zip(a, b)), default=0.0)


_BASELINES: dict[tuple, tuple] = {}


@pytest.mark.parametrize("name,key", CASES)
def test_train_key_is_used_or_refused(name, key, tmp_path, monkeypatch):
    """Refused: validation names the paper's reason (of the key, or of the optimizer or
    schedule the key needs).  Replaced by the method's own hyper-parameters: the upload is
    bit for bit the same.  Otherwise used: the upload differs."""
    entry = registry.REGISTRY[name]
    changed, base, rounds = CHANGED[key]
    refused = [k for k in changed if k in entry.refuses]
    if refused:
        with pytest.raises(config.ConfigError) as err:
            small_config(strategy=name, **{**BASE, **changed})
        value = changed[refused[0]]
        assert f"'{refused[0]}' = {value!r} is not used by '{name}'" in str(err.value)
        assert entry.refuses[refused[0]] in str(err.value)
        return
    cache = (name, tuple(sorted(base.items())), rounds)
    if cache not in _BASELINES:
        _BASELINES[cache] = _uploads(name, tmp_path, monkeypatch, rounds, **base)
    base_up, base_kept = _BASELINES[cache]
    up, kept = _uploads(name, tmp_path, monkeypatch, rounds, **changed)
    gaps = [_differ(up[pid], base_up[pid]) for pid in (0, 1)]
    if all(len(up[pid]) == 0 for pid in (0, 1)):  # uploads nothing (Local): its own model
        gaps = [_differ(kept, base_kept)]
    if key in entry.replaced_by:
        assert max(gaps) == 0.0, (name, key, gaps)
    else:
        assert max(gaps) > 1e-6, (name, key, gaps)


def test_uploads_are_reproducible_so_a_difference_is_the_key(tmp_path, monkeypatch):
    """The same round twice uploads the same arrays: the test above compares like with like."""
    for name in ("fedavg", "pfedhn", "local"):
        (a, ka), (b, kb) = (_uploads(name, tmp_path, monkeypatch) for _ in range(2))
        assert all(_differ(a[pid], b[pid]) == 0.0 for pid in (0, 1)), name
        assert _differ(ka, kb) == 0.0, name
    assert ka and not a[0], "Local uploads nothing and keeps its model"


def test_refusals_name_a_known_train_key_and_a_reason():
    keys = set(config.train_keys())
    for name, entry in registry.REGISTRY.items():
        for key, reason in entry.refuses.items():
            assert key in keys and key not in entry.replaced_by, (name, key)
            assert len(reason) > 40 and re.search(r"Alg\. \d|eq\. \d|section", reason), name
        assert set(entry.replaced_by) <= keys, name


def test_apfl_refuses_momentum_with_its_own_reason_not_scaffolds():
    with pytest.raises(config.ConfigError) as err:
        small_config(strategy="apfl", **{"train.momentum": 0.9})
    assert "APFL (Deng et al. 2020" in str(err.value) and "K * lr" not in str(err.value)
    # SCAFFOLD: weight decay is defined (the gradient of an L2 term of F_i), momentum is not
    small_config(strategy="scaffold", **{"train.weight-decay": 0.01})
    # the family's own hyper-parameters replace train.lr etc.: accepted, documented
    small_config(strategy="pfedme", **{"train.lr": 0.01, "train.batch-size": 50})
    with pytest.raises(config.ConfigError, match="SCAFFOLD's option II"):
        small_config(strategy="scaffold", **{"train.momentum": 0.9})


def test_defaults_pass_for_every_strategy():
    for name in registry.REGISTRY:
        small_config(strategy=name, **BASE)


def test_docs_table_is_the_registrys():
    text = DOCS.read_text(encoding="utf-8")
    start = "<!-- training-table: begin -->\n"
    end = "<!-- training-table: end -->"
    assert start in text and end in text
    committed = text.split(start, 1)[1].split(end, 1)[0]
    assert committed == registry.training_table(config.train_keys()), (
        "docs/training.md's table is stale: paste "
        "flower_pfl.registry.training_table(flower_pfl.config.train_keys())")
