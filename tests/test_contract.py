"""One contract per paper (flower_pfl/contract.py, flower_pfl/catalog/<paper>.py): parameters
declared once and read typed, privacy decisions, the wire classes, and the import rules that
keep the contract the one place a paper is declared."""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from flower_pfl import contract, instructions, registry
from flower_pfl.contract import AUTO_OR_POS, POS, Decision, Entry, Newcomer, Params, in_, param

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "flower_pfl"


@dataclass(frozen=True)
class Toy(Params):
    """An asymmetric declaration: every accepted annotation, keys out of alphabetical order."""

    zeta_max: int = param(3, POS, "an integer >= 1", "z")
    lambda_: str | float = param("auto", AUTO_OR_POS, "a number > 0 or 'auto'", "l")
    mode: Literal["a", "b"] = param("b", in_(("a", "b")), "one of ['a', 'b']", "m")
    rate: float = param(0.5, POS, "a number > 0", "r")
    on: bool = param(True, None, "true or false", "o")


def test_params_derive_the_hyper_table_in_field_order_with_types_from_annotations():
    table = Toy.hyper()
    assert list(table) == ["zeta-max", "lambda", "mode", "rate", "on"]
    assert table["zeta-max"].types == (int,)
    assert table["lambda"].types == (str, float, int)
    assert table["mode"].types == (str,)
    assert table["rate"].types == (float, int)
    assert table["on"].types == (bool,)
    assert [h.default for h in table.values()] == [3, "auto", "b", 0.5, True]
    assert table["rate"].doc == "r" and table["mode"].allowed == "one of ['a', 'b']"


def test_an_entry_validates_with_the_derived_table_and_the_strategy_reads_the_same_class():
    entry = Entry("toy", "a toy", privacy=Decision("w", None, None), params=Toy)
    values, problems = entry.validate_hyper({"rate": 2, "mode": "a"}, "hyper.toy")
    assert problems == [] and values["rate"] == 2.0 and isinstance(values["rate"], float)
    read = Toy.read(values)
    assert (read.zeta_max, read.lambda_, read.mode, read.rate, read.on) == (3, "auto", "a", 2.0,
                                                                          True)
    _, problems = entry.validate_hyper({"mode": "c", "on": 1, "rat": 1}, "hyper.toy")
    assert any("'hyper.toy.mode' = 'c' is out of range" in p for p in problems)
    assert any("'hyper.toy.on' = 1 has the wrong type" in p for p in problems)
    assert any("'hyper.toy.rat' is not a hyper-parameter" in p and "did you mean 'rate'" in p
               for p in problems)


def test_read_names_a_missing_key_and_a_field_without_param_is_refused():
    with pytest.raises(TypeError, match=r"Toy.rate: the hyper-parameters hold no 'rate'"):
        Toy.read({"zeta-max": 3, "lambda": 1.0, "mode": "a", "on": True})

    @dataclass(frozen=True)
    class Bare(Params):
        x: float = 1.0

    with pytest.raises(TypeError, match=r"Bare.x: declare it with param"):
        Bare.hyper()

    @dataclass(frozen=True)
    class Listy(Params):
        x: tuple[int, ...] = param((), None, "", "")  # not a scalar: refused

    with pytest.raises(TypeError, match="not a parameter type"):
        Listy.hyper()


def test_decisions_and_newcomer_rules_refuse_what_is_not_a_decision():
    assert Decision("w", "no", None).refusal("client-level") == "no"
    assert Decision("w", "no", None).refusal("sample-level") is None
    assert Decision("w", "no", "never").refusal("none") is None
    with pytest.raises(ValueError, match="reference"):
        Decision("w", None, None, reference="half")
    assert Newcomer(rule="fine-tune w", basis="paper").refused is None
    with pytest.raises(ValueError):
        Newcomer(rule="x", basis="guess")
    with pytest.raises(ValueError):
        Newcomer()  # neither a rule nor a reason
    with pytest.raises(ValueError):
        Newcomer(rule="x", basis="paper", refused="and a reason")


@pytest.mark.parametrize("name", sorted(registry.REGISTRY))
def test_every_contract_declares_params_privacy_and_reads_its_defaults(name):
    entry = registry.REGISTRY[name]
    assert entry.privacy is not None and entry.privacy.clipped
    defaults = {k: h.default for k, h in entry.hyper.items()}
    read = entry.params.read(defaults)
    for key, value in defaults.items():  # the validated value itself, not a converted copy
        assert getattr(read, _attr(read, key)) is value


def _attr(read: Params, key: str) -> str:
    return {contract.key_of(f.name): f.name for f in dataclasses.fields(read)}[key]


def test_the_strategy_reads_the_configured_parameters_once(tmp_path):
    """The strategy's ``self.params`` is its contract's class filled from the run's
    configuration (not the defaults), and what it sends follows it."""
    from flower_pfl.catalog.baselines import FedProxFit, FedProxFTParams
    from tests.conftest import small_config

    cfg = small_config(strategy="fedprox-ft", clients=4,
                       **{"hyper.fedprox-ft.mu": 0.3, "hyper.fedprox-ft.finetune-steps": 7})
    strategy = registry.strategy_class("fedprox-ft")(cfg, results_dir=tmp_path)
    assert type(strategy.params) is FedProxFTParams
    assert (strategy.params.mu, strategy.params.finetune_steps) == (0.3, 7)
    assert strategy.entry is registry.get("fedprox-ft")
    assert strategy.mechanism is strategy.entry.mechanism
    assert FedProxFit.from_config(strategy.fit_payload(0, 1)[1]).mu == 0.3


# ----------------------------------------------------------------- where a paper is declared
def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def client_modules_importing_strategies(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.py")
                  if any(m.startswith("flower_pfl.strategies") for m in _imports(p)))


def test_no_client_module_imports_a_strategy_module(tmp_path):
    assert client_modules_importing_strategies(PKG / "clients") == []
    planted = tmp_path / "planted.py"  # the check does fail
    planted.write_text("from flower_pfl.strategies.fedamp import FedAMP\n")
    assert client_modules_importing_strategies(tmp_path) == ["planted.py"]


def test_the_client_app_and_every_client_load_no_strategy_module():
    code = ("import sys\nfrom flower_pfl import registry\nimport flower_pfl.client_app\n"
            "for n in registry.REGISTRY: registry.client_class(n)\n"
            "print(sorted(m for m in sys.modules if m.startswith('flower_pfl.strategies')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_instructions_hold_only_the_wire_machinery_and_round_level_messages():
    classes = {n.name for n in ast.parse((PKG / "instructions.py").read_text()).body
               if isinstance(n, ast.ClassDef)}
    round_level = {"RoundInstruction", "EvaluateInstruction", "ReceivedModel", "NewcomerEval",
                   "NewcomerReply", "PrivateFit", "PrivateReply", "SampleLevelReply"}
    assert classes == {"WireError", "Spec", "Wire", "Reply"} | round_level
    assert {d.__name__ for d in instructions.DECLARATIONS} == round_level
    # every paper's wire class is declared by its contract's entries
    declared = {w for e in registry.REGISTRY.values() for w in e.wire}
    assert all(w.__module__.startswith("flower_pfl.catalog.") for w in declared)


def test_the_privacy_policy_names_no_strategy():
    text = (PKG / "privacy" / "policy.py").read_text()
    named = [n for n in registry.REGISTRY if re.search(rf"[\"']{re.escape(n)}[\"']", text)]
    assert named == []


def raw_hyper_reads(root: Path) -> list[str]:
    return sorted(f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py")
                  for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
                  if 'hyper["' in line or "hyper['" in line)


def test_no_module_reads_a_parameter_by_its_raw_key(tmp_path):
    assert raw_hyper_reads(PKG) == []
    (tmp_path / "planted.py").write_text('x = self.hyper["rho"]\n')
    assert raw_hyper_reads(tmp_path) == ["planted.py:1"]


def test_docs_algorithms_holds_the_generated_strategies_table():
    text = (ROOT / "docs" / "algorithms.md").read_text(encoding="utf-8")
    assert registry.strategies_table() in text, (
        "regenerate: python -c 'from flower_pfl import registry; "
        "print(registry.strategies_table())'")
