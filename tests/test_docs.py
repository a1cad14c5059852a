"""The algorithm pages (docs/algorithms/*.md) name only tests and hyper-parameters that exist.

What a page names, and how it is checked:

* a test file, ``tests/test_x.py``: the file exists;
* a test, ``tests/test_x.py::test_name`` (a line break after ``::`` allowed) or a bare
  `` `test_name` `` in backticks: a function of that name in that file / in some test file;
  parameter ids in brackets, ``test_name[a|b]``, must each appear in the test's
  ``parametrize`` decorators (an id ``x-y`` pytest joined from two parameters: each part);
* a hyper-parameter, ``hyper.<strategy>.<key>`` (``<a|b>`` for several strategies, ``<s>``
  for any): a registered strategy with that key in its catalog entry;
* a hyper-parameter table (a header cell says "hyper-parameter", or the first header cell is
  ``key`` under a heading that says "hyper-parameter"): the backticked keys of a row whose
  first cell is a registered strategy are that strategy's keys; the backticked first cells of
  a ``key`` table are keys of a strategy the page names in backticks.

Every Markdown file of the repository (README.md, docs/, tests/mutations/data/README.md,
the result folders' notes) links only to files that exist and, in a Markdown file, to
headings that exist (GitHub's anchors): :func:`broken_links`.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
import shlex
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

from flower_pfl import registry

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs" / "algorithms").glob("*.md"))

NODE = re.compile(r"tests/(test_\w+\.py)(?:::\s*(test_\w+)(\[[^\]\s`]*\])?)?")
BARE = re.compile(r"(?<![:\w/])`(test_\w+)(\[[^\]`]*\])?`")
HYPER = re.compile(r"hyper\.(<[^>]+>|[a-z0-9-]+)\.([a-z][a-z0-9-]*)")
TICKED = re.compile(r"`([^`]+)`")


@lru_cache(maxsize=None)
def defined_tests(tests_dir: Path = ROOT / "tests") -> dict[str, dict[str, str]]:
    """{file name: {test function: the source of its decorators}} of every test file."""
    out = {}
    for path in sorted(tests_dir.glob("test_*.py")):
        text = path.read_text()
        found = {}
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.name.startswith("test_"):
                found[node.name] = "\n".join(ast.get_source_segment(text, d) or ""
                                             for d in node.decorator_list)
        out[path.name] = found
    return out


def _param_problems(name: str, ids: str | None, decorators: str) -> list[str]:
    if not ids:
        return []
    missing = [i for i in ids[1:-1].split("|")
               if i and i not in decorators and not all(part in decorators
                                                        for part in i.split("-"))]
    return [f"{name}{ids}: no parameter {m!r} in its parametrize decorators" for m in missing]


def missing_tests(text: str, functions: dict[str, dict[str, str]]) -> list[str]:
    """The tests a page's ``text`` names that do not exist."""
    problems = []
    for file, name, ids in NODE.findall(text):
        if file not in functions:
            problems.append(f"tests/{file} does not exist")
        elif name and name not in functions[file]:
            problems.append(f"tests/{file}::{name} does not exist")
        elif name:
            problems += _param_problems(name, ids, functions[file][name])
    for name, ids in BARE.findall(text):
        owners = [f for f, names in functions.items() if name in names]
        if not owners:
            problems.append(f"{name}: no test of that name in tests/")
        else:
            problems += _param_problems(name, ids, "\n".join(functions[f][name] for f in owners))
    return problems


def _keys(strategy: str) -> set[str]:
    return set(registry.get(strategy).hyper)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def hyper_problems(text: str) -> list[str]:
    """The hyper-parameters a page's ``text`` names that no registered strategy has."""
    problems = []
    names = set(registry.REGISTRY)
    for who, key in HYPER.findall(text):
        if who.startswith("<"):
            inner = who[1:-1]
            owners = inner.split("|") if "|" in inner else sorted(names)
            unknown = [o for o in owners if o not in names]
            problems += [f"hyper.{who}.{key}: {o!r} is not a registered strategy" for o in unknown]
            owners = [o for o in owners if o in names]
            if "|" in inner:
                problems += [f"hyper.{o}.{key}: not a hyper-parameter of {o}"
                             for o in owners if key not in _keys(o)]
            elif not any(key in _keys(o) for o in owners):
                problems.append(f"hyper.{who}.{key}: no strategy has the key {key!r}")
        elif who not in names:
            problems.append(f"hyper.{who}.{key}: {who!r} is not a registered strategy")
        elif key not in _keys(who):
            problems.append(f"hyper.{who}.{key}: not a hyper-parameter of {who}")
    on_page = {t for t in TICKED.findall(text) if t in names}
    heading, header = "", None
    for line in text.splitlines():
        if line.startswith("#"):
            heading, header = line.lower(), None
            continue
        if not line.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = [c.lower() for c in cells]
            continue
        if set("".join(cells)) <= set("-: "):
            continue  # the |---| line
        hyper_cols = [i for i, h in enumerate(header) if "hyper-param" in h]
        first = TICKED.findall(cells[0])
        if hyper_cols and len(first) == 1 and first[0] in names:
            for i in hyper_cols:
                for key in TICKED.findall(cells[i] if i < len(cells) else ""):
                    if key not in _keys(first[0]):
                        problems.append(f"table row {first[0]}: {key!r} is not a "
                                        f"hyper-parameter of {first[0]}")
        elif header[0] == "key" and "hyper-param" in heading and first:
            if not any(first[0] in _keys(s) for s in on_page):
                problems.append(f"hyper-parameter table: {first[0]!r} is not a key of any "
                                f"strategy the page names ({sorted(on_page)})")
    return problems


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading's text: lower case, punctuation dropped but
    ``-`` and ``_``, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of ``text``'s headings (outside code blocks); a repeated heading's
    second anchor gets ``-1`` as on GitHub."""
    out: set[str] = set()
    for line in FENCE.sub("", text).splitlines():
        if line.startswith("#"):
            slug = anchor(line.lstrip("#"))
            n = 0
            while (f"{slug}-{n}" if n else slug) in out:
                n += 1
            out.add(f"{slug}-{n}" if n else slug)
    return out


def broken_links(text: str, page: Path) -> list[str]:
    """The relative links of the Markdown ``text`` of ``page`` (``[x](target)``, images
    too, code blocks aside) whose file does not exist, or whose ``#anchor`` is no heading
    of the Markdown file linked; ``http(s):``/``mailto:`` links are not followed."""
    problems = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue
        path, _, frag = target.partition("#")
        dest = (page.parent / path) if path else page
        if path and not dest.exists():
            problems.append(f"{page.name}: link ({target}): {path} does not exist")
        elif frag and dest.suffix == ".md" and frag not in anchors(
                text if dest == page else dest.read_text()):
            problems.append(f"{page.name}: link ({target}): no heading #{frag} in {dest.name}")
    return problems


def markdown_files() -> list[Path]:
    """Every Markdown file git tracks or would add (not the ignored ones)."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "*.md"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / f for f in out]


def test_every_relative_link_of_every_markdown_file_resolves():
    files = markdown_files()
    assert ROOT / "README.md" in files and ROOT / "docs" / "RESULTS.md" in files
    problems = [p for f in files if f.is_file() for p in broken_links(f.read_text(), f)]
    assert problems == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_names_only_existing_tests(page):
    assert missing_tests(page.read_text(), defined_tests()) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_names_only_existing_hyper_parameters(page):
    assert hyper_problems(page.read_text()) == []


def test_the_checks_find_a_missing_test_a_missing_parameter_and_a_missing_key():
    functions = {"test_a.py": {"test_one": "@pytest.mark.parametrize('p', ['lg', 'mh'])",
                               "test_two": ""}}
    good = ("`tests/test_a.py::test_one[lg|mh]`, `test_two` and `tests/test_a.py::\n"
            "test_two`; `hyper.fedamp.sigma`, `hyper.<fedamp|heurfedamp>.evaluate`\n\n"
            "| name | hyper-parameters (default) |\n|---|---|\n| `ditto` | `lambda` (0.1) |\n")
    assert missing_tests(good, functions) == [] and hyper_problems(good) == []
    assert missing_tests("`tests/test_a.py::test_three`", functions) == \
        ["tests/test_a.py::test_three does not exist"]
    assert missing_tests("`tests/test_b.py`", functions) == ["tests/test_b.py does not exist"]
    assert missing_tests("see `test_three`", functions) == \
        ["test_three: no test of that name in tests/"]
    assert len(missing_tests("`test_one[lg|meg]`", functions)) == 1
    assert hyper_problems("--set hyper.fedamp.sigmaa=1") == \
        ["hyper.fedamp.sigmaa: not a hyper-parameter of fedamp"]
    assert len(hyper_problems("`hyper.<fedamp|fedacs>.sigma-scale`")) == 1  # fedacs has none
    assert len(hyper_problems("| name | hyper-parameters |\n|---|---|\n| `ditto` | `mu` |")) == 1
    page = "`pfedme`\n### Hyper-parameters\n| key | default |\n|---|---|\n| `eta` | 0 |\n"
    assert len(hyper_problems(page)) == 1  # pfedme has no eta


# ------------------------------------------------------------------ the README: one page

README = ROOT / "README.md"
README_MAX_LINES = 150
#: the README's two commands: set up and run the default simulation / the fast test tier
RUN_COMMAND = "bash scripts/setup.sh && .venv/bin/flower-pfl run"
TEST_COMMAND = "bash scripts/setup.sh && .venv/bin/python -m pytest -q -n 2"
#: .ci/run's first stage, whose command must be the README's test command
CI_FAST_STAGE = re.compile(r"""^stage "setup\+fast" bash -euo pipefail -c '([^']*)'$""", re.M)
CODE_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def code_lines(text: str, language: str) -> list[str]:
    """The lines of ``text``'s fenced code blocks in ``language``, comments after ``  #``
    and surrounding blanks dropped."""
    return [line.split("  #")[0].strip()
            for lang, body in CODE_BLOCK.findall(text) if lang == language
            for line in body.splitlines() if line.strip()]


def readme_problems(readme: str, ci: str) -> list[str]:
    """What keeps the README ``readme`` from being one page with the two commands, its test
    command the one CI's first stage (in the .ci/run text ``ci``) runs."""
    problems = []
    if len(readme.splitlines()) > README_MAX_LINES:
        problems.append(f"README.md has {len(readme.splitlines())} lines (at most "
                        f"{README_MAX_LINES}: the rest goes in docs/)")
    setups = [c for c in code_lines(readme, "bash") if c.startswith("bash scripts/setup.sh")]
    if setups != [RUN_COMMAND, TEST_COMMAND]:
        problems.append(f"README.md's set-up commands are {setups}, not "
                        f"{[RUN_COMMAND, TEST_COMMAND]}")
    stage = CI_FAST_STAGE.findall(ci)
    if stage != [TEST_COMMAND]:
        problems.append(f".ci/run's setup+fast stage runs {stage}, not {TEST_COMMAND!r}")
    return problems


def command_problems(readme: str) -> list[str]:
    """The ``.venv/bin/flower-pfl`` lines of ``readme``'s bash blocks that the command's own
    parser refuses, or whose ``--config``/``--set`` make no valid configuration (paths
    relative to the working directory)."""
    from flower_pfl import cli
    from flower_pfl.config import ConfigError

    problems = []
    for line in code_lines(readme, "bash"):
        command = line.split("&& ")[-1]
        if not command.startswith(".venv/bin/flower-pfl "):
            continue
        try:
            args = cli.build_parser().parse_args(shlex.split(command)[1:])
            if args.command in ("run", "validate", "deploy"):
                cli.load_config(Path(args.config), args.set or [])
        except SystemExit:  # argparse: an unknown command or flag (its message on stderr)
            problems.append(f"{command}: refused by flower-pfl's parser")
        except ConfigError as exc:
            problems.append(f"{command}: {str(exc).splitlines()[-1].strip()}")
    return problems


def index_problems(readme: str, pages: list[Path]) -> list[str]:
    """The Markdown ``pages`` of docs/ (the result folders' notes aside: docs/RESULTS.md
    links them) that ``readme``'s docs index does not link."""
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in LINK.findall(FENCE.sub("", readme))}
    return [f"README.md's docs index does not link {p.relative_to(ROOT)}" for p in pages
            if p.relative_to(ROOT).parts[:1] == ("docs",)
            and p.relative_to(ROOT).parts[1] != "results" and p.resolve() not in linked]


def test_readme_is_one_page_with_the_two_commands_and_ci_runs_its_test_command():
    assert readme_problems(README.read_text(), (ROOT / ".ci" / "run").read_text()) == []
    # each part exists: the setup script, the console script `run`, pytest-xdist's -n
    assert (ROOT / "scripts" / "setup.sh").is_file()
    assert 'flower-pfl = "flower_pfl.cli:main"' in (ROOT / "pyproject.toml").read_text()
    from flower_pfl import cli

    assert cli.build_parser().parse_args(["run"]).command == "run"
    assert importlib.util.find_spec("xdist") is not None


def test_the_readme_flower_pfl_commands_parse_and_their_configurations_validate(
        tmp_path, monkeypatch):
    """Relative paths from the repository's root; the own-data example's ``patients.csv``
    made here."""
    readme = README.read_text()
    used = {shlex.split(c.split("&& ")[-1])[1] for c in code_lines(readme, "bash")
            if c.split("&& ")[-1].startswith(".venv/bin/flower-pfl ")}
    assert used >= {"run", "validate", "deploy", "certs"}
    (tmp_path / "patients.csv").write_text("age,bmi,outcome\n51,31.2,yes\n40,22.5,no\n")
    for name in ("configs", "simulation.yaml"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    assert command_problems(readme) == []


def test_the_readme_python_example_calls_run_as_it_is():
    """The README's ``flower_pfl.run(...)`` call binds to the function's signature, its
    configuration and overrides validate, and the columns it reads are rounds.csv's."""
    import flower_pfl
    from flower_pfl import api
    from flower_pfl.learning.metrics import STAT_KEYS

    block = "\n".join(code_lines(README.read_text(), "python"))
    calls = [n for n in ast.walk(ast.parse(block)) if isinstance(n, ast.Call)
             and ast.unparse(n.func) == "flower_pfl.run"]
    assert len(calls) == 1
    args = [ast.literal_eval(a) for a in calls[0].args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in calls[0].keywords if k.arg}
    bound = inspect.signature(flower_pfl.run).bind(*args, **kwargs)
    own = {"backend", "quiet", "timeout", "ray_address"}  # run's own, not configuration keys
    assert bound.arguments.get("backend", "simulation") in api.BACKENDS
    api.load_config(*args, **{k: v for k, v in kwargs.items() if k not in own})
    columns = {"round"} | {f"{side}_{k}" for side in ("personal", "global") for k in STAT_KEYS}
    read = [c for n in ast.walk(ast.parse(block)) if isinstance(n, ast.Subscript)
            and isinstance(n.slice, ast.List) for c in ast.literal_eval(n.slice)]
    assert read and set(read) <= columns, set(read) - columns


def test_the_readme_indexes_every_docs_page():
    pages = [f for f in markdown_files() if f.is_file()]
    assert ROOT / "docs" / "testing.md" in pages
    assert index_problems(README.read_text(), pages) == []


def test_the_readme_checks_find_a_long_page_a_changed_command_a_bad_flag_and_a_gap(tmp_path,
                                                                                 monkeypatch):
    readme, ci = README.read_text(), (ROOT / ".ci" / "run").read_text()
    long = readme + "\n" * (README_MAX_LINES - len(readme.splitlines()) + 1)
    assert len(readme_problems(long, ci)) == 1
    assert len(readme_problems(readme.replace("-q -n 2", "-q -n 4"), ci)) == 1
    assert len(readme_problems(readme, ci.replace("-q -n 2", "-q -n 4"))) == 1
    assert len(readme_problems(readme.replace(RUN_COMMAND, "bash scripts/setup.sh"), ci)) == 1
    monkeypatch.chdir(tmp_path)
    bad = ("```bash\n.venv/bin/flower-pfl run --sett rounds=5\n"
           ".venv/bin/flower-pfl validate --set hyper.fedamp.sigmaa=1\n"
           ".venv/bin/flower-pfl deploy --certs certs/ --set clients=3  # a comment\n```\n")
    problems = command_problems(bad)
    assert len(problems) == 2 and "--sett" in problems[0] and "sigmaa" in problems[1]
    page = ROOT / "docs" / "testing.md"
    assert index_problems("[t](docs/testing.md)", [page]) == []
    assert index_problems("[t](docs/testing.md)", [page, ROOT / "docs" / "layout.md"]) == [
        "README.md's docs index does not link docs/layout.md"]
    assert index_problems("", [ROOT / "docs" / "results" / "x" / "notes.md"]) == []
