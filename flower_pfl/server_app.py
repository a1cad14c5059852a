"""Flower ServerApp: read simulation.yaml (+ overrides), build the registered Strategy.

Run config keys (pyproject.toml ``[tool.flwr.app.config]``):
``config-file`` -- the YAML file (absolute, relative to the cwd, or to the app folder);
``overrides``   -- ``"key=value key2=value2"`` applied on top of the file for this run;
``results-dir`` -- where to write results (set by ``flower-pfl run``; empty: from YAML).
"""

from __future__ import annotations

from pathlib import Path

from flwr.common import Context
from flwr.server import ServerApp, ServerAppComponents, ServerConfig

from flower_pfl import config as config_mod
from flower_pfl import registry

APP_DIR = Path(__file__).resolve().parent.parent


def build_strategy(context: Context):
    rc = context.run_config
    path = config_mod.resolve_config_path(str(rc.get("config-file", "simulation.yaml")), APP_DIR)
    cfg = config_mod.load(path, str(rc.get("overrides", "")) or None)
    results_dir = str(rc.get("results-dir", "")) or None
    strategy = registry.get(cfg.strategy).strategy_cls()(cfg, results_dir=results_dir)
    return cfg, strategy


def server_fn(context: Context) -> ServerAppComponents:
    cfg, strategy = build_strategy(context)
    return ServerAppComponents(strategy=strategy, config=ServerConfig(
        num_rounds=cfg["rounds"], round_timeout=cfg["round-timeout"]))


app = ServerApp(server_fn=server_fn)
