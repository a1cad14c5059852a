"""Sample-level DP is checked before start on the run's own model (issue 67): one DP-SGD
step of it; BatchNorm and in-place activations refused at validation with the fix named,
a model opacus can train passes (meta-pytorch/opacus#828, #319)."""

from __future__ import annotations

import pytest
import torch

from flower_pfl.reliability import preflight as pf
from tests.conftest import small_config

USER_MODULE = '''
from torch import nn


def batchnorm():
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 26 * 26, 10))


def groupnorm_inplace():  # what opacus' ModuleValidator.fix leaves of the model above
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(inplace=True),
                         nn.Flatten(), nn.Linear(4 * 26 * 26, 10))


def groupnorm():
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 26 * 26, 10))
'''

DP = {"privacy.mode": "sample-level", "privacy.noise-multiplier": 1.0,
      "privacy.max-grad-norm": 1.0}


def _values(tmp_path, factory, **more):
    (tmp_path / "dpnets_issue67.py").write_text(USER_MODULE)
    cfg = small_config(**{**DP, **more})
    return {**cfg.values, "model": f"dpnets_issue67:{factory}", "model-args": {}}


def _check(values, tmp_path):
    batch = torch.rand(8, 1, 28, 28)
    pf.check_model(values, None, [str(tmp_path)], batch, 10, [100, 100])


@pytest.mark.parametrize("factory, match", [
    ("batchnorm", r"model 'dpnets_issue67:batchnorm' cannot train under privacy.mode "
                  r"sample-level: opacus refuses it .*Fix: replace each BatchNorm with "
                  r"GroupNorm or LayerNorm \(opacus.validators.ModuleValidator.fix"),
    ("groupnorm_inplace", r"its in-place module\(s\) \['.*2'\] overwrite the outputs .*Fix: "
                          r"inplace=False \(e.g. nn.ReLU\(\) for nn.ReLU\(inplace=True\)\)"),
])
def test_a_model_opacus_cannot_train_is_refused_before_start_with_the_fix(tmp_path, factory,
                                                                          match):
    with pytest.raises(pf.PreflightError, match=match):
        _check(_values(tmp_path, factory), tmp_path)


def test_a_model_opacus_can_train_passes_and_without_dp_nothing_is_asked(tmp_path):
    _check(_values(tmp_path, "groupnorm"), tmp_path)
    plain = small_config()
    values = {**plain.values, "model": "dpnets_issue67:groupnorm_inplace", "model-args": {}}
    _check(values, tmp_path)  # in place is fine without DP


def test_whatever_else_the_step_raises_is_refused_with_its_type(tmp_path, monkeypatch):
    from flower_pfl.learning import training

    def broken(*args, **kwargs):
        raise RuntimeError("Output 0 of BackwardHookFunctionBackward is a view\nand more")

    monkeypatch.setattr(training, "dp_train", broken)
    with pytest.raises(pf.PreflightError, match=r"fails one DP-SGD step under privacy.mode "
                       r"sample-level \(the clients would fail in round 1\): RuntimeError: "
                       r"Output 0 of BackwardHookFunctionBackward is a view$"):
        _check(_values(tmp_path, "groupnorm"), tmp_path)
