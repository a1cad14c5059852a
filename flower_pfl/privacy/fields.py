"""The ``privacy.*`` keys of the run configuration (docs/privacy.md).

:data:`PRIVACY_FIELDS` is merged into :data:`flower_pfl.config.FIELDS`;
:func:`privacy_checks` is the section's part of the cross-key checks: every key is read
by the mode it belongs to and refused (with the reason) under another; the strategy's
decision (:mod:`.policy`) refuses a mode that would not protect it.  No torch, no Flower.
"""

from __future__ import annotations

from typing import Any, Mapping

from flower_pfl.contract import MODES
from flower_pfl.fields import POS, Field, in_
from flower_pfl.privacy.policy import decision

NOISE_PLACES = ("server", "clients")
#: whether learning/training.py runs DP-SGD (opacus) for privacy.mode sample-level
SAMPLE_LEVEL_BUILT = True

PRIVACY_FIELDS: dict[str, Field] = {
    "privacy.mode": Field((str,), "none", in_(MODES), f"one of {list(MODES)} (client-level: "
                          "each client's update clipped and the mean noised; sample-level: "
                          "DP-SGD with opacus in each client)"),
    "privacy.clip-norm": Field((float, int), None, POS, "a number > 0 or null (client-level: "
                               "the L2 bound C of each client's update, model units)",
                               nullable=True),
    "privacy.noise-multiplier": Field((float, int), None, POS, "a number > 0 or null (z: noise "
                                      "std = z x clip; client-level: on the sum of updates; "
                                      "sample-level: DP-SGD's sigma)", nullable=True),
    "privacy.noise": Field((str,), "server", in_(NOISE_PLACES), f"one of {list(NOISE_PLACES)} "
                           "(client-level: the trusted server noises the mean, or each "
                           "sampled client adds its share z C / sqrt(m))"),
    "privacy.delta": Field((float,), None, lambda v: 0 < v < 1, "a number in (0, 1) or null "
                           "(null: min(1/(10 n), 1e-5), n = clients for client-level, the "
                           "client's training examples for sample-level)", nullable=True),
    "privacy.target-epsilon": Field((float, int), None, POS, "a number > 0 or null "
                                    "(client-level: the run stops, status budget-exhausted, "
                                    "before the round that would exceed it)", nullable=True),
    "privacy.adaptive-clip": Field((bool,), False, None, "true or false (client-level: clip-norm "
                                   "is only the first round's C, then moved toward "
                                   "target-quantile; Andrew et al. 2021)"),
    "privacy.target-quantile": Field((float,), 0.5, lambda v: 0 < v < 1, "a number in (0, 1) "
                                     "(adaptive-clip: the fraction of updates left unclipped "
                                     "that C aims for)"),
    "privacy.clip-lr": Field((float, int), 0.2, POS, "a number > 0 (adaptive-clip: eta_C of "
                             "the geometric update C <- C exp(-eta_C (b - quantile)))"),
    "privacy.count-noise": Field((float, int), None, POS, "a number > 0 or null (adaptive-clip: "
                                 "std of the noise on the unclipped count; null: m/20, the "
                                 "paper's)", nullable=True),
    "privacy.max-grad-norm": Field((float, int), None, POS, "a number > 0 or null "
                                   "(sample-level: DP-SGD's per-sample gradient clip)",
                                   nullable=True),
}

#: built-in models DP-SGD cannot train per sample, and why
PER_SAMPLE_REFUSED = {"resnet18": "its BatchNorm layers mix the samples of a batch, so "
                      "per-sample gradients (opacus) do not exist; use mclr, dnn or cnn",
                      "scalar": "the synthetic task's loss is a sum over samples, not the "
                      "mean DP-SGD's noise scale assumes; use client-level"}
#: key -> the modes that read it (set under another: refused)
READ_BY = {"privacy.clip-norm": ("client-level",),
           "privacy.noise-multiplier": ("client-level", "sample-level"),
           "privacy.noise": ("client-level",),
           "privacy.delta": ("client-level", "sample-level"),
           "privacy.target-epsilon": ("client-level",),
           "privacy.max-grad-norm": ("sample-level",),
           "privacy.adaptive-clip": ("client-level",)}
#: adaptive clipping's settings: read only with privacy.adaptive-clip true
ADAPTIVE_KEYS = ("privacy.target-quantile", "privacy.clip-lr", "privacy.count-noise")
#: key -> the modes that need it set
REQUIRED_BY = {"privacy.clip-norm": ("client-level",),
               "privacy.noise-multiplier": ("client-level", "sample-level"),
               "privacy.max-grad-norm": ("sample-level",)}
WHY_NOT = {"privacy.target-epsilon": " (sample-level ε is per client, from opacus' "
           "accountant on the client's own data size: the server cannot know it before the "
           "round; it is reported as epsilon_max)"}


def participants(values: Mapping[str, Any]) -> int:
    """N of the accounting: the clients a round may sample, i.e. ``clients`` less the
    held-out newcomers (:func:`flower_pfl.newcomers.participants`), who never train and
    spend no ε."""
    from flower_pfl import newcomers

    return newcomers.participants(values)


def sampled_per_round(values: Mapping[str, Any]) -> int:
    """m: the clients a round samples (strategies/nodes.py's rule, over the participants)."""
    n = participants(values)
    m = max(int(values["min-fit-clients"]), int(round(values["fraction-fit"] * n)))
    return min(m, n)


#: the default δ is at most this (and at most 1/(10 n))
DELTA_CAP = 1e-5


def default_delta(n: int) -> float:
    """The δ used when ``privacy.delta`` is null, for a unit of ``n`` records (client-level:
    the federation's N clients; sample-level: the client's n_i training examples):
    min(1/(10 n), 1e-5).  Well below 1/n on purpose: a mechanism that publishes one record
    outright (n records, one chosen at random) already meets δ = 1/n, so δ >= 1/n promises
    nothing (Dwork & Roth 2014, section 2.3).  Raises ValueError for n < 1."""
    if n < 1:
        raise ValueError(f"a δ for a unit of {n} records")
    return min(1.0 / (10 * n), DELTA_CAP)


def delta_for(values: Mapping[str, Any], n: int) -> float:
    """δ for a unit of ``n`` records: ``privacy.delta`` when set, else
    :func:`default_delta` of ``n``."""
    delta = values.get("privacy.delta")
    return float(delta) if delta is not None else default_delta(n)


def client_delta(values: Mapping[str, Any]) -> float:
    """δ of client-level DP: ``privacy.delta``, or :func:`default_delta` of N, the
    :func:`participants`."""
    return delta_for(values, participants(values))


def weak_delta(delta: float, n: int, unit: str) -> str | None:
    """The warning a δ >= 1/n deserves (None below it): ``unit`` names what is protected
    (e.g. "clients", "training examples of client 3")."""
    if delta < 1.0 / n:
        return None
    return (f"δ = {delta:.3g} is at least 1/n = 1/{n} for the {n} {unit} it protects: a "
            f"mechanism that publishes one of them outright meets that δ, so the (ε, δ) "
            f"reported promises little; set privacy.delta below {1.0 / n:.3g} "
            f"(null gives {default_delta(n):.3g})")


def _adaptive_checks(values: Mapping[str, Any]) -> list[str]:
    """Adaptive clipping's settings against the noise (privacy/adaptive.py)."""
    from flower_pfl.privacy.adaptive import default_count_std

    if values["privacy.noise"] != "server":
        return ["'privacy.adaptive-clip' needs privacy.noise server: the unclipped count's "
                "noise is added by the server"]
    z, count = values["privacy.noise-multiplier"], values["privacy.count-noise"]
    count = default_count_std(sampled_per_round(values)) if count is None else count
    if z is not None and not 2 * count > z:
        return [f"'privacy.count-noise' = {count:g} (null: m/20) is too small for "
                f"'privacy.noise-multiplier' = {z:g}: adaptive clipping needs 2 x count-noise "
                f"> noise-multiplier (Andrew et al. 2021, Thm 1); raise count-noise or sample "
                f"more clients"]
    return []


def privacy_checks(values: Mapping[str, Any]) -> list[str]:
    """The ``privacy.*`` problems that need more than one key (or the strategy)."""
    mode = values["privacy.mode"]
    problems = []
    for key, readers in READ_BY.items():
        if mode not in readers and values[key] != PRIVACY_FIELDS[key].default:
            problems.append(f"'{key}' = {values[key]!r} is read only with privacy.mode "
                            f"{' or '.join(readers)}, not {mode!r}{WHY_NOT.get(key, '')}")
    for key, needers in REQUIRED_BY.items():
        if mode in needers and values[key] is None:
            problems.append(f"'{key}' must be set for privacy.mode {mode!r} "
                            f"({PRIVACY_FIELDS[key].allowed})")
    for key in ADAPTIVE_KEYS:
        if not values["privacy.adaptive-clip"] and values[key] != PRIVACY_FIELDS[key].default:
            problems.append(f"'{key}' = {values[key]!r} is read only with "
                            f"privacy.adaptive-clip true")
    if mode == "none":
        return problems
    if mode == "client-level" and values["privacy.adaptive-clip"]:
        problems.extend(_adaptive_checks(values))
    try:
        refusal = decision(str(values["strategy"])).refusal(mode)
    except KeyError as exc:
        return [*problems, str(exc.args[0])]
    if refusal:
        problems.append(f"privacy.mode {mode!r} is refused for strategy "
                        f"{values['strategy']!r}: {refusal}")
    elif mode == "sample-level" and not SAMPLE_LEVEL_BUILT:
        problems.append("privacy.mode 'sample-level' is not wired into the clients' training "
                        "yet (issue #52, step 4): use client-level")
    elif mode == "sample-level" and values["model"] in PER_SAMPLE_REFUSED:
        problems.append(f"privacy.mode 'sample-level' with model {values['model']!r}: "
                        f"{PER_SAMPLE_REFUSED[values['model']]}")
    if values["max-update-norm"] is not None and mode == "client-level" \
            and values["privacy.clip-norm"] is not None \
            and values["max-update-norm"] < values["privacy.clip-norm"]:
        problems.append(f"'max-update-norm' = {values['max-update-norm']} is below "
                        f"'privacy.clip-norm' = {values['privacy.clip-norm']}: under DP both "
                        f"clip, so the noise would be calibrated to the larger bound; set "
                        f"privacy.clip-norm to the bound you mean")
    target = values["privacy.target-epsilon"]
    if mode == "client-level" and not problems and target is not None:
        from flower_pfl.privacy.accountant import ClientLevelAccountant  # dp-accounting

        first = ClientLevelAccountant(participants(values), client_delta(values)).epsilon(
            (sampled_per_round(values), float(values["privacy.noise-multiplier"])))
        if first > target:
            problems.append(f"'privacy.target-epsilon' = {target} is below the ε of a single "
                            f"round ({first:.4g} at noise-multiplier "
                            f"{values['privacy.noise-multiplier']}, δ = "
                            f"{client_delta(values):.3g}): no round could run")
    return problems
