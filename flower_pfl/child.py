"""Run a few lines of Python in a short-lived child process of the same interpreter.

Used where a long-lived process must not import torch (importing this CUDA build of torch
costs a process ~280 MB of private memory even on a CPU run): the launcher's preflight
check (reliability.preflight.preflight_apart) and the ServerApp's initial model
(server_app). The child sees the same ``sys.path`` as this process.
"""

from __future__ import annotations

import os
import subprocess
import sys


def run_python(code: str, *args: str, timeout_s: float | None = None
               ) -> subprocess.CompletedProcess:
    """``python -c code args...`` with this process's ``sys.path``; output captured as text.
    Raises ``subprocess.TimeoutExpired`` past ``timeout_s``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, timeout=timeout_s)
