"""The python side of ``benchmarks/gpu_check.sh`` (the GPU check; docs/BENCHMARKS.md "GPU").

    gpu_check.py configs OUT DATA_ROOT   write the runs' YAMLs into OUT
    gpu_check.py machine OUT             OUT/machine.json: GPU, cores, versions, revision
    gpu_check.py check PLAN              dry run: every command of PLAN (one shell-quoted
                                         command a line) parses, its files exist (exit 1 if not)
    gpu_check.py epoch OUT DATA_ROOT     one client's local epoch in process, CPU vs CUDA
    gpu_check.py report OUT              the one markdown report of OUT

The cells: FedAvg (``STRATEGY``), FMNIST practical 3 groups, every client every round,
1 epoch of batch 32 at lr 0.05; the CNN with 20 clients on 20,000 images, 4 rounds;
ResNet-18 with 20 clients on 10,000 images, 3 rounds.  Each once with ``device: cuda``
and ``client-resources {num-cpus: 1, num-gpus: FRACTION}`` (default 0.1: up to ten
ClientApp actors share the GPU) and once with ``device: cpu`` and ``num-gpus: 0`` (one actor
per core).  s/round is the median of the round-to-round differences of ``elapsed_s``
(the first round carries Ray's start).  The deployment: 2 clients, CNN, 2 rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: per-round goal, CPU s/round over GPU s/round (issue: ResNet-18 >= 5x, CNN >= 2x)
GOALS = {"cnn": 2.0, "resnet18": 5.0}
SIMS = ("sim-cnn-gpu", "sim-resnet18-gpu", "sim-cnn-cpu", "sim-resnet18-cpu")
SETTINGS = {"cnn": {"clients": 20, "rounds": 4, "subsample": 20000},
            "resnet18": {"clients": 20, "rounds": 3, "subsample": 10000}}
#: SMOKE=1: the same steps at a tiny size with every "GPU" cell on the CPU (no --gpu): checks
#: the check's own machinery (steps, PIDs, deployment, report) on a machine without a GPU
SMOKE = os.environ.get("SMOKE") == "1"
if SMOKE:
    SETTINGS = {m: {"clients": 4, "rounds": 3, "subsample": 1200} for m in SETTINGS}
FMNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def sim_tree(model: str, on_gpu: bool, out: Path, data_root: str) -> dict:
    s = SETTINGS[model]
    return {"strategy": os.environ.get("STRATEGY", "fedavg"), "rounds": s["rounds"],
            "clients": s["clients"], "fraction-fit": 1.0, "min-fit-clients": 2,
            "eval-every": 1, "eval-global": False, "checkpoint-every": 0, "seed": 0,
            "model": model, "device": "cuda" if on_gpu and not SMOKE else "cpu",
            "device-resident": os.environ.get("RESIDENT", "auto"),
            "output-dir": str(out / "runs"),
            "run-name": f"sim-{model}-{'gpu' if on_gpu else 'cpu'}",
            "client-resources": {"num-cpus": 1, "num-gpus":
                                 float(os.environ.get("FRACTION", "0.1"))
                                 if on_gpu and not SMOKE else 0},
            "data": {"dataset": "fmnist", "root": data_root, "partition": "practical",
                     "groups": 3, "dominant-share": 0.8, "subsample": s["subsample"]},
            "train": {"epochs": 1, "batch-size": 32, "lr": 0.05}}


def deploy_tree(out: Path, data_root: str) -> dict:
    return {"strategy": os.environ.get("STRATEGY", "fedavg"), "rounds": 2, "clients": 2,
            "fraction-fit": 1.0, "min-fit-clients": 2, "eval-every": 1, "checkpoint-every": 0,
            "seed": 0, "model": "cnn", "device": "cpu" if SMOKE else "cuda",
            "device-resident": os.environ.get("RESIDENT", "auto"),
            "output-dir": str(out / "runs"), "run-name": "deploy",
            "data": {"dataset": "fmnist", "root": data_root, "partition": "practical",
                     "groups": 2, "dominant-share": 0.8,
                     "subsample": 1200 if SMOKE else 4000},
            "train": {"epochs": 1, "batch-size": 32, "lr": 0.05}}


def configs(out: Path, data_root: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in SIMS:
        model, dev = name.split("-")[1:]
        (out / f"{name}.yaml").write_text(yaml.safe_dump(sim_tree(model, dev == "gpu", out,
                                                                  data_root)))
    (out / "deploy.yaml").write_text(yaml.safe_dump(deploy_tree(out, data_root)))


# ------------------------------------------------------------------------ dry run
def fmnist_problem(root: str | None) -> str | None:
    """Why ``root`` cannot serve FMNIST without a download, or None."""
    if not root:
        return "data.root is null: the GPU machine cannot download FMNIST (set DATA_ROOT)"
    path = Path(root)
    if not path.is_dir():
        return f"data.root {root}: no such folder (DATA_ROOT: a folder with the FMNIST files)"
    names = {p.name for p in path.rglob("*")}
    missing = [f for f in FMNIST_FILES if f not in names and f + ".gz" not in names]
    return f"data.root {root}: no {', '.join(missing)}[.gz]" if missing else None


def check_command(argv: list[str], cuda: bool) -> tuple[str, list[str]]:
    """(what it is, problems) of one planned command, without running it."""
    from flower_pfl import config as config_mod

    if argv[:1] == ["nvidia-smi"]:
        return "nvidia-smi (GPU machine only)", []
    py, rest = argv[0], argv[1:]
    if not (Path(py).is_file() and os.access(py, os.X_OK)):
        return " ".join(argv[:3]), [f"{py}: no executable python (PYTHON)"]
    if rest[:1] and rest[0].endswith("gpu_check.py"):
        if not Path(rest[0]).is_file():
            return rest[0], [f"{rest[0]}: no such file"]
        parser().parse_args(rest[1:])
        return f"gpu_check.py {rest[1]}", []
    if rest[:2] != ["-m", "flower_pfl.cli"]:
        return " ".join(argv), ["not a flower-pfl command"]
    cmd, args = rest[2], rest[3:]
    problems: list[str] = []
    what = f"flower-pfl {cmd}"
    if cmd in ("run", "validate", "certs", "node-key"):
        from flower_pfl.cli import build_parser

        ns = build_parser().parse_args([cmd, *args])
        if cmd in ("run", "validate"):
            try:
                cfg = config_mod.load(Path(ns.config), ns.set or None)
            except config_mod.ConfigError as exc:
                return what, [str(exc)]
            what += f" {Path(ns.config).name} ({cfg['model']}, {cfg['device']})"
            problem = fmnist_problem(cfg["data.root"])
            problems += [problem] if problem else []
    elif cmd == "superlink":
        from flower_pfl.running.sites import superlink_parser

        ns = superlink_parser().parse_args(args)
        from flower_pfl.running import deploy

        deploy.split_address(ns.address)
    elif cmd == "supernode":
        from flower_pfl.running.sites import supernode_parser, supernode_plan

        ns = supernode_parser().parse_args(args)
        if ns.gpu is not None and not cuda:  # checked against the machine's GPUs when run
            if not ns.gpu.isdigit():
                problems.append(f"--gpu {ns.gpu}: not a CUDA device number")
            ns.gpu = None
        for flag in ("ca", "key"):  # made by the plan's certs / node-key before it
            if getattr(ns, flag):
                path = Path(getattr(ns, flag))
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch(exist_ok=True)
        supernode_plan(ns)
        what += f" partition {ns.partition_id}"
    elif cmd == "submit":
        from flower_pfl.running.sites import submit_parser

        ns = submit_parser().parse_args(args)
        try:
            cfg = config_mod.load(Path(ns.config), ns.set or None)
        except config_mod.ConfigError as exc:
            return what, [str(exc)]
        problem = fmnist_problem(cfg["data.root"])
        problems += [problem] if problem else []
    else:
        problems.append(f"unknown flower-pfl command {cmd!r}")
    return what, problems


def check(plan: Path) -> int:
    import torch

    cuda = torch.cuda.is_available()
    failed = 0
    lines = [ln for ln in plan.read_text().splitlines() if ln.strip()]
    for line in lines:
        argv = shlex.split(line)
        try:
            what, problems = check_command(argv, cuda)
        except SystemExit as exc:  # argparse said why on stderr
            what, problems = " ".join(argv[:4]), [f"its arguments do not parse (exit {exc.code})"]
        except Exception as exc:  # noqa: BLE001 - a dry run reports every problem
            what, problems = " ".join(argv[:4]), [f"{type(exc).__name__}: {exc}"]
        print(f"  {'ok  ' if not problems else 'FAIL'} {what}")
        for p in problems:
            print(f"       {p}")
        failed += bool(problems)
    print(f"dry run: {len(lines)} commands, {failed} with problems "
          f"(CUDA {'available' if cuda else 'absent: --gpu and device cuda checked when run'})")
    return 1 if failed or not lines else 0


def machine(out: Path) -> None:
    import subprocess

    import flwr
    import ray
    import torch

    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip() or "?"
    gpu = "no CUDA"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu = f"{props.name}, {props.total_memory / 2**30:.0f} GiB"
    info = {"rev": rev, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "gpu": gpu, "cores": os.cpu_count(),
            "versions": f"torch {torch.__version__}, flwr {flwr.__version__}, "
                        f"ray {ray.__version__}, python {sys.version.split()[0]}"}
    (out / "machine.json").write_text(json.dumps(info))


# ------------------------------------------------------------------- in-process epoch
def epoch(out: Path, data_root: str) -> None:
    """One client's local epoch (after 20 warm-up steps) on the CPU (all cores) and on CUDA:
    the GPU's speed-up without Flower, Ray or process starts."""
    import torch

    from flower_pfl import config
    from flower_pfl.learning.client_data import load_client_data
    from flower_pfl.learning.models import model_for
    from flower_pfl.learning.training import TrainSpec, train

    rows = {}
    for model in ("cnn", "resnet18"):
        cfg = config.validate(sim_tree(model, True, out, data_root), source="epoch")
        spec = TrainSpec.from_config(cfg)
        for label, dev in (("cpu", "cpu"), ("cuda", "cpu" if SMOKE else "cuda")):
            device = torch.device(dev)
            data = load_client_data(cfg.values, 0, None, device)
            net = model_for(cfg).to(device)
            g = torch.Generator()
            g.manual_seed(0)
            train(net, data.x_train, data.y_train, spec, g, device,
                  num_steps=2 if SMOKE else 20)  # warm-up (cuDNN's choice of kernels)
            if dev == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            train(net, data.x_train, data.y_train, spec, g, device)
            if dev == "cuda":
                torch.cuda.synchronize()
            rows[f"{model}-{label}"] = {"seconds": time.perf_counter() - start,
                                      "samples": data.num_train}
    (out / "epoch.json").write_text(json.dumps(rows))


# ------------------------------------------------------------------------- report
def per_round(run: Path) -> tuple[float | None, int, str]:
    """(median s/round of the round-to-round differences, rounds done, status)."""
    try:
        s = json.loads((run / "summary.json").read_text())
    except (OSError, ValueError):
        return None, 0, "no summary.json"
    t = [r["elapsed_s"] for r in s.get("rounds", [])]
    diffs = [b - a for a, b in zip(t, t[1:])]
    return (statistics.median(diffs) if diffs else None), len(t), str(s.get("status"))


def device_truth(run: Path) -> dict:
    from flower_pfl.reporting.run_files import read_rows

    rows = read_rows(run, "clients")
    fits = read_rows(run, "fit")
    peaks = [float(r["gpu_peak_mib"]) for r in fits + rows if r.get("gpu_peak_mib")]
    return {"devices": Counter(r.get("device") or "-" for r in rows),
            "fit_devices": Counter(r.get("device") or "-" for r in fits),
            "names": sorted({r["gpu_name"] for r in fits + rows if r.get("gpu_name")}),
            "peak": max(peaks) if peaks else None}


def smi_window(out: Path, start: float, end: float) -> tuple[float | None, int | None]:
    """(most GPU memory used, most compute processes at once) sampled in [start, end]."""
    mem, apps = [], []
    try:
        lines = (out / "smi.csv").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(",")
        if len(parts) == 3 and start <= float(parts[0]) <= end:
            mem.append(float(parts[1]))
            apps.append(int(parts[2]))
    return (max(mem) if mem else None), (max(apps) if apps else None)


def fmt(x, spec=".2f", none="–"):
    return none if x is None else format(x, spec)


def report(out: Path) -> None:
    steps = {}
    for line in (out / "steps.tsv").read_text().splitlines() if (out / "steps.tsv").is_file() \
            else []:
        name, rc, start, end, cap = line.split("\t")
        steps[name] = (int(rc), float(start), float(end), float(cap))
    info = json.loads((out / "machine.json").read_text()) if (out / "machine.json").is_file() \
        else {}
    if SMOKE:
        print("SMOKE=1: every cell on the CPU at a tiny size (the check's machinery only; "
              "no GPU numbers)\n")
    print(f"# GPU check, flower-pfl {info.get('rev', '?')}, {info.get('date', '?')}\n")
    print(f"Machine: {info.get('gpu', 'no GPU')}; {info.get('cores', '?')} cores; "
          f"{info.get('versions', '')}. Strategy {os.environ.get('STRATEGY', 'fedavg')}, "
          f"num-gpus {os.environ.get('FRACTION', '0.1')} per client, device-resident "
          f"{os.environ.get('RESIDENT', 'auto')}.\n")
    print("## (a, b) Device truth\n")
    print("| run | status, rounds | clients.csv device (rows) | fit.csv device (fits) | GPU name "
          "| peak per fit (torch, MiB) | peak GPU memory used (nvidia-smi, MiB) | most processes "
          "on the GPU at once |")
    print("|---|---|---|---|---|---:|---:|---:|")
    for name in ("sim-cnn-gpu", "sim-resnet18-gpu", "deploy"):
        run = out / "runs" / name
        truth = device_truth(run)
        _, done, status = per_round(run)
        mem, apps = smi_window(out, *steps[name][1:3]) if name in steps else (None, None)
        print(f"| {name} | {status}, {done} | "
              f"{', '.join(f'{k} x{v}' for k, v in truth['devices'].items()) or '–'} | "
              f"{', '.join(f'{k} x{v}' for k, v in truth['fit_devices'].items()) or '–'} | "
              f"{', '.join(truth['names']) or '–'} | {fmt(truth['peak'], '.1f')} | "
              f"{fmt(mem, '.0f')} | {fmt(apps, 'd')} |")
    ep = json.loads((out / "epoch.json").read_text()) if (out / "epoch.json").is_file() else {}
    print("\n## (c) Seconds per round, CPU vs GPU\n")
    print("| setting | GPU s/round | CPU s/round | CPU / GPU | goal | met | one epoch in "
          "process, CPU / CUDA (d) |")
    print("|---|---:|---:|---:|---:|---|---:|")
    for model, goal in GOALS.items():
        s = SETTINGS[model]
        gpu, _, _ = per_round(out / "runs" / f"sim-{model}-gpu")
        cpu, _, _ = per_round(out / "runs" / f"sim-{model}-cpu")
        ratio = cpu / gpu if gpu and cpu else None
        met = "–" if ratio is None else ("yes" if ratio >= goal else "no")
        c, g = ep.get(f"{model}-cpu"), ep.get(f"{model}-cuda")
        ceiling = c["seconds"] / g["seconds"] if c and g and g["seconds"] > 0 else None
        print(f"| {model}, {s['clients']} clients, {s['subsample']} images | {fmt(gpu)} | "
              f"{fmt(cpu)} | {fmt(ratio)} | ≥ {goal:g} | {met} | {fmt(ceiling, '.1f')} |")
    print("\nA round's ratio far below the in-process epoch's: the round's time is not local "
          "training (Ray and Flower per message, process and CUDA-context starts, the "
          "server); see the steps' logs in OUT.")
    if ep:
        print("\n## (d) One local epoch in process (no Flower, Ray or process start)\n")
        print("| model | samples | CPU s | CUDA s | CPU / CUDA |")
        print("|---|---:|---:|---:|---:|")
        for model in GOALS:
            c, g = ep.get(f"{model}-cpu"), ep.get(f"{model}-cuda")
            if c and g:
                print(f"| {model} | {c['samples']} | {c['seconds']:.3f} | {g['seconds']:.3f} | "
                      f"{c['seconds'] / g['seconds']:.1f} |")
    print("\n## Steps\n")
    print("| step | exit | seconds | cap |")
    print("|---|---:|---:|---:|")
    for name, (rc, start, end, cap) in steps.items():
        print(f"| {name} | {rc} | {end - start:.0f} | {cap:.0f} |")
    if steps:
        first = min(v[1] for v in steps.values())
        last = max(v[2] for v in steps.values())
        print(f"\nSteps total: {last - first:.0f} s (logs and results: {out})")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    for name in ("configs", "epoch"):
        q = sub.add_parser(name)
        q.add_argument("out", type=Path)
        q.add_argument("data_root")
    sub.add_parser("check").add_argument("plan", type=Path)
    sub.add_parser("machine").add_argument("out", type=Path)
    sub.add_parser("report").add_argument("out", type=Path)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.what == "configs":
        configs(args.out, args.data_root)
    elif args.what == "check":
        return check(args.plan)
    elif args.what == "machine":
        machine(args.out)
    elif args.what == "epoch":
        epoch(args.out, args.data_root)
    else:
        report(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
