"""PLGU, FedSAM and FedRep on a model with BatchNorm (the paper's ResNet-18): the perturbed
pass leaves the running statistics untouched, each model keeps its own statistics, and the
scores count parameters only (PLGU itself: tests/test_plgu.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from flower_pfl.algorithms import plgu_math as pm
from flower_pfl.learning.models import build_model, get_arrays, initial_arrays
from flower_pfl.learning.training import TrainSpec, train
from tests.test_plgu import _cfg, _client_data, _same


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
