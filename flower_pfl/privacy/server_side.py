"""The server's part of client-level DP, one round at a time (numpy only; glue called by
strategies/private_round.py, math in :mod:`.clipping`, :mod:`.noise`, :mod:`.accountant`).

Per round: :meth:`ClientLevelDP.client_config` is what each sampled client is told (its
clip, what its update is a delta against, its noise share); every accepted upload is
clipped again here (:meth:`ClientLevelDP.clip_upload`: the server never relies on a client's
own clip; a no-op on an honest client) and weighted equally; with ``noise: server`` ONE
draw of the aggregate's noise is added to every accepted upload (:meth:`add_noise`), so
any aggregate that is the uploads' mean -- FedAvg's, FedRep's, SCAFFOLD's two means,
PLGU-LF's per-array means over the clients that shared the array -- comes out as the noised
mean, and everything the strategy computes from it is post-processing; then the round is
accounted (:meth:`record`).  ``updates`` are duck-typed: ``.arrays`` (model part, k arrays),
``.extra`` ({name: arrays}), ``.metrics`` (PLGU-LF's ``shared`` mask), ``.num_examples``,
``.pid`` (the accountant keeps who took part in which round: ``epsilon_known_schedule``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from flower_pfl.instructions import PrivateFit, PrivateReply
from flower_pfl.privacy import adaptive
from flower_pfl.privacy import noise as nz
from flower_pfl.privacy.accountant import ClientLevelAccountant
from flower_pfl.privacy.clipping import clip_update
from flower_pfl.privacy.fields import client_delta, participants, sampled_per_round
from flower_pfl.privacy.policy import decision


class ClientLevelDP:
    """Clip, noise and account client-level DP for one run (see the module docstring)."""

    def __init__(self, values: Mapping[str, Any],
                 rng: np.random.Generator | None = None) -> None:
        self.clip = float(values["privacy.clip-norm"])
        self.z = float(values["privacy.noise-multiplier"])
        self.place = str(values["privacy.noise"])
        self.target = values["privacy.target-epsilon"]
        self.sampled = sampled_per_round(values)
        self.reference = decision(str(values["strategy"])).reference
        # N: the clients a round may sample (held-out newcomers never are)
        self.accountant = ClientLevelAccountant(participants(values), client_delta(values))
        #: OS entropy: the noise must not be predictable from the run's seed (config.json)
        self.rng = rng if rng is not None else np.random.default_rng()
        self.clipped = 0  # uploads of the current round whose update the server shortened
        self._next: tuple[int, float] | None = None  # (rounds done, ε after one more)
        # adaptive clipping (privacy/adaptive.py): C moves each round; the update's noise
        # multiplier is raised so that it and the count's noise spend z together
        self.adaptive = bool(values.get("privacy.adaptive-clip", False))
        self.update_z = self.z
        if self.adaptive:
            count = values.get("privacy.count-noise")
            self.count_std = float(count) if count is not None else \
                adaptive.default_count_std(self.sampled)
            self.quantile = float(values["privacy.target-quantile"])
            self.clip_lr = float(values["privacy.clip-lr"])
            self.update_z = adaptive.update_multiplier(self.z, self.count_std)

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> "ClientLevelDP | None":
        return cls(values) if values.get("privacy.mode") == "client-level" else None

    def client_config(self, sampled: int) -> dict[str, Any]:
        """What a sampled client is sent: its clip, its update's reference, its noise share
        (0.0 under ``noise: server``)."""
        share = nz.client_std(self.z, self.clip, sampled) if self.place == "clients" else 0.0
        return PrivateFit(clip=self.clip, reference=self.reference, noise_std=share).to_config()

    def clip_upload(self, model: Sequence[np.ndarray], extra: Mapping[str, Sequence[np.ndarray]],
                    sent: Sequence[np.ndarray] | None
                    ) -> tuple[list[np.ndarray], dict[str, list[np.ndarray]], float]:
        """(model part, extra parts, norm before) of one upload whose update -- model part
        minus ``sent`` (zeros for a delta upload), then every extra part against zeros, as
        one vector -- is clipped to C."""
        arrays = [*model, *(a for part in extra.values() for a in part)]
        ref = None
        if self.reference == "sent" and sent is not None:
            ref = [*sent, *(np.zeros_like(a) for part in extra.values() for a in part)]
        out, norm = clip_update(arrays, ref, self.clip)
        if norm > self.clip:
            self.clipped += 1
        k = len(model)
        parts, start = {}, k
        for name, part in extra.items():
            parts[name] = out[start:start + len(part)]
            start += len(part)
        return out[:k], parts, norm

    @staticmethod
    def contributors(updates: Sequence[Any]) -> list[int]:
        """Per model array, how many updates carry it (PLGU-LF's ``shared`` mask; else all)."""
        n_arrays = len(updates[0].arrays)
        counts = np.zeros(n_arrays, dtype=int)
        for u in updates:
            mask = str(u.metrics.get("shared", "1" * n_arrays))
            counts += np.array([c == "1" for c in mask], dtype=int)[:n_arrays] \
                if len(mask) == n_arrays else 1
        return counts.tolist()

    def add_noise(self, updates: Sequence[Any]) -> None:
        """Server noise: one draw N(0, (z C / c_k)^2) per model array k (c_k its
        contributors) and N(0, (z C / n)^2) per extra array, added to EVERY update (in
        place), so the mean of the updates is the noised mean.  Nothing under
        ``noise: clients`` (the clients added their shares)."""
        if self.place != "server" or not updates:
            return
        counts = self.contributors(updates)
        model_noise = nz.gaussian_like(updates[0].arrays, [
            nz.server_std(self.update_z, self.clip, c) if c else 0.0 for c in counts], self.rng)
        extra_noise = {name: nz.gaussian_like(part, nz.server_std(self.update_z, self.clip,
                                                                  len(updates)), self.rng)
                       for name, part in updates[0].extra.items()}
        for u in updates:
            u.arrays = [(np.asarray(a, dtype=np.float64) + e).astype(np.asarray(a).dtype)
                        for a, e in zip(u.arrays, model_noise)]
            u.extra = {name: [(np.asarray(a, dtype=np.float64) + e).astype(np.asarray(a).dtype)
                              for a, e in zip(part, extra_noise[name])]
                       for name, part in u.extra.items()}

    def round_multiplier(self, updates: Sequence[Any], sampled: int) -> float:
        """The noise multiplier the round's sums really had (:func:`noise.effective_multiplier`
        with the fewest contributors of any shared array)."""
        counts = [c for c in self.contributors(updates) if c] or [len(updates)]
        return nz.effective_multiplier(self.z, self.place, min(counts), sampled)

    def record(self, updates: Sequence[Any], sampled: int) -> dict[str, float]:
        """Account the round; its server.csv measures (ε after it, the multiplier, clips)."""
        z_eff = self.round_multiplier(updates, sampled)
        self.accountant.record(sampled, z_eff, [u.pid for u in updates])
        row = {"epsilon": round(self.epsilon(), 6),
               "epsilon_known_schedule": round(self.accountant.known_schedule_epsilon(), 6),
               "dp_noise_multiplier": round(z_eff, 6),
               "dp_server_clipped": self.clipped, "dp_clip_norm": self.clip}
        self.clipped = 0
        if self.adaptive:  # the clients' bits (a missing one counts as clipped)
            unclipped = sum(1 for u in updates  # a missing bit counts as clipped
                            if PrivateReply.from_config(u.metrics).dp_clipped == 0)
            self.clip, row["dp_unclipped_fraction"] = adaptive.next_clip(
                self.clip, unclipped, len(updates), self.quantile, self.clip_lr,
                self.count_std, self.rng)
        return row

    def epsilon(self) -> float:
        return self.accountant.epsilon()

    def next_round_exceeds(self) -> bool:
        """Whether one more round (at the configured multiplier) would take ε past
        ``target-epsilon`` (False without a target)."""
        if self.target is None:
            return False
        done = len(self.accountant.rounds)  # asked several times a round: computed once
        if self._next is None or self._next[0] != done:
            self._next = (done, self.accountant.epsilon((self.sampled, self.z)))
        return self._next[1] > float(self.target)

    def state(self) -> dict[str, Any]:
        """The accountant's state and the clip the next round uses (adaptive clipping)."""
        return {"accountant": self.accountant.state(), "clip": self.clip}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.accountant = ClientLevelAccountant.from_state(state["accountant"])
        self.clip = float(state["clip"])
        self._next = None
