"""Typed hyper-parameter views (flower_pfl/strategies/hyper_view.py): each view's fields are
its strategies' catalog keys, read as validated (no conversion), and a field whose key is
missing fails at construction naming it."""

from __future__ import annotations

from dataclasses import dataclass, fields

import pytest

from flower_pfl.registry import REGISTRY
from flower_pfl.strategies.apfl import APFLHyper
from flower_pfl.strategies.ditto import DittoHyper
from flower_pfl.strategies.fedavg import FineTuneHyper
from flower_pfl.strategies.fedprox import FedProxHyper
from flower_pfl.strategies.fedrep import FedRepHyper
from flower_pfl.strategies.fedsam import SAMHyper
from flower_pfl.strategies.hyper_view import HyperView, hyper_key, read_hyper, read_views
from flower_pfl.strategies.perfedavg import PerFedAvgHyper

#: each view -> the strategies that name it (the class and its subclasses)
READERS = {
    FineTuneHyper: ["fedavg-ft", "fedprox-ft"], FedProxHyper: ["fedprox", "fedprox-ft"],
    DittoHyper: ["ditto"], PerFedAvgHyper: ["perfedavg"], APFLHyper: ["apfl"],
    SAMHyper: ["fedsam", "plgu-lf"], FedRepHyper: ["fedrep", "plgu-grep"],
}


@pytest.mark.parametrize("view,name", [(v, n) for v, ns in READERS.items() for n in ns])
def test_each_view_reads_its_strategies_catalog_defaults_unchanged(view, name):
    defaults = {k: h.default for k, h in REGISTRY[name].hyper.items()}
    got = read_hyper(view, defaults)
    for f in fields(view):
        key = hyper_key(f.name)
        if key in defaults:  # the value itself, not a converted copy
            assert getattr(got, f.name) is defaults[key]
        else:  # only a field with a default may be absent (FedRep's reading)
            assert getattr(got, f.name) == f.default


def test_a_field_without_its_key_fails_at_construction_naming_it():
    @dataclass(frozen=True)
    class Misspelt:
        pick_ration: float

    with pytest.raises(TypeError, match=r"Misspelt.pick_ration: .*no 'pick-ration' .*pick-ratio"):
        read_hyper(Misspelt, {"pick-ratio": 0.8})


def test_field_names_map_to_keys():
    assert hyper_key("alpha_k") == "alpha-k"
    assert hyper_key("lambda_") == "lambda"
    assert hyper_key("eq13_samples") == "eq13-samples"


def test_a_default_fills_only_an_absent_key():
    assert read_hyper(FedRepHyper, {"head-epochs": 5, "body-epochs": 1}).reading == "one-model"
    assert read_hyper(FedRepHyper, {"head-epochs": 5, "body-epochs": 1,
                                    "reading": "two-model"}).reading == "two-model"


def test_read_hyper_refuses_a_non_dataclass():
    with pytest.raises(TypeError, match="dataclass"):
        read_hyper(dict, {})


class _Owner:
    """A strategy's shape: ``hyper`` set, then every view read (as PersonalizedStrategy's
    ``__init__`` ends)."""

    ft_hyper = HyperView(FineTuneHyper)

    def __init__(self, hyper: dict) -> None:
        self.hyper = hyper
        read_views(self)


class _Child(_Owner):
    prox_hyper = HyperView(FedProxHyper)


def test_a_view_is_read_when_the_strategy_is_built_and_kept():
    owner = _Child({"finetune-steps": 7, "mu": 0.25})
    assert owner.ft_hyper.finetune_steps == 7 and owner.prox_hyper.mu == 0.25
    assert owner.ft_hyper is owner.ft_hyper  # read once, kept
    owner.hyper = {"finetune-steps": 99}  # not read again
    assert owner.ft_hyper.finetune_steps == 7
    # a base class's view is read too, when the object is built -- not in a round
    with pytest.raises(TypeError, match="FedProxHyper.mu: the hyper-parameters hold no 'mu'"):
        _Child({"finetune-steps": 7})
    with pytest.raises(TypeError, match="'finetune-steps'"):
        _Child({"mu": 0.25})
    assert isinstance(_Owner.ft_hyper, HyperView)  # on the class: the descriptor


def test_a_strategy_whose_hyper_parameters_lack_a_views_key_fails_when_built(tmp_path):
    from dataclasses import replace

    from flower_pfl.registry import strategy_class
    from tests.conftest import small_config

    cfg = small_config(strategy="fedprox-ft")
    built = strategy_class("fedprox-ft")(cfg, results_dir=tmp_path / "ok")
    assert vars(built)["_prox_hyper_view"].mu == cfg.hyper["mu"]  # read in __init__
    lacking = replace(cfg, hyper={k: v for k, v in cfg.hyper.items() if k != "mu"})
    with pytest.raises(TypeError, match="FedProxHyper.mu: the hyper-parameters hold no 'mu'"):
        strategy_class("fedprox-ft")(lacking, results_dir=tmp_path / "lacking")
