"""The opt-in phase timer (flower_pfl/phases.py, flower_pfl/timing.py): off by default and
wrapping nothing; on, the same per-client rows bit for bit and phases that add up."""

from __future__ import annotations

import math

from flwr.clientapp import ClientApp

from flower_pfl import client_app, phases, timing
from flower_pfl.clients import base
from flower_pfl.reporting.run_files import read_rows
from flower_pfl.running import inprocess
from flower_pfl.tuned import array_packing
from tests.conftest import small_config


def _timed(fn) -> bool:
    return getattr(fn, "__wrapped_by_phases__", False)


def test_off_by_default_wraps_nothing(monkeypatch):
    monkeypatch.delenv(phases.ENV, raising=False)
    assert timing.client_mods(client_app.RegistryClient) == []
    assert timing.install_server() is None
    assert not _timed(base.PFLClient.__dict__["fit"])
    assert not _timed(base.load_client_data)
    # the product's ClientApp runs with the array-packing mod alone (a tuned deployment's
    # packed arrays unpacked; it passes anything else through): the timer adds none
    assert client_app.app._mods == [array_packing.client_mod]


def _rows(run_dir):
    rows = read_rows(run_dir, "clients")
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in rows]


def test_on_gives_identical_client_rows_and_phases_that_add_up(tmp_path, monkeypatch):
    # unequal client sizes (dirichlet), a personal-state strategy (context.state in use)
    cfg = small_config(strategy="fedamp", clients=4, rounds=2, model="mclr",
                       data={"subsample": 1200})
    monkeypatch.delenv(phases.ENV, raising=False)
    inprocess.run(cfg, tmp_path / "off")
    monkeypatch.setenv(phases.ENV, str(tmp_path / "phases"))
    rec, mods = timing.install_client(client_app.RegistryClient)
    try:
        assert _timed(base.PFLClient.__dict__["fit"]) and len(mods) == 1
        monkeypatch.setattr(inprocess, "client_app",
                            ClientApp(client_fn=client_app.client_fn, mods=mods))
        inprocess.run(cfg, tmp_path / "on")
    finally:
        phases.uninstall(rec)
    assert not _timed(base.PFLClient.__dict__["fit"])  # uninstall put the originals back

    off, on = _rows(tmp_path / "off"), _rows(tmp_path / "on")
    assert off and on == off

    records = phases.read(tmp_path / "phases")
    train = [r for r in records if r["kind"] == "train"]
    evaluate = [r for r in records if r["kind"] == "evaluate"]
    assert len(train) == 2 * 4 and len(evaluate) == 2 * 4  # every message, once
    assert {r["round"] for r in train} == {1, 2}
    for r in train + evaluate:  # own times: the phases add up to the message's wall time
        assert math.isclose(sum(r["phases"].values()), r["total_s"], rel_tol=1e-6)
        assert all(v >= 0 for v in r["phases"].values())
    assert all(r["phases"]["training steps"] > 0 for r in train)
    assert all("training steps" not in r["phases"] for r in evaluate)
    assert all(r["phases"]["evaluation"] > 0 for r in evaluate)
    n, total, rows = phases.table(train)
    assert n == 8 and math.isclose(sum(share for _, _, share in rows), 1.0, rel_tol=1e-6)


def test_message_phases_first_messages_and_import_times():
    """benchmarks/message_phases.py's round-1 parts: each actor's earliest message (by
    start = end - total, not by end), and ``-X importtime`` self times summed by top-level
    package (a cumulative column counted would charge torch.nn twice)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import message_phases as mp

    recs = [{"pid": 1, "kind": "train", "round": 1, "end": 10.0, "total_s": 5.0},   # 5.0
            {"pid": 1, "kind": "evaluate", "round": 1, "end": 9.0, "total_s": 1.0},  # 8.0
            {"pid": 2, "kind": "train", "round": 1, "end": 7.0, "total_s": 0.5},     # 6.5
            {"pid": 2, "kind": "train", "round": 2, "end": 8.0, "total_s": 2.0}]     # 6.0
    got = {r["pid"]: (r["end"], r["kind"]) for r in mp.first_messages(recs)}
    assert got == {1: (10.0, "train"), 2: (8.0, "train")}
    text = ("import time: self [us] | cumulative | imported package\n"
            "import time:       120 |        120 |   _io\n"
            "import time:      3000 |       5000 |     torch.nn\n"
            "import time:      2000 |       7000 |   torch\n"
            "import time:       500 |       7500 | flower_pfl.client_app\n"
            "import time:        40 |         40 |   clients.base\n")
    seconds = mp.import_seconds(text)
    assert seconds == {"_io": 120e-6, "torch": 5000e-6, "flower_pfl": 500e-6,
                       "clients": 40e-6}
