"""Every gate can fail: each check CI relies on is shown failing on a planted error.

The gates, and what each test plants:

* the type check (``mypy``, pyproject.toml's [tool.mypy]): a function annotated ``-> int``
  returning a str in EVERY file ``files`` lists (mypy's ``--shadow-file``: the real files are
  not touched) must be reported in each, and nothing else; no per-module option may switch a
  listed file's errors off;
* the lint (``ruff check .``): every Python file git tracks is in ruff's scope but the one
  deliberate exclusion, and a file planted in each linted folder (ruff's ``--stdin-filename``)
  is reported for each selected rule family;
* test selection (``pytest``, ``-m 'not slow'``): tests/test_gates_selection.py;
* CI's stages (.ci/run) and the slow tier's halves: each stage failing (exit 1, and pytest's
  exit 5, no tests) stops CI, with stub commands in a copy of the real script;
* the mutation suite's start-up checks and its verdicts: a strategy without a mutation of its
  own paper, a patch that no longer applies, a target that selects no fast test, pytest's
  exit 5;
* the docs checks: a broken link or anchor, and a stale number in docs/RESULTS.md.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PLANTED = "\n\ndef _planted_gate_error() -> int:\n    return 'planted'\n"


# ---------------------------------------------------------------- the type check (mypy)

def _mypy_sources():
    """What ``.venv/bin/mypy`` (no arguments, run in the root) reads from pyproject.toml, by
    mypy's own option parser: (the files it checks as BuildSources, its options)."""
    from mypy.main import process_options

    cwd = os.getcwd()
    os.chdir(ROOT)  # `files` is relative to the root
    try:
        sources, options = process_options(["--config-file", "pyproject.toml"])
    finally:
        os.chdir(cwd)
    return options, sources


def test_mypy_with_no_arguments_checks_every_module_of_the_package():
    """... and the mutation suite's modules (tests/mutations/), under their import names."""
    _, sources = _mypy_sources()
    files = [*(ROOT / "flower_pfl").rglob("*.py"), *(ROOT / "tests" / "mutations").glob("*.py")]
    on_disk = {p.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".").removesuffix(
        ".__init__") for p in files if "__pycache__" not in p.parts}
    assert {s.module for s in sources} == on_disk
    assert {"flower_pfl.strategies.fedamp", "flower_pfl.clients.fedamp",
            "flower_pfl.server_app", "flower_pfl.running.sites", "tests.mutations.mutations",
            "tests.mutations.mutation_table", "tests.mutations.mutation_fork"} <= on_disk


def test_no_mypy_option_switches_a_listed_files_errors_off():
    options, sources = _mypy_sources()
    assert len(sources) >= 40 and {"flower_pfl.tuned.patch", "flower_pfl.running.app_stage",
                                    "flower_pfl.tuned.actor_queue"} <= {s.module for s in sources}
    for source in sources:
        mine = options.clone_for_module(source.module)
        assert not mine.ignore_errors, f"{source.module}: ignore_errors is on"
        assert mine.disallow_untyped_defs and mine.strict_equality, source.module
    assert "ignore_errors" not in (ROOT / "pyproject.toml").read_text().split("[tool.mypy]")[1]


def test_mypy_reports_a_planted_error_in_every_listed_file_and_nothing_else(tmp_path):
    _, sources = _mypy_sources()
    args, want = [], set()
    for source in sources:
        rel = Path(source.path).resolve().relative_to(ROOT).as_posix()
        text = (ROOT / rel).read_text()
        shadow = tmp_path / rel.replace("/", "__")
        shadow.write_text(text + PLANTED)
        args += ["--shadow-file", rel, str(shadow)]
        want.add((rel, len((text + PLANTED).splitlines())))
    # a cache of its own (the planted copies would invalidate the project's), kept between
    # runs: 15-25 s the first time, a few seconds after
    cache = Path(tempfile.gettempdir()) / f"flower-pfl-gates-mypy-{os.getuid()}"
    out = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache),
                          "--no-error-summary", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    errors = re.findall(r"^(\S+\.py):(\d+): error: (.*)$", out.stdout, re.M)
    found = {(f, int(line)) for f, line, _ in errors}
    assert found == want, out.stdout[-4000:] + out.stderr[-2000:]
    assert all(msg.endswith("[return-value]") for _, _, msg in errors)
    assert out.returncode == 1


# ---------------------------------------------------------------- the lint (ruff)

#: the one deliberate exclusion ([tool.ruff] extend-exclude): scripts kept verbatim as the
#: record of how a committed result was made
RUFF_EXCLUDED = ("docs/results/",)
#: one violation of each selected family: I001 (order), F401, B006, E711, W291
LINT_PLANT = "import sys\nimport os\n\n\ndef f(x=[]):\n    if x == None:\n" \
             "        return os.sep \n    return x\n"


def _python_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "*.py"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return [f for f in out if (ROOT / f).is_file()]


def test_ruff_lints_every_python_file_but_the_recorded_scripts():
    listed = subprocess.run([str(BIN / "ruff"), "check", "--show-files", "."], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    linted = {Path(p).resolve().relative_to(ROOT).as_posix() for p in listed}
    wanted = {f for f in _python_files() if not f.startswith(RUFF_EXCLUDED)}
    assert wanted - linted == set()
    assert {"tests/mutations/mutations.py", "tests/test_gates.py",
            "flower_pfl/strategies/fedamp.py", "flower_pfl/tuned/patch.py"} <= linted


def test_ruff_reports_a_planted_file_in_every_linted_folder():
    folders = sorted({Path(f).parent.as_posix() for f in _python_files()})
    assert {"tests", "benchmarks", "flower_pfl/running", "flower_pfl/clients"} <= set(folders)
    for folder in folders:
        out = subprocess.run([str(BIN / "ruff"), "check", "--no-cache", "--force-exclude",
                              "--output-format", "concise", "--stdin-filename",
                              f"{folder}/_planted_gate.py", "-"], input=LINT_PLANT, cwd=ROOT,
                             capture_output=True, text=True)
        codes = set(re.findall(r": ([A-Z]+\d+)", out.stdout))
        if folder.startswith(tuple(e.rstrip("/") for e in RUFF_EXCLUDED)):
            assert out.returncode == 0 and not codes, folder
        else:
            assert out.returncode == 1, (folder, out.stdout, out.stderr)
            assert {"I001", "F401", "B006", "E711", "W291"} <= codes, (folder, out.stdout)


# ---------------------------------------------------------------- CI's stages, the slow tier

STUB = "#!/usr/bin/env bash\necho {name} >> \"$CI_LOG\"\n" \
       "[ \"${{FAIL_AT:-}}\" = {name} ] && exit \"${{FAIL_RC:-1}}\"\nexit 0\n"
PY_STUB = "#!/usr/bin/env bash\ncase \"$*\" in *pytest*) n=fast;; *mutations.py*) n=mutations;;" \
          " *) n=python;; esac\necho $n >> \"$CI_LOG\"\n" \
          "[ \"${FAIL_AT:-}\" = $n ] && exit \"${FAIL_RC:-1}\"\nexit 0\n"


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture()
def ci_copy(tmp_path: Path) -> Path:
    """The real .ci/run in a folder whose setup, python, ruff, mypy and slow tier are stubs
    that log their stage and exit FAIL_RC when FAIL_AT names it."""
    _executable(tmp_path / ".ci" / "run", (ROOT / ".ci" / "run").read_text())
    _executable(tmp_path / "scripts" / "setup.sh", STUB.format(name="setup"))
    _executable(tmp_path / "scripts" / "slow_tier.sh", STUB.format(name="slow"))
    _executable(tmp_path / ".venv" / "bin" / "ruff", STUB.format(name="lint"))
    _executable(tmp_path / ".venv" / "bin" / "mypy", STUB.format(name="types"))
    _executable(tmp_path / ".venv" / "bin" / "python", PY_STUB)
    return tmp_path


STAGES = ["setup", "fast", "lint", "types", "slow", "mutations"]
#: the last stage runs these two side by side (their log lines come in either order)
TOGETHER = {"slow", "mutations"}


def _stages_run(log: Path) -> list[str]:
    seen = log.read_text().split()
    head = [s for s in seen if s not in TOGETHER]
    return head + sorted((s for s in seen if s in TOGETHER), key=STAGES.index)


@pytest.mark.parametrize("fail_at, rc", [(s, 1) for s in STAGES] + [("fast", 5), ("slow", 5),
                                                                      ("mutations", 5)])
def test_ci_stops_at_the_stage_that_fails(ci_copy: Path, fail_at: str, rc: int):
    log = ci_copy / "log"
    out = subprocess.run(["bash", str(ci_copy / ".ci" / "run")], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "CI_LOG": str(log),
                                                     "FAIL_AT": fail_at, "FAIL_RC": str(rc)})
    assert out.returncode == rc, out.stdout + out.stderr
    # a failing slow tier still lets the mutation suite beside it finish (and print)
    last = STAGES if fail_at in TOGETHER else STAGES[:STAGES.index(fail_at) + 1]
    assert _stages_run(log) == last
    assert ("ci: stage times" in out.stdout) is False  # CI stopped at the failing stage


def test_ci_runs_every_stage_when_none_fails_and_pipes_keep_their_failures(ci_copy: Path):
    log = ci_copy / "log"
    out = subprocess.run(["bash", str(ci_copy / ".ci" / "run")], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "CI_LOG": str(log)})
    assert out.returncode == 0 and _stages_run(log) == STAGES
    assert "=== mutation suite (exit 0) ===" in out.stdout
    assert "nice -n 19" in (ROOT / ".ci" / "run").read_text()  # the suite yields to the tier
    assert "ci: stage times" in out.stdout
    # a child `bash -c` does not inherit pipefail: each one in .ci/run sets it again
    script = (ROOT / ".ci" / "run").read_text()
    assert "set -euo pipefail" in script
    for call in re.findall(r"\bbash ([^'\n]*)-c '", script):
        assert "pipefail" in call, call
    assert subprocess.run(["bash", "-c", "false | cat"]).returncode == 0  # what it prevents
    assert subprocess.run(["bash", "-euo", "pipefail", "-c", "false | cat"]).returncode == 1


@pytest.mark.parametrize("rc_a, rc_b", [(0, 0), (1, 0), (0, 1), (5, 0), (0, 5)])
def test_the_slow_tier_fails_when_either_half_fails_or_runs_no_test(tmp_path, rc_a, rc_b):
    py = tmp_path / "python"
    _executable(py, f"#!/usr/bin/env bash\ncase \"$*\" in *--ignore=*) exit {rc_b};; esac\n"
                    f"exit {rc_a}\n")
    out = subprocess.run(["bash", str(ROOT / "scripts" / "slow_tier.sh")], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PY": str(py)})
    assert out.returncode == (0 if rc_a == rc_b == 0 else 1), out.stdout + out.stderr
    assert f"half A (exit {rc_a}," in out.stdout and f"half B (exit {rc_b}," in out.stdout


# ---------------------------------------------------------------- the mutation suite

def _suite():
    sys.path.insert(0, str(ROOT))
    from tests.mutations import mutation_table, mutations

    return mutation_table, mutations


def test_the_mutation_checks_fail_on_a_planted_gap():
    table, _ = _suite()
    from dataclasses import replace

    mutations = table.load_mutations()
    assert table.check_coverage(mutations) == table.check_targets(mutations) == []
    # fedamp keeps its shared core.yaml entries, loses its own paper's: not covered
    no_own = [m for m in mutations if not (m.table == "fedamp.yaml" and "fedamp" in m.strategies)]
    assert any("fedamp" in m.strategies for m in no_own)
    assert table.check_coverage(no_own) == [
        "strategy 'fedamp' is covered only by shared entries, none of its own paper's (add one "
        "to tests/mutations/data/fedamp.yaml)"]
    assert any("'local' is registered but no mutation" in p for p in table.check_coverage(
        [m for m in mutations if "local" not in m.strategies]))
    first = mutations[0]
    assert table.check_patches([replace(first, old="no such text anywhere")]) == [
        f"{first.name}: the old text occurs 0 times in {first.file} (must be exactly once): "
        "'no such text anywhere'"]
    assert len(table.check_patches([first, first])) == 1  # a name used twice
    # a patch through the top-level link: the runner's copy would patch a file no test imports
    side = next(m for m in mutations if m.file.startswith("flower_pfl/strategies/"))
    linked = side.file.removeprefix("flower_pfl/")
    assert table.check_patches([replace(side, file=linked)]) == [
        f"{side.name}: {linked} goes through a link; name the file itself ({side.file})"]
    planted = [replace(first, tests=("tests/test_nope.py",)),
               replace(first, tests=("tests/test_fedamp.py::test_renamed_away",)),
               replace(first, tests=("tests/test_deployment.py",)),
               replace(first, tests=("tests/test_e2e_simulation.py::"
                                     "test_failed_run_is_reported_not_hidden",)),
               replace(first, tests=("tests/test_bench.py::test_plots_exist[x]",))]
    assert [p.split(": ", 1)[1] for p in table.check_targets(planted)] == [
        "target tests/test_nope.py: tests/test_nope.py does not exist",
        "target tests/test_fedamp.py::test_renamed_away: no test 'test_renamed_away' in "
        "tests/test_fedamp.py",
        "target tests/test_deployment.py has no fast test",
        "target tests/test_e2e_simulation.py::test_failed_run_is_reported_not_hidden is marked "
        "slow (the suite runs -m 'not slow')",
        "target tests/test_bench.py::test_plots_exist[x] is marked slow (the suite runs "
        "-m 'not slow')"]


def test_a_target_that_selects_no_test_stops_the_suite_and_exit_5_never_kills():
    _, suite = _suite()
    assert suite.classify(5, "no tests ran in 0.1s")[0] == "error"
    assert suite.classify(4, "ERROR: not found")[0] == "error"
    assert suite.classify(0, "3 passed")[0] == "survived"
    assert suite.classify(1, "FAILED tests/test_a.py::test_b - x") == (
        "killed", "tests/test_a.py::test_b")
    missing = suite.uncollected(sys.executable, ROOT, [
        "tests/test_warnings_once.py", "tests/test_warnings_once.py::test_renamed_away"])
    assert missing == ["tests/test_warnings_once.py::test_renamed_away"]


# ---------------------------------------------------------------- the docs checks

def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    from tests.test_docs import broken_links

    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## A section\n")
    good = "[x](other.md) [y](other.md#a-section) [z](#top) [w](https://x.org/nope)\n\n# Top\n"
    assert broken_links(good, page) == []
    assert broken_links("[x](othr.md)", page) == ["page.md: link (othr.md): othr.md does not exist"]
    assert broken_links("[x](other.md#a-sectoin)", page) == [
        "page.md: link (other.md#a-sectoin): no heading #a-sectoin in other.md"]


def test_a_stale_number_in_results_md_is_found():
    from tests.test_results_doc import embed

    text = (ROOT / "docs" / "RESULTS.md").read_text()
    assert embed.stale_blocks(text, ROOT, "docs/RESULTS.md") == []
    lines = text.split("\n")
    block = embed.find_blocks(lines, "docs/RESULTS.md")[0]
    # one number of the first embedded table, 0.01 off
    i, match = next((i, m) for i in range(block.start + 1, block.end)
                    if lines[i].startswith("|") and (m := re.search(r"\d+\.\d\d", lines[i])))
    lines[i] = lines[i][:match.start()] + f"{float(match.group()) + 0.01:.2f}" + \
        lines[i][match.end():]
    assert embed.stale_blocks("\n".join(lines), ROOT, "docs/RESULTS.md") == [
        f"line {block.start + 1}: {block.path}#{block.selector}"]
