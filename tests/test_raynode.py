"""The Ray node of each fit (fit.csv's ray_node, ray_node_ip) and the cluster line, without Ray.

A fake ``ray`` module stands in for the one a ClientApp actor is connected to; the clients
and the strategy run in process through Flower's message path (``inprocess.run``). The
real cluster, across hosts: tests/test_ray_cluster.py (slow).
"""

from __future__ import annotations

import csv
import logging
import sys
import types

import pytest

from flower_pfl import raynode
from flower_pfl.running import inprocess
from flower_pfl.running.launch import LaunchError, check_ray_address
from tests.conftest import small_config


def fake_ray(connected: bool = True, node_of=lambda: "a" * 56, ip_of=lambda: "10.0.0.2",
             nodes=(), resources=None, gcs="10.0.0.1:6379"):
    """A stand-in for the ``ray`` module: what a process connected to Ray can ask."""
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: connected
    context = types.SimpleNamespace(get_node_id=node_of, gcs_address=gcs)
    ray.get_runtime_context = lambda: context
    ray.util = types.SimpleNamespace(get_node_ip_address=ip_of)
    ray.nodes = lambda: list(nodes)
    ray.cluster_resources = lambda: dict(resources or {})
    return ray


def _csv(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


def _small(**overrides):
    return small_config(**{"strategy": "fedamp", "model": "mclr", "rounds": 2, "clients": 4,
                           "data.subsample": 1500, **overrides})


# ------------------------------------------------------------------ the pure helpers
def test_node_metrics_only_where_the_process_is_connected_to_ray(monkeypatch):
    ray = fake_ray(node_of=lambda: "b" * 56, ip_of=lambda: "10.1.2.3")
    assert raynode.node_metrics(ray) == {"ray_node": "b" * 56, "ray_node_ip": "10.1.2.3"}
    assert raynode.node_metrics(fake_ray(connected=False)) == {}
    monkeypatch.setitem(sys.modules, "ray", ray)  # the module the process imported
    assert raynode.node_metrics()["ray_node"] == "b" * 56
    monkeypatch.delitem(sys.modules, "ray")  # never imported: no Ray, no keys
    assert raynode.node_metrics() == {}
    assert "ray" not in sys.modules  # and it did not import Ray to find out
    assert raynode.select({"ray_node": "x", "ray_node_ip": "y", "device": "cpu"}) == \
        {"ray_node": "x", "ray_node_ip": "y"}


def test_cluster_line_counts_alive_nodes_and_the_clusters_resources():
    nodes = [{"Alive": True, "NodeManagerAddress": "10.0.0.3"},
             {"Alive": False, "NodeManagerAddress": "10.0.0.9"},  # gone: not counted
             {"Alive": True, "NodeManagerAddress": "10.0.0.1"},
             {"Alive": True, "NodeManagerAddress": "10.0.0.2"}]
    ray = fake_ray(nodes=nodes, resources={"CPU": 3.0, "GPU": 0.5, "memory": 1e9})
    attached = {"RAY_ADDRESS": "10.0.0.1:6379"}
    assert raynode.cluster_line(ray, attached) == (
        "[flower-pfl] Ray cluster at 10.0.0.1:6379 (RAY_ADDRESS=10.0.0.1:6379): 3 node(s) "
        "alive (10.0.0.1, 10.0.0.2, 10.0.0.3), 3 CPUs, 0.5 GPUs")
    for private in ({}, {"RAY_ADDRESS": "local"}, {"RAY_ADDRESS": " "}):
        assert raynode.cluster_line(ray, private) is None  # this machine's own instance
    assert raynode.cluster_line(fake_ray(connected=False), attached) is None
    assert raynode.joined_cluster({"RAY_ADDRESS": "auto"}) == "auto"


def test_ray_address_is_checked_before_anything_starts():
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        assert check_ray_address(address) == address
    with pytest.raises(LaunchError, match=r"nothing answers there .*`ray start --head "
                                          r"--port=\d+`"):
        check_ray_address(address)  # closed now
    for bad in ("10.0.0.1", "ray://10.0.0.1:10001", ":6379", "10.0.0.1:port"):
        with pytest.raises(LaunchError, match="give the Ray head's HOST:PORT"):
            check_ray_address(bad)
    assert check_ray_address("auto") == "auto"


def test_run_with_a_ray_address_where_nothing_answers_stops_before_starting(tmp_path, capsys):
    import socket

    from flower_pfl.cli import main

    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    out = tmp_path / "out"
    assert main(["run", "--ray-address", address, "--set", f"output-dir={out}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"flower-pfl: cannot start: --ray-address {address}: nothing "
                          f"answers there"), err
    assert not out.exists()  # nothing started, no results folder


# --------------------------------------------------------- through the message path
def test_each_fit_records_its_ray_node_in_fit_csv_and_no_metric_changes(tmp_path,
                                                                       monkeypatch, caplog):
    """Unequal nodes per client (partition 0 and 3 on one node, 1 and 2 on another): each
    fit.csv row names its own client's node; every other column of fit.csv and
    clients.csv equals a run outside Ray, where the node columns do not exist."""
    monkeypatch.setitem(sys.modules, "ray", fake_ray(connected=False))  # imported, no Ray
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    inprocess.run(_small(), tmp_path / "plain")
    plain_fits = _csv(tmp_path / "plain" / "fit.csv")
    assert not set(plain_fits[0]) & set(raynode.KEYS)

    from flower_pfl.clients import base as client_base  # the node: its running partition's

    running: list[int] = []
    real_setup = client_base.PFLClient.setup

    def setup(self, config):  # every fit and evaluate starts here
        running.append(self.pid)
        return real_setup(self, config)

    monkeypatch.setattr(client_base.PFLClient, "setup", setup)
    node = {0: "n1", 3: "n1", 1: "n2", 2: "n2"}
    nodes = [{"Alive": True, "NodeManagerAddress": f"10.0.0.{i}"} for i in (1, 2, 3)]
    monkeypatch.setitem(sys.modules, "ray", fake_ray(
        node_of=lambda: node[running[-1]].ljust(56, "0"),
        ip_of=lambda: f"10.0.0.{int(node[running[-1]][1]) + 1}", nodes=nodes,
        resources={"CPU": 2.0}))
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    with caplog.at_level(logging.INFO, logger="flwr"):
        inprocess.run(_small(), tmp_path / "ray")
    fits = _csv(tmp_path / "ray" / "fit.csv")
    assert [(r["partition-id"], r["ray_node"][:2], r["ray_node_ip"]) for r in fits] == [
        (str(p), node[p], f"10.0.0.{int(node[p][1]) + 1}") for _ in (1, 2) for p in range(4)]
    assert [{k: v for k, v in r.items() if k not in raynode.KEYS} for r in fits] == plain_fits
    assert _csv(tmp_path / "ray" / "clients.csv") == _csv(tmp_path / "plain" / "clients.csv")
    said = [r.getMessage() for r in caplog.records if "Ray cluster at" in r.getMessage()]
    assert said == ["[flower-pfl] Ray cluster at 10.0.0.1:6379 (RAY_ADDRESS=10.0.0.1:6379): "
                    "3 node(s) alive (10.0.0.1, 10.0.0.2, 10.0.0.3), 2 CPUs, 0 GPUs"]  # once
