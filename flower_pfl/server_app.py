"""Flower ServerApp: read simulation.yaml (+ overrides), build the registered Strategy.

Run config keys (pyproject.toml ``[tool.flwr.app.config]``):
``config-file`` -- the YAML file (absolute, relative to the cwd, or to the app folder);
``overrides``   -- ``"key=value key2=value2"`` applied on top of the file for this run;
``results-dir`` -- where to write results (set by ``flower-pfl run``; empty: from YAML);
``resume``      -- continue the run in ``results-dir`` from its newest checkpoint
                   (``flower-pfl run --resume DIR`` sets it; docs/reliability.md);
``client-state-dir`` -- a folder for the clients' personal state (simulation: set by
                   ``flower-pfl run`` so that checkpoints include it; deployment nodes
                   use their own ``state-dir`` node config instead).

The legacy server loop always counts rounds from 1; :class:`ResumableServer` starts at
the strategy's ``start_round`` instead, so a resumed run continues with the next round,
and it ends the run early, with a checkpoint, when ``flower-pfl run`` asks it to stop.
Whatever raises once the strategy exists (a resume, a round's RoundError, a checkpoint)
ends the run ``failed`` in its summary.json, with the error's type and message
(``ResultsWriter.record_outcome``), before Flower sees the exception.

Importing this module replaces nothing of Flower's: ``main`` installs the run's ``engine``
(``tuned``: flower_pfl/tuned/, each replacement checked first; ``stock``: Flower as
released; docs/engine.md) before anything else.

The ServerApp's strategies do their math in numpy; only the initial model needs torch (its
seeded initialisation).  :func:`initial_arrays_apart` builds it in a short-lived child
process, so the ServerApp process never imports torch (importing this CUDA build of torch
costs a process ~280 MB of private memory, even on a CPU run) unless its strategy does
(pFedHN's hypernetwork).
"""

from __future__ import annotations

import json
import tempfile
import timeit
from logging import INFO
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
from flwr.app import Context
from flwr.common import Parameters  # the legacy loop's type (no newer home)
from flwr.common.logger import log
from flwr.server import Server, ServerAppComponents, ServerConfig  # the legacy loop
from flwr.server.client_manager import ClientManager, SimpleClientManager
from flwr.server.compat import start_grid
from flwr.server.history import History
from flwr.serverapp import Grid, ServerApp

from flower_pfl import config as config_mod
from flower_pfl import initial_model, registry, timing
from flower_pfl.child import run_python
from flower_pfl.strategies.nodes import message_threads
from flower_pfl.tuned import switch
from flower_pfl.tuned.engine_wakeup import poll_faster

if TYPE_CHECKING:  # imported with the registered strategy (registry.strategy_class)
    from flower_pfl.strategies.base import PersonalizedStrategy


class ResumableServer(Server):
    """Flower's legacy round loop (fit round, then federated evaluation), from
    ``strategy.start_round`` to ``num_rounds``.  After each round the strategy's
    ``after_round`` says whether the run ends there: its last round, or a stop asked for
    by ``flower-pfl run`` (both checkpointed; strategies/checkpointing.py).  Flower's
    public ``Server`` API only (``fit_round``, ``evaluate_round``, ``client_manager``):
    it is the same loop with ``engine: tuned`` and ``engine: stock``."""

    strategy: PersonalizedStrategy  # Flower's Server holds it as its base class, Strategy

    def __init__(self, *, client_manager: ClientManager, strategy: PersonalizedStrategy
                 ) -> None:
        super().__init__(client_manager=client_manager, strategy=strategy)

    def initial_parameters(self) -> Parameters:
        """The strategy's initial parameters (our strategies always give them: the model is
        built from the configuration), as Flower's ``Server`` asks for them first; raises
        ``RuntimeError`` where a strategy gives none (Flower would ask a random client)."""
        parameters = self.strategy.initialize_parameters(client_manager=self.client_manager())
        if parameters is None:
            raise RuntimeError(f"{type(self.strategy).__name__}.initialize_parameters gave "
                               f"no initial parameters")
        log(INFO, "Using initial global parameters provided by strategy")
        return parameters

    def fit(self, num_rounds: int, timeout: float | None) -> tuple[History, float]:
        history = History()
        log(INFO, "[INIT]")
        self.parameters = self.initial_parameters()
        start = timeit.default_timer()
        for current_round in range(getattr(self.strategy, "start_round", 1), num_rounds + 1):
            log(INFO, "")
            log(INFO, "[ROUND %s]", current_round)
            res_fit = self.fit_round(server_round=current_round, timeout=timeout)
            if res_fit is not None:
                parameters, fit_metrics, _ = res_fit
                if parameters:
                    self.parameters = parameters
                history.add_metrics_distributed_fit(server_round=current_round,
                                                    metrics=fit_metrics)
            res_fed = self.evaluate_round(server_round=current_round, timeout=timeout)
            if res_fed is not None and res_fed[0] is not None:
                history.add_loss_distributed(server_round=current_round, loss=res_fed[0])
                history.add_metrics_distributed(server_round=current_round, metrics=res_fed[1])
            after_round = getattr(self.strategy, "after_round", None)
            if after_round is not None and after_round(current_round, num_rounds):
                break  # the last round, or a stop asked for (checkpointed either way)
        return history, timeit.default_timer() - start


#: the child of :func:`initial_arrays_apart`: the run's values (JSON) in, arrays (npz) out
_CHILD = ("import json, sys, numpy as np\n"
          "from flower_pfl.learning.models import initial_arrays\n"
          "values = json.loads(open(sys.argv[1]).read())\n"
          "np.savez(sys.argv[2], *initial_arrays(values))\n")


def initial_arrays_apart(values: Mapping[str, Any]) -> list[np.ndarray]:
    """``flower_pfl.learning.models.initial_arrays`` of the run's ``values``, computed in a
    child process (same interpreter, same ``sys.path``) so that this one never imports
    torch; the arrays are bit for bit the ones computed here."""
    with tempfile.TemporaryDirectory(prefix="flower-pfl-init-") as tmp:
        cfg_path, out = Path(tmp) / "values.json", Path(tmp) / "arrays.npz"
        cfg_path.write_text(json.dumps(dict(values), default=str))
        done = run_python(_CHILD, str(cfg_path), str(out))
        if done.returncode != 0:
            raise RuntimeError(f"building the initial model failed:\n{done.stderr[-3000:]}")
        with np.load(out) as z:
            return [z[f"arr_{i}"] for i in range(len(z.files))]


def _flag(value: object) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes")


def read_config(context: Context) -> config_mod.RunConfig:
    """The run's validated configuration: the launcher's (``cfg``, validated there: parsed
    here, never validated twice), else the YAML file ``config-file`` with ``overrides``
    (``flwr run`` by hand: validated here; raises ``config.ConfigError``)."""
    rc = context.run_config
    if rc.get("cfg"):
        return config_mod.RunConfig.from_json(str(rc["cfg"]))
    path = config_mod.resolve_config_path(str(rc.get("config-file", "simulation.yaml")),
                                             config_mod.APP_DIR)
    return config_mod.load(path, str(rc.get("overrides", "")) or None)


def build_strategy(context: Context, cfg: config_mod.RunConfig | None = None
                   ) -> tuple[config_mod.RunConfig, PersonalizedStrategy]:
    """(the configuration, the registered strategy built from it); ``cfg``: the one
    :func:`read_config` read (None: read here)."""
    rc = context.run_config
    cfg = read_config(context) if cfg is None else cfg
    results_dir = str(rc.get("results-dir", "")) or None
    # the preflight check's copy (flower-pfl run), else built in a child process here
    initial = initial_model.read(str(rc.get("initial-arrays", "")) or None, cfg.values)
    log(INFO, "[flower-pfl] initial model: %s",
        initial_model.READ if initial is not None else initial_model.BUILT)
    strategy: PersonalizedStrategy = registry.strategy_class(cfg.strategy)(
        cfg, initial_arrays=initial if initial is not None else initial_arrays_apart(cfg.values),
        results_dir=results_dir)
    strategy.cfg_travels = not rc.get("cfg")  # the clients read the same run config
    client_state = str(rc.get("client-state-dir", ""))
    if client_state and int(cfg["checkpoint-every"]) > 0:
        strategy.client_state_dir = Path(client_state)
    if _flag(rc.get("resume", False)):
        strategy.results.adopt_earlier_rounds()  # until the checkpoint's list replaces them
        with strategy.results.record_outcome():  # a failed resume: summary.json says so
            strategy.resume()
    return cfg, strategy


def server_fn(context: Context, cfg: config_mod.RunConfig | None = None) -> ServerAppComponents:
    cfg, strategy = build_strategy(context, cfg)
    server = ResumableServer(client_manager=SimpleClientManager(), strategy=strategy)
    server.set_max_workers(message_threads(cfg["clients"]))
    return ServerAppComponents(server=server, config=ServerConfig(
        num_rounds=cfg["rounds"], round_timeout=cfg["round-timeout"]))


app = ServerApp()  # importing this module replaces nothing of Flower's


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Flower's compatibility loop (``start_grid``) over our server and strategy.  First
    thing, before the strategy is built and before Flower's simulation engine (starting
    Ray in this process meanwhile) builds its actor pool: the run's ``engine``
    (:func:`flower_pfl.tuned.switch.install`: ``tuned``, our replacements of Flower's
    engine code, each checked first; ``stock``, Flower as released; one log line either
    way; in a deployment's ServerApp, the grid's reply polling, :mod:`.tuned.grid_poll`),
    then the opt-in phase timer (:func:`flower_pfl.timing.install_server`).  With
    ``tuned`` but the engine's wake-up left out (``FLOWER_PFL_FLOWER_TICK=1``), the waiting
    threads' reply polling is shortened instead (:func:`poll_faster`)."""
    cfg = read_config(context)
    engine = switch.install(str(cfg.values.get("engine", "tuned")),  # an older run's: none
                            simulation=switch.in_simulation(grid))
    timing.install_server()  # nothing unless FLOWER_PFL_PHASES is set (flower_pfl.phases)
    components = server_fn(context, cfg)
    assert isinstance(components.server, ResumableServer), "server_fn builds one"
    strategy = components.server.strategy
    with strategy.results.record_outcome():  # raised: summary.json says failed, and why
        if "engine_wakeup" in engine.kept:
            poll_faster(grid, message_threads(int(strategy.num_clients)))
        start_grid(grid=grid, server=components.server, config=components.config)
