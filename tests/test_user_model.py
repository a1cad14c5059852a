"""Your own model: ``model: module:factory`` with ``model-args`` (docs/own-model.md).

A CNN with BatchNorm (2-d and 1-d) written into a folder outside the package, beside the
run's config file, runs FedAvg, FedRep and PLGU-GRep in one process through Flower's
message path; its head is declared by the model (the classifier, registered BEFORE the
last layer, so the default "last layer" would be wrong); wrong heads, output sizes and
factories are refused by the preflight check before any results folder exists."""

from __future__ import annotations

import csv
import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from flower_pfl import registry
from flower_pfl.learning import models
from flower_pfl.learning import user_model as um
from flower_pfl.reliability import preflight as pf
from flower_pfl.reliability.preflight import PreflightError
from flower_pfl.running import inprocess
from tests.conftest import small_config

USER_MODULE = '''
import itertools

import torch
from torch import nn


class Net(nn.Module):
    """conv -> BatchNorm2d -> pool -> classifier?  No: the classifier is registered before
    fc1/bn1, so module order puts it in the middle; the forward pass uses it last."""

    def __init__(self, classes=10, width=4, head="classifier"):
        super().__init__()
        self.conv = nn.Conv2d(1, width, 3, padding=1)
        self.bn = nn.BatchNorm2d(width)
        self.classifier = nn.Linear(16, classes)
        self.fc1 = nn.Linear(width * 7 * 7, 16)
        self.bn1 = nn.BatchNorm1d(16)
        if head is not None:
            self.head = head

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.bn(self.conv(x))), 4)
        return self.classifier(torch.relu(self.bn1(self.fc1(x.flatten(1)))))


def make(**kwargs):
    return Net(**kwargs)


def not_a_model():
    return "a string"


def lazy():
    return nn.Sequential(nn.Flatten(), nn.LazyLinear(10))


def numpy_init():
    import numpy as np

    net = Net()
    with torch.no_grad():  # numpy's global generator: seeded by the build too
        net.fc1.weight.copy_(torch.as_tensor(np.random.randn(*net.fc1.weight.shape)))
    return net


def loose():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 10), nn.BatchNorm1d(10, affine=False))


_calls = itertools.count()


def drifting():
    net = Net()
    with torch.no_grad():
        net.fc1.weight.add_(next(_calls))  # a new model each call: not seeded
    return net
'''


def _module(tmp_path: Path, name: str) -> str:
    """The user's module ``name`` (unique per test: sys.modules caches by name) written
    into ``tmp_path/project`` beside a config file; returns that config file's path."""
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / f"{name}.py").write_text(USER_MODULE)
    (project / "run.yaml").write_text("# the run's config file: its folder is searched\n")
    return str(project / "run.yaml")


def _cfg(source: str, reference: str, args: dict | None = None, **overrides):
    """A validated small config whose model is then the factory ``reference``: built as
    RunConfig directly, so this file does not depend on config.py's schema for it."""
    base = {"rounds": 2, "clients": 4, "data.subsample": 2000, "train.drop-last": True,
            "seed": 3, **overrides}
    cfg = small_config(**base)
    values = {**cfg.values, "model": reference, "model-args": dict(args or {})}
    return dataclasses.replace(cfg, values=values, source=source)


def _rows(path: Path) -> list[dict]:
    with open(path / "rounds.csv") as fh:
        return list(csv.DictReader(fh))


# ------------------------------------------------------------------- end to end
def test_a_batchnorm_model_from_outside_runs_fedavg_fedrep_plgu_grep(tmp_path):
    source = _module(tmp_path, "usernet_e2e")
    ref = "usernet_e2e:make"
    model = models.model_for(_cfg(source, ref, {"width": 4}))
    assert isinstance(model, um.UserModel)
    # the declared head is last, though registered in the middle; BN statistics travel
    assert model.layer_names() == ["net.conv", "net.bn", "net.fc1", "net.bn1",
                                   "net.classifier"]
    keys = [k for k, v in model.state_dict().items() if v.is_floating_point()]
    assert "net.bn.running_mean" in keys and "net.bn1.running_var" in keys
    assert not any("num_batches_tracked" in k for k in keys)
    head, body = models.head_split(model)
    assert [keys[i] for i in head] == ["net.classifier.weight", "net.classifier.bias"]

    initial = models.get_arrays(model)
    for strategy in ("fedavg", "fedrep", "plgu-grep"):
        cfg = _cfg(source, ref, {"width": 4}, strategy=strategy)
        out = tmp_path / strategy
        pf.preflight(cfg, out, out / "initial.npz")  # every check passes: folder made
        s = inprocess.run(cfg, out)
        rows = _rows(out)
        assert [int(r["round"]) for r in rows] == [1, 2], strategy
        assert float(rows[-1]["personal_mean"]) > 0.2, (strategy, rows[-1])  # chance: 0.1
        if strategy == "fedavg":
            arrays = s.global_arrays
            assert len(arrays) == len(keys)
            bn_var = arrays[keys.index("net.bn.running_var")]
            assert not np.allclose(bn_var, 1.0)  # the clients' BatchNorm statistics averaged
        else:  # the server holds the body only: everything but the declared classifier
            assert s.body_index == body and len(s.body) == len(keys) - 2
            assert all(a.shape != (10, 16) for a in s.body)
            moved = [not np.array_equal(s.body[j], initial[i]) for j, i in enumerate(body)]
            assert all(moved), strategy


# --------------------------------------------------------------- refused up front
@pytest.mark.parametrize("args, match", [
    ({"head": "classfier"}, r"the declared head names 'classfier', which is neither"),
    ({"head": ["classifier.weight"]}, r"overlaps the body: layer\(s\) \['classifier'\]"),
    ({"head": ["conv", "bn", "classifier", "fc1", "bn1"]}, r"is the whole model"),
    ({"head": 3}, r"the model's 'head' is a int"),
    ({"classes": 7}, r"gives \(7,\) outputs per sample but dataset 'fmnist' has 10 classes"),
    ({"classes": 12}, r"gives \(12,\) outputs per sample but dataset 'fmnist' has 10 classes"),
])
def test_a_wrong_head_or_output_size_is_refused_before_start(tmp_path, args, match):
    name = "usernet_bad_" + re.sub(r"\W", "_", tmp_path.name)
    source = _module(tmp_path, name)
    with pytest.raises(PreflightError, match=match):
        pf.preflight(_cfg(source, f"{name}:make", args, strategy="fedrep"), tmp_path / "res",
                     tmp_path / "res" / "initial.npz")
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("factory, match", [
    ("not_a_model", r"the factory returned a str, not a torch.nn.Module"),
    ("lazy", r"are lazy"),
    ("drifting", r"two builds with the same seed give different weights"),
    ("missing", r"has no attribute 'missing'"),
    ("loose", r"\['2.running_mean', '2.running_var'\] belong to a module without parameters"
              r".* fedrep would reset them"),
])
def test_a_factory_that_cannot_be_used_is_refused(tmp_path, factory, match):
    source = _module(tmp_path, f"usernet_f_{factory}")
    cfg = _cfg(source, f"usernet_f_{factory}:{factory}", strategy="fedrep")
    with pytest.raises(PreflightError, match=match):
        pf.preflight(cfg, tmp_path / "res")
    assert not (tmp_path / "res").exists()
    if factory == "loose":  # its statistics travel whole where no split is made
        pf.preflight(dataclasses.replace(cfg, values={**cfg.values, "strategy": "fedavg"}),
                     tmp_path / "res")


def test_a_module_nowhere_is_named(tmp_path):
    with pytest.raises(um.UserModelError, match=r"no module 'nowhere_model_xyz'"):
        um.import_factory("nowhere_model_xyz:make", [tmp_path])
    with pytest.raises(um.UserModelError, match="is not a factory reference"):
        um.import_factory("a-b:make")


#: the two-layer head (the classifier and BatchNorm1d bn1, in module order) and the body,
#: by hand
TWO_HEAD = ["net.classifier.weight", "net.classifier.bias", "net.bn1.weight", "net.bn1.bias",
            "net.bn1.running_mean", "net.bn1.running_var"]
TWO_BODY = ["net.conv.weight", "net.conv.bias", "net.bn.weight", "net.bn.bias",
            "net.bn.running_mean", "net.bn.running_var", "net.fc1.weight", "net.fc1.bias"]


@pytest.mark.parametrize("strategy", ["fedrep", "plgu-grep"])
def test_a_head_of_two_layers_runs_fedrep_and_plgu_grep(strategy, tmp_path, monkeypatch):
    """A declared head of 2 layers (bn1 with its running statistics, and the classifier)
    passes the preflight check and runs 2 rounds: each client uploads exactly the body
    (TWO_BODY, none of the head's arrays), keeps exactly the head (TWO_HEAD), the server
    averages the body, and the head's layers both train (eq. 9 on the whole head)."""
    from flower_pfl.clients.base import PFLClient
    from flower_pfl.clients.state import ClientState

    name = f"usernet_two_{strategy.replace('-', '_')}"
    cfg = _cfg(_module(tmp_path, name), f"{name}:make", {"head": ["bn1", "classifier"]},
               strategy=strategy)
    model = models.model_for(cfg)
    keys = [k for k, v in model.state_dict().items() if v.is_floating_point()]
    head, body = models.head_split(model)
    assert models.head_count(model) == 2
    assert [keys[i] for i in head] == TWO_HEAD and [keys[i] for i in body] == TWO_BODY
    initial = dict(zip(keys, models.get_arrays(model)))

    uploads, heads = [], []
    fit, set_arrays = PFLClient.fit, ClientState.set_arrays

    def spy_fit(self, parameters, config):
        arrays, n, metrics = fit(self, parameters, config)
        uploads.append([np.array(a, copy=True) for a in arrays])
        return arrays, n, metrics

    def spy_set(self, key, arrays):
        if key == "head":
            heads.append([np.array(a, copy=True) for a in arrays])
        return set_arrays(self, key, arrays)

    # what each phase trains, by parameter name: the head phase (eq. 9, salt 0) the head's
    # parameters, the body phase exactly the body's
    client = registry.client_class(strategy)
    trained: dict[str, set] = {"head": set(), "body": set()}
    lwsam, train_body = client.lwsam_train, client.train_body

    def names(model, tensors):
        return {n for n, p in model.named_parameters() if any(p is t for t in tensors)}

    def spy_lwsam(self, model, perturbed, scales, rho, plain=(), **kw):
        if kw.get("salt") == 0:
            trained["head"] |= names(model, list(plain)) | names(model, perturbed)
        return lwsam(self, model, perturbed, scales, rho, plain=plain, **kw)

    def spy_body(self, model, body_layers, *a, **kw):
        trained["body"] |= names(model, [p for layer in body_layers for p in layer])
        return train_body(self, model, body_layers, *a, **kw)

    monkeypatch.setattr(client, "lwsam_train", spy_lwsam)
    monkeypatch.setattr(client, "train_body", spy_body)
    monkeypatch.setattr(PFLClient, "fit", spy_fit)
    monkeypatch.setattr(ClientState, "set_arrays", spy_set)
    out = tmp_path / "run"
    pf.preflight(cfg, out, out / "initial.npz")  # a head of 2 layers is not refused
    s = inprocess.run(cfg, out)
    monkeypatch.undo()
    assert len(uploads) == 8 and len(heads) == 8  # 4 clients x 2 rounds
    params = {n for n, _ in model.named_parameters()}
    assert trained == {"head": set(TWO_HEAD) & params, "body": set(TWO_BODY) & params}
    shapes = lambda names: [initial[k].shape for k in names]  # noqa: E731
    assert all([a.shape for a in up] == shapes(TWO_BODY) for up in uploads)
    assert all([a.shape for a in h] == shapes(TWO_HEAD) for h in heads)
    assert s.body_index == body and [a.shape for a in s.body] == shapes(TWO_BODY)
    # the server's body is the mean of round 2's uploads (Algorithm 3, line 14)
    mean = [np.mean(np.stack([u[k] for u in uploads[4:]]).astype(np.float64), axis=0)
            for k in range(len(body))]
    assert all(np.allclose(a, m, atol=1e-6) for a, m in zip(s.body, mean))
    # both head layers trained: bn1's affine weight and statistics, the classifier's weight
    last = dict(zip(TWO_HEAD, heads[-1]))
    for name in ("net.bn1.weight", "net.bn1.running_mean", "net.classifier.weight"):
        assert not np.allclose(last[name], initial[name]), name
    assert float(_rows(out)[-1]["personal_mean"]) > 0.2  # chance: 0.1


# ------------------------------------------------------------------ head declarations
class _Body(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(3, 4)
        self.b = torch.nn.Linear(4, 2)
        self.c = torch.nn.Linear(2, 2)

    def forward(self, x):
        return self.c(self.b(self.a(x)))


class _ModuleHead(_Body):
    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(2, 2)  # a submodule called head: the head


class _MethodHead(_Body):
    def head(self):
        return ["b.weight", "b.bias"]


@pytest.mark.parametrize("net, head", [
    (_Body(), ["net.c"]),  # not declared: the last layer, as for the built-ins
    (_ModuleHead(), ["net.head"]),
    (_MethodHead(), ["net.b"]),
    (_Body(), ["net.a"]),  # set below: a function of the model
])
def test_each_way_to_declare_the_head(net, head):
    if head == ["net.a"]:
        net.head = lambda model: "a"
    model = um.UserModel(net, "m:f")
    assert model.head_problem is None and model.head_groups == head
    assert model.layer_names()[-len(head):] == head
    groups = dict(models.layer_groups(model))
    assert models.head_split(model)[0] == [i for g in head for i in groups[g]]


def test_the_preflight_judges_a_batch_of_one_and_the_hypernetwork_size(tmp_path):
    source = _module(tmp_path, "usernet_one")
    cfg = _cfg(source, "usernet_one:make")
    model = models.model_for(cfg)
    rebuild = lambda: models.model_for(cfg)  # noqa: E731
    batch = torch.zeros(4, 1, 28, 28)
    assert um.user_model_problems(model, rebuild, batch, 0, "fedavg", False, None) == []
    lines = um.user_model_problems(model, rebuild, batch, 2, "pfedhn", False, 10**9)
    assert "fails on a batch of 1 sample in training" in lines[0] and "2 client(s)" in lines[0]
    dim = sum(a.size for a in models.get_arrays(model))
    assert f"outputs all {dim} float entries" in lines[1] and "hidden = 1000000000" in lines[1]
    assert um.user_model_problems(model, rebuild, batch, 0, "pfedhn", False, 100) == []


@pytest.mark.parametrize("sizes, drop_last, refused", [
    ([33], False, True),  # 33 = 32 + 1: a last batch of one sample
    ([34, 64], False, False), ([33], True, False), ([1], True, True)])
def test_a_last_batch_of_one_is_judged_from_the_clients_sizes(tmp_path, sizes, drop_last,
                                                               refused):
    source = _module(tmp_path, "usernet_sizes")
    cfg = _cfg(source, "usernet_sizes:make", **{"train.batch-size": 32,
                                                "train.drop-last": drop_last})
    check = lambda: pf.check_model(cfg.values, None, [str(Path(source).parent)],  # noqa: E731
                                   torch.zeros(4, 1, 28, 28), 10, sizes)
    if refused:
        with pytest.raises(PreflightError, match=r"fails on a batch of 1 sample .* 1 client"):
            check()
    else:
        check()


def test_the_factory_is_seeded_and_built_once_per_process(tmp_path):
    source = _module(tmp_path, "usernet_seed")
    a = models.model_for(_cfg(source, "usernet_seed:make", seed=1))
    b = models.model_for(_cfg(source, "usernet_seed:make", seed=1))
    c = models.model_for(_cfg(source, "usernet_seed:make", seed=2))
    assert a is not b and all(np.array_equal(x, y) for x, y in
                              zip(models.get_arrays(a), models.get_arrays(b)))
    assert not np.array_equal(models.get_arrays(a)[0], models.get_arrays(c)[0])
    state = torch.random.get_rng_state()
    models.model_for(_cfg(source, "usernet_seed:make", seed=9))
    assert torch.equal(state, torch.random.get_rng_state())  # the global RNG untouched
    # numpy's generator seeded too (and restored): such a factory passes the check
    np_state = np.random.get_state()[1].copy()
    pf.check_model(_cfg(source, "usernet_seed:numpy_init").values, None,
                   [str(Path(source).parent)], torch.zeros(4, 1, 28, 28), 10, [100])
    assert np.array_equal(np_state, np.random.get_state()[1])
    # ... with the run's seed, as every process seeds it (not just the same state twice here)
    built = models.model_for(_cfg(source, "usernet_seed:numpy_init", seed=5))
    expected = np.random.RandomState(5).randn(16, 4 * 7 * 7).astype(np.float32)
    assert np.array_equal(built.net.fc1.weight.detach().numpy(), expected)


def test_flwr_run_hands_flower_the_staged_app_with_the_users_module(tmp_path, monkeypatch):
    # the one launch path every `flwr run` of ours takes (run, bench, deploy, submit): the app
    # folder it gives Flower must carry the module, or nodes elsewhere cannot build the model
    from flower_pfl.running import procs

    source = _module(tmp_path, "staged_net")
    cfg = _cfg(source, "staged_net:make")
    seen: dict[str, list[str]] = {}

    def stream_run(cmd, *args, **kwargs):
        app = Path(cmd[2])
        seen["files"] = sorted(p.name for p in app.iterdir())
        seen["pyproject"] = [(app / "pyproject.toml").read_text()]
        return "1"

    monkeypatch.setattr(procs, "stream_run", stream_run)
    monkeypatch.setattr(procs, "run_status", lambda *a, **k: "finished:completed")
    run_config = {"cfg": cfg.to_json(), "config-file": source}
    try:
        procs.flwr_run(run_config, tmp_path, {}, procs.ProcessSet(), tmp_path / "log")
    except Exception:  # noqa: BLE001 - what happens after the bundle is not this test's
        pass
    assert "staged_net.py" in seen["files"]
    assert "/staged_net.py" in seen["pyproject"][0]
