"""Which DP mode gives a real guarantee for which strategy (docs/privacy.md's table is
generated from the contracts' decisions; tests/test_privacy_policy.py checks it).

Client-level DP (each client's whole participation hidden) clips every update and puts
Gaussian noise on their MEAN: it protects a strategy only when the server reads the
uploads through that mean alone (any function of the noised mean is post-processing).
A server that reads uploads one by one (FedAMP's attention over each w_j, pFedHN's
per-client embedding step) sees clipped but un-noised updates: refused, with the reason.
Sample-level DP (DP-SGD in the client, opacus) protects each upload on its own, so it
also covers per-upload servers -- where the client's training of what it uploads runs
through the DP-SGD loop (flower_pfl/learning/training.py ``train``); strategies with
their own optimizer loops (SAM / LWSAM, meta-gradients, Moreau envelopes) are refused.
Each paper's contract declares its decision (``Entry(..., privacy=Decision(...))``,
flower_pfl/catalog/<paper>.py); this module reads them from the registry.  No torch, no
Flower.
"""

from __future__ import annotations

from flower_pfl import registry
from flower_pfl.contract import Decision


def decision(strategy: str) -> Decision:
    """The decision a registered ``strategy``'s contract declares (``Entry.privacy``).
    Raises KeyError for an unknown name."""
    return registry.get(strategy).privacy


def markdown_table() -> str:
    """The decision table of docs/privacy.md (a test keeps the doc equal to this)."""
    ok = "yes"
    lines = ["| strategy | what leaves the client (clipped) | client-level | sample-level |",
             "|---|---|---|---|"]
    for name in sorted(registry.REGISTRY):
        d = decision(name)
        lines.append(f"| {name} | {d.clipped} | {d.client_level or ok} | "
                     f"{d.sample_level or ok} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m flower_pfl.privacy.policy: docs/privacy.md's table
    print(markdown_table())
