"""pFedBreD_ns (lg / meg / mh) and pFedMe: eq. 14, the prox step and the envelope gradient by
hand on a tiny model, line 12 on the server, config rejections, pFedMe = pFedBreD with the
meta-step off (bit for bit), client state across rounds, and personalization on real FMNIST."""

from __future__ import annotations

import csv
import logging

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from flower_pfl import config
from flower_pfl.algorithms import pfedbred_math as pm
from flower_pfl.running import inprocess
from tests.conftest import small_config


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    # as in a Ray client actor (num-cpus 1): on a shared 2-core machine two intra-op threads
    # made each tiny SGD step ~60x slower
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------- a tiny model, by hand
X = np.array([[1.0, 2.0], [0.5, -1.0], [-1.5, 0.5]])
Y = np.array([0, 1, 1])
W0 = np.array([[0.2, -0.1], [0.4, 0.3]])  # 2 classes x 2 features, no bias


def _ce_grad(w: np.ndarray) -> np.ndarray:
    """d/dW mean_n CE(softmax(W x_n), y_n) = mean_n (p_n - e_{y_n}) x_n^T."""
    logits = X @ w.T
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(Y)), Y] -= 1.0
    return p.T @ X / len(Y)


def _tiny(w: np.ndarray) -> torch.nn.Linear:
    m = torch.nn.Linear(2, 2, bias=False).double()
    with torch.no_grad():
        m.weight.copy_(torch.tensor(w))
    return m


XB, YB = torch.tensor(X), torch.tensor(Y)
T = lambda a: [torch.tensor(np.asarray(a, dtype=np.float64))]  # noqa: E731 - terse test shorthand


def test_loss_gradient_and_lg_meta_step_by_hand():
    grad = pm.loss_gradient(_tiny(W0), XB, YB, F.cross_entropy)
    np.testing.assert_allclose(grad[0].numpy(), _ce_grad(W0), rtol=1e-12)
    mu = pm.meta_step(T(W0), "lg", grad_f=grad, eta_alpha=0.3)
    np.testing.assert_allclose(mu[0].numpy(), W0 - 0.3 * _ce_grad(W0), rtol=1e-12)


def test_meg_meta_step_by_hand():
    w, mem, theta = T([1.0, 2.0]), T([3.0, 1.0]), T([0.5, 0.5])
    mu = pm.meta_step(w, "meg", w_memory=mem, theta=theta, eta=0.1)
    # mu = w - eta (w_{i,R}^(t-1) - theta) = [1 - 0.1*2.5, 2 - 0.1*0.5]
    np.testing.assert_allclose(mu[0].numpy(), [0.75, 1.95], rtol=1e-12)


def test_mh_meta_step_is_both_terms_by_hand():
    mem, theta = T(W0 + 1.0), T(W0 - 0.5)
    grad = pm.loss_gradient(_tiny(W0), XB, YB, F.cross_entropy)
    mu = pm.meta_step(T(W0), "mh", grad_f=grad, w_memory=mem, theta=theta, eta=0.05,
                      eta_alpha=0.01)
    expected = W0 - 0.01 * _ce_grad(W0) - 0.05 * ((W0 + 1.0) - (W0 - 0.5))
    np.testing.assert_allclose(mu[0].numpy(), expected, rtol=1e-12)
    # pFedMe: mu = w, nothing else
    np.testing.assert_array_equal(pm.meta_step(T(W0), "none")[0].numpy(), W0)


@pytest.mark.parametrize("steps", [1, 2])
def test_prox_steps_by_hand(steps):
    # theta <- theta - alpha (grad f(theta) + lambda (theta - mu)), K times on one batch.
    # Removing the prox term, or detaching it (zero gradient), changes every entry.
    mu = W0 + np.array([[0.3, -0.1], [0.1, 0.4]])
    theta0, lam, alpha = W0 - 0.2, 15.0, 0.01
    model = _tiny(theta0)
    pm.prox_steps(model, T(mu), lam, alpha, steps, XB, YB, F.cross_entropy)
    expected = theta0
    for _ in range(steps):
        expected = expected - alpha * (_ce_grad(expected) + lam * (expected - mu))
    np.testing.assert_allclose(model.weight.detach().numpy(), expected, rtol=1e-12)
    without_prox = theta0 - alpha * _ce_grad(theta0)
    assert np.abs(model.weight.detach().numpy() - without_prox).min() > 1e-3


def test_envelope_gradient_and_main_step_by_hand():
    w, theta = np.array([[1.0, -2.0], [0.5, 0.0]]), np.array([[0.5, -1.0], [0.5, 1.0]])
    mu = np.array([[0.8, -1.5], [0.2, 0.4]])
    g = pm.envelope_gradient(T(mu), T(theta), 15.0)
    np.testing.assert_allclose(g[0].numpy(), 15.0 * (mu - theta), rtol=1e-12)
    model = _tiny(w)
    pm.main_step(model, T(mu), T(theta), 15.0, 0.01)  # eq. 13: w <- w - alpha_m lambda (mu - theta)
    np.testing.assert_allclose(model.weight.detach().numpy(), w - 0.15 * (mu - theta), rtol=1e-12)
    model = _tiny(w)
    pm.main_step(model, T(w), T(theta), 15.0, 0.01)  # envelope w: w - alpha_m lambda (w - theta)
    np.testing.assert_allclose(model.weight.detach().numpy(), w - 0.15 * (w - theta), rtol=1e-12)


def _prox_by_hand(theta, mu, lam, alpha, k):
    for _ in range(k):
        theta = theta - alpha * (_ce_grad(theta) + lam * (theta - mu))
    return theta


@pytest.mark.parametrize("envelope", ["mu", "w"])
def test_line_9_of_one_local_iteration_is_eq_13_by_hand(envelope):
    """lg, one local iteration on the tiny model: mu = w - eta_a grad f(w), theta = K prox
    steps from theta_0, then line 9 with eq. 13's lambda (mu - theta) (or lambda (w - theta))."""
    w_model, theta0 = _tiny(W0), np.array([[0.1, 0.0], [0.3, 0.2]])
    theta_model = _tiny(theta0)
    lam, alpha, alpha_m, k, eta_a = 15.0, 0.01, 0.02, 3, 0.3
    pm.local_round(w_model, theta_model, None, [(XB, YB)], prior="lg", lam=lam, alpha=alpha,
                   alpha_m=alpha_m, prox_iters=k, eta=0.0, eta_alpha=eta_a,
                   loss_fn=F.cross_entropy, envelope=envelope)
    mu = W0 - eta_a * _ce_grad(W0)
    theta = _prox_by_hand(theta0, mu, lam, alpha, k)
    centre = mu if envelope == "mu" else W0
    np.testing.assert_allclose(theta_model.weight.detach().numpy(), theta, rtol=1e-12)
    np.testing.assert_allclose(w_model.weight.detach().numpy(),
                               W0 - alpha_m * lam * (centre - theta), rtol=1e-12)
    # the two envelopes give different w here (mu != w): the option is not inert
    assert not np.allclose(mu, W0)


def test_mh_lookahead_by_hand():
    """The authors' code's mh: look-ahead gradient on b2 at w - eta_a grad f(w; b1), applied
    to w, then the meg term around the new w, prox on b2, line 9 with mu."""
    x2, y2 = np.array([[0.3, -0.7], [1.2, 0.4]]), np.array([1, 0])

    def grad(w, x, y):
        logits = x @ w.T
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(len(y)), y] -= 1.0
        return p.T @ x / len(y)

    lam, alpha, alpha_m, k, eta, eta_a = 15.0, 0.01, 0.02, 2, 0.05, 0.3
    memory, theta0 = np.array([[0.25, -0.05], [0.35, 0.3]]), np.array([[0.1, 0.0], [0.3, 0.2]])
    w_model, theta_model = _tiny(W0), _tiny(theta0)
    b1, b2 = (XB, YB), (torch.tensor(x2), torch.tensor(y2))
    stats = pm.local_round(w_model, theta_model, T(memory), [b1, b2], prior="mh-lookahead",
                           lam=lam, alpha=alpha, alpha_m=alpha_m, prox_iters=k, eta=eta,
                           eta_alpha=eta_a, loss_fn=F.cross_entropy)
    g_hat = grad(W0 - eta_a * grad(W0, X, Y), x2, y2)
    w1 = W0 - eta_a * g_hat
    mu = w1 - eta * (memory - theta0)
    theta = theta0
    for _ in range(k):
        theta = theta - alpha * (grad(theta, x2, y2) + lam * (theta - mu))
    np.testing.assert_allclose(theta_model.weight.detach().numpy(), theta, rtol=1e-12)
    np.testing.assert_allclose(w_model.weight.detach().numpy(),
                               w1 - alpha_m * lam * (mu - theta), rtol=1e-12)
    assert stats["local_iterations"] == 1.0 and stats["local_steps"] == 2.0 + k


def test_server_update_line_12():
    prev = [np.array([1.0, 1.0], np.float32)]
    ws = [[np.array([2.0, 0.0], np.float32)], [np.array([4.0, 2.0], np.float32)]]
    np.testing.assert_allclose(pm.server_update(prev, ws, 1.0)[0], [3.0, 1.0])
    # beta = 2 (pFedMe's extrapolation): (1-2)*[1,1] + 2*[3,1] = [5, 1]
    np.testing.assert_allclose(pm.server_update(prev, ws, 2.0)[0], [5.0, 1.0])
    # sample-weighted mean: (1*[2,0] + 3*[4,2]) / 4 = [3.5, 1.5]
    np.testing.assert_allclose(pm.server_update(prev, ws, 1.0, [1, 3])[0], [3.5, 1.5])
    with pytest.raises(ValueError, match="freezes"):
        pm.server_update(prev, ws, 0.0)


@pytest.mark.parametrize("strategy", ["pfedbred", "pfedbred-mh", "pfedme"])
def test_beta_zero_is_rejected_by_config(strategy):
    with pytest.raises(config.ConfigError, match="freeze the global model"):
        config.validate({"strategy": strategy, "hyper": {strategy: {"beta": 0}}})
    assert config.validate({"strategy": strategy, "hyper": {strategy: {"beta": 2.0}}}) \
        .hyper["beta"] == 2.0  # beta > 1 is allowed


def test_defaults_are_the_papers_and_unstable_steps_are_rejected():
    h = config.validate({"strategy": "pfedbred"}).hyper
    assert (h["prior"], h["alpha"], h["alpha-m"], h["beta"], h["local-iterations"],
            h["batch-size"], h["prox-steps"], h["lambda"], h["eta"], h["eta-alpha"]) == \
        ("mh", 0.01, 0.01, 1.0, 20, 20, 5, 15.0, 0.05, 0.01)
    with pytest.raises(config.ConfigError, match="prior"):
        config.validate({"strategy": "pfedbred", "hyper": {"pfedbred": {"prior": "xx"}}})
    with pytest.raises(config.ConfigError, match="overshoots"):
        config.validate({"strategy": "pfedme", "hyper": {"pfedme": {"lambda": 150}}})


# ------------------------------------------------------------- real clients, real FMNIST
def _tiny_run(tmp_path, strategy, rounds=2, **hyper):
    cfg = small_config(strategy=strategy, clients=4, rounds=rounds, model="mclr", **{
        "data.partition": "pathological", "data.subsample": 2000,
        "hyper": {strategy: {"local-iterations": 5, **hyper}}})
    manager = inprocess.make_federation(4)
    s = inprocess.run(cfg, tmp_path, manager)
    states = {int(p.context.node_config["partition-id"]): p.context.state
              for p in manager.all().values()}
    return s, states


def _personal(state):
    from flower_pfl.clients.state import ClientState

    return ClientState(state).get_arrays("personal")


@pytest.mark.parametrize("rule", ["restart", "carry"])
def test_pfedme_equals_pfedbred_with_meta_step_off_bit_for_bit(rule, tmp_path, caplog):
    me, me_states = _tiny_run(tmp_path / "me", "pfedme", **{"theta-init": rule})
    with caplog.at_level(logging.WARNING):
        off, off_states = _tiny_run(tmp_path / "off", "pfedbred", prior="mh", eta=0.0,
                                    **{"eta-alpha": 0.0, "theta-init": rule})
    assert "switches the meta-step off" in caplog.text
    for a, b in zip(me.global_arrays, off.global_arrays):
        assert np.array_equal(a, b)
    for pid in me_states:
        for a, b in zip(_personal(me_states[pid]), _personal(off_states[pid])):
            assert np.array_equal(a, b)
    # ... and the meta-step, switched on, changes the result (the test above can fail)
    on, _ = _tiny_run(tmp_path / "on", "pfedbred", prior="mh")
    assert any(not np.array_equal(a, b) for a, b in zip(me.global_arrays, on.global_arrays))


def test_theta_rules_differ_and_defaults_are_the_papers(tmp_path):
    """pfedme restarts theta from the received w each round (Dinh et al.), pFedBreD carries
    theta_iR (Algorithm 1 line 5); the two rules give different runs from round 2 on."""
    assert config.validate({"strategy": "pfedme"}).hyper["theta-init"] == "restart"
    assert config.validate({"strategy": "pfedbred-mh"}).hyper["theta-init"] == "carry"
    assert config.validate({"strategy": "pfedbred-mh"}).hyper["envelope"] == "mu"
    restart, _ = _tiny_run(tmp_path / "r", "pfedme", rounds=2)
    carry, _ = _tiny_run(tmp_path / "c", "pfedme", rounds=2, **{"theta-init": "carry"})
    assert any(not np.array_equal(a, b)
               for a, b in zip(restart.global_arrays, carry.global_arrays))


@pytest.mark.parametrize("prior", ["lg", "meg", "mh", "mh-lookahead"])
def test_each_prior_runs_and_differs_from_pfedme(prior, tmp_path):
    s, states = _tiny_run(tmp_path / prior, f"pfedbred-{prior}", rounds=1)
    me, _ = _tiny_run(tmp_path / "me", "pfedme", rounds=1)
    # at the first round meg's memory term is w^(t-1) - theta = 0 at r = 1, but not after
    assert any(not np.array_equal(a, b) for a, b in zip(me.global_arrays, s.global_arrays))
    from flower_pfl.clients.state import ClientState

    assert all(("pfedbred-w" in ClientState(st)) == (prior != "lg") for st in states.values())


def test_client_state_carries_theta_and_memory_across_rounds():
    from flwr.app import Context, RecordDict

    from flower_pfl.clients.pfedbred import PFedBreDClient
    from flower_pfl.clients.state import ClientState
    from flower_pfl.learning.models import initial_arrays

    cfg = small_config(strategy="pfedbred", model="mclr", clients=4, **{
        "data.partition": "pathological", "data.subsample": 2000})
    ins = {"cfg": cfg.to_json(), "prior": "meg", "lambda": 15.0, "alpha": 0.01,
           "alpha-m": 0.01, "local-iterations": 5, "prox-steps": 5, "batch-size": 20,
           "eta": 0.05, "eta-alpha": 0.01, "theta-init": "carry", "envelope": "mu"}
    w0 = initial_arrays(cfg)

    def client(state):
        return PFedBreDClient(Context(run_id=0, node_id=1, node_config={"partition-id": 0},
                                      state=state, run_config={}))

    state = RecordDict()
    w1, _, m1 = client(state).fit(w0, {**ins, "round": 1})
    # the server accepted round 1 (the base client commits staged state on that verdict)
    client(state).evaluate(w0, {**ins, "round": 1, "accepted-round": 1})
    theta1 = ClientState(state).get_arrays("personal")
    mem1 = ClientState(state).get_arrays("pfedbred-w")
    assert all(np.array_equal(a, b) for a, b in zip(mem1, w1))  # memorized w_{i,R}
    assert m1["w_theta_gap"] > 0 and any(not np.array_equal(a, b) for a, b in zip(theta1, w1))
    # round 2 from the same global: the stateful client starts theta at theta_{i,R}^(1) and
    # uses its memory, a fresh one starts both at w^(t-1) -> different results
    w2, _, _ = client(state).fit(w0, {**ins, "round": 2, "accepted-round": 1})
    w2_fresh, _, _ = client(RecordDict()).fit(w0, {**ins, "round": 2})
    assert any(not np.array_equal(a, b) for a, b in zip(w2, w2_fresh))


def test_personalized_theta_beats_global_on_pathological_fmnist(tmp_path):
    cfg = small_config(strategy="pfedbred-mh", clients=6, rounds=3, model="mclr", **{
        "data.partition": "pathological", "data.subsample": 3000})
    inprocess.run(cfg, tmp_path)
    with open(tmp_path / "rounds.csv") as fh:
        last = list(csv.DictReader(fh))[-1]
    # 2 classes per client: theta_i fits them, the global w must cover all 10
    assert float(last["personal_mean"]) > float(last["global_mean"]) + 0.1, last
    assert float(last["personal_mean"]) > 0.8


# -------------------------------------------- asymmetric inputs: eta != eta_alpha, sizes
def test_client_fit_is_mh_by_hand_with_the_servers_eta_and_eta_alpha(tmp_path):
    """pfedbred-mh from the strategy's own fit instructions to the client's upload, by hand
    in float64 on real FMNIST (MCLR): eta (0.3) != eta_alpha (0.07) and a carried theta and
    memory unlike w, so a swap of the two step sizes (or of memory and theta) moves every
    entry.  Per local iteration on batch b: mu = w - eta_alpha grad f(w; b) - eta (m - theta);
    K steps theta -= alpha (grad f(theta; b) + lambda (theta - mu)); w -= alpha_m lambda
    (mu - theta)."""
    from flower_pfl.clients.pfedbred import MEMORY_KEY, PFedBreDClient
    from flower_pfl.learning.training import batches
    from flower_pfl.strategies.pfedbred import PFedBreDMH
    from tests.test_baselines import make_client

    eta, eta_a, lam, alpha, alpha_m, iters, k, size = 0.3, 0.07, 2.0, 0.03, 0.05, 2, 2, 16
    cfg = small_config(strategy="pfedbred-mh", clients=4, model="mclr", **{
        "data.subsample": 2000, "hyper": {"pfedbred-mh": {
            "eta": eta, "eta-alpha": eta_a, "lambda": lam, "alpha": alpha, "alpha-m": alpha_m,
            "local-iterations": iters, "prox-steps": k, "batch-size": size}}})
    s = PFedBreDMH(cfg, results_dir=tmp_path)
    s.initialize_parameters(None)
    w0, extra = s.fit_payload(2, 1)
    rng = np.random.default_rng(7)
    theta0 = [(a + rng.normal(0, 0.05, a.shape)).astype(np.float32) for a in w0]
    memory = [(a + rng.normal(0, 0.08, a.shape)).astype(np.float32) for a in w0]
    client = make_client(PFedBreDClient, pid=2)
    client.state.set_arrays("personal", theta0)
    client.state.set_arrays(MEMORY_KEY, memory)
    up, _, _ = client.fit([a.copy() for a in w0], {"cfg": cfg.to_json(), "round": 1, **extra})
    order = list(batches(client.data.num_train, size, iters, client.generator(),
                         client.spec.drop_last))

    def grad(params, idx):
        leaf = [p.clone().requires_grad_(True) for p in params]
        xb = client.data.x_train[idx].flatten(1).double()
        loss = F.cross_entropy(xb @ leaf[0].T + leaf[1], client.data.y_train[idx])
        return torch.autograd.grad(loss, leaf)

    def by_hand(eta, eta_a):
        t64 = lambda arrays: [torch.tensor(a, dtype=torch.float64) for a in arrays]  # noqa: E731
        w, theta, mem = t64(w0), t64(theta0), t64(memory)
        for idx in order:
            mu = [p - eta_a * g - eta * (m - t)
                  for p, g, m, t in zip(w, grad(w, idx), mem, theta)]
            for _ in range(k):
                theta = [t - alpha * (g + lam * (t - m))
                         for t, g, m in zip(theta, grad(theta, idx), mu)]
            w = [p - alpha_m * lam * (m - t) for p, m, t in zip(w, mu, theta)]
        return [p.numpy() for p in w]

    want, swapped = by_hand(eta, eta_a), by_hand(eta_a, eta)
    error = max(float(np.abs(a - b).max()) for a, b in zip(up, want))
    gap = max(float(np.abs(a - b).max()) for a, b in zip(want, swapped))
    assert error < 1e-5 and gap > 100 * error + 1e-4, (error, gap)


@pytest.mark.parametrize("strategy", ["pfedme", "pfedbred"])
def test_server_mean_is_uniform_and_samples_weights_only_when_asked(strategy, tmp_path):
    """Line 12 on the strategy with unequal client sizes (10 vs 30 samples) and beta = 1.5:
    E_I is the uniform mean by default, the sample-weighted one with weighting: samples."""
    from flower_pfl import registry
    from flower_pfl.strategies.base import ClientUpdate

    def aggregate(**hyper):
        cfg = small_config(strategy=strategy, clients=4, model="mclr", **{
            "data.subsample": 2000, "hyper": {strategy: {"beta": 1.5, **hyper}}})
        s = registry.strategy_class(strategy)(cfg, results_dir=tmp_path / str(hyper))
        s.initialize_parameters(None)
        prev = [a.astype(np.float64) for a in s.global_arrays]
        ups = [[a + 1.0 for a in s.global_arrays], [a - 3.0 for a in s.global_arrays]]
        s.aggregate_updates(1, [ClientUpdate(0, ups[0], 10, {}), ClientUpdate(3, ups[1], 30, {})])
        return prev, s.global_arrays

    prev, uniform = aggregate()
    for p, got in zip(prev, uniform):  # mean offset (1 - 3)/2 = -1: w + 1.5 * (-1)
        np.testing.assert_allclose(got, p - 1.5, rtol=0, atol=1e-5)
    prev, weighted = aggregate(weighting="samples")
    for p, got in zip(prev, weighted):  # (10 * 1 + 30 * (-3))/40 = -2: w + 1.5 * (-2)
        np.testing.assert_allclose(got, p - 3.0, rtol=0, atol=1e-5)
