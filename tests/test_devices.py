"""Which device each client trained on: fit/evaluate metrics -> fit.csv, clients.csv, log."""

from __future__ import annotations

import csv
import logging

import torch

from flower_pfl.learning import devices
from flower_pfl.running import inprocess
from tests.conftest import small_config

MIB = 2 ** 20


def _csv(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


def _round_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "flwr" and "personalized accuracy mean" in r.getMessage()]


def _small(**overrides):
    return small_config(**{"strategy": "fedavg", "model": "mclr", "rounds": 2, "clients": 4,
                           "data.subsample": 1500, **overrides})


# ------------------------------------------------------------------ the pure helpers
def test_device_metrics_is_a_pure_function_of_device_name_and_peak():
    assert devices.device_metrics(torch.device("cpu")) == {"device": "cpu"}
    # a CPU fit never gets GPU values, even when some were passed
    assert devices.device_metrics("cpu", "NVIDIA H100", 5 * MIB) == {"device": "cpu"}
    out = devices.device_metrics(torch.device("cuda:1"), "NVIDIA H100 80GB HBM3",
                                 812.44 * MIB)
    assert out == {"device": "cuda:1", "gpu_name": "NVIDIA H100 80GB HBM3",
                   "gpu_peak_mib": 812.4}
    # plain Python types only (Flower's records refuse numpy scalars and None)
    assert [type(v) for v in out.values()] == [str, str, float]
    # unknown values are left out, never filled with stand-ins
    assert devices.device_metrics("cuda:0") == {"device": "cuda:0"}


def test_fake_cuda_device_is_reported_with_its_name_and_this_fits_peak(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: calls.append(d))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: f"NVIDIA Fake {d.index}")
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: 300 * MIB)
    devices.start_fit(torch.device("cuda:0"))
    assert calls == [torch.device("cuda:0")]  # the peak is this fit's, not the process'
    assert devices.fit_report(torch.device("cuda:0")) == {
        "device": "cuda:0", "gpu_name": "NVIDIA Fake 0", "gpu_peak_mib": 300.0}
    # a bare "cuda" (device: cuda in the YAML) is named by its index
    assert devices.fit_report(torch.device("cuda")) == {
        "device": "cuda:2", "gpu_name": "NVIDIA Fake 2", "gpu_peak_mib": 300.0}
    assert devices.fit_report("cuda:0", peak=False) == {"device": "cuda:0",
                                                        "gpu_name": "NVIDIA Fake 0"}
    # CPU: torch.cuda is not asked at all
    devices.start_fit(torch.device("cpu"))
    assert calls == [torch.device("cuda:0")]
    assert devices.fit_report(torch.device("cpu")) == {"device": "cpu"}


def test_describe_counts_devices_and_names_the_largest_peak():
    reports = [devices.device_metrics("cuda:0", "NVIDIA H100", p * MIB) for p in (10, 812.4, 5)]
    reports.append({"device": "cpu"})
    assert devices.describe(reports) == "cuda:0 (NVIDIA H100) x3, cpu x1, GPU peak 812.4 MiB"
    assert devices.describe([{"device": "cpu"}] * 10) == "cpu x10"  # no GPU peak on CPU
    assert devices.describe([{"accuracy": 0.5}]) == "unknown x1"


# ------------------------------------------------------------------- end to end (CPU)
def test_cpu_run_names_cpu_per_fit_per_client_and_in_the_round_line(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="flwr"):
        inprocess.run(_small(), tmp_path)
    fits = _csv(tmp_path / "fit.csv")
    assert len(fits) == 2 * 4 and {r["device"] for r in fits} == {"cpu"}
    rows = _csv(tmp_path / "clients.csv")
    assert len(rows) == 2 * 4 and {r["device"] for r in rows} == {"cpu"}
    for table in (fits, rows):  # no GPU values made up for a CPU run
        assert all(not r.get("gpu_name") and not r.get("gpu_peak_mib") for r in table)
    lines = _round_lines(caplog)
    assert len(lines) == 2 and all(line.endswith("| devices cpu x4") for line in lines), lines


def test_cuda_reports_travel_to_fit_csv_clients_csv_and_the_round_line(tmp_path, caplog,
                                                                        monkeypatch):
    """Fake CUDA reports from the clients (the tensors stay on the CPU) go through the real
    message path: string metrics are accepted, written, and never averaged as numbers."""
    real = devices.fit_report
    peaks = iter(range(1, 100))

    def fake(device, peak=True):
        if not peak:  # a client that has not trained yet: where it evaluated (the CPU)
            return real(device, peak=False)
        return devices.device_metrics("cuda:0", "NVIDIA Fake", next(peaks) * MIB)

    monkeypatch.setattr(devices, "fit_report", fake)
    with caplog.at_level(logging.INFO, logger="flwr"):
        s = inprocess.run(_small(**{"rounds": 1, "fraction-fit": 0.5}), tmp_path)
    assert not (tmp_path / "failures.csv").exists()
    fits = _csv(tmp_path / "fit.csv")
    assert len(fits) == 2
    assert [(r["device"], r["gpu_name"], float(r["gpu_peak_mib"])) for r in fits] == [
        ("cuda:0", "NVIDIA Fake", 1.0), ("cuda:0", "NVIDIA Fake", 2.0)]
    rows = {int(r["partition-id"]): r for r in _csv(tmp_path / "clients.csv")}
    trained = {int(r["partition-id"]) for r in fits}
    for pid, r in rows.items():
        if pid in trained:  # the device of its fit, with that fit's peak
            assert (r["device"], r["gpu_name"]) == ("cuda:0", "NVIDIA Fake")
            assert float(r["gpu_peak_mib"]) in (1.0, 2.0)
        else:
            assert (r["device"], r["gpu_name"], r["gpu_peak_mib"]) == ("cpu", "", ""), r
    assert _round_lines(caplog)[-1].endswith(
        "| devices cpu x2, cuda:0 (NVIDIA Fake) x2, GPU peak 2.0 MiB")
    assert s.eval_history and s.eval_history[-1]["mean"] > 0



# ------------------------------------------------- this machine's CUDA devices (preflight)
def test_cuda_devices_counts_and_says_why_there_is_none(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert devices.cuda_devices() == (3, "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    assert devices.cuda_devices() == (0, f"torch {torch.__version__} is built without CUDA")
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert devices.cuda_devices() == (0, "CUDA_VISIBLE_DEVICES='' hides every CUDA device")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert devices.cuda_devices() == (0, f"torch {torch.__version__} finds no CUDA device")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert devices.cuda_devices() == (0, f"torch {torch.__version__} finds no CUDA device")


def test_a_node_asked_for_cuda_on_a_cpu_machine_says_so_at_start(tmp_path, monkeypatch):
    """Issue 67: a SuperNode given the run's YAML with device: cuda on a machine without
    CUDA says at start that its fits will fail, and the fix; device: cpu is named as is."""
    import torch

    from flower_pfl.running.sites import supernode_parser, supernode_plan

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run = tmp_path / "run.yaml"
    for device, want in [("cuda", "device cuda (device in {run}) -- BUT THIS MACHINE HAS NO "
                                  "CUDA DEVICE (torch {v}): every fit and evaluation sent here "
                                  "will fail. Fix: device: auto in the run's YAML"),
                         ("cpu", "device cpu (device in {run});")]:
        run.write_text(f"device: {device}\n")
        args = supernode_parser().parse_args(
            ["--superlink", "h:1", "--insecure", "--partition-id", "0", "--num-partitions",
             "2", "--state-dir", str(tmp_path / "s"), "--config", str(run)])
        _, _, about = supernode_plan(args)
        assert want.format(run=run, v=torch.__version__) in about
