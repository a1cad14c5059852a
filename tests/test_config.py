"""simulation.yaml validation: good files load, every bad input gives ONE clear error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flower_pfl import config
from flower_pfl.config import ConfigError

REPO = Path(__file__).resolve().parent.parent


def test_repo_simulation_yaml_is_valid():
    cfg = config.load(REPO / "simulation.yaml")
    assert cfg.strategy in ("fedavg", "local", "fedavg-ft", "fedamp", "heurfedamp", "fedacs")
    assert cfg["clients"] >= 2 and cfg["data.dataset"] == "fmnist"


def test_defaults_fill_missing_keys_and_hyper():
    cfg = config.validate({"strategy": "fedavg-ft"})
    assert cfg["rounds"] == config.FIELDS["rounds"].default
    assert cfg.hyper == {"finetune-steps": 10}
    assert isinstance(cfg["train.lr"], float)


@pytest.mark.parametrize("tree, needle", [
    ({"roundz": 3}, "unknown key 'roundz' (did you mean 'rounds'?)"),
    ({"rounds": "ten"}, "'rounds' = 'ten' has the wrong type"),
    ({"rounds": 0}, "'rounds' = 0 is out of range: allowed is an integer >= 1"),
    ({"fraction-fit": 1.5}, "'fraction-fit' = 1.5 is out of range"),
    ({"rounds": True}, "'rounds' = True has the wrong type"),
    ({"strategy": "fedavgg"}, "unknown strategy 'fedavgg' (did you mean 'fedavg'?)"),
    ({"data": {"partition": "shards"}}, "'data.partition' = 'shards' is out of range"),
    ({"data": {"alpha": -1}}, "'data.alpha' = -1 is out of range"),
    ({"data": {"datset": "fmnist"}}, "unknown key 'data.datset'"),
    ({"hyper": {"fedavg-ft": {"finetune": 3}}},
     "'hyper.fedavg-ft.finetune' is not a hyper-parameter"),
    ({"hyper": {"fedavg-ft": {"finetune-steps": 0}}}, "'hyper.fedavg-ft.finetune-steps' = 0"),
    ({"hyper": {"nope": {}}}, "'hyper.nope': unknown strategy"),
    ({"hyper": {"fedamp": {"sigmaa": 1.0}}},
     "'hyper.fedamp.sigmaa' is not a hyper-parameter of 'fedamp' (did you mean 'sigma'?)"),
    ({"hyper": {"fedavgft": {}}}, "'hyper.fedavgft': unknown strategy (did you mean 'fedavg-ft'?)"),
    ({"min-fit-clients": 30, "clients": 20}, "'min-fit-clients' = 30 exceeds 'clients' = 20"),
    ({"client-resources": {"num-gpus": -0.5}}, "'client-resources.num-gpus' = -0.5"),
    # the data's classes, judged for every dataset (was: the 10-class ones only)
    ({"data": {"dataset": "cifar100", "partition": "pathological", "classes-per-client": 101}},
     "'data.classes-per-client' = 101 exceeds the 100 classes of cifar100"),
    ({"data": {"dataset": "emnist", "partition": "pathological", "classes-per-client": 63}},
     "'data.classes-per-client' = 63 exceeds the 62 classes of emnist"),
    ({"data": {"partition": "practical", "groups": 11}, "clients": 20},
     "'data.groups' = 11 exceeds the 10 classes of fmnist"),
    ({"data": {"partition": "practical", "groups": 5}, "clients": 4, "min-fit-clients": 2},
     "'data.groups' = 5 exceeds 'clients' = 4"),
])
def test_bad_input_gives_one_clear_error(tree, needle):
    with pytest.raises(ConfigError) as info:
        config.validate(tree, source="bad.yaml")
    message = str(info.value)
    assert needle in message
    assert message.startswith("invalid configuration in bad.yaml")


def test_all_problems_reported_together():
    with pytest.raises(ConfigError) as info:
        config.validate({"rounds": -1, "seeds": 3, "strategy": "x"})
    message = str(info.value)
    assert "'rounds'" in message and "'seeds'" in message and "unknown strategy 'x'" in message


def test_file_and_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"strategy": "fedavg", "rounds": 4, "data": {"alpha": 0.3}}))
    cfg = config.load(path, "rounds=7 data.alpha=0.1 strategy=local")
    assert (cfg["rounds"], cfg["data.alpha"], cfg.strategy) == (7, 0.1, "local")
    assert config.load(path, ["rounds=2"])["rounds"] == 2
    with pytest.raises(ConfigError, match="'rounds' = 'x'"):
        config.load(path, "rounds=x")
    with pytest.raises(ConfigError, match="not of the form key=value"):
        config.parse_overrides("rounds")


def test_not_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config.load(bad)
    with pytest.raises(ConfigError, match="not found"):
        config.load(tmp_path / "missing.yaml")


def test_json_round_trip():
    cfg = config.validate({"strategy": "fedavg-ft", "rounds": 2})
    again = config.RunConfig.from_json(cfg.to_json())
    assert dict(again.values) == dict(cfg.values) and dict(again.hyper) == dict(cfg.hyper)


def test_cli_validate_reports_error_before_anything_starts(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("strategy: fedamq\nrounds: 0\n")
    out = subprocess.run([sys.executable, "-m", "flower_pfl.cli", "run", "--config", str(bad)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "unknown strategy 'fedamq'" in out.stderr and "'rounds' = 0" in out.stderr
    assert "SuperLink" not in out.stdout + out.stderr


def test_key_written_twice_is_an_error(tmp_path):
    path = tmp_path / "twice.yaml"
    for text, needle in [("strategy: fedavg\nrounds: 3\ndata:\n  alpha: 0.5\nrounds: 5\n",
                          "key 'rounds' is written twice (lines 2 and 5)"),
                         ("strategy: fedavg\ndata:\n  alpha: 0.5\n  alpha: 0.1\n",
                          "key 'alpha' is written twice (lines 3 and 4)")]:
        path.write_text(text)
        with pytest.raises(ConfigError) as info:
            config.load(path)
        assert str(info.value) == (f"{path}: {needle}; YAML would silently keep the second"
                                   f" -- keep one")


def test_empty_file_is_an_error(tmp_path):
    for text in ("", "# only a comment\n"):
        path = tmp_path / "empty.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match="empty.yaml is empty"):
            config.load(path)


@pytest.mark.parametrize("tree, needle", [
    ({"clients": 10, "fraction-fit": 0.2, "min-fit-answers": 3},
     "'min-fit-answers' = 3 can never be met: a round samples 2 client(s)"),
    ({"clients": 4, "min-eval-answers": 5}, "'min-eval-answers' = 5 exceeds 'clients' = 4"),
    ({"checkpoint-every": -1}, "'checkpoint-every' = -1 is out of range"),
    ({"max-update-norm": 0}, "'max-update-norm' = 0 is out of range"),
    ({"stall-timeout": -5}, "'stall-timeout' = -5 is out of range"),
])
def test_reliability_keys_that_cannot_be_met(tree, needle):
    with pytest.raises(ConfigError) as info:
        config.validate(tree, source="bad.yaml")
    assert needle in str(info.value)


def test_a_misspelt_hyper_parameter_in_set_gets_the_closest_name(tmp_path):
    """--set hyper.X.KEY goes through the same suggestion as every other key; a name far from
    every hyper-parameter gets none (no guess where nothing is close)."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"strategy": "fedamp"}))
    with pytest.raises(ConfigError, match=r"'hyper\.fedamp\.lamda' .*\(did you mean 'lambda'\?\)"):
        config.load(path, ["hyper.fedamp.lamda=0.5"])
    with pytest.raises(ConfigError) as info:
        config.load(path, ["hyper.fedamp.zzz=0.5"])
    assert "did you mean" not in str(info.value) and "(allowed: ['alpha-k'" in str(info.value)


@pytest.mark.parametrize("columns", [80, 100])
def test_strategy_listing_tells_every_variant_apart(columns, monkeypatch, capsys):
    """`flower-pfl strategies` cuts each description at the terminal's width: what is left
    must differ between any two strategies (a family's shared preamble first would make the
    pfedbred variants' lines identical), and each pfedbred variant's line names its prior."""
    from flower_pfl import registry
    from flower_pfl.cli import main

    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["strategies"]) == 0
    lines = capsys.readouterr().out.splitlines()[:len(registry.REGISTRY)]
    shown = {ln.split()[0]: ln.split(None, 1)[1] for ln in lines}
    assert list(shown) == list(registry.REGISTRY)
    assert max(len(ln) for ln in lines) <= columns
    assert len(set(shown.values())) == len(shown), sorted(shown.values())
    for prior in ("lg", "meg", "mh", "mh-lookahead"):
        assert shown[f"pfedbred-{prior}"].startswith(f"prior {prior}:")
    assert "hyper 'prior'" in shown["pfedbred"] and "mu = w" in shown["pfedme"]


@pytest.mark.parametrize("tree", [
    {"data": {"dataset": "cifar100", "partition": "pathological", "classes-per-client": 100}},
    {"data": {"dataset": "emnist", "partition": "pathological", "classes-per-client": 62}},
    {"data": {"partition": "practical", "groups": 10}, "clients": 10},
    {"data": {"partition": "dirichlet", "groups": 50}},  # groups only matter for practical
])
def test_class_and_group_counts_at_their_limit_are_valid(tree):
    config.validate(tree, source="ok.yaml")


@pytest.mark.parametrize("raw,number", [("1e-2", 0.01), ("1E6", 1e6), ("5e-4", 5e-4),
                                        ("1.0e6", 1e6), ("-2e+3", -2000.0), (".5e1", 5.0),
                                        ("2.5", 2.5)])
def test_numbers_as_people_write_them_in_set_and_in_the_file(tmp_path, raw, number):
    """YAML 1.1 (PyYAML) reads 1e-2 as text; the loader reads it as the number it is."""
    assert config.parse_overrides([f"x={raw}"])["x"] == number
    assert isinstance(config.parse_overrides([f"x={raw}"])["x"], float)
    path = tmp_path / "run.yaml"
    path.write_text(f"strategy: fedavg\ntrain:\n  weight-decay: {raw.lstrip('-')}\n")
    assert config.load(path)["train.weight-decay"] == abs(number)
    assert config.load(path, overrides=[f"train.lr={raw.lstrip('-')}"])["train.lr"] == abs(number)


def test_exponent_text_that_is_not_a_number_stays_text():
    got = config.parse_overrides(["a=1e", "b=e5", "c=1e5x", "d=v1e5", "run-name=exp1e3"])
    assert got == {"a": "1e", "b": "e5", "c": "1e5x", "d": "v1e5", "run-name": "exp1e3"}
    assert config.parse_overrides(["n=7"])["n"] == 7
    assert config.parse_overrides(["q='1e-2'"])["q"] == "1e-2"


def test_a_whole_number_in_exponent_form_fills_an_integer_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("data:\n  subsample: 1e4\n")
    assert config.load(path)["data.subsample"] == 10000
    assert isinstance(config.load(path)["data.subsample"], int)
    with pytest.raises(ConfigError, match="'rounds' = 2.5 has the wrong type: expected integer"):
        config.validate({"rounds": 2.5})


@pytest.mark.parametrize("text,line,column", [
    ("strategy: fedavg\ntrain:\n\tlr: 0.01\n", 3, 1),
    ("strategy: fedavg\ntrain:\n  lr: 0.01\n  \tmomentum: 0.5\n", 4, 3),
    ("rounds: 3\ntrain:\n  lr:\t0.01\n", 3, 6),
])
def test_a_tab_gets_indent_with_spaces_naming_line_and_column(tmp_path, text, line, column):
    path = tmp_path / "tabbed.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        config.load(path)
    message = str(err.value)
    assert f"line {line}, column {column}: a tab character" in message, message
    assert "indent with spaces" in message and "cannot start any token" not in message


def test_yaml_error_without_a_tab_keeps_the_parsers_message(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("strategy: [fedavg\n")
    with pytest.raises(ConfigError, match="is not valid YAML") as err:
        config.load(path)
    assert "tab character" not in str(err.value)


def test_model_factory_reference_and_model_args():
    """A 'package.module:factory' model is checked by its syntax here (the module is
    imported by the preflight check: tests/test_user_model.py)."""
    with pytest.raises(ConfigError, match="'model' = 'a-b:c': 'a-b:c' is not a factory "
                                          "reference"):
        config.validate({"model": "a-b:c"})
    with pytest.raises(ConfigError, match="'model' = 'mypkg.nets:': "):
        config.validate({"model": "mypkg.nets:"})
    cfg = config.validate({"model": "mypkg.nets:make_net", "model-args": {"width": 8}})
    assert cfg["model"] == "mypkg.nets:make_net" and cfg["model-args"] == {"width": 8}
    assert config.validate({})["model-args"] == {}
    with pytest.raises(ConfigError, match="model-args are for a 'package.module:factory'"):
        config.validate({"model-args": {"width": 8}})
    with pytest.raises(ConfigError, match="'model-args' = 3 has the wrong type: expected mapping"):
        config.validate({"model": "m:f", "model-args": 3})
    with pytest.raises(ConfigError, match="'package.module:factory'"):
        config.validate({"model": "resnet"})
