"""The run's configuration is parsed once and read by the clients from the run config: no
message carries it, and the per-client metrics are those of a run whose messages carry it."""

from __future__ import annotations

import csv

import pytest
from flwr.app import Context, RecordDict

from flower_pfl.clients.base import PFLClient
from flower_pfl.running import inprocess
from tests.conftest import small_config


class RecordingProxy(inprocess.InProcessProxy):
    """Records the configuration keys of every instruction it carries."""

    keys: list[tuple[str, frozenset[str]]] = []

    def get_properties(self, ins, timeout, group_id):
        self.keys.append(("handshake", frozenset(ins.config)))
        return super().get_properties(ins, timeout, group_id)

    def fit(self, ins, timeout, group_id):
        self.keys.append(("fit", frozenset(ins.config)))
        return super().fit(ins, timeout, group_id)

    def evaluate(self, ins, timeout, group_id):
        self.keys.append(("evaluate", frozenset(ins.config)))
        return super().evaluate(ins, timeout, group_id)


def _rows(path):
    with open(path / "clients.csv") as fh:
        return [{k: v for k, v in r.items() if k not in ("elapsed_s",)} for r in csv.DictReader(fh)]


@pytest.mark.parametrize("strategy", ["fedamp", "ditto"])
def test_no_message_carries_the_configuration_and_the_metrics_stay(strategy, tmp_path):
    cfg = small_config(strategy=strategy, rounds=2, clients=4, model="mclr",
                       **{"fraction-fit": 0.5, "data.subsample": 2000})
    runs = {}
    for travels in (True, False):
        RecordingProxy.keys = []
        manager = inprocess.make_federation(
            4, proxy_cls=RecordingProxy, run_config={} if travels else {"cfg": cfg.to_json()})
        inprocess.run(cfg, tmp_path / str(travels), manager=manager, cfg_travels=travels)
        runs[travels] = (_rows(tmp_path / str(travels)), list(RecordingProxy.keys))
    carried = [kind for kind, keys in runs[True][1] if "cfg" in keys]
    assert set(carried) == {"fit", "evaluate"} and len(carried) == 2 * 2 + 2 * 4
    assert all("cfg" not in keys for _, keys in runs[False][1])
    assert all("cfg" not in keys for kind, keys in runs[True][1] if kind == "handshake")
    assert runs[False][0] == runs[True][0] and len(runs[True][0]) == 2 * 4


def test_a_client_without_the_configuration_says_where_it_looked():
    ctx = Context(run_id=0, node_id=1, node_config={"partition-id": 0, "num-partitions": 2},
                  state=RecordDict(), run_config={})
    with pytest.raises(RuntimeError, match="neither in the run config .* nor in the message"):
        PFLClient(ctx).run_config_text({"round": 1})
    cfg_json = small_config().to_json()
    ctx.run_config["cfg"] = cfg_json
    assert PFLClient(ctx).run_config_text({"round": 1}) == cfg_json
    # a message that carries it (a ServerApp started by `flwr run` with a YAML path) wins
    assert PFLClient(ctx).run_config_text({"cfg": "{}"}) == "{}"
