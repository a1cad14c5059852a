"""What `flower-pfl run` and `flower-pfl bench` print (flower_pfl/reporting/console.py and
its parts log_lines.py, console_output.py).

The fast tests feed the console the lines of a real `flwr run --stream` (captured below,
ANSI codes and Flower's History dump included) and check what a researcher sees: one line
per round, none of the noise, no colour codes when piped, the closing summary from a real
run's summary.json.  The slow tests run a real short `flower-pfl run` (Ray) piped and with
--verbose.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flower_pfl.reporting import console, console_output, log_lines
from flower_pfl.running import inprocess
from tests.conftest import small_config

REPO = Path(__file__).resolve().parent.parent
NOISE = ("History", "Flower configuration not found", "SuperNodes changed", "FutureWarning",
         "warnings.warn(", "will NOT be used", "configure_fit", "[ROUND", "Using SuperLink",
         "Successfully installed")

RAW = [  # a real `flwr run --stream` of 3 rounds (4 clients, mclr, pathological), as piped
    "/work/main/.venv/lib/python3.11/site-packages/flwr_datasets/partitioner/patholog"
    "ical_partitioner.py:190: UserWarning: Classes: [5, 6, 7, 8, 9] will NOT be used "
    "due to the chosen configuration. If it is undesired behavior consider setting 'f"
    "irst_class_deterministic_assignment=True' which in case when the number of class"
    "es is smaller than the number of partitions will utilize all the classes for the"
    " created partitions.",
    '  warnings.warn(',
    '',
    'Flower configuration not found. Created default configuration at /tmp/flower-pfl'
    '-wfwf3c1m/flwr-home/config.toml',
    '',
    'Using SuperLink: local (127.0.0.1:33983)',
    'Successfully started run 11932931054528870437',
    '\x1b[92mINFO \x1b[0m:      Starting logstream for run_id `11932931054528870437`',
    '\x1b[92mINFO \x1b[0m:      Starting Flower Simulation',
    '\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes changed'
    ' from 10 to 2.',
    '\x1b[92mINFO \x1b[0m:      Federation `@none/default` (4 simulated SuperNodes)',
    '\x1b[92mINFO \x1b[0m:      To change federation size, use the following command:',
    '\x1b[92mINFO \x1b[0m:      \tflwr federation simulation-config @none/default <su'
    'perlink> --num-supernodes <N>',
    'Successfully installed flower-pfl to /tmp/flower-pfl-wfwf3c1m/flwr-home/apps/flo'
    'wer-pfl.flower-pfl.0.1.0.d2e15b3b.',
    '\x1b[92mINFO \x1b[0m:      Starting Flower ServerApp, config: num_rounds=3, no r'
    'ound_timeout',
    '\x1b[92mINFO \x1b[0m:      ',
    '\x1b[92mINFO \x1b[0m:      [INIT]',
    '\x1b[92mINFO \x1b[0m:      [flower-pfl] strategy=fedavg clients=4 rounds=3 model'
    '=mclr (7850 parameters); results -> /tmp/h27/out/raw1',
    '\x1b[92mINFO \x1b[0m:      Using initial global parameters provided by strategy',
    '\x1b[92mINFO \x1b[0m:      ',
    '\x1b[92mINFO \x1b[0m:      [ROUND 1]',
    '/work/main/.venv/lib/python3.11/site-packages/ray/_private/worker.py:2051: Futur'
    'eWarning: Tip: In future versions of Ray, Ray will no longer override accelerato'
    'r visible devices env var if num_gpus=0 or num_gpus=None (default). To enable th'
    'is behavior and turn off this error message, set RAY_ACCEL_ENV_VAR_OVERRIDE_ON_Z'
    'ERO=0',
    '  warnings.warn(',
    '\x1b[92mINFO \x1b[0m:      configure_fit: strategy sampled 2 clients (out of 4)',
    '\x1b[92mINFO \x1b[0m:      aggregate_fit: received 2 results and 0 failures',
    '\x1b[92mINFO \x1b[0m:      configure_evaluate: strategy sampled 4 clients (out o'
    'f 4)',
    '\x1b[92mINFO \x1b[0m:      aggregate_evaluate: received 4 results and 0 failures',
    '\x1b[92mINFO \x1b[0m:      [flower-pfl] round 1: personalized accuracy mean 0.33'
    '10 weighted 0.3537 std 0.3344 worst10% 0.0000 top10% 0.7295 min 0.0000 | best me'
    'an 0.3310 | global accuracy mean 0.3310 | 4 clients answered, 0 did not | device'
    's cpu x4',
    '\x1b[92mINFO \x1b[0m:      ',
    '\x1b[92mINFO \x1b[0m:      [ROUND 2]',
    '\x1b[92mINFO \x1b[0m:      configure_fit: strategy sampled 2 clients (out of 4)',
    '\x1b[92mINFO \x1b[0m:      aggregate_fit: received 2 results and 0 failures',
    '\x1b[92mINFO \x1b[0m:      configure_evaluate: strategy sampled 4 clients (out o'
    'f 4)',
    '\x1b[92mINFO \x1b[0m:      aggregate_evaluate: received 4 results and 0 failures',
    '\x1b[92mINFO \x1b[0m:      [flower-pfl] round 2: personalized accuracy mean 0.39'
    '96 weighted 0.3617 std 0.3075 worst10% 0.0000 top10% 0.8649 min 0.0000 | best me'
    'an 0.3996 | global accuracy mean 0.3996 | 4 clients answered, 0 did not | device'
    's cpu x4',
    '\x1b[92mINFO \x1b[0m:      ',
    '\x1b[92mINFO \x1b[0m:      [ROUND 3]',
    '\x1b[92mINFO \x1b[0m:      configure_fit: strategy sampled 2 clients (out of 4)',
    '\x1b[92mINFO \x1b[0m:      aggregate_fit: received 2 results and 0 failures',
    '\x1b[92mINFO \x1b[0m:      configure_evaluate: strategy sampled 4 clients (out o'
    'f 4)',
    '\x1b[92mINFO \x1b[0m:      aggregate_evaluate: received 4 results and 0 failures',
    '\x1b[92mINFO \x1b[0m:      [flower-pfl] round 3: personalized accuracy mean 0.45'
    '06 weighted 0.5000 std 0.2317 worst10% 0.1486 top10% 0.7541 min 0.1486 | best me'
    'an 0.4506 | global accuracy mean 0.4506 | 4 clients answered, 0 did not | device'
    's cpu x4',
    '\x1b[92mINFO \x1b[0m:      [flower-pfl] final per-round table: /tmp/h27/out/raw1'
    '/rounds.csv',
    '\x1b[92mINFO \x1b[0m:      [flower-pfl] per-client table: /tmp/h27/out/raw1/clie'
    'nts.csv',
    '\x1b[92mINFO \x1b[0m:      ',
    '\x1b[92mINFO \x1b[0m:      [SUMMARY]',
    '\x1b[92mINFO \x1b[0m:      Run finished 3 round(s) in 19.58s',
    '\x1b[92mINFO \x1b[0m:      \tHistory (loss, distributed):',
    '\x1b[92mINFO \x1b[0m:      \t\tround 1: 5.251730086955618',
    '\x1b[92mINFO \x1b[0m:      \t\tround 2: 5.559668743864019',
    '\x1b[92mINFO \x1b[0m:      \t\tround 3: 3.1297486487855304',
    '\x1b[92mINFO \x1b[0m:      \tHistory (metrics, distributed, fit):',
    "\x1b[92mINFO \x1b[0m:      \t{'fit_clients': [(1, 2), (2, 2), (3, 2)],",
    "\x1b[92mINFO \x1b[0m:      \t 'fit_failures': [(1, 0), (2, 0), (3, 0)],",
    "\x1b[92mINFO \x1b[0m:      \t 'train_loss': [(1, 0.6652165364385361),",
    '\x1b[92mINFO \x1b[0m:      \t                (2, 0.3577798745661442),',
    '\x1b[92mINFO \x1b[0m:      \t                (3, 1.162836616455267)]}',
    '\x1b[92mINFO \x1b[0m:      \tHistory (metrics, distributed, evaluate):',
    "\x1b[92mINFO \x1b[0m:      \t{'eval_answered': [(1, 4), (2, 4), (3, 4)],",
    "\x1b[92mINFO \x1b[0m:      \t 'eval_missing': [(1, 0), (2, 0), (3, 0)],",
    '\x1b[92mINFO \x1b[0m:      ',
    '\x1b[92mINFO \x1b[0m:      ',
]


def _feed(lines, **kwargs) -> str:
    buf = io.StringIO()
    c = console.RunConsole(kwargs.pop("rounds", 3), stream=buf, **kwargs)
    with c:
        for line in lines:
            c.feed(line + "\n")
    return buf.getvalue()


CHECKPOINT = ("\x1b[92mINFO \x1b[0m:      [flower-pfl] checkpoint after round {k} written: "
              "/tmp/out/run/checkpoint/round-{k:06d} (0.01 s)")


def _twenty_rounds() -> list[str]:
    """The captured run stretched to 20 rounds: its round block repeated, numbers changed,
    with the checkpoint line a run writes every 5 rounds (checkpoint-every: 5)."""
    start = RAW.index(next(x for x in RAW if "[ROUND 1]" in x)) - 1
    end = RAW.index(next(x for x in RAW if "[ROUND 2]" in x)) - 1
    tail = RAW.index(next(x for x in RAW if "final per-round table" in x))
    block = RAW[start:end]
    lines = RAW[:start]
    for k in range(1, 21):
        lines += [x.replace("[ROUND 1]", f"[ROUND {k}]").replace("round 1:", f"round {k}:")
                  for x in block]
        if k % 5 == 1 and k > 1:  # written when round k starts
            lines.insert(len(lines) - len(block) + 2, CHECKPOINT.format(k=k - 1))
    return lines + RAW[tail:]


def test_default_console_shows_rounds_and_hides_the_noise():
    out = _feed(RAW, clients=4, actors=2)
    assert "\x1b[" not in out  # piped: no colour codes
    for noise in NOISE:
        assert noise not in out, noise
    rounds = [ln for ln in out.splitlines() if re.match(r"round \d/3 ", ln)]
    assert len(rounds) == 3
    # the numbers are the strategy's line's, in percent
    assert "personalized 45.06%  worst-10% 14.86%  top-10% 75.41%  best 45.06%" in rounds[2]
    assert "global 45.06%" in rounds[2] and "ETA" in rounds[2]
    assert "devices cpu x4" in rounds[0] and "devices" not in rounds[1]  # only when it changes
    # the start line, and flwr-datasets' warning once, as one short note
    assert "run 11932931054528870437: starting Ray with 4 clients, 2 at a time" in out
    assert out.count("classes [5, 6, 7, 8, 9] to no client") == 1


def test_a_twenty_round_run_fits_in_thirty_lines_and_its_last_lines_are_rounds():
    out = _feed(_twenty_rounds(), rounds=20, clients=4).splitlines()
    # + the launcher's header line and the 4-line summary (run, results, personalized,
    # global) that `flower-pfl run` prints around these
    assert len(out) + 5 <= 30, out
    assert re.match(r"round 20/20 ", out[-1])
    assert not any("History" in ln or "\t" in ln for ln in out)
    assert [ln.split(":")[0] for ln in out if "checkpoint" in ln] == [
        f"[flower-pfl] checkpoint after round {k} written" for k in (5, 10, 15)]


def test_verbose_shows_flowers_own_log_without_colour_when_piped():
    out = _feed(RAW, verbose=True)
    assert "[ROUND 1]" in out and "History (loss, distributed)" in out
    assert "configure_fit: strategy sampled 2 clients" in out
    assert "\x1b[" not in out


def test_warnings_errors_and_unknown_lines_are_never_hidden():
    lines = ["\x1b[93mWARNING \x1b[0m:   [flower-pfl] round 2: fit of partition-id 3 failed: "
             "timeout", "\x1b[91mERROR \x1b[0m:     ServerApp thread raised an exception",
             "Traceback (most recent call last):", '  File "x.py", line 1, in <module>']
    out = _feed(lines)
    assert "WARNING: [flower-pfl] round 2: fit of partition-id 3 failed: timeout" in out
    assert "ERROR: ServerApp thread raised an exception" in out
    assert "Traceback (most recent call last):" in out and 'File "x.py"' in out


def test_quiet_shows_warnings_but_no_rounds():
    out = _feed(RAW + ["\x1b[93mWARNING \x1b[0m:   something odd"], quiet=True)
    assert "round 1/3" not in out and "WARNING: something odd" in out


def test_the_progress_bar_on_a_terminal_keeps_the_round_lines():
    buf = io.StringIO()
    c = console.RunConsole(3, stream=buf, bar=True)
    c.out.color = True
    with c:
        for line in RAW:
            c.feed(line + "\n")
    text = log_lines.strip_ansi(buf.getvalue())
    assert "round 3/3  personalized 45.06%" in text
    assert "ETA" not in [ln for ln in text.splitlines() if ln.startswith("round 3/3")][0]


def test_parse_round_reads_the_strategy_line_and_refuses_others():
    line = next(x for x in RAW if "round 2: personalized" in x)
    r = log_lines.parse_round(line)
    assert (r.round, r.mean, r.worst10, r.best, r.global_, r.answered, r.missing) == \
        (2, 0.3996, 0.0, 0.3996, 0.3996, 4, 0)
    assert log_lines.parse_round("[flower-pfl] round 2: something else") is None
    mse = log_lines.RoundInfo(4, "mse", 0.5, 0.9, 0.1, 0.4, None, 3, 1, "")
    assert log_lines.format_round(mse, 10) == ("round  4/10  personalized mse 0.5000  "
                                               "worst-10% 0.9000  top-10% 0.1000  best 0.4000"
                                               " | 1 client(s) did not answer")


def test_eta_leaves_the_first_round_out():
    t = console_output.RoundTracker(10)
    t.started, t.first = 0.0, 1
    t.first_done_t, t.done = 30.0, 1  # round 1 took 30 s (Ray's start)
    assert t.eta(now=30.0) is None  # no round after the first yet: no ETA, not 9 x 30 s
    t.done = 3  # rounds 2 and 3 took 4 s and 6 s
    assert t.eta(now=40.0) == 7 * 5.0
    t.done = 10
    assert t.eta(now=80.0) == 0.0


def test_eta_of_a_resumed_run_counts_from_its_own_first_round():
    t = console_output.RoundTracker(20)
    t.started, t.first = 0.0, 6  # resumed after round 5: round 6 carries the start-up
    t.first_done_t, t.done = 50.0, 6
    assert t.eta(now=50.0) is None
    t.done = 8  # rounds 7 and 8: 3 s together
    assert t.eta(now=53.0) == 12 * 1.5


def test_round_lines_show_no_eta_until_a_round_after_the_first_and_share_the_summary_clock(
        monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(console.time, "time", lambda: now[0])  # a clock the test moves
    c = console.RunConsole(3, stream=io.StringIO(), bar=False)
    now[0] = 1010.0  # the launcher's preflight ran before the console was entered
    with c:
        for line in RAW:
            if "round 1: personalized" in line:
                now[0] += 60.0  # round 1 (with Ray's start) took 60 s
            elif re.search(r"round [23]: personalized", line):
                now[0] += 15.0  # rounds 2 and 3: 15 s each
            c.feed(line + "\n")
    rounds = [ln for ln in c.out.stream.getvalue().splitlines() if re.match(r"round \d/3 ", ln)]
    assert rounds[0].endswith("| 1m00s") and "ETA" not in rounds[0]
    assert rounds[1].endswith("| 1m15s, ETA 15s")
    assert rounds[2].endswith("| 1m30s, ETA 0s")
    assert c.elapsed() == 90.0  # what the closing summary prints: the round lines' clock


def test_summary_gives_final_and_best_of_a_real_run(tmp_path):
    cfg = small_config(strategy="fedavg", rounds=3, clients=3, model="mclr",
                       **{"data.subsample": 1500, "train.batch-size": 50})
    inprocess.run(cfg, tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    lines = console.summary_lines(tmp_path, 75.0)
    final = summary["final"]
    best = max(summary["rounds"], key=lambda r: r["personal_mean"])
    assert lines[0] == "[flower-pfl] run completed: 3 evaluated round(s) in 1m15s"
    assert lines[-2] == (f"  personalized accuracy: final {100 * final['personal_mean']:.2f}% "
                         f"(round 3), best {100 * best['personal_mean']:.2f}% (round "
                         f"{best['round']}), worst-10% {100 * final['personal_worst10_mean']:.2f}%")
    assert lines[-1].startswith(f"  global model accuracy: final "
                                f"{100 * final['global_mean']:.2f}% (round 3)")


def test_bench_console_shows_the_cell_and_the_round_inside_it():
    buf = io.StringIO()
    b = console.BenchConsole(4, stream=buf, bar=True)
    b.out.color = True
    with b:
        b.log("[bench] m: 4 cells (0 done, 4 to run)")
        b.cell(2, "prac/fedavg/seed-1", 3)
        for line in RAW[:-20]:  # up to round 3's line
            b.feed(line + "\n")
        tasks = {t.description: t for t in b.out.progress.tasks}
        assert tasks["cell 2/4"].completed == 1
        assert tasks["prac/fedavg/seed-1: round 3/3"].completed == 3
        b.cells_done(2, 30.0)
        assert b.out.progress.tasks[0].completed == 2
    text = log_lines.strip_ansi(buf.getvalue())
    assert "[bench] m: 4 cells" in text and "History" not in text
    # piped: the bench's own lines only (a cell's rounds would be thousands of lines)
    buf = io.StringIO()
    with console.BenchConsole(4, stream=buf) as b:
        b.cell(1, "prac/fedavg/seed-0", 3)
        for line in RAW:
            b.feed(line + "\n")
        b.log("[bench] cell 1/4 prac/fedavg/seed-0: completed in 20s")
    assert buf.getvalue() == "[bench] cell 1/4 prac/fedavg/seed-0: completed in 20s\n"


# ------------------------------------------------------------------------ the CLI
def test_every_subcommand_has_help(capsys):
    from flower_pfl.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    helps = {c.dest: c.help for c in sub._choices_actions}
    assert set(helps) == set(sub.choices) and all(helps.values()), helps


def test_strategies_list_fits_100_columns_and_one_strategy_shows_its_hyper(capsys):
    from flower_pfl import registry
    from flower_pfl.cli import main

    assert main(["strategies"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert max(len(ln) for ln in out) <= 100
    assert [ln.split()[0] for ln in out[:len(registry.REGISTRY)]] == list(registry.REGISTRY)
    assert main(["strategies", "fedamp"]) == 0
    out = capsys.readouterr().out
    assert max(len(ln) for ln in out.splitlines()) <= 100
    for key, h in registry.REGISTRY["fedamp"].hyper.items():
        assert f"    {key} = {h.default!r}" in out
    assert main(["strategies", "fedampp"]) == 2
    assert "did you mean 'fedamp'?" in capsys.readouterr().err


def test_set_errors_name_the_override_not_the_file(capsys):
    from flower_pfl.cli import main

    assert main(["validate", "--set", "rounds=-2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flower-pfl: invalid --set rounds=-2 (on top of ")
    assert "'rounds' = -2 is out of range" in err


# ------------------------------------------------------------------- real runs (Ray)
def _run(tmp_path, *extra):
    cmd = [str(Path(sys.executable).parent / "flower-pfl"), "run", "--set", "rounds=3",
           "--set", "clients=4", "--set", "model=mclr", "--set", "data.subsample=3000",
           "--set", "data.partition=pathological", "--set", f"output-dir={tmp_path}",
           "--set", "run-name=r", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)


@pytest.mark.slow  # starts Ray through `flwr run`
def test_real_run_default_console(tmp_path):
    out = _run(tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert "\x1b[" not in out.stdout and "History" not in out.stdout
    for noise in NOISE:
        assert noise not in out.stdout, noise
    assert len([ln for ln in lines if re.match(r"round \d/3 ", ln)]) == 3
    assert lines[-2].startswith("  personalized accuracy: final ") and "best" in lines[-2]
    assert lines[-1].startswith("  global model accuracy: final ")
    assert len(lines) <= 12, lines
    assert "History" in (tmp_path / "r" / "flwr-run.log").read_text()  # all kept there


@pytest.mark.slow  # starts Ray through `flwr run`
def test_real_run_verbose_shows_flowers_log(tmp_path):
    out = _run(tmp_path, "--verbose")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "[ROUND 1]" in out.stdout and "History (metrics, distributed, evaluate)" in out.stdout
    assert "\x1b[" not in out.stdout  # piped
    assert "  personalized accuracy: final " in out.stdout.splitlines()[-2]


def test_rays_worker_death_line_becomes_one_note_naming_the_pid():
    from flower_pfl.reporting.log_lines import classify

    raw = ("\x1b[33m(raylet)\x1b[0m A worker died or was killed while executing a task by an "
           "unexpected system error. To troubleshoot the problem, check the logs for the dead "
           "worker. RayTask ID: ffff Worker ID: 01ab Node ID: 9c Worker IP address: 192.0.2.2 "
           "Worker port: 10003 Worker PID: 8270 Worker exit type: SYSTEM_ERROR")
    kind, text = classify(raw)
    assert kind == "note"
    assert text.startswith("note: Ray: worker process 8270 died")
    assert classify("A worker pool was resized")[0] != "note"  # not every Ray line
