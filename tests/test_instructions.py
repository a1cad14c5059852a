"""Typed instructions round-trip (flower_pfl/instructions.py): each declaration -> config
dict -> the same declaration; a missing or mistyped key is refused with its name; a
hand-made message with a distinct value per key decodes to the expected fields; every
strategy's message decodes with the declaration its client reads."""

from __future__ import annotations

import dataclasses

import pytest

from flower_pfl import instructions as ins
from flower_pfl import registry
from flower_pfl.catalog.baselines import (
    APFLInstruction,
    DittoFit,
    FedProxFit,
    PerFedAvgEval,
    PerFedAvgFit,
)
from flower_pfl.catalog.fedamp import FedAMPFit
from flower_pfl.catalog.pfedbred import PFedBreDFit, PFedBreDReply
from flower_pfl.catalog.plgu import FedRepFit, PLGUFit, SAMFit
from flower_pfl.catalog.selffl import SelfFLFit, SelfFLReply
from flower_pfl.instructions import WireError
from tests.conftest import small_config
from tests.test_baselines import TINY

#: a distinct value per field, by declared type (index i keeps the values apart)
SAMPLE = {str: lambda i: f"text-{i}", int: lambda i: 100 + i, float: lambda i: 0.5 + i,
          bool: lambda i: i % 2 == 0}
#: a value of the wrong type for each declared type
WRONG = {str: 7, int: 2.5, float: "0.5", bool: 1}


def sample(decl: type[ins.Wire]) -> ins.Wire:
    return decl(**{s.attr: SAMPLE[s.type](i) for i, s in enumerate(decl.specs())})


@pytest.mark.parametrize("decl", registry.wire_classes(), ids=lambda d: d.__name__)
def test_every_declaration_round_trips_through_the_config_dict(decl):
    value = sample(decl)
    config = value.to_config()
    assert list(config) == list(decl.keys())  # every field sent, in declaration order
    assert decl.from_config({**config, "unrelated-key": "ignored"}) == value
    assert decl.from_config(value.to_record()) == value  # Flower's ConfigRecord, too


@pytest.mark.parametrize("decl", registry.wire_classes(), ids=lambda d: d.__name__)
def test_a_missing_required_key_and_a_mistyped_key_are_refused_with_their_name(decl):
    config = sample(decl).to_config()
    for spec in decl.specs():
        if spec.required:
            with pytest.raises(WireError, match=f"{decl.__name__}: the key '{spec.key}' is "
                               "missing"):
                decl.from_config({k: v for k, v in config.items() if k != spec.key})
        else:  # an optional key may be absent: its default
            absent = decl.from_config({k: v for k, v in config.items() if k != spec.key})
            default = next(f.default for f in dataclasses.fields(decl) if f.name == spec.attr)
            assert getattr(absent, spec.attr) == default
        with pytest.raises(WireError, match=f"'{spec.key}' = .* wrong type: expected "
                           f"{spec.type.__name__}"):
            decl.from_config({**config, spec.key: WRONG[spec.type]})
        wrong = dataclasses.replace(sample(decl), **{spec.attr: WRONG[spec.type]})
        with pytest.raises(WireError, match=f"'{spec.key}'"):  # the sending side, too
            wrong.to_config()


def test_a_bool_is_not_a_number_and_an_int_is_taken_for_a_float():
    with pytest.raises(WireError, match="'mu' = True"):
        FedProxFit.from_config({"mu": True})
    with pytest.raises(WireError, match="'personal-steps' = False"):
        DittoFit.from_config({"lambda": 0.1, "personal-steps": False})
    got = FedProxFit.from_config({"mu": 2})
    assert got.mu == 2.0 and type(got.mu) is float
    assert type(FedProxFit(mu=3).to_config()["mu"]) is float


def test_a_hand_made_message_decodes_to_the_expected_fields():
    """A distinct value per key, so a swapped or misspelt key mapping shows."""
    message = {"strategy": "pfedbred", "round": 7, "cfg": "{}", "lambda": 15, "alpha": 0.01,
               "alpha-m": 0.02, "local-iterations": 20, "prox-steps": 5, "batch-size": 32,
               "theta-init": "carry", "prior": "meg", "eta": 0.3, "envelope": "mu",
               "eta-alpha": 0.4, "w_theta_gap": 9.0}
    assert PFedBreDFit.from_config(message) == PFedBreDFit(
        lam=15.0, alpha=0.01, alpha_m=0.02, local_iterations=20, prox_steps=5, batch_size=32,
        theta_init="carry", prior="meg", eta=0.3, envelope="mu", eta_alpha=0.4)
    sent = ins.RoundInstruction.from_config(message)
    assert (sent.strategy, sent.round, sent.run_uid, sent.cfg, sent.accepted_round) == \
        ("pfedbred", 7, "", "{}", None)  # run-uid, accepted-round absent: not said
    assert PFedBreDReply.from_config(message).w_theta_gap == 9.0
    assert DittoFit.from_config({"lambda": 0.7, "personal-steps": 3}) == \
        DittoFit(lam=0.7, personal_steps=3)
    assert PerFedAvgEval.from_config({"alpha": 0.03, "personal-steps": 4}) == \
        PerFedAvgEval(alpha=0.03, personal_steps=4)
    assert APFLInstruction.from_config(
        {"alpha-init": 0.25, "alpha-lr": 0.5, "adapt-alpha": False}) == \
        APFLInstruction(alpha_init=0.25, alpha_lr=0.5, adapt_alpha=False)
    # Self-FL: first-fits absent -> 1 (one bootstrap fit); the wire keys of the base round
    selffl = {"warmup": False, "sample-variance": True, "sigma0-sq": 1.5, "s-minus": -1.0,
              "eta": 0.01, "l-max": 40, "variance-estimator": "bootstrap",
              "contraction": "measured", "eq13-samples": "offset", "bootstrap-max-steps": 300,
              "bootstrap-tol": 0.02, "bootstrap-lr": -1.0, "oracle-sigma-sq": 0.125}
    got = SelfFLFit.from_config(selffl)
    assert (got.sigma0_sq, got.s_minus, got.l_max, got.oracle_sigma_sq, got.first_fits) == \
        (1.5, -1.0, 40, 0.125, 1)
    assert ins.RoundInstruction("fedamp", 3, "abc", accepted_round=2).to_config() == \
        {"strategy": "fedamp", "round": 3, "run-uid": "abc", "accepted-round": 2}  # no cfg
    assert SelfFLReply(sigma_sq=0.5).to_config() == {"sigma_sq": 0.5}


# --------------------------------------- each strategy's message, as its client reads it
HYPER = {  # a distinct value per instruction field: a swapped mapping changes a value
    "fedprox": ({"mu": 0.3}, FedProxFit, {"mu": 0.3}),
    "ditto": ({"lambda": 0.7, "personal-steps": 3}, DittoFit,
              {"lam": 0.7, "personal_steps": 3}),
    "perfedavg": ({"alpha": 0.02, "delta": 0.004, "variant": "hf"}, PerFedAvgFit,
                  {"alpha": 0.02, "delta": 0.004, "variant": "hf"}),
    "apfl": ({"alpha-init": 0.3, "alpha-lr": 0.7}, APFLInstruction,
             {"alpha_init": 0.3, "alpha_lr": 0.7}),
    "fedsam": ({"rho": 0.06}, SAMFit, {"rho": 0.06}),
    "plgu-lf": ({"rho": 0.07, "personal-layers": 1}, PLGUFit,
                {"rho": 0.07, "personal_layers": 1}),
    "plgu-grep": ({"rho": 0.08, "head-epochs": 2, "body-epochs": 3}, FedRepFit,
                  {"rho": 0.08, "head_epochs": 2, "body_epochs": 3}),
    "fedrep": ({"head-epochs": 4, "body-epochs": 1}, FedRepFit,
               {"rho": 0.0, "head_epochs": 4, "body_epochs": 1, "reading": "one-model"}),
    "plgu-ghn": ({"rho": 0.09}, SAMFit, {"rho": 0.09}),
    "pfedbred": ({"lambda": 12.0, "alpha": 0.01, "alpha-m": 0.02, "prox-steps": 4,
                  "local-iterations": 6, "batch-size": 7, "prior": "meg"}, PFedBreDFit,
                 {"lam": 12.0, "alpha": 0.01, "alpha_m": 0.02, "prox_steps": 4,
                  "local_iterations": 6, "batch_size": 7, "prior": "meg"}),
    "pfedme": ({"lambda": 12.0}, PFedBreDFit, {"lam": 12.0, "prior": "none"}),
    "selffl": ({"l-max": 33, "bootstrap-max-steps": 44, "bootstrap-tol": 0.03},
               SelfFLFit, {"l_max": 33, "bootstrap_max_steps": 44, "bootstrap_tol": 0.03,
                               "sigma0_sq": -1.0, "first_fits": 1}),
}


@pytest.mark.parametrize("name", sorted(HYPER))
def test_each_strategys_fit_message_is_what_its_client_reads(name, tmp_path):
    from flower_pfl.registry import strategy_class

    hyper, decl, expected = HYPER[name]
    cfg = small_config(strategy=name, **TINY,
                       **{f"hyper.{name}.{k}": v for k, v in hyper.items()})
    strategy = strategy_class(name)(cfg, results_dir=tmp_path)
    strategy.initialize_parameters(None)
    _, extra = strategy.fit_payload(0, 1)
    got = decl.from_config(extra)
    assert {k: getattr(got, k) for k in expected} == expected
    assert set(decl.keys()) - set(extra) <= {s.key for s in decl.specs() if not s.required}


def test_fedamp_family_sends_the_prox_weight_its_client_reads(tmp_path):
    from flower_pfl.strategies.heurfedamp import HeurFedAMP

    cfg = small_config(strategy="heurfedamp", **TINY,
                       **{"hyper.heurfedamp.alpha-k": 2.0, "hyper.heurfedamp.lambda": 0.3})
    sent = HeurFedAMP(cfg, results_dir=tmp_path).fit_config(0, 1)
    assert FedAMPFit.from_config(sent).prox_coef == pytest.approx(0.3 / 2.0)
