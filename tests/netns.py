"""Hosts as Linux network namespaces, for the slow tests that need separate machines.

:class:`Net`: a hub namespace (``fpl-hub-<tag>``) with a bridge, and one namespace per host
(``fpl-<role>-<tag>``), each with a veth pair to the bridge and an address in a private /24
that exists only inside these namespaces. ``<tag>`` is random plus the owning pytest's PID:
:func:`sweep_stale` removes a failed run's leftovers (only those whose owner is gone).
:func:`empty_ns` stops every process of a host; :func:`crash` SIGKILLs them. Needs root
and ``ip netns``.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import time
from pathlib import Path

from flower_pfl.running.procs import is_alive, stop_tree

# mount an empty tmpfs over every folder in $FPL_HIDE, then become the host's command
HIDE = 'for d in $FPL_HIDE; do mount -t tmpfs -o size=1m fpl-hidden "$d" || exit 97; done; ' \
       'exec "$@"'
NAME = re.compile(r"^fpl-[a-z0-9]+-[0-9a-f]{4}p(\d+)$")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out


def namespaces() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line.strip()]


def root_links() -> list[str]:
    return re.findall(r"^\d+: (fpl-[^:@]+)", ip("-o", "link", "show").stdout, re.M)


def ns_pids(ns: str) -> set[int]:
    return {int(p) for p in ip("netns", "pids", ns, check=False).stdout.split()}


def empty_ns(ns: str) -> None:
    """Stop every process in ``ns`` (a host going down), until none is left."""
    for _ in range(5):
        pids = ns_pids(ns)
        if not pids:
            return
        stop_tree(pids, grace_s=5)
    assert not ns_pids(ns), f"processes left in {ns}: {ns_pids(ns)}"


def crash(ns: str) -> None:
    """The host goes down: SIGKILL to every process in ``ns``, nothing shuts down cleanly."""
    deadline = time.time() + 30
    while ns_pids(ns) and time.time() < deadline:
        for pid in ns_pids(ns):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    assert not ns_pids(ns), f"processes left in {ns}: {ns_pids(ns)}"


def sweep_stale() -> None:
    """Namespaces and root links of earlier runs whose pytest is gone."""
    for ns in namespaces():
        match = NAME.match(ns)
        if ns.startswith("fpl-") and not (match and is_alive(int(match.group(1)))):
            empty_ns(ns)
            ip("netns", "del", ns, check=False)
    for link in root_links():
        ip("link", "del", link, check=False)


class Net:
    """A hub namespace with a bridge and one namespace per host, each on the /24."""

    def __init__(self, roles: list[str]) -> None:
        self.tag = f"{secrets.token_hex(2)}p{os.getpid()}"
        self.subnet = f"10.213.{secrets.randbelow(200) + 20}"
        self.hub = f"fpl-hub-{self.tag}"
        self.ns = {role: f"fpl-{role}-{self.tag}" for role in roles}
        self.addr = {role: f"{self.subnet}.{i + 1}" for i, role in enumerate(roles)}

    def names(self) -> list[str]:
        return [self.hub, *self.ns.values()]

    def create(self) -> None:
        ip("netns", "add", self.hub)
        ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        ip("-n", self.hub, "link", "set", "br0", "up")
        for role, ns in self.ns.items():
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", self.hub, "link", "add", f"v-{role}", "type", "veth",
                "peer", "name", "eth0", "netns", ns)
            ip("-n", self.hub, "link", "set", f"v-{role}", "master", "br0", "up")
            ip("-n", ns, "addr", "add", f"{self.addr[role]}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")

    def destroy(self) -> None:
        for ns in reversed(self.names()):
            if ns in namespaces():
                empty_ns(ns)
                ip("netns", "del", ns, check=False)

    def start(self, role: str, argv: list[str], cwd: Path, log: Path, env: dict,
              hide: list[str] = ()) -> subprocess.Popen:
        """``ip netns exec <host> <argv>`` in ``cwd``, output to ``log``."""
        env = {**env, "FPL_HIDE": " ".join(hide)}
        with open(log, "ab") as fh:
            return subprocess.Popen(["ip", "netns", "exec", self.ns[role], "sh", "-c", HIDE,
                                     "sh", *argv], cwd=cwd, env=env, stdout=fh,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
