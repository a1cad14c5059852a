"""``flower_pfl.run``: one run from Python, its results handed back (docs/python-api.md).

    import flower_pfl
    result = flower_pfl.run("simulation.yaml", strategy="fedamp", rounds=3,
                            data={"alpha": 0.1}, backend="inprocess")
    result.rounds        # rounds.csv: a pandas DataFrame (a list of dicts without pandas)
    result.summary       # summary.json: status, coverage, final, bmta, error, ...
    result.dir           # the results folder

Two backends (``backend=``), the same configuration, checks and results folder:

* ``simulation`` (the default): what ``flower-pfl run`` does
  (:func:`flower_pfl.running.launch.run_simulation`): a private SuperLink, ``flwr run``,
  the clients in Ray actors with the YAML's client resources, the stall watchdog; results
  equal to the command line's, whatever this process is (a notebook's kernel stays free
  of torch and Ray);
* ``inprocess``: the same Strategy and ClientApp in this process through Flower's message
  path (:func:`flower_pfl.running.inprocess.run`), clients one after another; no Ray or
  SuperLink to start, so a small run takes seconds -- for quick experiments.

``backend`` is this function's own parameter; ``engine`` is not: like any other
configuration key it goes through ``**overrides`` (``run(cfg, engine="stock")`` sets the
YAML's ``engine: tuned | stock``, Flower's engine replacements on or off).

Nothing here parses YAML, validates, checks the machine or reads a CSV by itself: the
configuration goes through :mod:`flower_pfl.config`, the checks before start through
:mod:`flower_pfl.reliability.preflight` (as ``flower-pfl run``), the tables through
:func:`flower_pfl.reporting.run_files.read_rows`.  Heavy modules are imported only when a run
starts (``import flower_pfl`` stays light).
"""

from __future__ import annotations

import importlib
import logging
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from flower_pfl import config as config_mod
from flower_pfl.config import ConfigError
from flower_pfl.reliability.preflight import PreflightError

if TYPE_CHECKING:
    from flower_pfl.config import RunConfig

__all__ = ["run", "load_config", "RunResult", "RunFailed", "ConfigError", "PreflightError",
           "BACKENDS", "TABLES"]

#: the two ways a run goes, ``backend=`` (module docstring); the first is the default
BACKENDS = ("simulation", "inprocess")
#: the CSV files of a results folder a :class:`RunResult` reads as tables
TABLES = ("rounds", "clients", "fit", "server", "failures")


class RunFailed(RuntimeError):
    """A run that started and ended ``failed``: ``result`` is its :class:`RunResult`
    (``result.summary["status"] == "failed"``, ``result.error`` the recorded
    ``{"type", "message"}``, the tables of the rounds it did evaluate); the exception that
    ended it is ``__cause__`` (in process: e.g. the strategy's RoundError; in simulation the
    launcher's LaunchError -- the ServerApp's own error is in ``result.error``)."""

    def __init__(self, message: str, result: RunResult) -> None:
        super().__init__(message)
        self.result = result


class RunResult:
    """A run's results folder, read back.  Every attribute reads the files when asked, so
    a result of a run still going shows its rounds so far.

    ``dir``: the folder (``<output-dir>/<run-name>``); ``backend``: how it ran (one of
    :data:`BACKENDS`; the configuration's ``engine`` key is in ``config``);
    ``config``: its validated configuration (dotted keys -> values, as ``config.json``).
    Tables (:meth:`table`): :attr:`rounds`, :attr:`clients`, :attr:`fit`, :attr:`server`,
    :attr:`failures` -- a pandas DataFrame per file where pandas is installed, else a list
    of dicts, one per CSV row; a cell is an int, a float or a str as it reads, None where
    empty (NaN in a DataFrame); a file the run did not write is an empty table.
    """

    def __init__(self, results_dir: str | Path, backend: str,
                 config: Mapping[str, Any] | None = None) -> None:
        self.dir = Path(results_dir)
        self.backend = backend
        if config is None:
            from flower_pfl.reporting.run_files import read_values

            config = read_values(self.dir)
        self.config = dict(config)

    def __repr__(self) -> str:
        summary = self.summary
        return (f"RunResult({self.config.get('strategy', '?')}, {summary.get('status', '?')}, "
                f"{len(summary.get('rounds') or [])} evaluated round(s), backend={self.backend}, "
                f"dir={str(self.dir)!r})")

    @property
    def summary(self) -> dict[str, Any]:
        """``summary.json`` as a dict ({} before the run wrote one): ``status`` (running,
        completed, stopped, failed), ``rounds`` (rounds.csv's rows), ``final``, ``bmta``,
        ``coverage``, ``error`` of a failed run, the strategy's own entries."""
        from flower_pfl.reporting.run_files import read_summary

        summary = read_summary(self.dir)
        return summary if isinstance(summary, dict) else {}

    @property
    def status(self) -> str | None:
        """``summary.json``'s status (None: no summary)."""
        status = self.summary.get("status")
        return None if status is None else str(status)

    @property
    def error(self) -> dict[str, Any] | None:
        """What ended a failed run, ``{"type": ..., "message": ...}``; None otherwise."""
        error = self.summary.get("error")
        return dict(error) if isinstance(error, dict) else None

    @property
    def coverage(self) -> dict[str, Any] | None:
        """How many clients the numbers cover (summary.json ``coverage``; docs/reliability.md)."""
        coverage = self.summary.get("coverage")
        return dict(coverage) if isinstance(coverage, dict) else None

    def rows(self, name: str) -> list[dict[str, Any]]:
        """``<name>.csv``'s rows (``name`` one of :data:`TABLES` or a strategy's own table,
        e.g. FedACS' ``peers``) as dicts of typed cells (:func:`typed`)."""
        from flower_pfl.reporting.run_files import read_rows

        return [{key: typed(value) for key, value in row.items()}
                for row in read_rows(self.dir, name)]

    def table(self, name: str) -> Any:
        """:meth:`rows` of ``<name>.csv`` as a pandas DataFrame (columns in the file's
        order), or the list itself without pandas."""
        rows = self.rows(name)
        pandas = _pandas()
        if pandas is None:
            return rows
        from flower_pfl.reporting.run_files import read_rows

        header = list(read_rows(self.dir, name)[0]) if rows else []
        return pandas.DataFrame(rows, columns=header)

    @property
    def rounds(self) -> Any:
        """rounds.csv: a row per evaluated round (``personal_mean``, ``personal_worst10_mean``,
        ``global_mean``, ``clients_evaluated``, ``personal_bmta``, ...)."""
        return self.table("rounds")

    @property
    def clients(self) -> Any:
        """clients.csv: a row per client per evaluated round (``partition-id``, the metric,
        ``loss``, ``trained``, ...)."""
        return self.table("clients")

    @property
    def fit(self) -> Any:
        """fit.csv: a row per accepted upload (``partition-id``, ``num-examples``,
        ``train_loss``, the device, the strategy's per-client quantities)."""
        return self.table("fit")

    @property
    def server(self) -> Any:
        """server.csv: a row per round of server-side quantities."""
        return self.table("server")

    @property
    def failures(self) -> Any:
        """failures.csv: a row per failed message (``phase``, ``partition-id``, ``reason``)."""
        return self.table("failures")


def typed(cell: str | None) -> Any:
    """A CSV cell as its value: ``"3"`` -> 3, ``"0.5"``/``"nan"``/``"1e-05"`` -> float, ``""``
    -> None, anything else the string itself."""
    if cell is None or cell == "":
        return None
    try:
        return int(cell)
    except ValueError:
        pass
    try:
        return float(cell)
    except ValueError:
        return cell


def _pandas() -> Any | None:
    """The pandas module, or None where it is not installed."""
    try:
        return importlib.import_module("pandas")
    except ImportError:
        return None


# ---------------------------------------------------------------------- configuration
def _keyword_keys(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Overrides as :func:`flower_pfl.config.merge` takes them: a keyword written as a Python
    name has its underscores read as hyphens (``run_name`` = ``run-name``; no configuration
    key has an underscore); a dotted key (``**{"data.alpha": 0.1}``) and the keys of a
    nested mapping (``data={"alpha": 0.1}``) are taken as written."""
    return {(key.replace("_", "-") if key.isidentifier() else key): value
            for key, value in overrides.items()}


def load_config(config: str | os.PathLike[str] | Mapping[str, Any] | None = None,
                **overrides: Any) -> RunConfig:
    """The validated configuration :func:`run` would run (nothing is checked on the machine
    or started): ``config`` a YAML file (absolute, relative to the cwd or to the app folder;
    default the app's ``simulation.yaml``) or a mapping with a YAML file's content (keys not
    given take their defaults), with ``overrides`` set on top (:func:`_keyword_keys`).
    Raises ConfigError naming every bad key, as ``flower-pfl validate``."""
    mapping = _keyword_keys(overrides)
    if config is None or isinstance(config, (str, os.PathLike)):
        path = config_mod.resolve_config_path(os.fspath(config or "simulation.yaml"),
                                              config_mod.APP_DIR)
        return config_mod.load(path, mapping or None)
    if not isinstance(config, Mapping):
        raise ConfigError(f"config: a YAML file's path or a mapping, got {type(config).__name__}")
    return config_mod.validate(config_mod.merge(config, mapping),
                               source="flower_pfl.run(config={...})")


def _results_dir(cfg: RunConfig) -> Path:
    """:func:`~flower_pfl.reporting.run_dirs.new_results_dir`, its refusal a PreflightError."""
    from flower_pfl.reporting.run_dirs import new_results_dir

    try:
        return new_results_dir(cfg)
    except FileExistsError as exc:
        raise PreflightError(str(exc)) from None


# ------------------------------------------------------------------------------ run
def run(config: str | os.PathLike[str] | Mapping[str, Any] | None = None, *,
        backend: str = "simulation", quiet: bool = False, timeout: float | None = None,
        ray_address: str | None = None, **overrides: Any) -> RunResult:
    """Run one configuration and return its :class:`RunResult`.

    ``config``/``overrides``: as :func:`load_config` (``strategy="fedamp"``,
    ``**{"data.alpha": 0.1}``, ``data={"alpha": 0.1}``, ``run_name="x"``; ``engine="stock"``
    is the configuration's ``engine`` key, an override like the others).
    ``backend``: ``"simulation"`` (default: Ray, as ``flower-pfl run``) or ``"inprocess"``
    (module docstring).  ``quiet``: warnings only, no round lines (simulation: the console
    of ``flower-pfl run``, the full log in ``<results>/flwr-run.log``; in process: Flower's
    log above WARNING).  ``timeout`` (simulation only): seconds before the run is stopped
    and failed.  ``ray_address``: run the clients on that Ray cluster (``HOST:PORT``;
    default ``RAY_ADDRESS``, else a private Ray instance).

    Raises, before anything is started or any folder made: ConfigError (a bad key, type or
    value; an unknown backend), PreflightError (this machine, the folders, the data or the
    model cannot serve the run: the checks ``flower-pfl run`` makes).  Raises RunFailed
    (``.result``: the recorded run, status failed) when the run fails, KeyboardInterrupt
    (status stopped) when interrupted.  A run ``stopped`` by a stop request is returned."""
    if backend not in BACKENDS:
        raise ConfigError(f"backend {backend!r}: one of {', '.join(BACKENDS)}")
    if timeout is not None and backend != "simulation":
        raise ConfigError(f"timeout: only the simulation backend has one (backend {backend!r})")
    if ray_address is not None and backend != "simulation":
        raise ConfigError(f"ray_address: only the simulation backend uses Ray "
                          f"(backend {backend!r})")
    cfg = load_config(config, **overrides)
    results_dir = _results_dir(cfg)
    if backend == "inprocess":
        return _run_inprocess(cfg, results_dir, quiet)
    return _run_simulation(cfg, results_dir, quiet, timeout, ray_address)


def _failed(result: RunResult, exc: BaseException) -> RunFailed:
    error = result.error or {}
    what = f"{error.get('type')}: {error.get('message')}" if error else f"{exc}"
    return RunFailed(f"the run failed: {what} (results: {result.dir})", result)


def _run_inprocess(cfg: RunConfig, results_dir: Path, quiet: bool) -> RunResult:
    """:func:`flower_pfl.running.inprocess.run` after :func:`~flower_pfl.reliability.
    preflight.preflight` in this process (torch is imported here anyway).  Its scope is
    ``deployment``: clients on this machine, no Ray, so Ray's client resources do not apply."""
    from flower_pfl.reliability.preflight import preflight

    preflight(cfg, results_dir, scope="deployment")
    from flower_pfl.running import inprocess

    result = RunResult(results_dir, "inprocess", cfg.values)
    try:
        with _flower_log_level(logging.WARNING if quiet else None):
            inprocess.run(cfg, results_dir, client_state_dir=results_dir / "client-state")
    except Exception as exc:  # the run's outcome is in summary.json (record_outcome)
        if result.status != "failed":
            raise
        raise _failed(result, exc) from exc
    return result


@contextmanager
def _flower_log_level(level: int | None) -> Iterator[None]:
    """Flower's logger at ``level`` inside the block (None: left alone)."""
    logger = logging.getLogger("flwr")
    before = logger.level
    if level is not None:
        logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


def _run_simulation(cfg: RunConfig, results_dir: Path, quiet: bool, timeout: float | None,
                    ray_address: str | None) -> RunResult:
    """``flower-pfl run``'s path (:func:`flower_pfl.cli.run_command`): the checks before
    start in a child (this process never imports torch), which write the initial model;
    :func:`~flower_pfl.running.launch.run_simulation` with its console; the launcher's
    record of a failure (:func:`~flower_pfl.reporting.results.mark_failed`) or a stop."""
    from flower_pfl import initial_model, raynode
    from flower_pfl.reliability import stop
    from flower_pfl.reliability.preflight_apart import preflight_apart
    from flower_pfl.reporting.console import RunConsole
    from flower_pfl.reporting.results import mark_failed
    from flower_pfl.running.launch import check_ray_address, config_tree, run_simulation
    from flower_pfl.running.procs import LaunchError

    address = ray_address or raynode.joined_cluster()
    if address:
        try:
            check_ray_address(address)
        except LaunchError as exc:
            raise PreflightError(str(exc)) from exc
    console = RunConsole(cfg["rounds"], clients=cfg["clients"], quiet=quiet)
    initial = results_dir / initial_model.FILE  # read by the ServerApp, removed at the end
    with console.own_warnings():
        preflight_apart(cfg, results_dir, initial_out=initial,
                        scope="cluster" if address else "simulation")
    result = RunResult(results_dir, "simulation", cfg.values)
    # the validated configuration travels whole in the run config (``cfg``); the file the
    # run config names beside it is that configuration, so a reader of it sees the same
    with _tree_file(config_tree(cfg.values, cfg.hyper)) as path:
        try:
            with console:
                run_simulation(cfg, path, [], results_dir, timeout_s=timeout, echo=False,
                               on_line=console.feed, ray_address=address,
                               initial_arrays=initial)
        except KeyboardInterrupt:
            stop.mark_stopped(results_dir)
            raise
        except Exception as exc:  # LaunchError, or the launcher's own: recorded, then raised
            mark_failed(results_dir, exc)
            if not isinstance(exc, LaunchError):
                raise
            console.summary(results_dir, console.elapsed())
            raise _failed(result, exc) from exc
        finally:
            stop.clear_stop(results_dir)
            initial.unlink(missing_ok=True)
    console.summary(results_dir, console.elapsed())
    return result


@contextmanager
def _tree_file(tree: dict[str, Any]) -> Iterator[Path]:
    """A temporary YAML file of ``tree``, removed on exit."""
    import yaml

    with tempfile.TemporaryDirectory(prefix="flower-pfl-api-") as tmp:
        path = Path(tmp) / "run.yaml"
        path.write_text(yaml.safe_dump(tree, sort_keys=True))
        yield path
