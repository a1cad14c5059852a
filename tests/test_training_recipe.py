"""Every ``train.*`` key, for every registered strategy, is used or refused.

Used: one in-process round (2 real FMNIST clients, the Flower message path; two rounds for
the lr schedule's keys, which act from round 2 on) with the key changed uploads something
else than the same round without it -- the arrays the client returns, or, for a method that
uploads nothing (Local), the personal model it keeps.  Refused: validation stops with the
strategy's own reason (its catalog entry's ``refuses``), which names the hyper-parameter
that takes the key's role where one does.  There is no third kind.  The table of
docs/training.md is the registry's (``training_table``).  All in the fast tier: one test
per strategy, every key of it, each distinct run once (~0.1 s a run).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from flower_pfl import config, registry
from flower_pfl.catalog import NEEDS
from flower_pfl.clients.base import PFLClient
from flower_pfl.clients.state import ClientState
from flower_pfl.reporting import results
from flower_pfl.reporting.results import ResultsWriter
from flower_pfl.running import inprocess
from tests.conftest import small_config

DOCS = Path(__file__).resolve().parent.parent / "docs" / "training.md"
# 2 clients, both sampled, one round of 3 steps, no evaluation round, no checkpoint
BASE = {"clients": 2, "fraction-fit": 1.0, "rounds": 1, "model": "tests.tiny_model:mlp",
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


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The runs here are tiny (6,370 parameters, batches of 15): one intra-op thread is ~10x
    faster than two on a loaded 2-core machine (measured 0.05 s against 0.33-0.54 s a
    PLGU-GRep run) and changes nothing the tests compare (each compares runs of one
    setting)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


#: a strategy's own settings in BASE: FedFomo trains on its training split less its
#: validation share, and the default 0.2 leaves whole batches of 15 here (nothing for
#: train.drop-last to drop); 0.25 leaves a remainder
OWN_BASE = {"fedfomo": {"hyper.fedfomo.val-fraction": 0.25}}


def _base(name):
    """BASE for strategy ``name``: the keys it refuses left at their defaults, and its own
    settings (``OWN_BASE``)."""
    return {**{k: v for k, v in BASE.items() if k not in registry.REGISTRY[name].refuses},
            **OWN_BASE.get(name, {})}


def test_every_train_key_has_a_changed_value():
    assert set(CHANGED) == set(config.train_keys())
    for key, (changed, base, _) in CHANGED.items():
        assert changed[key] != config.FIELDS[key].default and changed[key] != BASE.get(key), key
        assert key not in base and {k: v for k, v in changed.items() if k != key} == base, key
    # a key that acts only under another's non-default value is changed with that value
    for key, needed in NEEDS.items():
        assert CHANGED[key][0][needed] != config.FIELDS[needed].default, key
    schedule = {k for k, needed in NEEDS.items() if needed == "train.lr-schedule"}
    assert schedule == set(config.SCHEDULE_KEYS)


def _uploads(name, tmp_path, monkeypatch, rounds=1, **changed):
    """partition-id -> (uploaded arrays, the arrays the fit wrote to its state) of
    ``rounds`` in-process rounds of ``name`` (BASE, its refused keys at their defaults,
    with ``changed``)."""
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
    monkeypatch.setattr(results, "write_heatmap_png", lambda *a, **k: None)  # nor heatmap
    monkeypatch.setattr(ClientState, "set_arrays", spy_set)
    cfg = small_config(strategy=name, **{**_base(name), "rounds": rounds, **changed})
    inprocess.run(cfg, tmp_path / f"run-{len(list(tmp_path.iterdir()))}")
    monkeypatch.undo()
    assert sorted(got) == [0, 1], got.keys()
    return got, kept.get(-1, [])


def _differ(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    if len(a) != len(b):
        return float("inf")
    return max((float(np.abs(x.astype(np.float64) - y).max()) if x.shape == y.shape
                else float("inf") for x, y in zip(a, b)), default=0.0)


@pytest.mark.parametrize("name", sorted(registry.REGISTRY))
def test_every_train_key_is_used_or_refused(name, tmp_path, monkeypatch):
    """For each ``train.*`` key, in config order: refused -- validation of the key's changed
    value names the entry's reason (and what the key needs, the optimizer or schedule, is
    refused with it); otherwise used -- the key's prerequisites validate and the upload of
    the round with the key changed differs from the same round without.  One test per
    strategy, each distinct run once: a key is checked or the test fails, none skipped."""
    entry, base = registry.REGISTRY[name], _base(name)
    runs: dict[str, tuple] = {}

    def uploads(settings, rounds):
        cache = repr((sorted(settings.items()), rounds))
        if cache not in runs:
            runs[cache] = _uploads(name, tmp_path, monkeypatch, rounds, **settings)
        return runs[cache]

    checked = []
    for key in config.train_keys():
        changed, before, rounds = CHANGED[key]
        if key in entry.refuses:
            with pytest.raises(config.ConfigError) as err:
                small_config(strategy=name, **{**base, **changed})
            assert f"'{key}' = {changed[key]!r} is not used by '{name}'" in str(err.value)
            assert entry.refuses[key] in str(err.value), key
            checked.append(key)
            continue
        needs = {k for k, v in changed.items() if v != config.FIELDS[k].default}
        assert not needs & set(entry.refuses), (name, key)  # what the key needs is accepted
        (up, kept), (base_up, base_kept) = uploads(changed, rounds), uploads(before, rounds)
        gaps = [_differ(up[pid], base_up[pid]) for pid in (0, 1)]
        if all(len(up[pid]) == 0 for pid in (0, 1)):  # uploads nothing (Local): its own model
            gaps = [_differ(kept, base_kept)]
        assert max(gaps) > 1e-6, (name, key, gaps)
        checked.append(key)
    assert checked == list(config.train_keys())


def test_uploads_are_reproducible_so_a_difference_is_the_key(tmp_path, monkeypatch):
    """The same round twice uploads the same arrays: the test above compares like with like."""
    for name in ("fedavg", "pfedhn", "local"):
        (a, ka), (b, kb) = (_uploads(name, tmp_path, monkeypatch) for _ in range(2))
        assert all(_differ(a[pid], b[pid]) == 0.0 for pid in (0, 1)), name
        assert _differ(ka, kb) == 0.0, name
    assert ka and not a[0], "Local uploads nothing and keeps its model"


def test_refusals_name_a_known_train_key_a_reason_and_what_replaces_it():
    """Each reason cites the paper (an algorithm, equation or section); a hyper-parameter it
    names as taking the key's role (``hyper.<name>.<param>``) is one of the entry's; a key
    that acts only under a refused key is refused too.  No "accepted but not used" kind."""
    keys = set(config.train_keys())
    for name, entry in registry.REGISTRY.items():
        assert not getattr(entry, "replaced_by", None), name
        for key, reason in entry.refuses.items():
            assert key in keys, (name, key)
            assert len(reason) > 40 and re.search(r"Alg\. \d|eq\. \d|section", reason), name
            for other, param in re.findall(r"hyper\.([\w-]+)\.([\w-]+)", reason):
                assert other == name and param in entry.hyper, (name, key, param)
        for key, needed in NEEDS.items():
            assert (key in entry.refuses) == (needed in entry.refuses), (name, key)


def test_apfl_refuses_momentum_with_its_own_reason_not_scaffolds():
    with pytest.raises(config.ConfigError) as err:
        small_config(strategy="apfl", **{"train.momentum": 0.9})
    assert "APFL (Deng et al. 2020" in str(err.value) and "K * lr" not in str(err.value)
    # SCAFFOLD: weight decay is defined (the gradient of an L2 term of F_i), momentum is not
    small_config(strategy="scaffold", **{"train.weight-decay": 0.01})
    with pytest.raises(config.ConfigError, match="SCAFFOLD's option II"):
        small_config(strategy="scaffold", **{"train.momentum": 0.9})


def test_a_key_replaced_by_a_hyper_parameter_is_refused_naming_it():
    """pFedBreD / pFedMe's solver runs on its own step sizes and batch; FedRep counts head
    and body passes: the train keys those take over are refused, the reason names them."""
    with pytest.raises(config.ConfigError) as err:
        small_config(strategy="pfedme", **{"train.lr": 0.01, "train.batch-size": 50})
    text = str(err.value)
    assert "'train.lr' = 0.01 is not used by 'pfedme'" in text
    assert "hyper.pfedme.alpha (the K prox steps" in text and "hyper.pfedme.alpha-m" in text
    assert "'train.batch-size' = 50 is not used by 'pfedme'" in text
    assert "one mini-batch of hyper.pfedme.batch-size samples" in text
    with pytest.raises(config.ConfigError, match=r"'train.epochs' = 3 is not used by "
                                                 r"'pfedbred-mh'.*hyper.pfedbred-mh.local-iter"):
        small_config(strategy="pfedbred-mh", **{"train.epochs": 3})
    with pytest.raises(config.ConfigError, match=r"'train.epochs' = 2 is not used by "
                                                 r"'plgu-grep'.*hyper.plgu-grep.head-epochs"):
        small_config(strategy="plgu-grep", **{"train.epochs": 2})
    # at their defaults they validate (a shared train section may write the defaults)
    small_config(strategy="pfedme", **{"train.lr": 0.05, "train.batch-size": 32})
    small_config(strategy="fedrep", **{"train.epochs": 1, "train.steps": 4})


def test_defaults_pass_for_every_strategy():
    for name in registry.REGISTRY:
        small_config(strategy=name, **_base(name))


def test_docs_table_is_the_registrys():
    text = DOCS.read_text(encoding="utf-8")
    start = "<!-- training-table: begin -->\n"
    end = "<!-- training-table: end -->"
    assert start in text and end in text
    committed = text.split(start, 1)[1].split(end, 1)[0]
    assert committed == registry.training_table(config.train_keys()), (
        "docs/training.md's table is stale: paste "
        "flower_pfl.registry.training_table(flower_pfl.config.train_keys())")
