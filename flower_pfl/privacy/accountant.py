"""The ε of client-level DP over the rounds run, from Google's dp-accounting (never by hand).

A round samples m of the N clients uniformly WITHOUT replacement (strategies/nodes.py:
``m = max(min-fit-clients, round(fraction-fit * N))``), each sampled client's update is
clipped to C and Gaussian noise of std z_eff C goes on their sum (:mod:`.noise`).  Fixed-size
sampling is analysed under the "replace one client" neighbouring relation (the subsampled
RDP bound of Wang, Balle & Kasiviswanathan, AISTATS 2019, Thm 27 -- dp-accounting's
``SampledWithoutReplacementDpEvent`` in its ``RdpAccountant`` with ``REPLACE_ONE``).
Replacing one client's clipped update by another's moves the sum by up to 2C, so the
Gaussian event's multiplier (std / L2 sensitivity) is ``z_eff / 2``
(:data:`REPLACE_ONE_SENSITIVITY`).  Rounds compose (``SelfComposedDpEvent`` of each
distinct (m, z_eff)); ε is the RDP accountant's ``get_epsilon(delta)``.

Cost: one event's RDP curve (dp-accounting's ``_compute_rdp_sample_wor_gaussian``, ~0.2 s of
pure Python over its orders) is computed once per distinct (N, m, z_eff) in this process
(:func:`event_rdp`, cached) and each ε sums ``count x curve`` over the distinct events in the
order the accountant would compose them, then converts with dp-accounting's
``compute_epsilon`` -- the same floating-point operations as ``RdpAccountant.compose`` +
``get_epsilon`` on a fresh accountant, so the value is bit for bit dp-accounting's
(tests/test_privacy.py checks equality), at microseconds a round instead of 0.2 s.

The state (:meth:`ClientLevelAccountant.state`) is plain JSON -- N, δ and one
(m, z_eff) pair per round done -- so a checkpoint carries it and a resumed run continues
the same ε (strategies/checkpointing.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping, Sequence

import dp_accounting
import numpy as np
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import (
    compute_epsilon,
)

#: the L2 sensitivity of the sum of updates clipped to C, in units of C, when neighbouring
#: federations differ by REPLACING one client (fixed-size sampling needs this relation)
REPLACE_ONE_SENSITIVITY = 2.0


def round_event(num_clients: int, sampled: int, multiplier: float) -> dp_accounting.DpEvent:
    """The DpEvent of one round: m = ``sampled`` of N = ``num_clients`` clients without
    replacement, Gaussian noise of std ``multiplier`` x C on the sum of updates clipped to
    C (the event's own multiplier is ``multiplier / REPLACE_ONE_SENSITIVITY``)."""
    if not 1 <= sampled <= num_clients:
        raise ValueError(f"a round samples {sampled} of {num_clients} clients")
    if not multiplier > 0:
        raise ValueError(f"noise multiplier must be > 0, got {multiplier}")
    gaussian = dp_accounting.GaussianDpEvent(multiplier / REPLACE_ONE_SENSITIVITY)
    return dp_accounting.SampledWithoutReplacementDpEvent(num_clients, sampled, gaussian)


def _fresh() -> RdpAccountant:
    return RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)


@lru_cache(maxsize=1024)
def event_rdp(num_clients: int, sampled: int, multiplier: float) -> tuple[float, ...]:
    """The RDP curve (one value per order of a fresh :class:`RdpAccountant`) of ONE round
    :func:`round_event` (N, m, z_eff): what dp-accounting's accountant adds to its state when
    it composes that event once (0 + 1 x curve = the curve, exactly).  Cached: the curve is
    a pure function of (N, m, z_eff).  Raises ValueError as :func:`round_event`."""
    acc = _fresh().compose(round_event(num_clients, sampled, multiplier))
    return tuple(float(r) for r in acc._rdp)  # the composed state of one event


#: the RDP orders of a fresh accountant (dp-accounting's defaults), for ``compute_epsilon``
ORDERS = np.array(_fresh()._orders)


def epsilon_of(num_clients: int, delta: float, rounds: list[tuple[int, float]]) -> float:
    """ε(δ) of ``rounds`` ((m, z_eff) each) bit for bit as a fresh ``RdpAccountant`` composing
    each distinct (m, z_eff) with its count, in first-seen order, then ``get_epsilon(delta)``
    (state ``+= count x curve`` from zeros; ``compute_epsilon(orders, state, delta)``);
    0.0 for no rounds."""
    if not rounds:
        return 0.0
    state = np.zeros_like(ORDERS, dtype=np.float64)
    for (m, z), count in Counter((int(m), float(z)) for m, z in rounds).items():
        state += count * np.array(event_rdp(num_clients, m, z), dtype=np.float64)
    return float(compute_epsilon(ORDERS, state, delta)[0])


@lru_cache(maxsize=1024)
def gaussian_rdp(multiplier: float) -> tuple[float, ...]:
    """The RDP curve of one round WITHOUT subsampling amplification: the Gaussian event of
    std ``multiplier`` x C on a sum of L2 sensitivity 2C (:data:`REPLACE_ONE_SENSITIVITY`),
    what a round costs a client known to have taken part in it."""
    if not multiplier > 0:
        raise ValueError(f"noise multiplier must be > 0, got {multiplier}")
    acc = _fresh().compose(dp_accounting.GaussianDpEvent(multiplier / REPLACE_ONE_SENSITIVITY))
    return tuple(float(r) for r in acc._rdp)


def known_schedule_epsilon(delta: float, multipliers: list[float]) -> float:
    """ε(δ) of ONE client to an adversary who knows the rounds it took part in (the client
    sample is not secret: e.g. it can be re-drawn from a published seed, or fit.csv is
    public): the Gaussian event of each of its rounds (``multipliers``: z_eff of each),
    composed without the subsampling amplification :func:`epsilon_of` assumes; rounds it
    was not in cost it nothing.  0.0 for no rounds."""
    if not multipliers:
        return 0.0
    state = np.zeros_like(ORDERS, dtype=np.float64)
    for z, count in Counter(float(z) for z in multipliers).items():
        state += count * np.array(gaussian_rdp(z), dtype=np.float64)
    return float(compute_epsilon(ORDERS, state, delta)[0])


@dataclass
class ClientLevelAccountant:
    """ε(δ) of the rounds done so far.  ``rounds``: one [m, z_eff] per round, in order;
    ``taken_part``: partition-id (as text, JSON's key) -> the z_eff of each round whose
    aggregate its update entered (for :meth:`known_schedule_epsilon`)."""

    num_clients: int
    delta: float
    rounds: list[list[float]] = field(default_factory=list)
    taken_part: dict[str, list[float]] = field(default_factory=dict)

    def record(self, sampled: int, multiplier: float, contributors: Sequence[int] = ()
               ) -> None:
        """One more round: ``sampled`` clients, noise multiplier ``multiplier`` on the sum;
        ``contributors``: the partition-ids whose updates entered it."""
        round_event(self.num_clients, sampled, multiplier)  # validates
        self.rounds.append([int(sampled), float(multiplier)])
        for pid in contributors:
            self.taken_part.setdefault(str(int(pid)), []).append(float(multiplier))

    def known_schedule_epsilon(self) -> float:
        """The largest ε(δ) of any client to an adversary who knows who took part in which
        round (:func:`known_schedule_epsilon`; 0.0 before any round).  Computed once per
        distinct multiset of multipliers (with one z, once per participation count)."""
        distinct = {tuple(sorted(zs)) for zs in self.taken_part.values()}
        return max((known_schedule_epsilon(self.delta, list(zs)) for zs in distinct),
                   default=0.0)

    def epsilon(self, extra: tuple[int, float] | None = None) -> float:
        """ε after the rounds done (and one more ``extra`` = (m, z_eff) round: what the
        next round would cost); 0.0 before any round."""
        rounds = [(int(m), float(z)) for m, z in self.rounds]
        if extra is not None:
            round_event(self.num_clients, *extra)  # validates
            rounds.append((int(extra[0]), float(extra[1])))
        return epsilon_of(self.num_clients, self.delta, rounds)

    def state(self) -> dict[str, Any]:
        """JSON-ready: everything :meth:`from_state` needs to continue the same ε."""
        return {"num_clients": self.num_clients, "delta": self.delta,
                "rounds": [list(r) for r in self.rounds],
                "taken_part": {k: list(v) for k, v in self.taken_part.items()}}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "ClientLevelAccountant":
        return cls(int(state["num_clients"]), float(state["delta"]),
                   [[int(m), float(z)] for m, z in state["rounds"]],
                   {str(k): [float(z) for z in v]
                    for k, v in state.get("taken_part", {}).items()})


def noise_for_epsilon(num_clients: int, sampled: int, rounds: int, delta: float,
                      target: float) -> float:
    """The smallest noise multiplier z whose ``rounds`` rounds (m = ``sampled`` of N) stay
    within ε(δ) <= ``target``: dp-accounting's ``calibrate_dp_mechanism`` (a bracketed search
    of the same events :func:`round_event` builds) -- for a matrix that fixes ε, not z."""
    from dp_accounting import mechanism_calibration as mc

    return float(mc.calibrate_dp_mechanism(
        _fresh, lambda z: dp_accounting.SelfComposedDpEvent(
            round_event(num_clients, sampled, z), rounds), target, delta,
        mc.ExplicitBracketInterval(0.1, 100.0), tol=1e-3))


def rounds_within(num_clients: int, sampled: int, multiplier: float, delta: float,
                  target: float, limit: int) -> int:
    """How many full rounds (at most ``limit``) keep ε(δ) <= ``target`` (0: not even one)."""
    acc = ClientLevelAccountant(num_clients, delta)
    done = 0
    while done < limit and acc.epsilon((sampled, multiplier)) <= target:
        acc.record(sampled, multiplier)
        done += 1
    return done
