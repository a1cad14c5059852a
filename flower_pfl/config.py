"""Load and validate ``simulation.yaml``: the one place that knows its schema.

A run is described by one YAML file plus optional ``key=value`` overrides (dotted
keys, YAML-typed values).  Every problem in the file -- unknown key, wrong type,
out-of-range value, unknown strategy or hyper-parameter -- is collected and raised
as ONE :class:`ConfigError` before anything is trained.

The validated result is a :class:`RunConfig`: a frozen, JSON-serialisable view that
the ServerApp sends to every client, so clients never read files of their own
(important for real deployment, where client machines hold no copy of the YAML).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from flower_pfl.data_fields import DATA_FIELDS, data_checks
from flower_pfl.factory_ref import check_factory_reference
from flower_pfl.fields import FRACTION as _FRACTION
from flower_pfl.fields import NONNEG as _NONNEG
from flower_pfl.fields import POS as _POS
from flower_pfl.fields import Field as Field  # re-exported: config.FIELDS' type
from flower_pfl.fields import in_ as _in
from flower_pfl.hyper import ConfigError as ConfigError  # this module's public name
from flower_pfl.hyper import (
    StrictLoader,
    check_value,
    did_you_mean,
    parse_scalar,
    tab_message,
)
from flower_pfl.learning.schedule import SCHEDULES
from flower_pfl.newcomers import NEWCOMER_FIELDS, newcomer_checks
from flower_pfl.privacy.fields import PRIVACY_FIELDS, privacy_checks

#: the app's folder: simulation.yaml, pyproject.toml, strategies/ and clients/ beside flower_pfl/
APP_DIR = Path(__file__).resolve().parent.parent

MODELS = ("mclr", "dnn", "cnn", "resnet18", "scalar")
DEVICES = ("auto", "cpu", "cuda")
ENGINES = ("tuned", "stock")
RESIDENT = ("auto", "always", "never")
OPTIMIZERS = ("sgd", "adam", "adamw")
#: schedule parameters -> the schedules that read them (set for another: refused)
SCHEDULE_KEYS = {"train.lr-gamma": ("step", "exponential"), "train.lr-step-rounds": ("step",),
                 "train.lr-min": ("cosine",), "train.lr-horizon": ("cosine",)}


# Dotted key -> Field.  `strategy` and `hyper` are validated against the registry; the
# `data.*` keys are in data_fields.py, the `privacy.*` keys in privacy/fields.py.
_CORE: dict[str, Field] = {
    "strategy": Field((str,), "fedavg", None, "a registered strategy name"),
    "rounds": Field((int,), 20, _POS, "an integer >= 1"),
    "clients": Field((int,), 20, lambda v: v >= 2, "an integer >= 2"),
    "fraction-fit": Field((float, int), 0.2, _FRACTION, "a number in (0, 1]"),
    "min-fit-clients": Field((int,), 2, _POS, "an integer >= 1"),
    "eval-every": Field((int,), 1, _POS, "an integer >= 1"),
    "eval-global": Field((bool,), True, None, "true or false"),
    "seed": Field((int,), 0, _NONNEG, "an integer >= 0"),
    "round-timeout": Field((float, int), None, _POS, "seconds > 0 or null (wait for every "
                           "client; in deployment a dead node then blocks the round)",
                           nullable=True),
    # reliability (docs/reliability.md)
    "min-fit-answers": Field((int,), 1, _POS, "an integer >= 1 (valid updates a round needs; "
                             "fewer is an error)"),
    "min-eval-answers": Field((int,), 1, _POS, "an integer >= 1 (evaluation answers an "
                              "evaluation round needs; fewer is an error)"),
    "max-update-norm": Field((float, int), None, _POS, "a number > 0 or null: an upload whose "
                             "L2 distance to what the server sent exceeds it is rejected",
                             nullable=True),
    "checkpoint-every": Field((int,), 5, _NONNEG, "an integer >= 0 (rounds between checkpoints "
                              "for --resume; 0: none)"),
    "stall-timeout": Field((float, int), 1800.0, _POS, "seconds > 0 or null: the launcher stops "
                           "a run whose log shows no progress for this long", nullable=True),
    "engine": Field((str,), "tuned", _in(ENGINES), f"one of {list(ENGINES)} (tuned: the "
                    "project's fenced replacements of Flower's engine internals, on the Flower "
                    "versions they were tested on; stock: Flower as released)"),
    "device": Field((str,), "auto", _in(DEVICES), f"one of {list(DEVICES)}"),
    "device-resident": Field((str,), "auto", _in(RESIDENT), f"one of {list(RESIDENT)} (a "
                             "client's data held on its training device for the process's "
                             "lifetime; auto: on a GPU, never on the CPU)"),
    "model": Field((str,), "cnn", lambda v: v in MODELS or ":" in v,
                   f"one of {list(MODELS)} or 'package.module:factory' (a function returning an "
                   f"nn.Module)"),
    "model-args": Field((dict,), {}, None, "a mapping of keyword arguments for a "
                        "'package.module:factory' model ({} for none)"),
    "output-dir": Field((str,), "outputs", None, "a directory path"),
    "run-name": Field((str,), None, None, "a name for the results folder", nullable=True),
    "cache-dir": Field((str,), None, None, "a directory for data/partition caches", nullable=True),
    # experiment tracking (reporting/tracking.py): what is written beside the results files
    "tracking": Field((str,), "none", _in(("none", "tensorboard")), "one of ['none', "
                      "'tensorboard'] (TensorBoard event files: pip install "
                      "'flower-pfl[tensorboard]')", nullable=True),
    "tracking-dir": Field((str,), None, None, "a folder or null: TensorBoard events go to "
                          "<tracking-dir>/<run name> (null: <results>/tensorboard)",
                          nullable=True),
}

_TRAIN_AND_AFTER: dict[str, Field] = {
    "train.epochs": Field((int,), 1, _POS, "an integer >= 1"),
    "train.steps": Field((int,), None, _POS, "an integer >= 1 or null (null: use epochs)",
                         nullable=True),
    "train.batch-size": Field((int,), 32, _POS, "an integer >= 1"),
    "train.lr": Field((float, int), 0.05, _POS, "a number > 0"),
    "train.momentum": Field((float, int), 0.0, lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "train.weight-decay": Field((float, int), 0.0, _NONNEG, "a number >= 0"),
    "train.drop-last": Field((bool,), False, None, "true or false (true: every local step "
                             "uses a full batch; a pass's remainder waits for the next pass)"),
    # the optimizer and the learning rate over rounds (docs/training.md, learning/schedule.py)
    "train.optimizer": Field((str,), "sgd", _in(OPTIMIZERS), f"one of {list(OPTIMIZERS)}"),
    "train.betas": Field((list,), [0.9, 0.999], lambda v: len(v) == 2 and all(
        isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in v),
        "two numbers in [0, 1) (Adam/AdamW's beta1, beta2)"),
    "train.eps": Field((float, int), 1e-8, _POS, "a number > 0 (Adam/AdamW's epsilon)"),
    "train.lr-schedule": Field((str,), "constant", _in(SCHEDULES), f"one of {list(SCHEDULES)} "
                               "(the lr of each server round, learning/schedule.py)"),
    "train.lr-gamma": Field((float, int), 0.1, lambda v: 0 < v <= 1, "a number in (0, 1] "
                            "(step: factor every lr-step-rounds rounds; exponential: per round)"),
    "train.lr-step-rounds": Field((int,), 10, _POS, "an integer >= 1 (step: rounds per factor)"),
    "train.lr-min": Field((float, int), 0.0, _NONNEG, "a number >= 0, below train.lr (cosine: "
                          "the lr from the horizon on)"),
    "train.lr-horizon": Field((int,), None, _POS, "an integer >= 1 or null (cosine: rounds "
                              "from lr to lr-min; null: 'rounds')", nullable=True),
    "client-resources.num-cpus": Field((int,), 1, _POS, "an integer >= 1"),
    "client-resources.num-gpus": Field((float, int), 0.0, _NONNEG,
                                       "a number >= 0 (a GPU fraction)"),
    # server-side model store (flower_pfl/model_store.py)
    "server.model-store": Field((str,), "auto", _in(("auto", "memory", "disk")),
                                "one of ['auto', 'memory', 'disk'] (auto: memory below "
                                "server.memory-budget-mb, else a file in <results>/state)"),
    "server.store-dtype": Field((str,), "float32", _in(("float32", "float16")),
                                "one of ['float32', 'float16'] (the stored client models)"),
    "server.memory-budget-mb": Field((float, int), None, _POS, "a number > 0 or null (half "
                                     "the machine's memory): the model store's budget",
                                     nullable=True),
}

FIELDS: dict[str, Field] = {**_CORE, **DATA_FIELDS, **_TRAIN_AND_AFTER, **PRIVACY_FIELDS,
                            **NEWCOMER_FIELDS}

SECTIONS = {"data", "train", "client-resources", "server", "privacy", "hyper", "newcomers"}


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and dotted in SECTIONS:
            flat.update(_flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def parse_overrides(overrides: str | Sequence[str] | None) -> dict[str, Any]:
    """Parse ``"rounds=5 strategy=fedamp"`` (or a list of such pairs) into a dict.

    Values are parsed as YAML scalars, so ``5`` is an int, ``0.5`` a float, ``null`` None.
    Pairs are separated by whitespace or ``;``.
    """
    if not overrides:
        return {}
    if isinstance(overrides, str):
        items = overrides.replace(";", " ").split()
    else:
        items = list(overrides)
    parsed: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value")
        key, raw = item.split("=", 1)
        parsed[key.strip()] = parse_scalar(raw) if raw != "" else None
    return parsed


def merge(tree: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """``tree`` (a copy) with ``overrides`` set: keys are dotted paths (``data.alpha``) and/or
    nested mappings; a mapping set onto a mapping merges into it, anything else replaces.
    The one dotted-key merge: config overrides, bench matrices, resumed configurations."""
    out = copy.deepcopy(dict(tree))
    for key, value in (overrides or {}).items():
        parts = str(key).split(".")
        node = out
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        last = parts[-1]
        if isinstance(value, Mapping) and isinstance(node.get(last), Mapping):
            node[last] = merge(node[last], value)
        else:
            node[last] = copy.deepcopy(value)
    return out


@dataclass(frozen=True)
class RunConfig:
    """A validated run configuration (dotted keys -> values) with the chosen strategy's
    complete hyper-parameters (registry defaults filled in)."""

    values: Mapping[str, Any]
    hyper: Mapping[str, Any]
    source: str = "<dict>"

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def strategy(self) -> str:
        return self.values["strategy"]

    def to_json(self) -> str:
        return json.dumps({"values": dict(self.values), "hyper": dict(self.hyper),
                           "source": self.source}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "RunConfig":
        raw = json.loads(text)
        return cls(values=raw["values"], hyper=raw["hyper"], source=raw.get("source", "<json>"))


def validate(tree: Mapping[str, Any] | None, source: str = "<dict>") -> RunConfig:
    """Validate a parsed YAML tree; raise ONE ConfigError listing every problem."""
    from flower_pfl.registry import REGISTRY  # loads every catalog module: only here

    problems: list[str] = []
    if tree is not None and not isinstance(tree, Mapping):
        raise ConfigError(f"{source}: the top level must be a mapping of keys to values, "
                          f"got {tree!r}")
    tree = dict(tree or {})
    hyper_tree = tree.pop("hyper", None) or {}
    flat = _flatten(tree)
    for section in SECTIONS - {"hyper"}:
        if section in flat and not isinstance(flat[section], Mapping):
            problems.append(f"'{section}' must be a mapping, got {flat[section]!r}")
            flat.pop(section)

    values: dict[str, Any] = {}
    for key, _value in flat.items():
        if key not in FIELDS:
            problems.append(f"unknown key '{key}'{did_you_mean(key, list(FIELDS))}")
    for key, field in FIELDS.items():
        if key not in flat:  # the default (a float where the field is a number)
            values[key], problem = check_value(key, copy.deepcopy(field.default), field.types,
                                               nullable=True)
            assert problem is None, problem  # FIELDS' defaults fit their own types
            continue
        value, problem = check_value(key, flat[key], field.types, field.check, field.allowed,
                                     field.nullable)
        if problem:
            problems.append(problem)
        else:
            values[key] = value

    name = values.get("strategy")
    if name not in REGISTRY:
        problems.append(f"unknown strategy '{name}'{did_you_mean(str(name), list(REGISTRY))}: "
                        f"allowed are {sorted(REGISTRY)}")
    hyper: dict[str, Any] = {}
    if not isinstance(hyper_tree, Mapping):
        problems.append(f"'hyper' must be a mapping of strategy name -> hyper-parameters, "
                        f"got {hyper_tree!r}")
        hyper_tree = {}
    for strat, params in hyper_tree.items():
        if strat not in REGISTRY:
            problems.append(f"'hyper.{strat}': unknown strategy"
                            f"{did_you_mean(strat, REGISTRY)}; allowed are {sorted(REGISTRY)}")
            continue
        if params is None:
            continue
        if not isinstance(params, Mapping):
            problems.append(f"'hyper.{strat}' must be a mapping, got {params!r}")
            continue
        checked, errs = REGISTRY[strat].validate_hyper(params, prefix=f"hyper.{strat}")
        problems.extend(errs)
        if strat == name:
            hyper = checked
    if name in REGISTRY and not hyper:
        hyper, _ = REGISTRY[name].validate_hyper({}, prefix=f"hyper.{name}")

    if name in REGISTRY:
        from flower_pfl.registry import refused_train_keys

        problems.extend(refused_train_keys(name, values, FIELDS))
    if not problems:
        problems.extend(_cross_checks(values))
        cross_check = REGISTRY[str(name)].cross_check  # a known name: no problem so far
        if cross_check is not None:
            problems.extend(cross_check(values, hyper))
        rule = REGISTRY[str(name)].newcomer
        if values["newcomers.clients"] is not None and (rule is None or rule.refused):
            problems.append(f"'newcomers.clients' is set but strategy '{name}' has no newcomer "
                            f"rule: " + (rule.refused if rule is not None and rule.refused else
                                         "its contract declares none yet (docs/newcomers.md "
                                         "lists the strategies that have one)"))
    if problems:
        raise ConfigError(f"invalid configuration in {source}:\n  - " + "\n  - ".join(problems))
    return RunConfig(values=values, hyper=hyper, source=source)


def _model_checks(values: Mapping[str, Any]) -> list[str]:
    """A ``package.module:factory`` model's reference is checked by its syntax
    (:func:`flower_pfl.factory_ref.check_factory_reference`; the preflight check imports and
    calls it); ``model-args`` goes with a factory only."""
    model = values["model"]
    if ":" not in model:
        return [f"'model-args' = {values['model-args']!r} is set but 'model' = {model!r} is a "
                f"built-in model: model-args are for a 'package.module:factory' model"
                ] if values["model-args"] else []
    problem = check_factory_reference(model)  # the syntax: the module is imported later,
    return [f"'model' = {model!r}: {problem}"] if problem else []  # by the preflight check


def _recipe_checks(values: Mapping[str, Any]) -> list[str]:
    """The optimizer's and the schedule's settings that would be silently ignored."""
    problems = []
    opt, schedule = values["train.optimizer"], values["train.lr-schedule"]
    if opt != "sgd" and values["train.momentum"]:
        problems.append(f"'train.momentum' = {values['train.momentum']} has no meaning for "
                        f"train.optimizer = {opt!r}: its momentum is train.betas[0]")
    for key in ("train.betas", "train.eps"):
        if opt == "sgd" and values[key] != FIELDS[key].default:
            problems.append(f"'{key}' = {values[key]!r} is for adam/adamw, not for "
                            f"train.optimizer = 'sgd'")
    for key, readers in SCHEDULE_KEYS.items():
        if schedule not in readers and values[key] != FIELDS[key].default:
            problems.append(f"'{key}' = {values[key]!r} is read by the {' and '.join(readers)} "
                            f"schedule(s), not by train.lr-schedule = {schedule!r}")
    if schedule == "cosine" and values["train.lr-min"] >= values["train.lr"]:
        problems.append(f"'train.lr-min' = {values['train.lr-min']} is not below 'train.lr' = "
                        f"{values['train.lr']}: the cosine schedule would not decrease")
    return problems


def _cross_checks(values: Mapping[str, Any]) -> list[str]:
    problems = (_model_checks(values) + _recipe_checks(values) + data_checks(values)
                + privacy_checks(values) + newcomer_checks(values))
    if values["min-fit-clients"] > values["clients"]:
        problems.append(f"'min-fit-clients' = {values['min-fit-clients']} exceeds 'clients' = "
                        f"{values['clients']}")
    sampled = max(values["min-fit-clients"], int(round(values["fraction-fit"] * values["clients"])))
    if sampled < 1:
        problems.append(f"'fraction-fit' = {values['fraction-fit']} of {values['clients']} clients "
                        f"samples nobody; raise it or 'min-fit-clients'")
    if values["min-fit-answers"] > min(sampled, values["clients"]):
        problems.append(f"'min-fit-answers' = {values['min-fit-answers']} can never be met: a "
                        f"round samples {min(sampled, values['clients'])} client(s) "
                        f"(max(min-fit-clients, round(fraction-fit * clients)))")
    if values["min-eval-answers"] > values["clients"]:
        problems.append(f"'min-eval-answers' = {values['min-eval-answers']} exceeds 'clients' = "
                        f"{values['clients']}")
    return problems


def load(path: str | Path, overrides: str | Sequence[str] | Mapping[str, Any] | None = None
         ) -> RunConfig:
    """Read a YAML file, apply ``key=value`` overrides and validate."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"configuration file not found: {path}")
    try:
        with open(path, encoding="utf-8") as fh:  # a file object: errors name the path
            tree = yaml.load(fh, Loader=StrictLoader)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(tab_message(path, exc) or f"{path} is not valid YAML: {exc}") from exc
    if tree is None:
        raise ConfigError(f"{path} is empty (no key set): write at least 'strategy:' and the "
                          f"keys you mean; `flower-pfl validate` shows what a file gives")
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys to values")
    if overrides:
        mapping = overrides if isinstance(overrides, Mapping) else parse_overrides(overrides)
        tree = merge(tree, mapping)
    return validate(tree, source=str(path))


def resolve_config_path(name: str, app_dir: Path | None = None) -> Path:
    """Find a config file: absolute, relative to the cwd, or relative to the app directory."""
    path = Path(name).expanduser()
    if path.is_absolute():
        return path
    candidates = [Path.cwd() / path]
    if app_dir is not None:
        candidates.append(app_dir / path)
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise ConfigError(f"configuration file '{name}' not found (looked in "
                      f"{', '.join(str(c.parent) for c in candidates)})")


def train_keys() -> tuple[str, ...]:
    """Every ``train.*`` key of the run configuration (:data:`FIELDS`), in its order."""
    return tuple(key for key in FIELDS if key.startswith("train."))
