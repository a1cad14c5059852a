"""Extra arrays travel as arrays: Self-FL's d_m and SCAFFOLD's dc_i follow the model in the
upload (their c in the download) and meet the same upload check as a model array.

In-process (flower_pfl/running/inprocess.py) on a small real FMNIST subset; a transport between
server and clients tampers with chosen uploads after the client built them.
"""

from __future__ import annotations

import csv

import numpy as np
import pytest
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

from flower_pfl.reliability import uploads
from flower_pfl.running import inprocess
from tests.conftest import small_config

#: per strategy: its extra part's name, and the overrides of a short run with d_m in round 1
CELLS = {
    "selffl": ("optimum-offset", {"hyper.selffl.warmup-rounds": 0,
                                  "hyper.selffl.bootstrap-max-steps": 10}),
    "scaffold": ("control-delta", {}),
}


class TamperingProxy(inprocess.InProcessProxy):
    """``plan[(round, pid)]``: 'extra-nan' | 'extra-shape' | 'extra-big' | 'model-nan'
    applied to the upload's LAST array (inside the extra part) or its first (the model)."""

    plan: dict[tuple[int, int], str] = {}
    sizes: dict[tuple[int, int], int] = {}

    def fit(self, ins, timeout, group_id):
        res = super().fit(ins, timeout, group_id)
        key = (int(ins.config["round"]), int(self.context.node_config["partition-id"]))
        arrays = parameters_to_ndarrays(res.parameters)
        self.sizes[key] = len(arrays)
        what = self.plan.get(key)
        if what == "extra-nan":
            arrays[-1] = arrays[-1].copy()
            arrays[-1].flat[0] = np.nan
        elif what == "extra-shape":  # one value too many: an oversized extra array
            arrays[-1] = np.concatenate([arrays[-1].ravel(), np.zeros(1, arrays[-1].dtype)])
        elif what == "extra-big":
            arrays[-1] = arrays[-1] * np.float32(1e6) + np.float32(1.0)
        elif what == "model-nan":
            arrays[0] = np.full_like(arrays[0], np.nan)
        res.parameters = ndarrays_to_parameters(arrays)
        return res


def _run(strategy, tmp_path, plan, **extra):
    name, overrides = CELLS[strategy]
    cfg = small_config(strategy=strategy, rounds=2, clients=4, model="mclr",
                       **{"data.subsample": 2000, **overrides, **extra})
    TamperingProxy.plan, TamperingProxy.sizes = plan, {}
    manager = inprocess.make_federation(4, proxy_cls=TamperingProxy)
    return name, inprocess.run(cfg, tmp_path, manager=manager)


def _failures(tmp_path) -> dict[tuple[int, int], str]:
    with open(tmp_path / "failures.csv") as fh:
        return {(int(r["round"]), int(r["partition-id"])): r["reason"]
                for r in csv.DictReader(fh)}


@pytest.mark.parametrize("strategy", sorted(CELLS))
def test_a_bad_extra_array_is_rejected_by_the_model_arrays_upload_check(strategy, tmp_path):
    plan = {(1, 0): "extra-nan", (1, 1): "extra-shape", (1, 2): "model-nan"}
    name, s = _run(strategy, tmp_path, plan)
    model_arrays = len(s.global_arrays)
    # the upload is the model, then the extra part (SCAFFOLD: dc_i has the model's shapes)
    assert TamperingProxy.sizes[(1, 3)] == model_arrays + (1 if strategy == "selffl"
                                                           else model_arrays)
    got = _failures(tmp_path)
    assert set(got) == {(1, 0), (1, 1), (1, 2)}
    last = TamperingProxy.sizes[(1, 3)] - 1
    assert f"update rejected: array {last} (extra '{name}') holds 1 NaN/Inf" in got[(1, 0)]
    assert f"update rejected: array {last} (extra '{name}') has shape" in got[(1, 1)]
    assert "update rejected: array 0 holds" in got[(1, 2)]  # a model array: the same check
    with open(tmp_path / "server.csv") as fh:
        server = {int(r["round"]): r for r in csv.DictReader(fh)}
    assert int(server[1]["fit_ok"]) == 1 and int(server[2]["fit_ok"]) == 4
    assert all(np.isfinite(a).all() for a in s.global_arrays)
    if strategy == "scaffold":
        assert all(np.isfinite(c).all() for c in s.control)
    else:
        assert np.isfinite(s.sigma0_sq)


def test_max_update_norm_bounds_self_fl_d_m_as_it_bounds_the_model(tmp_path):
    """d_m is an update (an offset from the round's model): max-update-norm bounds it too."""
    name, s = _run("selffl", tmp_path, {(1, 0): "extra-big"}, **{"max-update-norm": 1e3})
    got = _failures(tmp_path)
    assert set(got) == {(1, 0)}
    assert f"extra '{name}' norm" in got[(1, 0)] and "max-update-norm = 1000" in got[(1, 0)]
    assert s.bounded_extra() == {name}


def test_layout_of_model_and_extra_parts():
    model = [np.zeros((2, 3), np.float32), np.zeros(3, np.float32)]
    template = uploads.UploadTemplate(model, {"a": [np.zeros(4, np.float32)],
                                                  "b": model})
    upload = template.arrays
    assert len(upload) == 5
    got_model, extra = template.split(upload)
    assert len(got_model) == 2 and list(extra) == ["a", "b"] and len(extra["b"]) == 2
    assert template.check(upload, 3) is None
    assert "wrong number of arrays: 4 (the model has 2 + 'a' 1 + 'b' 2)" in \
        template.check(upload[:4], 3)
    text = uploads.describe_parts({"c": model})
    assert text == "c:2" and uploads.parse_parts(text) == [("c", 2)]
    got_model, extra = uploads.split_parts([*model, *model], uploads.parse_parts(text))
    assert len(got_model) == 2 and len(extra["c"]) == 2
