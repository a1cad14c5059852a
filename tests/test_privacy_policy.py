"""The privacy.* keys, the per-strategy DP decisions and docs/privacy.md's table."""

from __future__ import annotations

from pathlib import Path

import pytest

from flower_pfl import config
from flower_pfl.contract import MODES
from flower_pfl.privacy.policy import decision, markdown_table
from flower_pfl.registry import REGISTRY

CLIENT = {"mode": "client-level", "clip-norm": 1.0, "noise-multiplier": 1.0}
SAMPLE = {"mode": "sample-level", "noise-multiplier": 1.0, "max-grad-norm": 1.0}
DOC = Path(__file__).resolve().parent.parent / "docs" / "privacy.md"


def problems(tree) -> str:
    with pytest.raises(config.ConfigError) as err:
        config.validate(tree)
    return str(err.value)


DECISIONS = {name: decision(name) for name in sorted(REGISTRY)}


def test_every_registered_strategy_has_a_decision():
    assert all(d.clipped for d in DECISIONS.values())


@pytest.mark.parametrize("strategy,mode", [(s, m) for s in sorted(DECISIONS) for m in MODES[1:]
                                           if DECISIONS[s].refusal(m)])
def test_each_refused_strategy_and_mode_gives_its_reason(strategy, mode):
    privacy = CLIENT if mode == "client-level" else SAMPLE
    text = problems({"strategy": strategy, "privacy": privacy})
    assert f"privacy.mode {mode!r} is refused for strategy {strategy!r}" in text
    assert DECISIONS[strategy].refusal(mode) in text


@pytest.mark.parametrize("strategy,mode", [("fedavg", "client-level"), ("plgu-lf", "client-level"),
                                           ])
def test_allowed_strategy_and_mode_validate(strategy, mode):
    privacy = CLIENT if mode == "client-level" else SAMPLE
    assert config.validate({"strategy": strategy, "privacy": privacy})["privacy.mode"] == mode


def test_keys_of_another_mode_are_refused_with_their_reader():
    text = problems({"privacy": {"clip-norm": 1.0, "target-epsilon": 3}})
    assert "'privacy.clip-norm' = 1.0 is read only with privacy.mode client-level" in text
    assert "'privacy.target-epsilon' = 3.0 is read only" in text
    text = problems({"privacy": {**SAMPLE, "clip-norm": 1.0, "noise": "clients",
                                 "target-epsilon": 2.0}})
    assert "'privacy.noise' = 'clients'" in text and "opacus' accountant" in text
    assert "'privacy.max-grad-norm' = 1.0 is read only with privacy.mode sample-level" in \
        problems({"privacy": {**CLIENT, "max-grad-norm": 1.0}})


def test_required_keys_and_ranges_name_the_key():
    text = problems({"privacy": {"mode": "client-level"}})
    assert "'privacy.clip-norm' must be set" in text
    assert "'privacy.noise-multiplier' must be set" in text
    assert "'privacy.max-grad-norm' must be set" in problems({"privacy": {
        "mode": "sample-level", "noise-multiplier": 1.0}})
    assert "privacy.delta" in problems({"privacy": {**CLIENT, "delta": 1.5}})
    assert "privacy.mode" in problems({"privacy": {"mode": "user-level"}})


def test_a_target_below_one_round_and_a_tighter_max_update_norm_are_refused():
    text = problems({"clients": 20, "privacy": {**CLIENT, "target-epsilon": 0.5}})
    assert "below the ε of a single round" in text
    text = problems({"max-update-norm": 0.5, "privacy": CLIENT})
    assert "'max-update-norm' = 0.5 is below 'privacy.clip-norm' = 1.0" in text


def test_docs_table_is_generated_from_the_policy():
    text = DOC.read_text(encoding="utf-8")
    assert markdown_table() in text, "regenerate: python -m flower_pfl.privacy.policy"


def test_adaptive_clip_keys_and_their_checks():
    text = problems({"privacy": {**CLIENT, "clip-lr": 0.5}})
    assert "'privacy.clip-lr' = 0.5 is read only with privacy.adaptive-clip true" in text
    text = problems({"clients": 20, "privacy": {**CLIENT, "adaptive-clip": True}})
    assert "'privacy.count-noise' = 0.2 (null: m/20) is too small" in text  # m = 4
    assert "needs privacy.noise server" in problems({"privacy": {
        **CLIENT, "adaptive-clip": True, "noise": "clients", "count-noise": 5.0}})
    assert "adaptive-clip" in problems({"privacy": {**SAMPLE, "adaptive-clip": True}})
    ok = config.validate({"privacy": {**CLIENT, "adaptive-clip": True, "count-noise": 5.0}})
    assert ok["privacy.adaptive-clip"] is True
