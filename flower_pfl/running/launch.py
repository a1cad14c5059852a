"""Run one configuration in Ray simulation (``flower-pfl run``), then clean up.

:func:`run_simulation` starts a private simulation SuperLink (its own FLWR_HOME and loopback
port, runtime dependency installation off) -- or runs on a shared one
(:func:`simulation_superlink`, the bench's) -- calls ``flwr run`` with ``num-supernodes``
and client resources taken from the YAML (:func:`federation_config`), checks the run's
FINAL status (:func:`flower_pfl.running.procs.flwr_run`: ``flwr run --stream`` exits 0 even when
the run failed) and stops every process it started -- SuperLink, SuperExec, ServerApp,
Ray -- by PID, also on failure or Ctrl-C; with ``ray_address`` (``flower-pfl run
--ray-address``, :func:`check_ray_address`) the clients run on an existing Ray cluster,
joined through ``RAY_ADDRESS`` (:mod:`flower_pfl.raynode`).  :func:`resume_config`
rebuilds the configuration of a run to resume from its checkpoint (only the keys that
cannot change its past, :data:`flower_pfl.reliability.checkpoints.RESUME_FREE_KEYS`, may
differ: ``rounds`` extends it).
The command line: :mod:`flower_pfl.cli`; what it prints while a run goes (it passes
``echo=False`` and its console's ``on_line``): :mod:`flower_pfl.reporting.console`.
"""

from __future__ import annotations

import shutil
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from flower_pfl import config as config_mod
from flower_pfl.config import APP_DIR
from flower_pfl.running import procs as procs_mod
from flower_pfl.running.procs import (  # noqa: F401 - LaunchError: what run_simulation raises
    LaunchError,
    OnLine,
    ProcessSet,
    RunOutcome,
)

#: Ray settings of a simulation's private Ray instance (its raylet reads ``RAY_<name>``; a
#: value set in the environment wins). Ray starts one idle Python worker per CPU for the
#: first driver (~50-90 MB each) besides the ClientApp actors, which never use them.
RAY_ENV = {"RAY_prestart_worker_first_driver": "0", "RAY_USAGE_STATS_ENABLED": "0"}

# ------------------------------------------------------------------------ processes
def simulation_env(flwr_home: Path, port: int) -> dict[str, str]:
    """The environment of a simulation SuperLink and all it starts: Flower's
    (:func:`flower_pfl.running.procs.flwr_env`) with :data:`RAY_ENV` where not set."""
    env = procs_mod.flwr_env(flwr_home, port)
    for key, value in RAY_ENV.items():
        env.setdefault(key, value)
    return env


@contextmanager
def simulation_superlink(workdir: Path, log_path: Path, ray_address: str | None = None
                         ) -> Iterator[tuple[dict[str, str], ProcessSet]]:
    """A private simulation SuperLink on a free loopback port; stopped on exit.

    ``ray_address``: the head of an existing Ray cluster (``HOST:PORT``) its simulation
    attaches to, through ``RAY_ADDRESS`` (Flower 1.42's Ray backend calls ``ray.init()``
    without an address and its ``init_args`` cannot carry one); default: the environment's
    ``RAY_ADDRESS``, else a private Ray instance (:func:`flower_pfl.running.procs.flwr_env`)."""
    flwr_home = workdir / "flwr-home"
    flwr_home.mkdir(parents=True, exist_ok=True)
    port = procs_mod.free_port()
    env = simulation_env(flwr_home, port)
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    procs = ProcessSet()
    try:
        proc = procs.start([procs_mod.bin_path("flower-superlink"), "--insecure", "--simulation",
                            "--isolation", "subprocess", "--host", "127.0.0.1", "--port", str(port),
                            "--disable-runtime-dependency-installation"],
                           env, log_path)
        procs_mod.wait_http(f"http://127.0.0.1:{port}/health", 120, proc)
        yield env, procs
    finally:
        procs.stop()



# ---------------------------------------------------------------------------- runs
def run_simulation(cfg: config_mod.RunConfig, config_path: Path, overrides: Sequence[str],
                   results_dir: Path, app_dir: Path = APP_DIR, timeout_s: float | None = None,
                   echo: bool = True, num_supernodes: int | None = None, resume: bool = False,
                   on_line: OnLine | None = None,
                   superlink: tuple[dict[str, str], ProcessSet] | None = None,
                   ray_address: str | None = None,
                   initial_arrays: Path | None = None) -> RunOutcome:
    """Run ``cfg`` through ``flwr run`` in Ray simulation and stop everything it started.

    ``num_supernodes`` defaults to the YAML's ``clients`` (only tests set another value).
    ``resume`` continues the run in ``results_dir`` from its newest checkpoint. The
    watchdog stops a run that shows no progress for ``stall-timeout`` seconds.
    ``superlink``: the ``(env, procs)`` of a running :func:`simulation_superlink` to run
    on (several runs share one); by default a private one is started and stopped, its
    simulation attached to the Ray cluster at ``ray_address`` where given (the caller
    checks it: :func:`check_ray_address`).
    The outcome's ``pids`` are the processes this run started (a private SuperLink
    included, a shared one not).
    ``initial_arrays``: the run's initial model as the preflight check wrote it
    (:mod:`flower_pfl.initial_model`), for the ServerApp to read instead of building it.
    Raises LaunchError if the run did not reach ``finished:completed``.
    """
    from flower_pfl.reliability import stop

    results_dir.mkdir(parents=True, exist_ok=True)
    stop.clear_stop(results_dir)  # a stop asked of an earlier run of this folder
    workdir = Path(tempfile.mkdtemp(prefix="flower-pfl-"))
    run_config: dict[str, str | bool] = {
        "cfg": cfg.to_json(),  # validated once; the ServerApp and every client read it
        "config-file": str(config_path.resolve()), "overrides": " ".join(overrides),
        "results-dir": str(results_dir.resolve()), "resume": resume,
        # the clients' personal state lives in their (Ray) processes: mirror it here so that
        # checkpoints hold it and a resumed run gets it back
        "client-state-dir": str((results_dir / "client-state").resolve()),
        "initial-arrays": str(initial_arrays.resolve()) if initial_arrays else ""}
    try:
        with ExitStack() as stack:
            before: set[int] = set()
            if superlink is None:
                superlink = stack.enter_context(
                    simulation_superlink(workdir, results_dir / "superlink.log", ray_address))
            else:  # the shared SuperLink and what it ran before are not this run's
                superlink[1].snapshot()
                before = set(superlink[1].known)
            env, procs = superlink
            outcome = procs_mod.flwr_run(
                run_config, workdir, env, procs, results_dir / "flwr-run.log",
                federation_config=federation_config(cfg, num_supernodes), app_dir=app_dir,
                echo=echo, timeout_s=timeout_s, on_line=on_line, stall_s=cfg["stall-timeout"],
                append=resume)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        stop.clear_stop(results_dir)  # asked of this run: answered or moot now
    return RunOutcome(outcome.status, outcome.run_id, set(procs.known) - before)


def check_ray_address(address: str, timeout_s: float = 5.0) -> str:
    """``address`` (``HOST:PORT`` of a Ray head's GCS, as ``ray start --head`` prints it)
    where something answers there; a LaunchError naming the fix otherwise (else Ray, asked
    to join a cluster that is not there, fails only minutes later inside the simulation).
    ``auto`` (the cluster last started on this machine) is passed on unchecked."""
    import socket

    address = address.strip()
    if address == "auto":
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or address.startswith("ray://"):
        raise LaunchError(f"--ray-address {address!r}: give the Ray head's HOST:PORT as "
                          f"`ray start --head --port=PORT` on the head machine printed it "
                          f"(e.g. 10.0.0.1:6379), or `auto` for the cluster last started on "
                          f"this machine")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise LaunchError(
            f"--ray-address {address}: nothing answers there ({exc}). Start the cluster's "
            f"head on {host} with `ray start --head --port={port}` (and each worker with "
            f"`ray start --address={address}`), or check the address and that the port is "
            f"open from this machine") from exc
    return address


def federation_config(cfg: config_mod.RunConfig, num_supernodes: int | None = None) -> str:
    """``flwr run --federation-config`` for a simulation of ``cfg``: its client count
    (``num_supernodes`` overrides it; only tests set another value) and client resources."""
    return (f"num-supernodes={num_supernodes or cfg['clients']} "
            f"client-resources-num-cpus={cfg['client-resources.num-cpus']} "
            f"client-resources-num-gpus={cfg['client-resources.num-gpus']}")


# -------------------------------------------------------------------------- resume
class AlreadyCompleted(Exception):
    """``--resume`` of a run that has run all its rounds (nothing to do; not an error)."""


def resume_config(results_dir: Path, config_path: Path | None = None,
                  overrides: Sequence[str] = ()) -> tuple[config_mod.RunConfig, Path]:
    """The configuration to continue a results folder with, as a YAML file the ServerApp
    reads (``<results>/resume.yaml``): the run's OWN configuration (saved in its newest
    checkpoint) with ``overrides`` applied -- or ``config_path`` with ``overrides`` where
    a file is named.  Only :data:`flower_pfl.reliability.checkpoints.RESUME_FREE_KEYS` may differ
    from the saved configuration (``--set rounds=N`` extends a run); a ConfigError names
    every other key that does.  AlreadyCompleted where the checkpoint is the run's last
    round and ``rounds`` is not raised."""
    import yaml

    from flower_pfl.reliability import checkpoints

    if not results_dir.is_dir():
        raise config_mod.ConfigError(f"--resume {results_dir}: no such folder (give the "
                                     f"results folder of the run to continue)")
    folder = checkpoints.latest_checkpoint(results_dir)
    if folder is None:
        raise config_mod.ConfigError(
            f"--resume {results_dir}: no checkpoint there (a run writes one every "
            f"'checkpoint-every' rounds, when it is stopped and when it ends; none with "
            f"checkpoint-every 0)")
    state = checkpoints.read_checkpoint(folder)
    saved, done = state["config"], int(state["round"])
    own = results_dir / "resume.yaml"
    own.write_text(yaml.safe_dump(config_tree(saved["values"], saved["hyper"]), sort_keys=True))
    cfg = config_mod.load(config_path or own, list(overrides) or None)
    diff = checkpoints.config_differences(saved["values"], saved["hyper"], cfg.values,
                                          cfg.hyper)
    if diff:
        raise config_mod.ConfigError(
            f"--resume {results_dir}: {', '.join(diff)} differ(s) from the run's own "
            f"configuration; a resumed run may change only "
            f"{', '.join(checkpoints.RESUME_FREE_KEYS)} (start a new run to change the rest)")
    if done >= int(cfg["rounds"]):
        if done == int(saved["values"]["rounds"]) == int(cfg["rounds"]):
            raise AlreadyCompleted(f"{results_dir} has completed all its {done} round(s); "
                                   f"nothing to resume. Extend it with `flower-pfl run "
                                   f"--resume {results_dir} --set rounds=N` (N > {done})")
        raise config_mod.ConfigError(f"--resume {results_dir}: its checkpoint is after round "
                                     f"{done}; set rounds above {done} to continue it")
    own.write_text(yaml.safe_dump(config_tree(cfg.values, cfg.hyper), sort_keys=True))
    return config_mod.load(own), own


def config_tree(values: Mapping[str, Any], hyper: Mapping[str, Any]) -> dict[str, Any]:
    """A YAML tree that loads as ``values`` with the strategy's ``hyper``."""
    tree = config_mod.merge({}, dict(values))
    tree["hyper"] = {values["strategy"]: dict(hyper)}
    return tree
