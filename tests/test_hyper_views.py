"""Typed hyper-parameter views (flower_pfl/strategies/hyper_view.py): each view's fields are
its strategies' catalog keys, read as validated (no conversion), and a field whose key is
missing fails at construction naming it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from flower_pfl.strategies.hyper_view import HyperView, hyper_key, read_hyper, read_views


@dataclass(frozen=True)
class EpochsHyper:
    """A view with a defaulted field (as FedRep's reading was)."""

    head_epochs: int
    body_epochs: int
    reading: str = "one-model"


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
    assert read_hyper(EpochsHyper, {"head-epochs": 5, "body-epochs": 1}).reading == "one-model"
    assert read_hyper(EpochsHyper, {"head-epochs": 5, "body-epochs": 1,
                                    "reading": "two-model"}).reading == "two-model"


def test_read_hyper_refuses_a_non_dataclass():
    with pytest.raises(TypeError, match="dataclass"):
        read_hyper(dict, {})


@dataclass(frozen=True)
class FineTuneHyper:
    finetune_steps: int


@dataclass(frozen=True)
class FedProxHyper:
    mu: float


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

    class Viewed(strategy_class("fedprox-ft")):
        prox_hyper = HyperView(FedProxHyper)

    cfg = small_config(strategy="fedprox-ft")
    built = Viewed(cfg, results_dir=tmp_path / "ok")
    assert vars(built)["_prox_hyper_view"].mu == cfg.hyper["mu"]  # read in __init__
    lacking = replace(cfg, hyper={k: v for k, v in cfg.hyper.items() if k != "mu"})
    with pytest.raises(TypeError, match="FedProxHyper.mu: the hyper-parameters hold no 'mu'"):
        Viewed(lacking, results_dir=tmp_path / "lacking")
