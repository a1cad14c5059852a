"""Which DP mode gives a real guarantee for which strategy (docs/privacy.md's table is
generated from :data:`DECISIONS`; tests/test_privacy_policy.py checks both ways).

Client-level DP (each client's whole participation hidden) clips every update and puts
Gaussian noise on their MEAN: it protects a strategy only when the server reads the
uploads through that mean alone (any function of the noised mean is post-processing).
A server that reads uploads one by one (FedAMP's attention over each w_j, pFedHN's
per-client embedding step) sees clipped but un-noised updates: refused, with the reason.
Sample-level DP (DP-SGD in the client, opacus) protects each upload on its own, so it
also covers per-upload servers -- where the client's training of what it uploads runs
through the DP-SGD loop (flower_pfl/learning/training.py ``train``); strategies with
their own optimizer loops (SAM / LWSAM, meta-gradients, Moreau envelopes) are refused.
No torch, no Flower: a table keyed by registered strategy name.
"""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("none", "client-level", "sample-level")
#: what the model part of an upload is a delta against: "sent" (the model the server sent
#: that client this round) or "zero" (the upload already is a delta)
REFERENCES = ("sent", "zero")


@dataclass(frozen=True)
class Decision:
    """One strategy's DP decisions: ``client_level`` / ``sample_level`` is None when the
    mode gives a real guarantee, else the reason it is refused; ``clipped`` says what
    leaves the client (and is clipped); ``reference``: see :data:`REFERENCES`."""

    clipped: str
    client_level: str | None
    sample_level: str | None
    reference: str = "sent"

    def refusal(self, mode: str) -> str | None:
        """The reason ``mode`` is refused (None: allowed; ``none`` always is)."""
        if mode == "client-level":
            return self.client_level
        if mode == "sample-level":
            return self.sample_level
        return None


_PER_UPLOAD = ("the server reads each client's upload on its own ({what}), not only their "
               "mean, so noise on the aggregate does not protect it; use mode: sample-level")
_OWN_LOOP = ("its clients train what they upload with their own optimizer loop ({what}), "
             "not the DP-SGD loop of learning/training.py; use mode: client-level")
_OK_MEAN = None
_NOTHING = ("nothing leaves a Local client (no upload: ε = 0 without DP); there is nothing "
            "to protect")

_MODEL = "the whole model w_i (delta against the model sent)"

DECISIONS: dict[str, Decision] = {
    "fedavg": Decision(_MODEL, _OK_MEAN, None),
    "fedavg-ft": Decision(_MODEL, _OK_MEAN, None),
    "fedprox": Decision(_MODEL, _OK_MEAN, None),
    "fedprox-ft": Decision(_MODEL, _OK_MEAN, None),
    "ditto": Decision("the global-model copy w_i (v_i never leaves)", _OK_MEAN, None),
    "apfl": Decision("the global-model copy w_i (v_i, alpha_i never leave)", _OK_MEAN,
                     _OWN_LOOP.format(what="APFL's joint w/v/alpha step")),
    "perfedavg": Decision(_MODEL, _OK_MEAN,
                          _OWN_LOOP.format(what="Per-FedAvg's meta-gradient step")),
    "scaffold": Decision("w_i and the control delta dc_i, clipped together", _OK_MEAN, None),
    "fedsam": Decision("Delta_i = w_i - w (already a delta)", _OK_MEAN,
                       _OWN_LOOP.format(what="SAM's two-pass step"), reference="zero"),
    "plgu-lf": Decision("Delta_i of the shared layers (personal layers upload zeros and are "
                        "never noised)", _OK_MEAN,
                        _OWN_LOOP.format(what="LWSAM's two-pass step"), reference="zero"),
    "fedrep": Decision("the body phi_i (the head never leaves)", _OK_MEAN,
                       _OWN_LOOP.format(what="FedRep's head-then-body loop")),
    "plgu-grep": Decision("the body phi_i (the head never leaves)", _OK_MEAN,
                          _OWN_LOOP.format(what="LWSAM's two-pass step")),
    "pfedbred": Decision(_MODEL, _OK_MEAN,
                         _OWN_LOOP.format(what="the Moreau-envelope inner loop")),
    "pfedbred-lg": Decision(_MODEL, _OK_MEAN,
                            _OWN_LOOP.format(what="the Moreau-envelope inner loop")),
    "pfedbred-meg": Decision(_MODEL, _OK_MEAN,
                             _OWN_LOOP.format(what="the Moreau-envelope inner loop")),
    "pfedbred-mh": Decision(_MODEL, _OK_MEAN,
                            _OWN_LOOP.format(what="the Moreau-envelope inner loop")),
    "pfedbred-mh-lookahead": Decision(_MODEL, _OK_MEAN, _OWN_LOOP.format(
        what="the Moreau-envelope inner loop")),
    "pfedme": Decision(_MODEL, _OK_MEAN, _OWN_LOOP.format(what="the Moreau-envelope inner loop")),
    "fedacs": Decision(_MODEL, _PER_UPLOAD.format(
        what="each stored w_j is compared and selected per client"), None),
    "pfedhn": Decision(_MODEL, _PER_UPLOAD.format(
        what="each upload moves its own client's embedding v_i"),
        _OWN_LOOP.format(what="the SAM/LWSAM step")),
    "plgu-ghn": Decision(_MODEL, _PER_UPLOAD.format(
        what="each upload moves its own client's embedding v_i"),
        _OWN_LOOP.format(what="LWSAM's two-pass step")),
    "selffl": Decision("theta_m, the offset d_m and sigma_m^2", _PER_UPLOAD.format(
        what="each theta_m is weighted by its own sigma_m^2"),
        "its clients upload sigma_m^2 and d_m computed from bootstrap fits outside the DP-SGD "
        "loop, and the server weights by them: no mode protects Self-FL here"),
    "local": Decision("nothing", _NOTHING, _NOTHING),
}


def decision(strategy: str) -> Decision:
    """The decision for a registered ``strategy``.  Raises KeyError naming the table when
    a registered strategy has none (tests/test_privacy_policy.py keeps them in step)."""
    from flower_pfl import registry  # TRANSITIONAL: every contract will hold its decision

    held = registry.get(strategy).privacy
    if held is not None:
        return held
    if strategy not in DECISIONS:
        raise KeyError(f"strategy {strategy!r} has no entry in flower_pfl/privacy/policy.py "
                       f"DECISIONS: decide which DP modes protect it")
    return DECISIONS[strategy]


def markdown_table() -> str:
    """The decision table of docs/privacy.md (a test keeps the doc equal to this)."""
    ok = "yes"
    lines = ["| strategy | what leaves the client (clipped) | client-level | sample-level |",
             "|---|---|---|---|"]
    from flower_pfl import registry

    for name in sorted(registry.REGISTRY):
        d = decision(name)
        lines.append(f"| {name} | {d.clipped} | {d.client_level or ok} | "
                     f"{d.sample_level or ok} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m flower_pfl.privacy.policy: docs/privacy.md's table
    print(markdown_table())
