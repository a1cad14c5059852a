"""APFL: gradients through the mixture (v and alpha), state v_i/alpha_i across rounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from flower_pfl.algorithms.baselines_math import apfl_step
from flower_pfl.config import ConfigError
from tests.conftest import small_config
from tests.test_baselines import TINY, replay_fit, state_arrays, state_values, two_rounds


def _tiny():
    torch.manual_seed(0)
    w, v = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    return w, v, x, y


def test_apfl_step_matches_the_mixture_gradients_by_hand():
    w, v, x, y = _tiny()
    alpha, lr, alpha_lr = 0.3, 0.1, 0.2
    w0 = [p.detach().clone() for p in w.parameters()]
    v0 = [p.detach().clone() for p in v.parameters()]
    # by hand: vbar = alpha v + (1 - alpha) w; g = grad f(vbar)
    weight = (alpha * v0[0] + (1 - alpha) * w0[0]).requires_grad_(True)
    bias = (alpha * v0[1] + (1 - alpha) * w0[1]).requires_grad_(True)
    g = torch.autograd.grad(F.cross_entropy(x @ weight.T + bias, y), [weight, bias])
    gw = torch.autograd.grad(F.cross_entropy(w(x), y), list(w.parameters()))
    d_alpha = sum(((vv - ww) * gg).sum() for vv, ww, gg in zip(v0, w0, g))

    new_alpha, _, _ = apfl_step(w, v, alpha, x, y, lr, alpha_lr, F.cross_entropy)
    for p, p0, gg in zip(v.parameters(), v0, g):  # grad_v = alpha * grad f(vbar)
        assert torch.allclose(p, p0 - lr * alpha * gg, atol=1e-6)
    for p, p0, gg in zip(w.parameters(), w0, gw):  # w: plain SGD on f(w)
        assert torch.allclose(p, p0 - lr * gg, atol=1e-6)
    assert new_alpha == pytest.approx(alpha - alpha_lr * float(d_alpha), abs=1e-6)
    assert new_alpha != alpha


def test_alpha_is_fixed_without_adaptation_and_clipped_to_unit_interval():
    w, v, x, y = _tiny()
    assert apfl_step(w, v, 0.4, x, y, 0.1, 0.2, F.cross_entropy, adapt_alpha=False)[0] == 0.4
    with torch.no_grad():
        for p in v.parameters():
            p.mul_(50.0)  # far from w: a huge alpha gradient
    a = apfl_step(w, v, 0.5, x, y, 0.1, 1e4, F.cross_entropy)[0]
    assert 0.0 <= a <= 1.0


def test_v_and_alpha_continue_across_rounds(tmp_path):
    cfg = small_config(strategy="apfl", rounds=2, **TINY)
    s, proxies, before, ins, res = two_rounds(cfg, tmp_path)
    pid = 2
    alpha1 = float(state_values(before[pid], "apfl")["alpha"])
    alpha2 = float(state_values(proxies[pid].context.state, "apfl")["alpha"])
    assert alpha1 != cfg.hyper["alpha-init"] and alpha2 != alpha1  # alpha adapts
    v2 = state_arrays(proxies[pid].context.state, "apfl-v")
    # round 2 replayed from the round-1 state gives the stored v_i, alpha_i ...
    again, _ = replay_fit(proxies[pid], before[pid], ins[pid])
    for a, b in zip(state_arrays(again, "apfl-v"), v2):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert float(state_values(again, "apfl")["alpha"]) == pytest.approx(alpha2)
    # ... while a client starting fresh (v_i = global, alpha_i = alpha-init) ends elsewhere
    fresh, _ = replay_fit(proxies[pid], None, ins[pid])
    assert max(float(np.abs(a - b).max()) for a, b in
               zip(state_arrays(fresh, "apfl-v"), v2)) > 1e-4
    assert float(state_values(fresh, "apfl")["alpha"]) != pytest.approx(alpha2)
    # the personalized (mixture) model is evaluated beside the global one, and differs
    last = (tmp_path / "rounds.csv").read_text()
    assert "global_mean" in last


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_alpha_zero_or_one_is_rejected(alpha):
    with pytest.raises(ConfigError, match="0 is FedAvg, 1 is Local"):
        small_config(strategy="apfl", **{"hyper.apfl.alpha-init": alpha})


def test_personalized_model_is_the_mixture_of_v_and_w():
    """APFL's personalized model: vbar_i = alpha_i v_i + (1 - alpha_i) w with the client's
    stored v_i and alpha_i and the global w it is sent; w alone is the global model."""
    from flower_pfl.clients.apfl import APFLClient
    from flower_pfl.learning.models import initial_arrays, model_for, set_arrays
    from flower_pfl.learning.training import evaluate
    from tests.test_baselines import make_client

    cfg = small_config(strategy="apfl", **TINY)
    w = initial_arrays(cfg)
    rng = np.random.default_rng(0)
    v = [a + rng.normal(0, 0.05, size=a.shape).astype(np.float32) for a in w]
    client = make_client(APFLClient, pid=1)
    client.state.set_arrays("apfl-v", v)
    client.state.set_values("apfl", {"alpha": 0.3})
    config = {"cfg": cfg.to_json(), "round": 2, "eval-global": True, "alpha-init": 0.5,
              "alpha-lr": 0.05, "adapt-alpha": True}
    loss, _, metrics = client.evaluate([a.copy() for a in w], config)
    model = model_for(cfg)
    set_arrays(model, [0.3 * a + 0.7 * b for a, b in zip(v, w)])
    want, _ = evaluate(model, client.data.x_test, client.data.y_test, torch.device("cpu"))
    assert loss == pytest.approx(want, rel=1e-5)
    assert abs(loss - metrics["global_loss"]) > 1e-3  # the mixture is not w
    # a client that never trained (no v_i yet) evaluates w itself
    fresh, _, m = make_client(APFLClient, pid=1).evaluate([a.copy() for a in w], config)
    assert fresh == pytest.approx(m["global_loss"])


def test_round_two_trains_the_stored_v_not_a_copy_of_w(tmp_path):
    """v_i continues across rounds: the same client state with v_i replaced by the global
    model it receives (alpha_i kept) ends round 2 elsewhere."""
    import copy

    from flwr.common import parameters_to_ndarrays

    from flower_pfl.clients.state import ClientState

    cfg = small_config(strategy="apfl", rounds=2, **TINY)
    s, proxies, before, ins, res = two_rounds(cfg, tmp_path)
    gap = lambda a, b: max(float(np.abs(x - y).max()) for x, y in zip(a, b))  # noqa: E731
    for pid in (1, 3):
        w_t = parameters_to_ndarrays(ins[pid].parameters)
        assert gap(state_arrays(before[pid], "apfl-v"), w_t) > 1e-3  # v_i is not w^t
        v2 = state_arrays(proxies[pid].context.state, "apfl-v")
        view = ClientState(copy.deepcopy(before[pid]))
        view.resolve(1)  # round 1 was accepted
        view.set_arrays("apfl-v", w_t)
        state, _ = replay_fit(proxies[pid], view.records, ins[pid])
        assert gap(state_arrays(state, "apfl-v"), v2) > 1e-4


def _one_weight_models(w0, v0):
    w, v = torch.nn.Linear(1, 1, bias=False), torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        w.weight.fill_(w0)
        v.weight.fill_(v0)
    return w, v


def _squared_error(out, y):
    return ((out - y) ** 2).mean()


@pytest.mark.parametrize("target,alpha_lr,want_alpha", [
    (2.0, 0.1, 0.72),    # inside [0, 1] and above 0.5 (a real APFL run reaches 0.578)
    (2.0, 1.0, 1.0),     # 0.4 + 3.2 = 3.6: clipped at the upper end, 1
    (-2.0, 0.1, 0.0)])   # 0.4 - 0.48 = -0.08: clipped at the lower end, 0
def test_alpha_moves_above_one_half_and_is_clipped_at_both_ends_by_hand(
        target, alpha_lr, want_alpha):
    """One weight, w = 0, v = 1, x = 1, squared error to the target y: vbar = alpha, so
    f(vbar) = (alpha - y)^2, d f / d alpha = 2 (alpha - y) (v - w) x = 2 (alpha - y);
    from alpha = 0.4: y = 2 gives -3.2, y = -2 gives 4.8.  The steps of w and v by hand
    too (eta = 0.1): w <- 0 - 0.1 * 2 (0 - y); v <- 1 - 0.1 * alpha * 2 (alpha - y)."""
    w, v = _one_weight_models(0.0, 1.0)
    x, y = torch.tensor([[1.0]]), torch.tensor([[target]])
    alpha, loss_w, loss_mix = apfl_step(w, v, 0.4, x, y, 0.1, alpha_lr, _squared_error)
    assert alpha == pytest.approx(want_alpha, abs=1e-6)
    assert loss_w == pytest.approx(target ** 2) and loss_mix == pytest.approx((0.4 - target) ** 2)
    assert float(w.weight) == pytest.approx(0.2 * target, abs=1e-6)
    assert float(v.weight) == pytest.approx(1.0 - 0.1 * 0.4 * 2 * (0.4 - target), abs=1e-6)
