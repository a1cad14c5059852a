"""Typed hyper-parameter views (flower_pfl/strategies/hyper_view.py): each view's fields are
its strategies' catalog keys, read as validated (no conversion), and a field whose key is
missing fails at construction naming it."""

from __future__ import annotations

from dataclasses import dataclass, fields

import pytest

from flower_pfl.registry import REGISTRY
from flower_pfl.strategies.apfl import APFLHyper
from flower_pfl.strategies.ditto import DittoHyper
from flower_pfl.strategies.fedacs import FedACSHyper
from flower_pfl.strategies.fedamp import FedAMPHyper
from flower_pfl.strategies.fedavg import FineTuneHyper
from flower_pfl.strategies.fedprox import FedProxHyper
from flower_pfl.strategies.fedrep import FedRepHyper
from flower_pfl.strategies.fedsam import SAMHyper
from flower_pfl.strategies.heurfedamp import HeurFedAMPHyper
from flower_pfl.strategies.hyper_view import hyper_key, read_hyper
from flower_pfl.strategies.message_passing import ScoredModel
from flower_pfl.strategies.perfedavg import PerFedAvgHyper
from flower_pfl.strategies.selffl import SelfFLHyper

#: each view -> the strategies whose __init__ reads it (the class and its subclasses)
READERS = {
    FineTuneHyper: ["fedavg-ft", "fedprox-ft"], FedProxHyper: ["fedprox", "fedprox-ft"],
    DittoHyper: ["ditto"], PerFedAvgHyper: ["perfedavg"], APFLHyper: ["apfl"],
    SAMHyper: ["fedsam", "plgu-lf"], FedRepHyper: ["fedrep", "plgu-grep"],
    ScoredModel: ["fedamp", "heurfedamp", "fedacs"], FedAMPHyper: ["fedamp"],
    HeurFedAMPHyper: ["heurfedamp"], FedACSHyper: ["fedacs"], SelfFLHyper: ["selffl"],
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
