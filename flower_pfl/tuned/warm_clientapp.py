"""A SuperExec whose ClientApp processes start warm: forked, not started afresh.

Flower 1.42's SuperExec (``flower-superexec``, started by the SuperNode;
``flwr/supercore/superexec/run_superexec.py``) hands each task to
``SubprocessExecutor.launch`` (``flwr/supercore/superexec/executor/subprocess_executor.py``),
which starts ``flwr-clientapp --runtime-api-address ADDR --token TOKEN (--insecure |
--root-certificates CA) --parent-pid PID`` for every message: each a new interpreter that
imports flwr (0.3-0.8 s) and torch (1.2-2.3 s) before the app's code runs.

:func:`launch` takes its place in the SuperExec process (started through
:mod:`flower_pfl.tuned.entry` by a tuned SuperNode, :mod:`.superexec_start`): a ClientApp
task's arguments -- the list Flower's ``launch`` builds, :func:`flower_args` -- go to a
:class:`ForkServer` (:mod:`.fork_server`: a parent with numpy, torch, torchvision
and Flower's ClientApp entry imported, nothing of the project's at start),
which forks a child that runs Flower's ``flwr_clientapp()`` with them.  What the child does
from there is Flower's: it fetches its token's message, installs the FAB, loads the app,
reads the node's data and configuration -- nothing is kept warm that a node's data or
configuration could change.  Two steps are shared within one parent, which serves one FAB
(``--fab-once``): a later child given the same FAB bytes uses the folder the first child
installed it to, which is what Flower's own install does for a FAB whose folder exists
(:func:`.fork_server.install_once`), and finds the app's module imported from that folder by
the parent (:func:`.fork_server.warm_app`); another FAB, other code: another parent.
Where :mod:`.pull_backoff` is installed in this process, the parent gives its children the
same shorter object-pull backoff.  The parent is started on the first ClientApp task, and
again when a task names another FAB (``fab_hash``)
or when it has died.  Other task types, and a task the fork server cannot take (its pipe
broken), go to Flower's ``launch``.

Installed by :func:`flower_pfl.tuned.switch.install` (process ``superexec``) after
:data:`NEEDS` are met.  ``FLOWER_PFL_FLOWER_CLIENTAPP=1`` keeps Flower's launcher.
No Flower import at module level.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from logging import WARNING
from pathlib import Path
from typing import Any

from flower_pfl.tuned import pull_backoff
from flower_pfl.tuned.gate import Need
from flower_pfl.tuned.patch import Replaced, say

#: set to 1 to keep Flower's launcher (a new ``flwr-clientapp`` process per message)
KEEP_FLOWER_ENV = "FLOWER_PFL_FLOWER_CLIENTAPP"

_EX = "flwr.supercore.superexec.executor"
#: what of Flower's :func:`install` replaces and uses (flower_pfl/tuned/gate.py)
NEEDS = [
    Need(f"{_EX}.subprocess_executor:SubprocessExecutor.launch", "body",
         "5a7c903289c35b88"),  # Flower 1.42.0's: flower_args builds the same list
    Need("flwr.supercore.constant:TASK_TYPE_TO_COMMAND"),
    Need("flwr.supercore.constant:TASK_TYPE_TO_APPIO_API_ADDRESS_ARG"),
    Need("flwr.supercore.constant:TaskType.CLIENT_APP"),
    Need(f"{_EX}.types:LaunchResult.accepted"),
    Need("flwr.supernode.cli.flwr_clientapp:flwr_clientapp"),  # what a child runs
    # the FAB extracted once per parent (fork_server.install_once, ``--fab-once``): the
    # function a child calls by its module's name, and Flower's install, which returns a
    # folder of the same hash untouched
    Need("flwr.supernode.runtime.run_clientapp:install_from_fab", "params",
         "fab_file,install_dir,skip_prompt"),
    Need("flwr.supernode.runtime.run_clientapp:run_clientapp", "names", "install_from_fab"),
    Need("flwr.cli.install:validate_and_install", "body", "628b69fb852ae858"),
]
#: the longest a warm parent may take to import what it preloads (torch: 1-3 s)
READY_TIMEOUT_S = 120.0
#: the fork server's command (run by path: it imports nothing of this project)
SERVER_COMMAND = [sys.executable, str(Path(__file__).with_name("fork_server.py")),
                  "flwr-clientapp"]


class ForkServer:
    """The warm parent (a :mod:`.fork_server` process) and how to reach it.  ``command``:
    how to start it; ``starts``: how many times one was started; ``fab_hash``: the FAB of
    the tasks it serves; ``broken``: one failed to start (no more tries)."""

    def __init__(self, command: list[str] | None = None, **popen: Any) -> None:
        self.command = list(command or SERVER_COMMAND)
        self.popen = popen
        self.proc: subprocess.Popen[str] | None = None
        self.fab_hash: str | None = None
        self.starts = 0
        self.broken = False

    def submit(self, argv: list[str], quiet: bool = False, fab_hash: str | None = None) -> bool:
        """Have a child forked that runs ``argv``; False when the server could not take it.
        A server of another ``fab_hash``, or one that has exited, is replaced first."""
        if self.proc is not None and (self.proc.poll() is not None
                                      or fab_hash != self.fab_hash):
            self.stop()
        if self.broken:
            return False
        if self.proc is None and not self._start(fab_hash):
            return False
        pipe = None if self.proc is None else self.proc.stdin
        try:
            if pipe is None:
                raise BrokenPipeError
            pipe.write(json.dumps({"argv": argv, "quiet": quiet}) + "\n")
            pipe.flush()
        except (BrokenPipeError, OSError, ValueError):
            self.stop()
            return False
        return True

    def _start(self, fab_hash: str | None) -> bool:
        """Start a warm parent and wait until its imports are done (at most
        :data:`READY_TIMEOUT_S`); one that never says so marks this server ``broken``
        (Flower's launcher from then on) and a WARNING is logged."""
        import select

        read, write = os.pipe()
        try:
            self.proc = subprocess.Popen([*self.command, *pull_backoff.fork_server_args(),
                                          "--fab-once", "1", "--ready-fd", str(write)],
                                         stdin=subprocess.PIPE, text=True, pass_fds=(write,),
                                         **self.popen)
        finally:
            os.close(write)
        self.fab_hash, self.starts = fab_hash, self.starts + 1
        with os.fdopen(read, "rb") as ready:
            said = b""
            if select.select([ready], [], [], READY_TIMEOUT_S)[0]:
                said = ready.readline()
        if said == b"ready\n":
            return True
        proc = self.proc
        self.stop()
        self.broken = True
        status = None if proc is None else proc.returncode
        say(WARNING, f"[flower-pfl] warm ClientApp launcher: its parent process did not start "
                     f"({' '.join(self.command)}, exit status {status}); ClientApps start as "
                     f"Flower's from now on")
        return False

    @property
    def pid(self) -> int | None:
        """The warm parent's pid; None when none runs."""
        return None if self.proc is None or self.proc.poll() is not None else self.proc.pid

    def stop(self) -> None:
        """End the warm parent (its stdin closed; killed after 5 s); its children go on."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()


#: the SuperExec process' warm parent
SERVER = ForkServer()


def flower_args(spec: Any) -> list[str]:
    """The command Flower 1.42.0's ``SubprocessExecutor.launch`` starts for ``spec`` (an
    ``ExecutionSpec``)."""
    from flwr.supercore.constant import TASK_TYPE_TO_APPIO_API_ADDRESS_ARG, TASK_TYPE_TO_COMMAND

    args = [TASK_TYPE_TO_COMMAND[spec.task_type],
            TASK_TYPE_TO_APPIO_API_ADDRESS_ARG[spec.task_type], spec.runtime_api_address,
            "--token", spec.token]
    if spec.insecure:
        args.append("--insecure")
    elif spec.root_certificates_path is not None:
        args.extend(["--root-certificates", spec.root_certificates_path])
    if spec.parent_pid is not None:
        args.extend(["--parent-pid", str(spec.parent_pid)])
    if spec.runtime_dependency_install:
        args.append("--allow-runtime-dependency-installation")
    return args


def launch(self: Any, spec: Any) -> Any:
    """``SubprocessExecutor.launch``: a ClientApp task forked from :data:`SERVER`, anything
    else (or a task it could not take) started by Flower's own ``launch``."""
    from flwr.supercore.constant import TaskType
    from flwr.supercore.superexec.executor.types import LaunchResult

    if spec.task_type == TaskType.CLIENT_APP and SERVER.submit(
            flower_args(spec), bool(spec.suppress_output), spec.fab_hash):
        return LaunchResult.accepted()
    return flowers_own("launch")(self, spec)


#: what :func:`install` puts in Flower's place (flower_pfl/tuned/patch.py); :func:`uninstall`
#: leaves the warm parent running until :meth:`ForkServer.stop`
_replaced = Replaced({f"{_EX}.subprocess_executor:SubprocessExecutor.launch": launch})
install, installed, uninstall = _replaced.install, _replaced.installed, _replaced.undo
flowers_own = _replaced.flowers  #: Flower's own ``SubprocessExecutor.launch``, installed or not
