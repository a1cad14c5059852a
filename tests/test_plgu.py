"""PLGU (Qu et al., CVPR 2023) with FedSAM, FedRep and pFedHN: eq. 6 and the LWSAM
perturbation by hand, LWSAM = SGD at rho = 0, PLGU-LF's two limits, PLGU-GRep = FedRep and
PLGU-GHN = pFedHN at rho = 0, the hypernetwork's gradient from a client delta, and each
mechanism switched off against on -- all on small real FMNIST subsets."""

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
from flower_pfl.strategies.base import ClientUpdate
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


# --------------------------------------------------------------- PLGU-GRep / FedRep
def test_plgu_grep_at_rho_zero_is_fedrep(tmp_path):
    rep, rep_states = _run(_cfg("fedrep"), tmp_path, "rep")
    g0, g0_states = _run(_cfg("plgu-grep", **{"hyper.plgu-grep.rho": 0.0}), tmp_path, "g0")
    assert _same(rep.body, g0.body)
    for pid in range(4):
        assert _same(rep_states[pid].get_arrays("head"), g0_states[pid].get_arrays("head"))
    g, _ = _run(_cfg("plgu-grep"), tmp_path, "g")  # rho = 0.05: LWSAM on the body acts
    assert not _same(rep.body, g.body)


def test_fedrep_head_is_personal_and_body_is_shared(tmp_path):
    rep, states = _run(_cfg("fedrep", rounds=1), tmp_path, "rep")
    init = initial_arrays(_cfg("fedrep"))
    assert len(rep.body) == 6  # conv1, conv2, fc1 (weight + bias each); fc2 is the head
    assert not _same(rep.body, init[:6])
    heads = [states[pid].get_arrays("head") for pid in range(4)]
    assert all(len(h) == 2 for h in heads)
    assert not np.array_equal(heads[0][0], heads[1][0])  # each client its own head


def test_grep_scores_follow_eq10(tmp_path):
    from flwr.app import Context, RecordDict

    from flower_pfl.clients.plgu import PLGUGRepClient

    cfg = _cfg("plgu-grep")
    ctx = Context(run_id=0, node_id=1, node_config={"partition-id": 0}, state=RecordDict(),
                  run_config={})
    client = PLGUGRepClient(ctx)
    client.setup({"cfg": cfg.to_json(), "round": 1})
    body = initial_arrays(cfg)[:6]
    layers = [None, None, None]
    assert client.body_scales(body, layers) == pytest.approx([1.0, 1.0, 1.0])  # first time
    mine = [b.copy() for b in body]
    mine[0] = mine[0] + 1.0  # conv1's weight moved by 1 in every entry
    client.state.set_arrays("body", mine)
    lam = client.body_scales(body, layers)
    assert lam[0] == pytest.approx(3.0) and lam[1:] == pytest.approx([0.0, 0.0])


# ------------------------------------------------------------------ pFedHN / PLGU-GHN
def test_hypernetwork_gets_the_client_delta_as_gradient():
    torch.manual_seed(0)
    target = np.arange(6, dtype=np.float32)
    hn = pm.HyperNetwork(4, 8, target)
    v = torch.as_tensor(pm.init_embedding(4, 0, 1))
    with torch.no_grad():
        theta = hn(v)
    trained = theta + torch.tensor([1.0, -2.0, 0.0, 0.5, 0.0, 3.0])  # client delta
    grads, g_v = pm.hypernetwork_grads(hn, v, trained)
    names = [n for n, _ in hn.named_parameters()]
    by_name = dict(zip(names, grads))
    # d<theta, theta - theta~>/d bias_out = theta - theta~ = -delta
    torch.testing.assert_close(by_name["out.bias"], -(trained - theta))
    for n, g in by_name.items():
        assert float(g.abs().sum()) > 0, f"no gradient reaches {n}"
    assert float(g_v.abs().sum()) > 0  # the embedding learns too
    zero, zero_v = pm.hypernetwork_grads(hn, v, theta)  # no delta: no gradient
    assert all(float(g.abs().sum()) == 0 for g in zero) and float(zero_v.abs().sum()) == 0


def test_pfedhn_server_step_moves_hypernetwork_and_embedding(tmp_path):
    from flower_pfl.strategies.pfedhn import PFedHN

    cfg = _cfg("pfedhn")
    s = PFedHN(cfg, results_dir=tmp_path)
    s.initialize_parameters(inprocess.make_federation(4))
    theta0 = s.generate(1)
    assert _same(theta0, s.generate(1))
    v0 = s.store.get("embedding", 1).copy()
    hn0 = [p.detach().clone() for p in s.hn.parameters()]
    trained = [a + 0.01 for a in theta0]  # a client delta of +0.01 everywhere
    s.aggregate_updates(1, [ClientUpdate(1, trained, 10)])
    assert all(not torch.equal(a, b.detach()) for a, b in zip(hn0, s.hn.parameters()))
    assert not np.array_equal(v0, s.store.get("embedding", 1))
    assert np.array_equal(s.store.get("embedding", 0), s.store.get("embedding", 0))
    moved = s.spec.flatten(s.generate(1)) - s.spec.flatten(theta0)
    assert float(moved.mean()) > 0  # the generated model moved towards the trained one


def test_plgu_ghn_at_rho_zero_is_pfedhn(tmp_path):
    hn, _ = _run(_cfg("pfedhn"), tmp_path, "hn")
    g0, _ = _run(_cfg("plgu-ghn", **{"hyper.plgu-ghn.rho": 0.0}), tmp_path, "g0")
    assert all(torch.equal(a, b) for a, b in zip(hn.hn.parameters(), g0.hn.parameters()))
    g, _ = _run(_cfg("plgu-ghn"), tmp_path, "g")
    assert not all(torch.equal(a, b) for a, b in zip(hn.hn.parameters(), g.hn.parameters()))


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


def test_grep_and_ghn_scores_single_out_a_later_layer():
    """Eq. 10 (PLGU-GRep, over the body) and PLGU-GHN's eq. 6 put all of Lambda = L xi on
    the one layer that differs -- here the last body layer (fc1) / the last layer (fc2)."""
    from flower_pfl.clients.plgu import PLGUGHNClient, PLGUGRepClient
    from tests.test_baselines import make_client

    cfg = _cfg("plgu-grep")
    grep = make_client(PLGUGRepClient)
    grep.setup({"cfg": cfg.to_json(), "round": 2})
    body = initial_arrays(cfg)[:6]  # conv1, conv2, fc1 (weight + bias each)
    mine = [b.copy() for b in body]
    mine[4] = mine[4] + 0.01
    grep.state.set_arrays("body", mine)
    assert grep.body_scales(body, [None] * 3) == pytest.approx([0.0, 0.0, 3.0])

    cfg = _cfg("plgu-ghn")
    ghn = make_client(PLGUGHNClient)
    ghn.setup({"cfg": cfg.to_json(), "round": 2})
    generated = initial_arrays(cfg)
    model = ghn.new_model(generated)
    assert ghn.scales(generated, model) == pytest.approx([1.0] * 4)  # nothing trained yet
    trained = [a.copy() for a in generated]
    trained[7] = trained[7] + 0.01  # fc2's bias
    ghn.state.set_arrays("trained", trained)
    assert ghn.scales(generated, model) == pytest.approx([0.0, 0.0, 0.0, 4.0])


# ---------------------------------------------------------------- FedSAM, client and server
def test_fedsam_client_runs_sam_and_uploads_its_delta():
    """One local step of the real FedSAM client on its first mini-batch, by hand: g at w,
    eps = rho g/||g||, g~ at w + eps, upload Delta = -lr g~."""
    from flower_pfl.clients.fedsam import FedSAMClient
    from flower_pfl.learning.training import batches
    from tests.test_baselines import make_client

    rho, lr = 0.5, 0.05
    cfg = _cfg("fedsam", model="mclr", **{"train.steps": 1, "train.lr": lr})
    w = initial_arrays(cfg)

    def fit(r):
        client = make_client(FedSAMClient)
        delta, _, _ = client.fit([a.copy() for a in w], {"cfg": cfg.to_json(), "round": 1,
                                                         "rho": r})
        return client, delta

    client, delta = fit(rho)
    idx = next(batches(client.data.num_train, 32, 1, client.generator(), False))
    xb, yb = client.data.x_train[idx], client.data.y_train[idx]
    ref = build_model("mclr", (1, 28, 28), 10, seed=0)
    params = list(ref.parameters())
    with torch.no_grad():
        for p, a in zip(params, w):
            p.copy_(torch.as_tensor(a))
    g = torch.autograd.grad(F.cross_entropy(ref(xb), yb), params)
    norm = torch.sqrt(sum((x ** 2).sum() for x in g))
    with torch.no_grad():
        for p, gi in zip(params, g):
            p.add_(rho * gi / norm)
    g_sam = torch.autograd.grad(F.cross_entropy(ref(xb), yb), params)
    for d, gs in zip(delta, g_sam):
        np.testing.assert_allclose(d, -lr * gs.numpy(), rtol=1e-4, atol=1e-7)
    _, plain = fit(0.0)
    assert not _same(delta, plain)  # rho reaches the optimizer


def test_mean_delta_moves_each_array_by_the_mean_of_those_who_shared_it():
    from flower_pfl.strategies.fedsam import apply_mean_delta

    w = [np.zeros(2, np.float32), np.ones(3, np.float32)]
    ups = [ClientUpdate(0, [np.array([1.0, 2.0]), np.full(3, 3.0)], 10, {"shared": "11"}),
           ClientUpdate(1, [np.array([3.0, 0.0]), np.zeros(3)], 90, {"shared": "10"}),
           ClientUpdate(2, [np.array([5.0, 5.0]), np.full(3, 9.0)], 5, {"shared": "00"})]
    out, counts = apply_mean_delta(w, ups)  # PLGU-LF: per array, over those who shared it
    assert counts.tolist() == [2, 1]
    np.testing.assert_allclose(out[0], [2.0, 1.0])  # unweighted mean of (1, 2) and (3, 0)
    np.testing.assert_allclose(out[1], [4.0, 4.0, 4.0])
    out, counts = apply_mean_delta(w, [ClientUpdate(u.pid, u.arrays, u.num_examples, {})
                                       for u in ups])  # FedSAM: every array shared
    assert counts.tolist() == [3, 3]
    np.testing.assert_allclose(out[0], [3.0, 7 / 3], rtol=1e-6)
    np.testing.assert_allclose(out[1], [5.0, 5.0, 5.0])


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


# ------------------------------------------------ BatchNorm: the paper's ResNet-18
# A ResNet-18 (20 BatchNorm layers) on real FMNIST batches shrunk to 14 x 14 (area
# averaging) keeps these tests at a fraction of a second per step on a CPU.
def _bn_batches(n, side=14, size=16):
    _, d = _client_data()
    x = F.interpolate(d.x_train[:len(d.y_train)], size=(side, side), mode="area")
    gen = torch.Generator().manual_seed(5)
    from flower_pfl.learning.training import batches

    return x, d.y_train, [(x[i], d.y_train[i]) for i in batches(len(d.y_train), size, n, gen)]


def _resnet(seed=0):
    return build_model("resnet18", (1, 14, 14), 10, seed=seed)


def _bns(model):
    return [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]


def _channel_stats(out):
    """(mean, unbiased variance) per channel over batch and space: what BatchNorm2d in
    train mode folds into its running statistics."""
    return out.mean((0, 2, 3)), out.var((0, 2, 3), unbiased=True)


def test_perturbed_pass_leaves_batchnorm_statistics_untouched():
    """One SAM step on a ResNet-18, by hand: the running statistics move ONCE, with the
    unperturbed pass -- net.bn1's running_mean = 0.1 * (channel means of conv1(x) at theta),
    running_var = 0.9 + 0.1 * (their unbiased variances), num_batches_tracked = 1 on every
    BatchNorm -- and the perturbed pass alone leaves every buffer bit for bit as it was."""
    from flower_pfl.algorithms.lwsam import lwsam_step

    _, _, data = _bn_batches(1)
    xb, yb = data[0]
    model = _resnet().train()
    with torch.no_grad():
        mean, var = _channel_stats(model.net.conv1(xb))
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.05)
    lwsam_step(model, xb, yb, opt, params, [1.0] * len(params), 0.05)
    assert [int(bn.num_batches_tracked) for bn in _bns(model)] == [1] * 20
    torch.testing.assert_close(model.net.bn1.running_mean, 0.1 * mean, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(model.net.bn1.running_var, 0.9 + 0.1 * var, rtol=1e-5,
                               atol=1e-7)
    # the perturbed pass on its own: parameters and buffers restored bit for bit
    g = torch.autograd.grad(F.cross_entropy(model(xb), yb), params)  # moves the buffers
    before = [t.clone() for t in list(model.parameters()) + list(model.buffers())]
    pm.perturbed_gradient(model, params, pm.lwsam_perturbation(g, [1.0] * len(g), 0.05), xb,
                          yb, F.cross_entropy)
    after = list(model.parameters()) + list(model.buffers())
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_two_model_on_resnet18_theta_is_plain_sgd_and_w_keeps_its_own_statistics():
    """Algorithm 1 on a ResNet-18: theta~ equals plain SGD bit for bit, running statistics
    included; both models count exactly one BatchNorm step per local step; w~'s statistics
    come from its OWN forward at w~^k (before line 8's update): after two steps net.bn1's
    running_mean is 0.9 * (its value after step 1) + 0.1 * (channel means of conv2d(x_2)
    with w~^1's conv1 weight), which differs from theta~'s (theta~'s conv1 took another
    step)."""
    x, y, data = _bn_batches(3)
    ref = _resnet()
    gen = torch.Generator().manual_seed(5)
    train(ref, x, y, TrainSpec(lr=0.05, batch_size=16, steps=3), gen, torch.device("cpu"))
    theta_m, w_m = _resnet(), _resnet()
    theta, w = list(theta_m.parameters()), list(w_m.parameters())
    scales = [1.7 if i % 3 == 0 else 0.4 for i in range(len(theta))]  # Lambda, unequal
    pm.two_model_train(theta_m, theta, w, data[:1], scales, 0.05, lr=0.05, w_model=w_m)
    step1, conv1 = w_m.net.bn1.running_mean.clone(), w_m.net.conv1.weight.detach().clone()
    torch.testing.assert_close(step1, theta_m.net.bn1.running_mean)  # the same start
    pm.two_model_train(theta_m, theta, w, data[1:2], scales, 0.05, lr=0.05, w_model=w_m)
    with torch.no_grad():
        mean, _ = _channel_stats(F.conv2d(data[1][0], conv1, padding=1))
    torch.testing.assert_close(w_m.net.bn1.running_mean, 0.9 * step1 + 0.1 * mean,
                               rtol=1e-5, atol=1e-7)
    pm.two_model_train(theta_m, theta, w, data[2:], scales, 0.05, lr=0.05, w_model=w_m)
    assert _same(get_arrays(theta_m), get_arrays(ref))  # parameters AND running stats
    for model in (theta_m, w_m):
        assert [int(bn.num_batches_tracked) for bn in _bns(model)] == [3] * 20
    init = _resnet()
    for bn, bn0, bt in zip(_bns(w_m), _bns(init), _bns(theta_m)):
        assert not torch.equal(bn.running_mean, bn0.running_mean)
        assert not torch.equal(bn.running_var, bn0.running_var)
        assert not torch.equal(bn.running_mean, bt.running_mean)


def _bn_cfg(strategy, **over):
    return _cfg(strategy, model="resnet18", **{"train.steps": 1, "train.batch-size": 8,
                                               **over})


def _keys(model):
    return [k for k, v in model.state_dict().items() if v.is_floating_point()]


def test_plgu_lf_on_resnet18_uploads_w_statistics_and_scores_parameters_only():
    """The real PLGU-LF client, two-model reading, on a ResNet-18: (a) at rho = 0 and D = 0
    theta~ and w~ take the same steps, so the uploaded w~ equals the kept theta~ buffers
    included -- every BatchNorm running_mean/var delta is non-zero; (b) eq. 6 scores
    parameters only: a personal model whose net.bn1 running_mean is 1 away from w's and
    whose net.fc bias is 0.01 away keeps net.fc personal (scored with the buffers, net.bn1
    would win)."""
    from flower_pfl.clients.plgu import PLGULFClient
    from tests.test_baselines import make_client

    cfg = _bn_cfg("plgu-lf")
    w = initial_arrays(cfg)
    keys = _keys(build_model("resnet18", (1, 28, 28), 10, seed=0))
    stats = [i for i, k in enumerate(keys) if k.endswith(("running_mean", "running_var"))]
    assert len(stats) == 40

    def fit(personal, rho, d):
        client = make_client(PLGULFClient)
        if personal is not None:
            client.state.set_arrays("personal", personal)
        upload, _, metrics = client.fit([a.copy() for a in w], {
            "cfg": cfg.to_json(), "round": 2, "rho": rho, "personal-layers": d,
            "reading": "two-model"})
        client.state.resolve(accepted_round=2)
        return upload, metrics, client.state.get_arrays("personal")

    upload, metrics, kept = fit(None, 0.0, 0)
    assert metrics["shared"] == "1" * len(w)
    assert all(upload[i].any() for i in stats)  # w~'s statistics followed the data
    for i in stats:
        np.testing.assert_allclose(w[i] + upload[i], kept[i], rtol=1e-5, atol=1e-6)
    personal = [a.copy() for a in w]
    personal[keys.index("net.bn1.running_mean")] += 1.0
    personal[keys.index("net.fc.bias")] += 0.01
    _, metrics, _ = fit(personal, 0.05, 1)
    assert metrics["personal_layers"] == "net.fc"
    assert metrics["xi_max"] == 1.0 and metrics["xi_min"] == 0.0


def test_grep_and_ghn_score_resnet18_parameters_not_batchnorm_statistics():
    """Eq. 10 over the body and PLGU-GHN's eq. 6 on a ResNet-18: a body / trained model
    whose BatchNorm statistics differ a lot and one conv weight a little puts all of
    Lambda = L xi on that conv layer (the body's arrays interleave parameters and
    statistics, so this also checks the body offsets)."""
    from flower_pfl.clients.plgu import PLGUGHNClient, PLGUGRepClient
    from flower_pfl.learning.models import layer_groups
    from tests.test_baselines import make_client

    cfg = _bn_cfg("plgu-grep")
    model = build_model("resnet18", (1, 28, 28), 10, seed=0)
    keys, names = _keys(model), [n for n, _ in layer_groups(model)]
    arrays = initial_arrays(cfg)
    conv = names.index("net.layer3.0.conv2")
    grep = make_client(PLGUGRepClient)
    grep.setup({"cfg": cfg.to_json(), "round": 2})
    body = arrays[:-2]  # every group but net.fc (weight, bias)
    mine = [b.copy() for b in body]
    mine[keys.index("net.layer2.1.bn2.running_var")] += 5.0
    mine[keys.index("net.layer3.0.conv2.weight")] += 0.001
    expect = [0.0] * 40
    expect[conv] = 40.0
    grep.state.set_arrays("body", mine)
    assert grep.body_scales(body, [None] * 40) == pytest.approx(expect)

    ghn = make_client(PLGUGHNClient)
    ghn.setup({"cfg": _bn_cfg("plgu-ghn").to_json(), "round": 2})
    trained = [a.copy() for a in arrays]
    trained[keys.index("net.bn1.running_mean")] += 5.0
    trained[keys.index("net.layer3.0.conv2.weight")] += 0.001
    ghn.state.set_arrays("trained", trained)
    expect = [0.0] * 41
    expect[conv] = 41.0
    assert ghn.scales(arrays, ghn.new_model(arrays)) == pytest.approx(expect)


def test_grep_two_model_body_copy_takes_its_own_batchnorm_steps():
    """PLGU-GRep's w~ (the uploaded body) runs its own forward: at rho = 0 it takes the
    same steps as the trained body phi~, so its arrays -- running statistics included --
    equal phi~'s; without its forward its statistics would stay where they started."""
    from flower_pfl.clients.fedsam import layer_tensors
    from flower_pfl.clients.plgu import PLGUGRepClient
    from tests.test_baselines import make_client

    cfg = _bn_cfg("plgu-grep")
    client = make_client(PLGUGRepClient)
    client.setup({"cfg": cfg.to_json(), "round": 1})
    model = client.new_model()
    start = get_arrays(model)
    _, uploaded = client.train_body(model, layer_tensors(model)[:-1], [1.0] * 40, 0.0, 2,
                                    {"head-epochs": 1, "body-epochs": 1, "rho": 0.0,
                                     "reading": "two-model"})
    arrays = get_arrays(model)
    body = client.split(model)[1]
    stats = [j for j, i in enumerate(body) if _keys(model)[i].endswith("running_var")]
    assert len(stats) == 20 and all(not np.array_equal(uploaded[j], start[body[j]])
                                    for j in stats)
    for j, i in enumerate(body):
        np.testing.assert_allclose(uploaded[j], arrays[i], rtol=1e-6, atol=1e-7)


def test_fedsam_client_on_resnet18_moves_running_statistics_once_per_step():
    """The real FedSAM client, one SAM step on a ResNet-18: the uploaded delta of net.bn1's
    running statistics is exactly one BatchNorm update at w (by hand, from conv1's output
    on the client's first mini-batch), not two; and on models without buffers the scored
    groups are the layer groups and there are no statistics to restore (unchanged)."""
    from flower_pfl.clients.fedsam import FedSAMClient, parameter_groups
    from flower_pfl.learning.models import layer_groups
    from flower_pfl.learning.training import batches
    from tests.test_baselines import make_client

    cfg = _bn_cfg("fedsam")
    w = initial_arrays(cfg)
    client = make_client(FedSAMClient)
    delta, _, _ = client.fit([a.copy() for a in w], {"cfg": cfg.to_json(), "round": 1,
                                                     "rho": 0.5})
    idx = next(batches(client.data.num_train, 8, 1, client.generator(), False))
    ref = build_model("resnet18", (1, 28, 28), 10, seed=0)
    with torch.no_grad():
        mean, var = _channel_stats(ref.net.conv1(client.data.x_train[idx]))
    keys = _keys(ref)
    np.testing.assert_allclose(delta[keys.index("net.bn1.running_mean")], 0.1 * mean.numpy(),
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(delta[keys.index("net.bn1.running_var")],
                               0.1 * (var.numpy() - 1.0), rtol=1e-4, atol=1e-6)
    for name in ("mclr", "dnn", "cnn"):
        m = build_model(name, (1, 28, 28), 10, seed=0)
        assert parameter_groups(m) == layer_groups(m) and not pm.running_stats(m)
