"""PLGU (Qu et al., CVPR 2023): eq. 6 and the LWSAM perturbation by hand, LWSAM = SGD at
rho = 0, Algorithm 1's two models, PLGU-LF's two limits and the layers it keeps personal, and
the perturbation radius each strategy sends -- all on small real FMNIST subsets. PLGU-GRep =
FedRep and PLGU-GHN = pFedHN: tests/test_plgu_grep_ghn.py; FedSAM's client and server:
tests/test_fedsam.py; BatchNorm (the paper's ResNet-18): tests/test_plgu_batchnorm.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from flower_pfl.algorithms import plgu_math as pm
from flower_pfl.clients.state import ClientState
from flower_pfl.learning import client_data
from flower_pfl.learning.models import build_model, get_arrays, initial_arrays
from flower_pfl.learning.training import TrainSpec, train, train_lwsam
from flower_pfl.running import inprocess
from tests.conftest import small_config


def _cfg(strategy, **over):
    base = {"clients": 4, "rounds": 2, "fraction-fit": 1.0, "data.partition": "pathological",
            "data.classes-per-client": 3, "data.subsample": 2000, "train.batch-size": 32}
    base.update(over)
    return small_config(strategy=strategy, **base)


def _run(cfg, tmp_path, name):
    manager = inprocess.make_federation(cfg["clients"])
    strategy = inprocess.run(cfg, tmp_path / name, manager=manager)
    states = {int(p.context.node_config["partition-id"]): ClientState(p.context.state)
              for p in manager.all().values()}
    return strategy, states


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


# ------------------------------------------------------------------ eq. 6 / eq. 10 by hand
def test_eq6_layer_scores_by_hand():
    w = [[np.zeros((2, 2)), np.zeros(2)], [np.ones(2)]]  # layer 1: 6 entries, layer 2: 2
    theta = [[np.array([[3.0, 0.0], [0.0, 0.0]]), np.array([4.0, 0.0])], [np.array([1.0, 3.0])]]
    # ||theta_1 - w_1|| = 5 over 6 entries; ||theta_2 - w_2|| = 2 over 2 entries
    d = pm.layer_distances(theta, w)
    assert d == pytest.approx([5 / 6, 1.0])
    xi = pm.layer_scores(theta, w)
    assert xi == pytest.approx([(5 / 6) / (5 / 6 + 1), 1 / (5 / 6 + 1)])
    assert xi.sum() == pytest.approx(1.0)
    assert pm.lwsam_scaling(xi) == pytest.approx(2 * xi)  # Lambda = L xi, mean 1
    assert pm.layer_scores(w, w) == pytest.approx([0.5, 0.5])  # 0/0: uniform (documented)
    assert pm.lwsam_scaling(pm.layer_scores(w, w)) == pytest.approx([1.0, 1.0])  # = SAM
    assert pm.split_layers([0.1, 0.5, 0.3, 0.1], 2) == ([1, 2], [0, 3])
    # a tie at the cut goes to the earlier layer (uniform scores: the first D layers)
    assert pm.split_layers([0.2, 0.5, 0.1, 0.2], 2) == ([0, 1], [2, 3])
    assert pm.split_layers([0.25] * 4, 1) == ([0], [1, 2, 3])
    assert pm.split_layers([0.1, 0.5], 0) == ([], [0, 1])
    assert pm.split_layers([0.1, 0.5], 5) == ([0, 1], [])


def test_lwsam_perturbation_per_layer_proportional_to_scores_and_norm_rho():
    g = [torch.tensor([3.0, 0.0]), torch.tensor([[0.0, 4.0]])]  # ||g|| = 5
    rho = 0.2
    sam = pm.lwsam_perturbation(g, [1.0, 1.0], rho)
    assert math.sqrt(sum(float((e ** 2).sum()) for e in sam)) == pytest.approx(rho)
    torch.testing.assert_close(sam[0], torch.tensor([rho * 3 / 5, 0.0]))
    xi = np.array([0.8, 0.2])
    lam = pm.lwsam_scaling(xi)  # [1.6, 0.4]
    eps = pm.lwsam_perturbation(g, lam, rho)
    lam_g = math.sqrt((1.6 * 3) ** 2 + (0.4 * 4) ** 2)  # ||Lambda g||
    for l in range(2):
        torch.testing.assert_close(eps[l], rho * float(lam[l]) * g[l] / lam_g)
    assert math.sqrt(sum(float((e ** 2).sum()) for e in eps)) == pytest.approx(rho)
    # per layer ||eps_l|| / ||g_l|| is proportional to xi_l
    ratio = [float(eps[l].norm() / g[l].norm()) for l in range(2)]
    assert ratio[0] / ratio[1] == pytest.approx(xi[0] / xi[1])
    # the scale of Lambda cancels: xi (sum 1) and L xi give the same eps
    for a, b in zip(eps, pm.lwsam_perturbation(g, xi, rho)):
        torch.testing.assert_close(a, b)
    assert all(float(e.abs().sum()) == 0 for e in pm.lwsam_perturbation(g, lam, 0.0))
    zero = [torch.zeros(2)]
    assert float(pm.lwsam_perturbation(zero, [1.0], rho)[0].abs().sum()) == 0  # no NaN


# ----------------------------------------------------------------- the optimizer step
def _client_data():
    cfg = _cfg("fedsam")
    return cfg, client_data.load_client_data(cfg.values, 0)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_lwsam_at_rho_zero_is_sgd_bit_for_bit(momentum):
    cfg, d = _client_data()
    spec = TrainSpec(lr=0.05, batch_size=32, epochs=1, momentum=momentum)
    a = build_model("cnn", (1, 28, 28), 10, seed=3)
    b = build_model("cnn", (1, 28, 28), 10, seed=3)
    train(a, d.x_train, d.y_train, spec, torch.Generator().manual_seed(7), torch.device("cpu"))
    params = list(b.parameters())
    train_lwsam(b, d.x_train, d.y_train, spec, torch.Generator().manual_seed(7),
                torch.device("cpu"), params, [1.0] * len(params), rho=0.0)
    assert _same(get_arrays(a), get_arrays(b))
    c = build_model("cnn", (1, 28, 28), 10, seed=3)  # rho > 0 must change the result
    params = list(c.parameters())
    train_lwsam(c, d.x_train, d.y_train, spec, torch.Generator().manual_seed(7),
                torch.device("cpu"), params, [1.0] * len(params), rho=0.05)
    assert not _same(get_arrays(a), get_arrays(c))


def test_one_sam_step_by_hand_on_real_batch():
    _, d = _client_data()
    xb, yb = d.x_train[:32], d.y_train[:32]
    model = build_model("mclr", (1, 28, 28), 10, seed=1)
    w0 = [p.detach().clone() for p in model.parameters()]
    rho, lr, lam = 0.1, 0.05, [1.7, 0.3]  # weight and bias of the one layer, scaled apart
    # by hand: g at w0, eps = rho lam g/||lam g||, g~ at w0 + eps, w1 = w0 - lr g~
    ref = build_model("mclr", (1, 28, 28), 10, seed=1)
    g = torch.autograd.grad(F.cross_entropy(ref(xb), yb), list(ref.parameters()))
    norm = torch.sqrt(sum(((s * x) ** 2).sum() for x, s in zip(g, lam)))  # ||Lambda g||
    with torch.no_grad():
        for p, gi, s in zip(ref.parameters(), g, lam):
            p.add_(rho * s * gi / norm)
    g2 = torch.autograd.grad(F.cross_entropy(ref(xb), yb), list(ref.parameters()))
    expected = [w - lr * gi for w, gi in zip(w0, g2)]
    spec = TrainSpec(lr=lr, batch_size=32, steps=1)
    gen = torch.Generator().manual_seed(0)
    train_lwsam(model, xb, yb, spec, gen, torch.device("cpu"), list(model.parameters()), lam,
                rho)
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.detach(), e)


def test_plain_and_frozen_tensors():
    _, d = _client_data()
    model = build_model("dnn", (1, 28, 28), 10, seed=2)
    before = get_arrays(model)
    spec = TrainSpec(lr=0.05, batch_size=32, steps=3)
    train_lwsam(model, d.x_train, d.y_train, spec, torch.Generator().manual_seed(0),
                torch.device("cpu"), list(model.fc2.parameters()), [1.0, 1.0], 0.05,
                plain=[])  # fc1 frozen
    after = get_arrays(model)
    assert _same(before[:2], after[:2]) and not _same(before[2:], after[2:])


# ------------------------------------------------------------------- PLGU-LF limits
def test_plgu_lf_without_personal_layers_is_fedsam_while_lambda_is_identity(tmp_path):
    """D = 0: Algorithm 2 line 8 puts the whole global model into theta~, every layer is
    universal, LWSAM on all layers, w += mean Delta: FedSAM's update. On every client's
    first participation Lambda = I (uniform scores), so round 1 must match FedSAM bit for
    bit; from round 2 on Lambda comes from eq. 6 and the two must part."""
    one = {"hyper.plgu-lf.personal-layers": 0, "hyper.plgu-lf.reading": "one-model"}
    fs, _ = _run(_cfg("fedsam", rounds=1), tmp_path, "fs1")
    lf, _ = _run(_cfg("plgu-lf", rounds=1, **one), tmp_path, "lf1")
    assert _same(fs.global_arrays, lf.global_arrays)
    assert not _same(fs.global_arrays, initial_arrays(_cfg("fedsam")))
    fs2, _ = _run(_cfg("fedsam", rounds=2), tmp_path, "fs2")
    lf2, _ = _run(_cfg("plgu-lf", rounds=2, **one), tmp_path, "lf2")
    assert not _same(fs2.global_arrays, lf2.global_arrays)  # the eq. 6 scores act
    # the two-model reading is not FedSAM even at D = 0: w~'s SAM gradients are taken
    # along theta~'s plain-SGD path, not along w~'s own
    two, _ = _run(_cfg("plgu-lf", rounds=1, **{"hyper.plgu-lf.personal-layers": 0}),
                  tmp_path, "two")
    assert not _same(fs.global_arrays, two.global_arrays)


def test_plgu_lf_with_every_layer_personal_is_local(tmp_path):
    """D = L: line 8 keeps every layer of the client's own model, nothing is universal, so
    nothing is perturbed or uploaded: each personal model follows Local's SGD exactly and
    the global model never moves (section 4.1's "FedAvg" does not follow from Alg. 2)."""
    cfg_lf = _cfg("plgu-lf", **{"hyper.plgu-lf.personal-layers": 4,  # the CNN's 4 layers
                                "hyper.plgu-lf.reading": "one-model"})
    lf, lf_states = _run(cfg_lf, tmp_path, "lf")
    loc, loc_states = _run(_cfg("local"), tmp_path, "loc")
    for pid in range(4):
        mine = lf_states[pid].get_arrays("personal")
        assert mine is not None and _same(mine, loc_states[pid].get_arrays("personal"))
    assert _same(lf.global_arrays, initial_arrays(cfg_lf))
    assert lf.eval_history[-1]["mean"] == loc.eval_history[-1]["mean"]
    # two-model: theta~ is still Local's model bit for bit (plain SGD on the kept layers),
    # but w~ takes the LWSAM gradients and is uploaded, so the global model moves
    two, two_states = _run(_cfg("plgu-lf", **{"hyper.plgu-lf.personal-layers": 4}), tmp_path,
                           "two")
    for pid in range(4):
        assert _same(two_states[pid].get_arrays("personal"),
                     loc_states[pid].get_arrays("personal"))
    assert not _same(two.global_arrays, initial_arrays(cfg_lf))


# ------------------------------------------------------- Algorithm 1, two models
def _theta_w(seed=3):
    theta = build_model("cnn", (1, 28, 28), 10, seed=seed)
    w = build_model("cnn", (1, 28, 28), 10, seed=seed)
    return theta, w, list(theta.parameters()), list(w.parameters())


def _scales(model, lam):
    from flower_pfl.clients.fedsam import layer_tensors

    return [float(lam[l]) for l, layer in enumerate(layer_tensors(model)) for _ in layer]


def test_two_model_theta_is_plain_sgd_bit_for_bit_and_w_takes_lwsam():
    """Lines 4-8: theta~'s update is plain SGD exactly (the perturbed pass is undone bit for
    bit), w~ differs from theta~ after ONE step with rho > 0, and at rho = 0 w~ = theta~."""
    _, d = _client_data()
    spec = TrainSpec(lr=0.05, batch_size=32, steps=1)
    ref = build_model("cnn", (1, 28, 28), 10, seed=3)
    train(ref, d.x_train, d.y_train, spec, torch.Generator().manual_seed(7),
          torch.device("cpu"))
    from flower_pfl.learning.training import batches

    def data(n):
        gen = torch.Generator().manual_seed(7)
        return ((d.x_train[i], d.y_train[i]) for i in batches(len(d.y_train), 32, n, gen))

    theta_m, w_m, theta, w = _theta_w()
    lam = [2.0, 1.0, 0.5, 0.5]
    pm.two_model_train(theta_m, theta, w, data(1), _scales(theta_m, lam), 0.05, lr=0.05)
    assert _same(get_arrays(theta_m), get_arrays(ref))  # plain SGD, bit for bit
    assert not _same(get_arrays(w_m), get_arrays(theta_m))  # one step: apart
    theta_m, w_m, theta, w = _theta_w()
    pm.two_model_train(theta_m, theta, w, data(3), _scales(theta_m, lam), 0.0, lr=0.05)
    assert _same(get_arrays(w_m), get_arrays(theta_m))  # rho = 0: the same steps


def test_eps_on_the_cnn_is_proportional_to_scores_with_norm_rho_and_uniform_is_sam():
    """On the CNN with real scores (eq. 6 between two real models) and a real gradient:
    ||eps_l|| / ||eps_l^SAM|| proportional to xi_l, ||eps|| = rho, and uniform scores give
    FedSAM's eps = rho g/||g|| exactly."""
    from flower_pfl.clients.fedsam import layer_tensors, per_layer
    from flower_pfl.learning.models import layer_groups

    _, d = _client_data()
    model = build_model("cnn", (1, 28, 28), 10, seed=3)
    other = build_model("cnn", (1, 28, 28), 10, seed=4)
    groups = layer_groups(model)
    xi = pm.layer_scores(per_layer(get_arrays(other), groups), per_layer(get_arrays(model),
                                                                          groups))
    assert np.ptp(xi) > 0.05  # the layers' scores really differ
    g = torch.autograd.grad(F.cross_entropy(model(d.x_train[:32]), d.y_train[:32]),
                            list(model.parameters()))
    rho = 0.05
    eps = pm.lwsam_perturbation(g, _scales(model, pm.lwsam_scaling(xi)), rho)
    sam = pm.lwsam_perturbation(g, [1.0] * len(g), rho)
    total = math.sqrt(sum(float((e.double() ** 2).sum()) for e in eps))
    assert total == pytest.approx(rho, rel=1e-6)
    sizes = [len(layer) for layer in layer_tensors(model)]
    ratios, k = [], 0
    for n in sizes:
        e_l = math.sqrt(sum(float((e.double() ** 2).sum()) for e in eps[k:k + n]))
        s_l = math.sqrt(sum(float((e.double() ** 2).sum()) for e in sam[k:k + n]))
        ratios.append(e_l / s_l)
        k += n
    np.testing.assert_allclose(np.array(ratios) / ratios[0], xi / xi[0], rtol=1e-5)
    norm = torch.sqrt(sum((x.double() ** 2).sum() for x in g))
    for e, gi in zip(sam, g):  # uniform = SAM's eps (FedSAM's local optimizer)
        assert torch.equal(e, (rho / norm).to(gi.dtype) * gi)
    uniform = pm.lwsam_perturbation(g, _scales(model, pm.lwsam_scaling(np.full(4, 0.25))), rho)
    assert all(torch.equal(a, b) for a, b in zip(uniform, sam))


def test_plgu_lf_keeps_top_layers_personal_and_shares_the_rest(tmp_path):
    cfg = _cfg("plgu-lf", rounds=2)
    lf, states = _run(cfg, tmp_path, "lf")
    rows = lf.results.server_rows
    assert rows[-1]["arrays_shared_by_nobody"] < len(lf.global_arrays)
    # round 2: every client has a personal model, so one layer (its top xi) stays personal
    personal_layers = rows[-1]["personal_layer_choices"].split(";")
    assert all(p in {"conv1", "conv2", "fc1", "fc2"} for p in personal_layers)
    for pid in range(4):
        mine = states[pid].get_arrays("personal")
        assert not _same(mine, lf.global_arrays)
    # switching LWSAM off (rho = 0) changes the result: the perturbation acts
    off, _ = _run(_cfg("plgu-lf", rounds=2, **{"hyper.plgu-lf.rho": 0.0}), tmp_path, "off")
    assert not _same(off.global_arrays, lf.global_arrays)


def test_every_strategy_reports_five_percent_tails(tmp_path):
    import csv

    _run(_cfg("plgu-lf", rounds=1), tmp_path, "lf")
    with open(tmp_path / "lf" / "rounds.csv") as fh:
        row = next(csv.DictReader(fh))
    for key in ("personal_worst5_mean", "personal_top5_mean", "global_worst5_mean",
                "global_top5_mean"):
        assert 0.0 <= float(row[key]) <= 1.0


# ------------------------------------------- the layers chosen follow the scores (eq. 6)
def test_plgu_lf_keeps_the_layer_that_differs_personal_even_when_it_is_the_last():
    """A client whose personal model differs from the global one only in fc2 (the LAST of
    the DNN's two layers) has xi = (0, 1): with D = 1 it keeps fc2 personal -- starts it
    from its own fc2, uploads no delta for it -- and shares fc1. Lambda = L xi = (0, 2)
    gives the universal fc1 no perturbation: the fit equals the rho = 0 fit bit for bit,
    while a client whose fc1 also differs gets one."""
    from flower_pfl.clients.plgu import PLGULFClient
    from tests.test_baselines import make_client

    cfg = _cfg("plgu-lf", model="dnn", **{"train.steps": 5})
    w = initial_arrays(cfg)  # fc1.weight, fc1.bias, fc2.weight, fc2.bias
    rng = np.random.default_rng(0)
    later = [a.copy() for a in w]
    for i in (2, 3):
        later[i] = later[i] + rng.normal(0, 0.1, size=w[i].shape).astype(np.float32)

    def fit(personal, rho, reading="one-model"):
        client = make_client(PLGULFClient)
        client.state.set_arrays("personal", personal)
        upload, _, metrics = client.fit([a.copy() for a in w], {
            "cfg": cfg.to_json(), "round": 2, "rho": rho, "personal-layers": 1,
            "reading": reading})
        client.state.resolve(accepted_round=2)
        return upload, metrics, client.state.get_arrays("personal")

    upload, metrics, kept = fit(later, 0.05)
    assert metrics["personal_layers"] == "fc2" and metrics["shared"] == "1100"
    assert metrics["xi_min"] == 0.0 and metrics["xi_max"] == 1.0
    assert not upload[2].any() and not upload[3].any() and upload[0].any()
    moved = lambda a, b: float(np.sqrt(sum(((x - y) ** 2).sum() for x, y in zip(a, b))))  # noqa: E731
    start_gap = moved(later[2:], w[2:])
    assert moved(kept[2:], later[2:]) < 0.2 * start_gap < moved(kept[2:], w[2:])
    # Lambda_fc1 = 0: no perturbation on the shared layer
    plain, _, _ = fit(later, 0.0)
    assert _same(upload, plain)
    both = [a.copy() for a in later]
    both[0] = both[0] + rng.normal(0, 0.01, size=w[0].shape).astype(np.float32)
    assert not _same(fit(both, 0.05)[0], fit(both, 0.0)[0])
    # two-model: the whole w~ is uploaded, and eps (over ALL layers) falls on fc2 alone
    up2, m2, kept2 = fit(later, 0.05, "two-model")
    assert m2["shared"] == "1111" and all(a.any() for a in up2)
    up0, _, kept0 = fit(later, 0.0, "two-model")
    assert _same(kept2, kept0)  # theta~ is plain SGD whatever rho
    assert not _same(up2, up0)  # ... while w~ takes the gradients at theta~ + eps


# ------------------------------------------------------ the perturbation radius sent
@pytest.mark.parametrize("name, sends", [("fedsam", True), ("plgu-lf", True), ("plgu-grep", True),
                                         ("plgu-ghn", True), ("fedrep", False),
                                         ("pfedhn", False)])
def test_each_strategy_sends_its_rho_to_the_clients(name, sends, tmp_path):
    """The perturbation radius the clients get: the strategy's rho for FedSAM and the PLGU
    variants (a non-default value here, so nothing can hard-code the default), 0 (plain
    SGD) for FedRep and pFedHN."""
    from flower_pfl import registry

    over = {f"hyper.{name}.rho": 0.07} if sends else {}
    cfg = _cfg(name, model="dnn", **over)
    s = registry.strategy_class(name)(cfg, results_dir=tmp_path)
    s.initialize_parameters(None)
    _, extra = s.fit_payload(0, 1)
    assert extra["rho"] == (0.07 if sends else 0.0)
