"""A warm parent for ClientApp processes: ``python .../fork_server.py flwr-clientapp``.

Run by path, never as ``flower_pfl.…``: it starts with nothing of this project imported;
the app's code (``flower_pfl`` included) only ever comes from the run's FAB, as for
Flower's own ``flwr-clientapp``.  With ``--fab-once 1`` (one parent per FAB: its starter
starts another for another FAB), once its first child has installed the FAB, the parent
imports the app's module from that folder before it forks the next (:func:`warm_app`), so
later children skip the FAB's extraction and the app's import; nothing of a node's data
or configuration is ever read here.
It imports :data:`PRELOAD` (numpy, torch, torchvision, Flower's ClientApp entry: most of
a ``flwr-clientapp`` start; importing torch does not initialise CUDA), then
reads requests, one JSON line each on stdin: ``{"argv": ["flwr-clientapp", ...], "quiet":
bool}``; for each it forks a child that runs Flower's ``flwr_clientapp()`` with that ``sys.argv``
(``quiet``: its output to /dev/null, as Flower's ``suppress_output``) and exits with its
status.  Children are reaped by the kernel (SIGCHLD ignored here, restored in a child).
End of stdin (its SuperExec gone or restarting it) ends it; running children go on (each
watches the SuperExec's pid, ``--parent-pid``, as Flower's do).

``--ready-fd N``: a pipe on which it writes :data:`READY` once its imports are done (its
starter waits for that, and uses Flower's launcher if it never comes).  ``--kwdefaults
module:function.param=number,...``: keyword defaults set after the imports, so every child
has them (:func:`set_kwdefaults`; the tuned engine's shorter object-pull backoff,
:mod:`flower_pfl.tuned.pull_backoff`, whose starter checked the functions).  ``--fab-once
1``: a FAB extracted and verified once per parent, not once per message
(:func:`install_once`; its starter checked Flower's function).  ``--preload
a,b`` and ``--run module:function`` replace :data:`PRELOAD` and Flower's entry (tests).
Started by :class:`flower_pfl.tuned.warm_clientapp.ForkServer`.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import signal
import sys
import tempfile
import traceback
from pathlib import Path
from typing import IO, Any, Callable, Sequence

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)  # run by path: its folder is not a place to import from

#: imported once by the parent, shared by every child it forks: third-party packages the
#: project's ClientApp imports (its dependencies, not its code: that comes from the FAB):
#: torchvision (ResNet-18, image folders) and Flower's ClientApp entry.  dp_accounting
#: (0.5-2 s a process) is the server's accountant: since the clients bind to the papers'
#: contracts instead of the strategies, no client imports it
PRELOAD = ("numpy", "torch", "torchvision", "flwr.supernode.cli.flwr_clientapp")
#: the function each child runs
RUN = "flwr.supernode.cli.flwr_clientapp:flwr_clientapp"
#: written to ``--ready-fd`` once the imports are done
READY = b"ready\n"
#: where Flower's ClientApp entry finds the function that installs the run's FAB
INSTALL = "flwr.supernode.runtime.run_clientapp:install_from_fab"


def _resolve(ref: str) -> Callable[[], Any]:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _child(request: dict[str, Any], run: Callable[[], Any]) -> None:
    """In the forked child: Flower's entry with the request's argv; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)  # the requests pipe is the parent's
        if request.get("quiet"):
            os.dup2(null, 1)
            os.dup2(null, 2)
        sys.argv = list(request["argv"])
        run()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported, then the child's status says so
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - exiting anyway
                pass
        os._exit(code)


def set_kwdefaults(spec: str) -> None:
    """``"pkg.mod:fn.param=0.05,..."``: set each function's keyword default ``param`` to the
    number given (digits only: an int, else a float).  Raises ``KeyError`` for a parameter
    that is not keyword-only."""
    for item in filter(None, spec.split(",")):
        ref, _, value = item.partition("=")
        ref, _, param = ref.rpartition(".")
        fn: Any = _resolve(ref)
        if param not in (fn.__kwdefaults__ or {}):
            raise KeyError(f"{ref} has no keyword-only parameter {param!r}")
        number = int(value) if value.isdigit() else float(value)
        fn.__kwdefaults__ = {**fn.__kwdefaults__, param: number}


def install_once(flowers: Callable[..., Path], records: Path) -> Callable[..., Path]:
    """Flower's ``install_from_fab`` (``flowers``) for a FAB given as bytes, extracted and
    verified once per parent: the first child that installs a FAB writes where it went to
    ``records``/<the FAB's SHA-256>; a later child given the same bytes returns that folder
    while it exists, as Flower's own install does for a FAB already installed
    (``validate_and_install``: an existing folder of that hash is returned untouched), without
    extracting and hashing the archive again first (0.14-0.18 s a message, traced).  Any
    other call is Flower's."""

    def install(fab_file: Path | bytes, install_dir: Path | None = None,
                skip_prompt: bool = False) -> Path:
        if not isinstance(fab_file, bytes) or install_dir is not None:
            return flowers(fab_file, install_dir, skip_prompt)
        record = records / hashlib.sha256(fab_file).hexdigest()
        try:
            done = Path(record.read_text())
        except OSError:
            done = None
        if done is not None and done.is_dir():
            return done
        path = flowers(fab_file, install_dir, skip_prompt)
        try:
            partial = record.with_suffix(f".{os.getpid()}")
            partial.write_text(str(path))
            os.replace(partial, record)  # a reader sees the whole record or none
        except OSError:
            pass  # the parent is gone (its folder with it): the next child installs again
        return Path(path)

    return install


def warm_app(records: Path) -> str | None:
    """Import the ClientApp's module from the folder the first child installed the FAB to
    (the record :func:`install_once` wrote; one FAB per parent), as Flower's ``load_app``
    would in a child: the folder first on ``sys.path``, the module of the project's
    ``[tool.flwr.app.components] clientapp`` reference.  Flower's ``load_app`` takes a
    module already in ``sys.modules``, so every later child starts with the app's code
    imported.  Nothing is read of a node's data or configuration (the app reads them per
    message).  Returns the module's name, or None when no FAB is installed yet, the
    import failed (the children then import it as Flower's do) or it initialised CUDA
    (this parent then exits: a fork after CUDA is initialised is unsafe; its starter starts
    another)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Flower's own dependency on 3.10
        import tomli as tomllib

    done = [r for r in records.iterdir() if "." not in r.name]
    if not done:
        return None
    try:
        folder = Path(done[0].read_text())
        config = tomllib.loads((folder / "pyproject.toml").read_text())
        module = config["tool"]["flwr"]["app"]["components"]["clientapp"].partition(":")[0]
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - the children import it as Flower's do
        traceback.print_exc()
        return None
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        print(f"fork_server: importing {module} initialised CUDA; exiting", file=sys.stderr)
        os._exit(3)
    return module


def serve(requests: IO[str], preload: Sequence[str] = PRELOAD, run: str = RUN,
          ready_fd: int | None = None, kwdefaults: str = "",
          fab_once: bool = False) -> None:
    """Import ``preload``, set ``kwdefaults`` (:func:`set_kwdefaults`), with ``fab_once``
    put :func:`install_once` in the place of :data:`INSTALL`, say ``ready`` on ``ready_fd``
    (then closed: no child holds it), then fork a child per request line until
    ``requests`` ends; with ``fab_once``, once a child has installed the FAB, the app's
    module is imported here before the next fork (:func:`warm_app`)."""
    for name in preload:
        importlib.import_module(name)
    set_kwdefaults(kwdefaults)
    records = None
    if fab_once:
        records = Path(tempfile.mkdtemp(prefix="flower-pfl-fabs-"))
        module, _, name = INSTALL.partition(":")
        owner = importlib.import_module(module)
        setattr(owner, name, install_once(getattr(owner, name), records))
    target = _resolve(run)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    if ready_fd is not None:
        os.write(ready_fd, READY)
        os.close(ready_fd)
    app: str | None = None
    try:
        for line in requests:
            if not line.strip():
                continue
            request = json.loads(line)
            if records is not None and app is None:
                app = warm_app(records)
            if os.fork() == 0:
                _child(request, target)
    finally:
        if records is not None:
            shutil.rmtree(records, ignore_errors=True)


def main(argv: Sequence[str]) -> None:
    args = list(argv)
    if not args or args[0] != "flwr-clientapp":
        raise SystemExit("usage: fork_server.py flwr-clientapp [--preload a,b] "
                         "[--run module:function] [--ready-fd N] [--kwdefaults m:f.p=x,...] "
                         "[--fab-once 1]")
    options = dict(zip(args[1::2], args[2::2]))
    preload = tuple(filter(None, options.get("--preload", ",".join(PRELOAD)).split(",")))
    ready = options.get("--ready-fd")
    serve(sys.stdin, preload, options.get("--run", RUN), int(ready) if ready else None,
          options.get("--kwdefaults", ""), options.get("--fab-once") == "1")


if __name__ == "__main__":
    main(sys.argv[1:])
