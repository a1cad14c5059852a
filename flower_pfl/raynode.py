"""Where a simulation ran on a Ray cluster: the node of each fit, and the cluster joined.

Client side (clients/base.py): :func:`node_metrics` -- in a process connected to Ray (a
simulation's ClientApp actor) the Ray node it runs on, as two fit metrics (plain ``str``;
outside Ray, deployment or in-process, no key at all, so fit.csv's cells stay empty):

* ``ray_node``     -- ``ray.get_runtime_context().get_node_id()`` (hex, as ``ray.nodes()``
  and ``ray list nodes`` name it)
* ``ray_node_ip``  -- the node's address (``ray.util.get_node_ip_address``)

Server side (strategies/base.py): :func:`select` puts the keys in ``fit.csv``; the process
that owns the simulation's Ray connection is Flower's simulation process, which also runs
the ServerApp, so :func:`cluster_line` there (once, after the first fits came back: Ray is
connected by then) reads ``ray.nodes()`` and ``ray.cluster_resources()`` -- the cluster
Flower itself joined, not a probe's view -- for a run attached to an existing cluster
(``RAY_ADDRESS`` other than ``local``; ``flower-pfl run --ray-address`` sets it).

Ray is never imported here: only a process that already imported it can be connected.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping

RAY_NODE = "ray_node"
RAY_NODE_IP = "ray_node_ip"
#: the metric keys this module reports (both strings)
KEYS = (RAY_NODE, RAY_NODE_IP)


def connected_ray(ray: Any = None) -> Any:
    """The ``ray`` module where this process is connected to Ray (``ray`` given: that
    module, for tests), else None.  Never imports Ray."""
    ray = sys.modules.get("ray") if ray is None else ray
    if ray is None or not hasattr(ray, "is_initialized") or not ray.is_initialized():
        return None
    return ray


def node_metrics(ray: Any = None) -> dict[str, str]:
    """``{ray_node, ray_node_ip}`` of the Ray node this process runs on; ``{}`` outside Ray."""
    ray = connected_ray(ray)
    if ray is None:
        return {}
    return {RAY_NODE: str(ray.get_runtime_context().get_node_id()),
            RAY_NODE_IP: str(ray.util.get_node_ip_address())}


def select(metrics: Mapping[str, Any]) -> dict[str, str]:
    """The Ray node keys of a reply's metrics, as strings (none where it ran outside Ray)."""
    return {key: str(metrics[key]) for key in KEYS if key in metrics}


def joined_cluster(environ: Mapping[str, str] | None = None) -> str | None:
    """The address of the existing cluster a simulation attaches to (``RAY_ADDRESS``),
    None for a private instance (unset, empty or ``local``)."""
    address = (os.environ if environ is None else environ).get("RAY_ADDRESS", "").strip()
    return None if address in ("", "local") else address


def cluster_line(ray: Any = None, environ: Mapping[str, str] | None = None) -> str | None:
    """``[flower-pfl] Ray cluster at 10.0.0.1:6379 (RAY_ADDRESS=...): 3 nodes alive
    (10.0.0.1, 10.0.0.2, 10.0.0.3), 2 CPUs, 0 GPUs`` where this process is connected to an
    existing cluster; None where not connected or on a private instance."""
    address = joined_cluster(environ)
    ray = connected_ray(ray)
    if ray is None or address is None:
        return None
    alive = [n for n in ray.nodes() if n.get("Alive")]
    resources = ray.cluster_resources()
    ips = ", ".join(sorted(str(n.get("NodeManagerAddress")) for n in alive))
    gcs = ray.get_runtime_context().gcs_address
    return (f"[flower-pfl] Ray cluster at {gcs} (RAY_ADDRESS={address}): {len(alive)} "
            f"node(s) alive ({ips}), {resources.get('CPU', 0):g} CPUs, "
            f"{resources.get('GPU', 0):g} GPUs")
