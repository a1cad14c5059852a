"""A ClientApp actor SIGKILLed mid-run: every client goes on training (tuned/actor_queue.py).

Slow tier.  A real ``flower-pfl run`` (FedAMP, 4 clients, all sampled each round, 2 Ray
actors of 1 CPU each on one machine); once the console has printed round 2's line, one
``ray::ClientAppActor`` process found in the run's process tree (/proc) is SIGKILLed.
Issue 53's case (a raylet killed on a 4-host cluster) left the dead actor in Flower's pool:
from then on 2-6 of 8 clients failed every round, one traceback per failure on the
console, and the run still said ``completed``.  Here: the lost actor's messages are sent
once more to the live actor and a new actor replaces it, so every client trains and is
evaluated in every round (fit.csv, clients.csv; no failures.csv row), the run ends
``completed`` with its coverage complete, and the console says it in one line (two when
the new actor answers after the lost messages were settled), with no traceback.

The new actor is started in the background while the run goes on; 40 rounds leave it
time to answer before the run ends (here: killed in round 3-7, the new actor in the
pool ~11 rounds later, ~1.5 s).
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flower_pfl.tuned.actor_keeper import LOST

pytestmark = pytest.mark.slow

CLIENTS, ROUNDS = 4, 40
CONFIG = {"strategy": "fedamp", "rounds": ROUNDS, "clients": CLIENTS, "fraction-fit": 1.0,
          "model": "mclr", "eval-every": 1, "client-resources": {"num-cpus": 1},
          "data": {"dataset": "fmnist", "partition": "dirichlet", "subsample": 3000}}
ACTOR = "ray::ClientAppActor"


def descendants(root: int) -> list[int]:
    """Every process below ``root``, from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def actors_under(root: int) -> list[int]:
    """The run's ClientApp actor processes (Ray titles them ``ray::ClientAppActor...``)."""
    return sorted(p for p in descendants(root) if cmdline(p).startswith(ACTOR))


def rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_a_sigkilled_actor_is_replaced_and_every_client_keeps_training(tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    env = {**os.environ, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    env.pop("RAY_ADDRESS", None)  # the run's own Ray, in its own process tree
    env.pop("FLOWER_PFL_FLOWER_POOL", None)
    cli = Path(sys.executable).with_name("flower-pfl")
    run = subprocess.Popen([str(cli), "run", "--config", str(cfg), "--set",
                            f"output-dir={tmp_path / 'out'}"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    actors: list[int] = []
    killed, killed_after = None, None
    try:
        assert run.stdout is not None
        for line in run.stdout:
            lines.append(line.rstrip("\n"))
            if not actors and re.match(r"round +1/", line):  # found now, killed at once later
                actors = actors_under(run.pid)
                assert len(actors) == 2, f"expected 2 ClientApp actors, found {actors}"
            if killed is None and re.match(r"round +2/", line):
                killed, killed_after = actors[0], len(lines)
                os.kill(killed, signal.SIGKILL)
        rc = run.wait(timeout=600)
    finally:
        if run.poll() is None:  # a hung run: stop the launcher (it stops its children)
            run.send_signal(signal.SIGTERM)
            run.wait(timeout=120)
    console = "\n".join(lines)
    assert killed is not None, f"no round 2 line:\n{console}"
    assert rc == 0, console
    assert not Path(f"/proc/{killed}").exists()
    (results,) = (tmp_path / "out").iterdir()

    # every client trained in every round, none failed, every client evaluated every round
    fits = rows(results / "fit.csv")
    for r in range(1, ROUNDS + 1):
        assert sorted(int(f["partition-id"]) for f in fits if int(f["round"]) == r) \
            == list(range(CLIENTS)), f"round {r}'s fits"
    assert rows(results / "failures.csv") == []
    evaluated = rows(results / "clients.csv")
    for r in range(1, ROUNDS + 1):
        assert sorted(int(c["partition-id"]) for c in evaluated if int(c["round"]) == r) \
            == list(range(CLIENTS)), f"round {r}'s evaluation"
    last = [c for c in evaluated if int(c["round"]) == ROUNDS]
    assert all(int(c["fit-rounds"]) == ROUNDS for c in last)  # no fit lost on any client
    summary = json.loads((results / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["coverage"]["complete"] is True, summary["coverage"]

    # the loss in one line (console and flwr-run.log), the new actor, no traceback
    after = lines[killed_after:]
    said = [line for line in after if LOST in line]
    assert 1 <= len(said) <= 2, console  # the messages; the new actor (with them, or after)
    assert "retried on live actors" in said[0] and "0 failed" in said[0], console
    assert all(f"(ActorDiedError, pid {killed}, " in line for line in said), console
    assert f"{LOST} 1 actor replaced; " in said[-1], console
    assert not any("Traceback" in line or "ActorDiedError:" in line for line in after), console
    log = (results / "flwr-run.log").read_text()
    assert log.count(LOST) == len(said)
