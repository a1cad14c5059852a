"""Mutation suite: switch each algorithm's idea off, one at a time, and see a test fail.

Every registered strategy's mechanisms (attention weights, thresholds, prox terms, meta
steps, control variates, personal heads and layers, perturbations, hypernetwork updates,
fine-tuning, aggregation rules, ...) appear in tests/mutations/data/ as a
mutation (:class:`tests.mutations.mutation_table.Mutation`): one small patch (``old`` text ->
``new`` text in one file) that turns the mechanism off while the code still runs, and the test
targets (files or ``file::test`` node ids) that should notice.
The runner takes one snapshot of the repository's source (flower_pfl/, strategies/,
clients/, tests/, benchmarks/, configs/, pyproject.toml, simulation.yaml -- not .venv,
docs/ or .git); for each mutation it copies the snapshot to a scratch folder, applies
the patch (it must match exactly once, so a patch cannot silently rot when the code
changes), and runs

    <python> -m pytest -x -q -p no:cacheprovider -m "not slow" <targets>

there, with PYTHONPATH set so that the scratch copy's packages shadow the editable
install (checked before anything runs; ``--sanity`` shows it) and every target must
select at least one test. A failing test KILLS the mutation; a mutation
that passes every target SURVIVED, which means a missing test: add one that fails under
the mutation (never weaken the mutation). Before the mutations, the unmutated copy runs
every target once (the baseline); it must pass, or the suite stops.

By default each such pytest is not a new interpreter but a fork of a warm parent
(tests/mutations/mutation_fork.py, one per job) that imported torch, Flower, dp-accounting,
... once and never this project's code: the child chdirs into the scratch copy, takes the same
environment and ``sys.path`` and runs the same pytest command line, so its exit status and
output are those of the subprocess (most of a subprocess's ~3 s was those imports).
``--no-fork`` runs every pytest as a subprocess, as before.

Output: a markdown table (mutation, strategies, killed by, seconds) on stdout and in
``--out``; exit status 1 if a mutation survived (or errored). Every registered strategy
must be covered by at least one mutation (checked at start): a new strategy adds its
mutations to tests/mutations/data/<its catalog module>.yaml (README.md there).

    python tests/mutations/mutations.py --jobs 1 [--only NAME ...] [--kind subtle]
                                   [--out docs/mutations.md] [--no-fork]
    python tests/mutations/mutations.py --list       # the mutations, their files and targets
    python tests/mutations/mutations.py --sanity     # show that the scratch copy is imported
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from tests.mutations.mutation_fork import WarmRunner  # noqa: E402
from tests.mutations.mutation_table import (  # noqa: E402
    KINDS,
    ROOT,
    Mutation,
    check_coverage,
    check_patches,
    check_placement,
    check_targets,
    load_mutations,
)

MUTATIONS = load_mutations()
#: what a scratch copy holds (everything the tests import or read)
COPY = ("flower_pfl", "strategies", "clients", "tests", "benchmarks", "configs",
        "pyproject.toml", "simulation.yaml")
PACKAGES = ("flower_pfl", "flower_pfl.strategies", "flower_pfl.clients")
PYTEST = ("-x", "-q", "-p", "no:cacheprovider", "-m", "not slow")
TIMEOUT_S = 600


def make_scratch(parent: Path, source: Path = ROOT) -> Path:
    """A copy of ``source``'s files named in COPY, in a new folder under ``parent``; a copy of
    the repository leaves its bytecode behind, a copy of a snapshot takes the snapshot's
    (:func:`warm_bytecode`)."""
    dest = Path(tempfile.mkdtemp(prefix="mut-", dir=parent))
    ignore = shutil.ignore_patterns(".pytest_cache", "*.egg-info", *(
        ("__pycache__", "*.pyc") if source.resolve() == ROOT.resolve() else ()))
    for name in COPY:
        src = source / name
        if src.is_symlink():  # the top-level strategies/ and clients/: links into the package
            os.symlink(os.readlink(src), dest / name)
        elif src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, dest / name)
    return dest


def warm_bytecode(python: str, snapshot: Path, targets: Sequence[str]) -> list[str]:
    """Compile ``snapshot`` once for every mutation's copy of it: each module to a
    ``checked-hash`` .pyc (PEP 552: the interpreter compares the hash of the source with the
    one in the .pyc at every import, so the one file a mutation changes is compiled afresh from
    its new text, never taken from the cache), then pytest's rewritten test modules, by
    collecting ``targets`` there with bytecode written (pytest 9 checks those by the source's
    hash too). Without it every mutation's pytest compiled the ~300 modules it imports
    (~0.4 s a mutation). Returns :func:`uncollected` of ``targets`` (the same collection)."""
    subprocess.run([python, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode",
                    "checked-hash", *(str(snapshot / n) for n in COPY
                                      if (snapshot / n).is_dir()
                                      and not (snapshot / n).is_symlink())],
                   check=True, capture_output=True, text=True, timeout=TIMEOUT_S)
    return uncollected(python, snapshot, targets, write_bytecode=True)


def apply(mutation: Mutation, scratch: Path) -> None:
    path = scratch / mutation.file
    text = path.read_text()
    if text.count(mutation.old) != 1:
        raise SystemExit(f"mutation {mutation.name}: old text not found exactly once in "
                         f"{mutation.file}")
    path.write_text(text.replace(mutation.old, mutation.new))


def env_for(scratch: Path) -> dict[str, str]:
    """The environment of a pytest run in ``scratch``: this one, the copy's packages first on
    the path, and no PYTEST_ADDOPTS (a caller's ``-k`` there would select the suite's tests
    for it: the targets and PYTEST decide what runs)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = os.pathsep.join([str(scratch)] + ([env["PYTHONPATH"]]
                                                          if env.get("PYTHONPATH") else []))
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def imported_from(python: str, scratch: Path, runner: WarmRunner | None = None
                  ) -> dict[str, str]:
    """Where a process started like the pytest runs (a fork of ``runner``'s warm parent,
    or a new interpreter) imports the packages from."""
    code = ("import importlib\n"
            f"for name in {PACKAGES!r}:\n"
            "    print(name, importlib.import_module(name).__file__)\n")
    if runner is not None:
        rc, out, err, _ = runner.run(scratch, env_for(scratch), code=code, timeout=TIMEOUT_S)
        if rc != 0:
            raise SystemExit(f"the warm runner's probe failed (exit {rc}): {err[-3000:]}")
    else:
        out = subprocess.run([python, "-c", code], cwd=scratch, env=env_for(scratch),
                             capture_output=True, text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in out.strip().splitlines())


def check_shadowing(python: str, scratch: Path, runner: WarmRunner | None = None
                    ) -> dict[str, str]:
    where = imported_from(python, scratch, runner)
    wrong = {k: v for k, v in where.items()
             if not Path(v).resolve().is_relative_to(scratch.resolve())}
    if wrong:
        raise SystemExit(f"the scratch copy does not shadow the installed packages: {wrong}")
    return where


def run_pytest(python: str, scratch: Path, targets: Sequence[str], stop_first: bool = True,
               runner: WarmRunner | None = None) -> tuple[int, str, float]:
    """``python -m pytest`` of ``targets`` in ``scratch`` (in a fork of ``runner``'s warm
    parent when given): (exit status, -1 on the timeout; stdout + stderr; seconds)."""
    args = [python, "-m", "pytest", *(PYTEST if stop_first else PYTEST[1:]), *targets]
    started = time.perf_counter()
    if runner is not None:
        rc, out, err, timed_out = runner.run(scratch, env_for(scratch), args[3:],
                                             timeout=TIMEOUT_S)
        # on the timeout, subprocess.run's exception holds the stdout only
        return (-1, out, time.perf_counter() - started) if timed_out else (
            rc, out + err, time.perf_counter() - started)
    try:
        proc = subprocess.run(args, cwd=scratch, env=env_for(scratch), capture_output=True,
                              text=True, timeout=TIMEOUT_S)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc = -1
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    return rc, out, time.perf_counter() - started


def uncollected(python: str, scratch: Path, targets: Sequence[str],
                write_bytecode: bool = False) -> list[str]:
    """Targets that select no test under ``-m "not slow"`` (renamed, or marked slow): a
    mutation aimed at them would die of pytest's "no tests ran", not of a failing test."""
    args = [python, "-m", "pytest", "--collect-only", "-q", *PYTEST[2:], *targets]
    env = env_for(scratch)
    if write_bytecode:
        del env["PYTHONDONTWRITEBYTECODE"]
    proc = subprocess.run(args, cwd=scratch, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    ids = [line.strip() for line in proc.stdout.splitlines() if "::" in line]
    return [t for t in targets
            if not any(i == t or i.startswith(t + "[") or i.startswith(t + "::") for i in ids)]


def first_failure(output: str) -> str | None:
    """The first FAILED/ERROR node id of pytest's short summary (or of its error report)."""
    for line in output.splitlines():
        match = re.match(r"^(FAILED|ERROR) (\S+)", line)
        if match:
            return match.group(2)
    return None


def last_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def run_one(mutation: Mutation, python: str, parent: Path, source: Path,
            runners: queue.Queue[WarmRunner] | None = None) -> dict[str, Any]:
    """Apply ``mutation`` to a fresh copy of ``source`` and run its targets there (in a fork
    of a warm parent taken from ``runners``, or in a new interpreter)."""
    scratch = make_scratch(parent, source)
    runner = runners.get() if runners is not None else None
    try:
        apply(mutation, scratch)
        rc, out, seconds = run_pytest(python, scratch, mutation.tests, runner=runner)
    finally:
        if runners is not None and runner is not None:
            runners.put(runner)
        shutil.rmtree(scratch, ignore_errors=True)
    status, by = classify(rc, out)
    return {"mutation": mutation, "status": status, "by": by, "seconds": seconds,
            "output": out}


def classify(rc: int, out: str) -> tuple[str, str]:
    """(status, killed-by) of a mutation whose targets' pytest exited ``rc`` with output
    ``out``: only a failing test (1) or an error while collecting or running (2) kills it;
    0 is a survivor, and anything else -- 5, no test ran; 3, 4, pytest itself; -1, the
    timeout -- is an error, which fails the suite as a survivor does."""
    if rc == 0:
        return "survived", "**SURVIVED**"
    if rc in (1, 2):  # a test failed / an error while collecting or running
        return "killed", first_failure(out) or f"error: {last_line(out)}"
    if rc == -1:
        return "error", f"**TIMEOUT** after {TIMEOUT_S} s"
    return "error", f"**pytest exit {rc}**: {last_line(out)}"


def baseline_targets(mutations: Sequence[Mutation]) -> list[str]:
    """The union of the targets; a node id is dropped where its whole file is a target."""
    targets = list(dict.fromkeys(t for m in mutations for t in m.tests))
    files = {t for t in targets if "::" not in t}
    return [t for t in targets if "::" not in t or t.split("::")[0] not in files]


def table(results: Sequence[dict[str, Any]], command: str, total_s: float,
          baseline_s: float) -> str:
    killed = sum(r["status"] == "killed" for r in results)
    lines = [f"Command: `{command}`", "",
             f"{killed} of {len(results)} mutations killed; baseline {baseline_s:.0f} s, "
             f"whole suite {total_s:.0f} s.", "",
             "| mutation | kind | strategies | killed by | seconds |",
             "|---|---|---|---|---|"]
    for r in results:
        m = r["mutation"]
        lines.append(f"| `{m.name}` | {m.kind} | {', '.join(m.strategies)} | {r['by']} | "
                     f"{r['seconds']:.1f} |")
    return "\n".join(lines) + "\n"


NOTE = """# Mutation suite

Contributor note: a new strategy adds its mutations to `tests/mutations/data/<its
catalog module>.yaml` -- one small patch per mechanism of the algorithm (the idea switched
off while the code still runs) and the cheapest test that must fail under it; `python
tests/mutations/mutations.py --only NAME` checks it, and the suite refuses to start while a
registered strategy has no mutation. A mutation that survives means a missing test: add a
test that fails under it, never weaken the mutation.

Two kinds (the `kind` column): `switch-off` mutations turn a mechanism off; `subtle` ones
(`kind: subtle`, each file's last section) leave it running with one detail wrong -- a sign,
a factor of 2, a norm for a squared norm, two similar variables swapped, an axis -- and are
killed by tests whose inputs are asymmetric (unequal client sizes and step sizes, partial
participation), where such an error cannot cancel. `--kind subtle` runs only those.

"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1, help="mutations run at the same time")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutations")
    parser.add_argument("--kind", choices=KINDS,
                        help="run only the mutations of this kind (switch-off or subtle)")
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter that runs pytest (default: this one)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--sanity", action="store_true",
                        help="show where a scratch copy imports the packages from and exit")
    parser.add_argument("--skip-baseline", action="store_true",
                        help="do not run the unmutated targets first (when they have just "
                             "passed unmutated: .ci/run after the fast and slow tiers)")
    parser.add_argument("--no-fork", action="store_true",
                        help="run each pytest as a new interpreter, not as a fork of a warm "
                             "parent (tests/mutations/mutation_fork.py); the same verdicts, "
                             "slower")
    args = parser.parse_args(argv)

    problems = (check_patches(MUTATIONS) + check_coverage(MUTATIONS) + check_targets(MUTATIONS)
                + check_placement(MUTATIONS))
    if problems:
        print("mutation suite: " + "\n".join(problems), file=sys.stderr)
        return 2
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name}  ({m.kind})  [{', '.join(m.strategies)}]  {m.file}\n    " +
                  "\n    ".join(m.tests))
        return 0
    selected = list(MUTATIONS)
    if args.only:
        unknown = sorted(set(args.only) - {m.name for m in MUTATIONS})
        if unknown:
            print(f"unknown mutation(s): {unknown}; --list shows them", file=sys.stderr)
            return 2
        selected = [m for m in MUTATIONS if m.name in args.only]
    if args.kind:
        selected = [m for m in selected if m.kind == args.kind]

    started = time.perf_counter()
    parent = Path(tempfile.mkdtemp(prefix="flower-pfl-mutations-"))
    try:
        # one snapshot of the source: the baseline and every mutation start from it, so
        # edits made to the working tree while the suite runs do not mix in
        source = make_scratch(parent)
        problems = check_patches(MUTATIONS, source)
        if problems:
            print("mutation suite: " + "\n".join(problems), file=sys.stderr)
            return 2
        scratch = make_scratch(parent, source)
        where = check_shadowing(args.python, scratch)
        if args.sanity:
            for name, path in where.items():
                print(f"{name}.__file__ = {path}")
            if not args.no_fork:
                with WarmRunner(args.python, env_for(scratch)) as runner:
                    for name, path in check_shadowing(args.python, scratch, runner).items():
                        print(f"{name}.__file__ = {path} (in a fork of the warm parent)")
            probe = next(m for m in MUTATIONS if m.file.startswith("flower_pfl/strategies/"))
            apply(probe, scratch)
            print(f"scratch copy {scratch}: applied {probe.name} to {probe.file} "
                  f"({'mutated' if probe.new in (scratch / probe.file).read_text() else 'NOT'}"
                  f" in the copy; the repository's file is untouched: "
                  f"{probe.old in (ROOT / probe.file).read_text()})")
            return 0
        baseline_s = 0.0
        targets = baseline_targets(selected)
        # every target, not the baseline's union: a node id inside a file that is another
        # mutation's target would hide there
        missing = warm_bytecode(args.python, source,
                                list(dict.fromkeys(t for m in selected for t in m.tests)))
        if missing:
            print("these targets select no test (renamed, or marked slow; a mutation needs a "
                  "fast test that kills it): " + ", ".join(missing), file=sys.stderr)
            return 2
        if not args.skip_baseline:
            print(f"baseline: {len(targets)} target(s), unmutated ...", flush=True)
            rc, out, baseline_s = run_pytest(args.python, scratch, targets, stop_first=False)
            if rc != 0:
                print(out[-6000:], file=sys.stderr)
                print(f"baseline FAILED (pytest exit {rc}): the unmutated tests must pass "
                      "before mutations mean anything", file=sys.stderr)
                return 2
            print(f"baseline passed in {baseline_s:.0f} s: {last_line(out)}", flush=True)
        shutil.rmtree(scratch, ignore_errors=True)

        results: dict[str, dict[str, Any]] = {}
        jobs = max(1, args.jobs)
        if jobs > 1:  # each job's torch on one thread: jobs do not fight over the cores
            os.environ.setdefault("OMP_NUM_THREADS", "1")
        with contextlib.ExitStack() as stack:
            runners: queue.Queue[WarmRunner] | None = None
            if not args.no_fork:  # one warm parent per job, started with the jobs' env
                runners = queue.Queue()
                scratch = make_scratch(parent, source)
                for _ in range(jobs):
                    runner = stack.enter_context(WarmRunner(args.python, env_for(scratch)))
                    check_shadowing(args.python, scratch, runner)
                    runners.put(runner)
                shutil.rmtree(scratch, ignore_errors=True)
            pool = stack.enter_context(concurrent.futures.ThreadPoolExecutor(max_workers=jobs))
            futures = {pool.submit(run_one, m, args.python, parent, source, runners): m
                       for m in selected}
            for future in concurrent.futures.as_completed(futures):
                r = future.result()
                results[r["mutation"].name] = r
                print(f"{r['mutation'].name}: {r['status']} ({r['by']}, {r['seconds']:.1f} s)",
                      flush=True)
                if r["status"] != "killed":
                    print(r["output"][-3000:], flush=True)
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    ordered = [results[m.name] for m in selected]
    command = "python tests/mutations/mutations.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    text = table(ordered, command.strip(), time.perf_counter() - started, baseline_s)
    print("\n" + text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(NOTE + text)
    return 0 if all(r["status"] == "killed" for r in ordered) else 1


if __name__ == "__main__":
    sys.exit(main())
