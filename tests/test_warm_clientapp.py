"""The warm ClientApp launcher (flower_pfl/tuned/warm_clientapp.py, fork_server.py): a
SuperExec's ClientApp tasks forked from a parent that imported the heavy modules once.

Flower's own ``SubprocessExecutor.launch`` runs next to ours on the same task: the same
``flwr-clientapp`` arguments, handed to the warm parent instead of a new process.  A real
fork server (a marker module in place of torch, a reporting function in place of Flower's
ClientApp entry): each task runs in a child of the parent, which imported the marker
module -- the child did not; a configuration changed between two tasks is read afresh; a task of
another FAB gets a new parent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flwr.supercore.constant import TaskType
from flwr.supercore.superexec.executor import subprocess_executor
from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor
from flwr.supercore.superexec.executor.types import ExecutionSpec, LaunchResult

from flower_pfl.tuned import switch, warm_clientapp

ON_142 = {"flwr": "1.42.0", "ray": "2.55.1"}.get


def _spec(task_type=TaskType.CLIENT_APP, **changes) -> ExecutionSpec:
    fields = dict(task_type=task_type, runtime_api_address="127.0.0.1:9094", token="tok",
                  insecure=False, root_certificates_path="/certs/ca.crt",
                  runtime_dependency_install=False, parent_pid=4242, suppress_output=True,
                  task_id=7, fab_hash="fab1")
    return ExecutionSpec(**{**fields, **changes})  # type: ignore[arg-type]


class Taken:
    def __init__(self):
        self.argv = []

    def submit(self, argv, quiet=False, fab_hash=None):
        self.argv.append((argv, quiet, fab_hash))
        return True


@pytest.fixture
def installed(monkeypatch):
    switch.uninstall()
    started: list[list[str]] = []
    monkeypatch.setattr(subprocess_executor.subprocess, "Popen",
                        lambda args, **kw: started.append(args))
    server = Taken()
    monkeypatch.setattr(warm_clientapp, "SERVER", server)
    done = switch.install("tuned", process="superexec", version_of=ON_142,
                          log=lambda *a: None)
    yield done, started, server
    switch.uninstall()
    assert vars(SubprocessExecutor)["launch"] is warm_clientapp.flowers_own("launch")


def test_a_clientapp_task_goes_to_the_warm_parent_with_flowers_arguments(installed):
    done, started, server = installed
    assert done.replaced == ("warm_clientapp", "pull_backoff")
    executor = SubprocessExecutor()
    warm_clientapp.flowers_own("launch")(executor, _spec())  # Flower's: a new process
    assert executor.launch(_spec()) == LaunchResult.accepted()  # ours
    assert started == [["flwr-clientapp", "--runtime-api-address", "127.0.0.1:9094",
                        "--token", "tok", "--root-certificates", "/certs/ca.crt",
                        "--parent-pid", "4242"]]
    assert server.argv == [(started[0], True, "fab1")]
    executor.launch(_spec(insecure=True, parent_pid=None, suppress_output=False,
                          runtime_dependency_install=True, fab_hash=None))
    assert server.argv[-1] == (["flwr-clientapp", "--runtime-api-address", "127.0.0.1:9094",
                                "--token", "tok", "--insecure",
                                "--allow-runtime-dependency-installation"], False, None)


def test_other_tasks_and_a_refused_one_start_as_flowers(installed, monkeypatch):
    _, started, server = installed
    SubprocessExecutor().launch(_spec(TaskType.SERVER_APP))
    assert started[-1][0] == "flwr-serverapp" and server.argv == []
    monkeypatch.setattr(server, "submit", lambda *a, **k: False)  # its pipe broken
    SubprocessExecutor().launch(_spec())
    assert started[-1][0] == "flwr-clientapp" and len(started) == 2


def test_stock_and_a_changed_launch_keep_flowers(monkeypatch):
    switch.uninstall()
    assert switch.install("stock", process="superexec", log=lambda *a: None).replaced == ()
    assert not warm_clientapp.installed()

    def launch(self, spec):  # a later Flower's launch
        return LaunchResult.failed("changed")

    monkeypatch.setattr(SubprocessExecutor, "launch", launch)
    lines = []
    done = switch.install("tuned", process="superexec", version_of=ON_142,
                          log=lambda level, fmt, text: lines.append(text))
    assert done.replaced == () and SubprocessExecutor.launch is launch
    assert "subprocess_executor.SubprocessExecutor.launch: not the body" in lines[0]
    switch.uninstall()


HEAVY = "import os\nLOADED_BY = os.getpid()  # the process that imported this module\n"
REPORT = '''
import json, os, sys
def report():
    import warm_heavy  # imported here unless the parent preloaded it
    out, conf, shard = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(conf) as fh, open(shard, "rb") as data:
        value, rows = fh.read(), data.read().hex()
    with open(out, "a") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "shard": rows,
                             "loaded_by": warm_heavy.LOADED_BY, "conf": value}) + "\\n")
'''


def _reports(path, n):
    deadline = time.monotonic() + 60  # a bound on waiting, not a timed assertion
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= n:
            return [json.loads(line) for line in lines]
        time.sleep(0.02)
    raise AssertionError(f"{n} reports expected, {path} has fewer")


def test_each_task_runs_in_a_child_of_the_warm_parent_and_reads_its_config_afresh(tmp_path):
    """...and its shard: nothing of a node's configuration or data is kept in the parent."""
    (tmp_path / "warm_heavy.py").write_text(HEAVY)  # stands for torch
    (tmp_path / "warm_report.py").write_text(REPORT)  # stands for Flower's ClientApp entry
    out, conf, shard = tmp_path / "out.jsonl", tmp_path / "node.conf", tmp_path / "shard.npy"
    argv = ["flwr-clientapp", str(out), str(conf), str(shard)]
    server = warm_clientapp.ForkServer(
        [*warm_clientapp.SERVER_COMMAND, "--preload", "warm_heavy",
         "--run", "warm_report:report"], env={**os.environ, "PYTHONPATH": str(tmp_path)})
    try:
        conf.write_text("partition-id=0")
        shard.write_bytes(bytes([1, 2]))
        assert server.submit(argv, fab_hash="fab1")
        first = server.pid
        a, = _reports(out, 1)
        conf.write_text("partition-id=1")  # the node's configuration changed
        shard.write_bytes(bytes([3]))  # and its shard (flower-pfl partition again)
        assert server.submit(argv, fab_hash="fab1")
        b = _reports(out, 2)[1]
        assert server.pid == first and server.starts == 1
        assert server.submit(argv, fab_hash="fab2")
        c = _reports(out, 3)[2]
    finally:
        server.stop()
    # warm_heavy was imported by the parent, before the fork: the children did not import it
    assert a["ppid"] == a["loaded_by"] == first != a["pid"]
    assert b["ppid"] == first and b["pid"] not in (a["pid"], first)
    assert (a["conf"], b["conf"]) == ("partition-id=0", "partition-id=1")  # not stale
    assert (a["shard"], b["shard"]) == ("0102", "03")
    # another FAB: a new parent (its code could differ), which imported warm_heavy anew
    assert server.starts == 2 and c["ppid"] == c["loaded_by"] != first
    assert server.pid is None


def test_the_fork_server_imports_nothing_of_this_project():
    probe = ("import runpy, sys; sys.argv = ['x', 'flwr-clientapp', '--preload', '']; "
             "sys.stdin = open('/dev/null'); "
             f"runpy.run_path({str(warm_clientapp.SERVER_COMMAND[1])!r}, run_name='__main__'); "
             "print(sorted(m for m in sys.modules if m.startswith('flower_pfl')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_parent_that_cannot_start_leaves_the_tasks_to_flowers_launcher(tmp_path):
    server = warm_clientapp.ForkServer(
        [*warm_clientapp.SERVER_COMMAND, "--preload", "no_such_module_here"],
        stderr=subprocess.DEVNULL)
    assert not server.submit(["flwr-clientapp", "--help"])
    assert not server.submit(["flwr-clientapp", "--help"])  # not tried again
    assert server.broken and server.starts == 1 and server.pid is None


TORCH_REPORT = '''
import json, os, sys
def report():
    had = "torch" in sys.modules  # before this child imports anything
    import torch
    with open(sys.argv[1], "a") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "had_torch": had,
                             "threads": torch.get_num_threads()}) + "\\n")
'''


def test_a_task_runs_in_a_process_that_did_not_import_torch_itself(tmp_path):
    """The real torch, preloaded by the parent (as :data:`fork_server.PRELOAD` does): the
    child finds it imported when it starts, and keeps the thread count the node's
    environment gave the parent (``OMP_NUM_THREADS``, flower-pfl deploy)."""
    (tmp_path / "warm_torch.py").write_text(TORCH_REPORT)
    out = tmp_path / "out.jsonl"
    server = warm_clientapp.ForkServer(
        [*warm_clientapp.SERVER_COMMAND, "--preload", "torch", "--run", "warm_torch:report"],
        env={**os.environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"})
    try:
        assert server.submit(["flwr-clientapp", str(out)])
        child, = _reports(out, 1)
        parent = server.pid
    finally:
        server.stop()
    assert child["had_torch"] and child["ppid"] == parent != child["pid"]
    assert child["threads"] == 1


def test_the_parent_preloads_every_third_party_package_the_clients_import():
    """After the warm parent's imports, a ClientApp importing the project's client code
    (every client, the data and model modules) imports nothing new but that code: no
    third-party package is left for each message to import (dp_accounting + scipy, 0.5-2 s
    a process, were, while the clients imported the strategies)."""
    from flower_pfl.tuned import fork_server

    clients = sorted(p.stem for p in (Path(__file__).parent.parent / "clients").glob("*.py")
                     if p.stem != "__init__")
    probe = (f"import importlib, sys\nfor m in {list(fork_server.PRELOAD)!r}: "
             "importlib.import_module(m)\nbefore = set(sys.modules)\n"
             "import flower_pfl.client_app, flower_pfl.learning.data, flower_pfl.learning.models\n"
             f"for c in {clients!r}: importlib.import_module('flower_pfl.clients.' + c)\n"
             "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
             "print(sorted(new - set(sys.stdlib_module_names) - {'flower_pfl'}))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_fab_is_extracted_once_per_parent_and_again_when_its_folder_is_gone(tmp_path):
    """fork_server.install_once: the first child of a parent installs with Flower's
    function; a later one given the same bytes gets the folder without Flower's extraction;
    other bytes, a removed folder, a FAB given as a path or an install_dir: Flower's."""
    from flower_pfl.tuned import fork_server

    calls = []

    def flowers(fab, install_dir=None, skip_prompt=False):
        calls.append((fab, install_dir, skip_prompt))
        folder = tmp_path / "apps" / f"app-{len(calls)}"
        folder.mkdir(parents=True)
        return folder

    records = tmp_path / "records"
    records.mkdir()
    install = fork_server.install_once(flowers, records)
    first = install(b"fab-one", skip_prompt=True)
    assert install(b"fab-one", skip_prompt=True) == first and len(calls) == 1
    other = install(b"fab-two", skip_prompt=True)
    assert other != first and len(calls) == 2
    first.rmdir()  # somebody cleaned FLWR_HOME: installed again, not a missing folder
    again = install(b"fab-one", skip_prompt=True)
    assert again.is_dir() and len(calls) == 3
    assert install(b"fab-one", skip_prompt=True) == again and len(calls) == 3
    install(tmp_path / "x.fab")
    install(b"fab-one", tmp_path / "elsewhere")
    assert len(calls) == 5 and calls[0] == (b"fab-one", None, True)


PROBE = """
import json, sys
from flwr.supernode.runtime import run_clientapp
def probe():
    with open(sys.argv[1], "a") as fh:
        fh.write(json.dumps({"install": run_clientapp.install_from_fab.__qualname__}) + "\\n")
"""


def test_the_warm_parents_children_install_the_fab_once(tmp_path):
    """What a child of the warm parent calls for Flower's FAB install is install_once's."""
    (tmp_path / "warm_probe.py").write_text(PROBE)
    out = tmp_path / "out.jsonl"
    server = warm_clientapp.ForkServer(
        [*warm_clientapp.SERVER_COMMAND, "--preload", "flwr.supernode.runtime.run_clientapp",
         "--run", "warm_probe:probe"], env={**os.environ, "PYTHONPATH": str(tmp_path)})
    try:
        assert server.submit(["flwr-clientapp", str(out)], fab_hash="fab1")
        (got,) = _reports(out, 1)
    finally:
        server.stop()
    assert got == {"install": "install_once.<locals>.install"}


def test_once_a_child_installed_the_fab_the_parent_imports_the_app_from_that_folder(
        tmp_path, monkeypatch):
    """fork_server.warm_app: nothing before a FAB is installed; then the module of the
    project's clientapp reference, imported from the folder the first child installed to
    (Flower's load_app in a later child finds it in sys.modules); an app that fails to
    import is left to the children."""
    from flower_pfl.tuned import fork_server

    records, folder = tmp_path / "records", tmp_path / "installed"
    records.mkdir()
    folder.mkdir()
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "warm_app_mod", raising=False)
    assert fork_server.warm_app(records) is None  # no child has installed the FAB yet
    (folder / "pyproject.toml").write_text(
        '[tool.flwr.app.components]\nclientapp = "warm_app_mod:app"\n')
    (folder / "warm_app_mod.py").write_text("import os\nLOADED_BY = os.getpid()\napp = 1\n")
    (records / "ab12.999").write_text(str(folder))  # a record being written: not read
    assert fork_server.warm_app(records) is None
    (records / "ab12").write_text(str(folder))
    assert fork_server.warm_app(records) == "warm_app_mod"
    assert sys.path[0] == str(folder) and sys.modules["warm_app_mod"].LOADED_BY == os.getpid()
    (folder / "broken_mod.py").write_text("raise ImportError('no')\n")
    (folder / "pyproject.toml").write_text(
        '[tool.flwr.app.components]\nclientapp = "broken_mod:app"\n')
    assert fork_server.warm_app(records) is None and "broken_mod" not in sys.modules


FAKE_INSTALL = """
import os
from pathlib import Path
from flwr.supernode.runtime import run_clientapp

def install(fab, install_dir=None, skip_prompt=False):  # stands for Flower's install
    folder = Path(os.environ["WARM_TEST_DIR"]) / "installed"
    folder.mkdir(exist_ok=True)
    (folder / "pyproject.toml").write_text(
        '[tool.flwr.app.components]\\nclientapp = "warm_app_mod2:app"\\n')
    (folder / "warm_app_mod2.py").write_text("import os\\nLOADED_BY = os.getpid()\\napp = 1\\n")
    return folder

run_clientapp.install_from_fab = install
"""
CHILD = """
import json, os, sys
from flwr.supernode.runtime import run_clientapp
def probe():  # stands for Flower's ClientApp entry: installs the FAB, then loads the app
    run_clientapp.install_from_fab(b"the-fab", skip_prompt=True)
    mod = sys.modules.get("warm_app_mod2")
    with open(sys.argv[1], "a") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "ppid": os.getppid(),
                             "app_loaded_by": mod and mod.LOADED_BY}) + "\\n")
"""


def test_later_children_start_with_the_app_imported_by_their_parent(tmp_path):
    """The first child installs the FAB and imports the app itself; the parent then imports
    it from the installed folder, so the next child finds it loaded (by the parent)."""
    (tmp_path / "warm_fake_install.py").write_text(FAKE_INSTALL)
    (tmp_path / "warm_child.py").write_text(CHILD)
    out = tmp_path / "out.jsonl"
    server = warm_clientapp.ForkServer(
        [*warm_clientapp.SERVER_COMMAND, "--preload", "warm_fake_install",
         "--run", "warm_child:probe"],
        env={**os.environ, "PYTHONPATH": str(tmp_path), "WARM_TEST_DIR": str(tmp_path)})
    try:
        assert server.submit(["flwr-clientapp", str(out)], fab_hash="fab1")
        first, = _reports(out, 1)
        assert server.submit(["flwr-clientapp", str(out)], fab_hash="fab1")
        second = _reports(out, 2)[1]
    finally:
        server.stop()
    assert first["app_loaded_by"] is None  # nothing of the app in the parent before
    assert second["app_loaded_by"] == second["ppid"] == first["ppid"] != second["pid"]
