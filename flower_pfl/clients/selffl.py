"""Self-FL client -- Chen et al., Algorithm 1 (client side).

Keeps in context.state its personal parameters theta_m^{t-1} and the Welford moments of
eq. 13.  Each round:

  sigma_m^2 by eq. 13 (empirical variance of the samples so far);
  theta_m^INIT by eq. 10 from the global model theta^{t-1}, its previous personal model
  and the server's sigma_0^2 and S_{-m};
  variance-estimator 'bootstrap' (default, section 3.2): a copy, started from
  theta_m^INIT, trains on a bootstrap resample of the local train set until the
  ConvergenceRule fires or ``bootstrap-max-steps`` -> the local optimum theta_{m,t} and
  the per-step contraction it achieved (the curvature h_m of eq. 8, 'measured'); its
  moments feed eq. 13, and the upload carries d_m = theta_{m,t} - theta^{t-1} (float32, the
  size of the model) after the model as its extra part ``optimum-offset`` (checked by the
  server like a model array) and the fit metrics ||d_m||^2, so the server can form eq. 14
  over local optima.
  'surrogate': eq. 13 over the personal models theta_m^t, nothing extra uploaded;
  a first participation with ``first-fits`` > 1 (partial participation) fits that many
  independent resamples, so eq. 13 has two samples at once and this round's eqs. 8/10 use it;
  neither takes a sample in the early warm-up rounds (``sample-variance`` false: the
  server's warm start, strategies/selffl.py);
  (l_m, eta_m) by eq. 8 (flower_pfl/selffl_math.local_schedule), l_m SGD steps of size
  eta_m from theta_m^INIT -> the new personal model theta_m^t.

Returns theta_m^t (and d_m), sigma_m^2, and every rule it used: ``steps_rule`` (one of
selffl_math.RULES), ``init_coef`` (0 = eq. 10 undefined, started from the global model),
``eta_m``, and for the bootstrap its steps, whether the rule fired and its seconds.
The bootstrap copy starts where the round's training starts (theta_m^INIT): "treat each
round of local training as the optimization from a bootstrapped sample" (section 3.2).
"""

from __future__ import annotations

import math
import time
from typing import TypedDict

import numpy as np
import torch
from flwr.common import NDArrays
from torch import nn

from flower_pfl.algorithms import selffl_math as sm
from flower_pfl.catalog import selffl
from flower_pfl.catalog.selffl import SelfFLFit, SelfFLReply
from flower_pfl.clients.base import MessageConfig, Metrics, PersonalStateClient
from flower_pfl.learning.models import get_arrays
from flower_pfl.learning.params import ParamSpec
from flower_pfl.learning.training import train
from flower_pfl.registry import client_for
from flower_pfl.reliability.uploads import UploadTemplate


def first_participation_fits(first_fits: int, samples: int) -> int:
    """Bootstrap fits this round: enough for eq. 13's two samples at once when the server
    asks for ``first_fits`` > 1 (partial participation), else the one sample per round."""
    return max(1, first_fits - samples) if first_fits > 1 else 1


class Bootstrap(TypedDict, total=False):
    """The bootstrap fit's part of a reply (:class:`~flower_pfl.instructions.SelfFLReply`'s
    fields of the same names)."""

    bootstrap_steps: float
    bootstrap_converged: bool
    bootstrap_s: float
    curvature: float  # NaN: unknown (sent as -1)
    bootstrap_fits: int
    optimum_sq_norm: float


def _known(value: float) -> float:
    value = float(value)
    return value if value >= 0 else math.nan


@client_for(selffl.SELFFL)
class SelfFLClient(PersonalStateClient):
    def load_moments(self) -> sm.Welford:
        meta = self.state.get_values("selffl") or {"count": 0}
        arrays = self.state.get_arrays("selffl-moments")
        if arrays is None:
            return sm.Welford()
        return sm.Welford(int(meta["count"]), arrays[0].astype(np.float64),
                          arrays[1].astype(np.float64))

    def save_moments(self, moments: sm.Welford) -> None:
        assert moments.mean is not None and moments.m2 is not None  # count > 0: add() set them
        self.state.set_values("selffl", {"count": moments.count})
        self.state.set_arrays("selffl-moments", [moments.mean, moments.m2])

    def bootstrap_optimum(self, init: np.ndarray, spec: ParamSpec, config: MessageConfig,
                          fit: int = 0) -> tuple[np.ndarray, Bootstrap]:
        """theta_{m,t}: train a copy from ``init`` on a bootstrap resample of the local train
        set until the ConvergenceRule fires (or the step cap); returns it flattened.
        ``fit`` > 0: a further independent resample of the same round (first participation)."""
        sent = SelfFLFit.from_config(config)
        n = self.data.num_train
        rng = np.random.default_rng([self.cfg["seed"], self.pid, self.round, 0xB007]
                                    + ([fit] if fit else []))
        idx = torch.from_numpy(rng.integers(0, n, size=n))
        x, y = self.data.x_train[idx], self.data.y_train[idx]
        model = self.new_model(spec.unflatten(init.astype(np.float32)))
        cap = sent.bootstrap_max_steps
        # window: one pass over the resample, but at most a third of the cap so that the
        # contraction is always measured over at least cap/3 steps
        rule = sm.ConvergenceRule(sent.bootstrap_tol,
                                  window=min(-(-n // self.spec.batch_size), max(1, cap // 3)))

        def stop(m: nn.Module) -> bool:
            # (arg-type: after a backward pass some parameter has a gradient, so the sum is
            # a Tensor, never sum()'s start 0)
            norm = torch.sqrt(sum((p.grad.detach() ** 2).sum()  # type: ignore[arg-type]
                                  for p in m.parameters() if p.grad is not None))
            return rule.update(float(norm))

        loss_fn = self.loss_fn()
        lr = sent.bootstrap_lr if sent.bootstrap_lr > 0 else sent.eta
        started = time.perf_counter()
        out = train(model, x, y, self.spec, self.generator(salt=1 + fit), self.device,
                    num_steps=cap, lr=lr,
                    loss_fn=loss_fn, stop=stop)
        rho = rule.contraction()
        info: Bootstrap = {
            "bootstrap_steps": out["local_steps"], "bootstrap_converged": rule.converged,
            "bootstrap_s": time.perf_counter() - started,
            "curvature": sm.measured_curvature(rho, lr)}
        return spec.flatten(get_arrays(model)).astype(np.float64), info

    def fit_round(self, parameters: NDArrays, config: MessageConfig
                  ) -> tuple[NDArrays, Metrics]:
        spec = ParamSpec.of(parameters)
        theta_global = spec.flatten(parameters).astype(np.float64)
        personal = self.state.get_arrays("personal")
        theta_prev = theta_global if personal is None else spec.flatten(personal).astype(np.float64)
        moments = self.load_moments()
        default_steps = self.spec.num_steps(self.data.num_train)
        sent = SelfFLFit.from_config(config)
        oracle = _known(sent.oracle_sigma_sq)
        extra: Bootstrap = {}
        upload: dict[str, list[np.ndarray]] = {}
        sample = sent.sample_variance  # False in the early warm-up rounds
        boot = sent.variance_estimator == "bootstrap" and sample
        fits = first_participation_fits(sent.first_fits, moments.count) \
            if boot and not math.isfinite(oracle) else 1
        if fits > 1:
            # first participation under partial participation: u = fits independent
            # resamples now (section 3.2: "u independent samples of its data and the
            # corresponding local optimal parameter"), so eq. 13 is known this round and
            # eqs. 8/10 use it at once instead of at the client's next participation.  The
            # fits start at the global model (eq. 10 cannot be formed without sigma_m^2; for
            # a client without a personal model it IS the global model)
            for k in range(fits):
                found, info = self.bootstrap_optimum(theta_global, spec, config, fit=k)
                moments.add(found - theta_global if sent.eq13_samples == "offset"
                            else found)
                if k == 0:  # eq. 14's sample and eq. 8's contraction: the first resample
                    optimum, extra = found, {**info, "bootstrap_fits": fits}
        sigma_m_sq = oracle if math.isfinite(oracle) else moments.variance  # eq. 13
        eta = sent.eta
        sigma0_sq, s_minus = _known(sent.sigma0_sq), _known(sent.s_minus)
        coef = 0.0 if sent.warmup else sm.init_coefficient(sigma0_sq, sigma_m_sq, s_minus)
        init = sm.init_params(theta_global, theta_prev, coef)  # eq. 10 (coef 0: global model)
        if boot and fits == 1:
            # the fit runs first: its contraction sets this round's eq. 8 ('measured')
            optimum, extra = self.bootstrap_optimum(init, spec, config)
        curvature = extra.get("curvature") if sent.contraction == "measured" else None
        eta_m: float | None
        if sent.warmup:
            steps, eta_m, why = default_steps, None, sm.RULE_WARMUP
        else:
            steps, eta_m, why = sm.local_schedule(eta, sigma_m_sq, s_minus, sent.l_max,
                                                  default_steps, curvature=curvature)
        model = self.new_model(spec.unflatten(init.astype(np.float32)))
        metrics = self.local_train(model, num_steps=steps, lr=eta_m)
        theta_new = get_arrays(model)
        if boot:
            offset = optimum - theta_global  # d_m: what eq. 14 needs (with ||d_m||^2)
            # eq. 13 over the local optima theta_{m,t}, or over their offsets d_m to the
            # round's global model (the global model's drift is not client noise)
            if fits == 1:  # (first participation: already added above)
                moments.add(offset if sent.eq13_samples == "offset" else optimum)
            upload[sm.OPTIMUM_OFFSET] = [offset.astype(np.float32)]
            extra["optimum_sq_norm"] = float(offset @ offset)
        elif sample:
            moments.add(spec.flatten(theta_new))  # surrogate: eq. 13 over theta_m^t
        if moments.count:
            self.save_moments(moments)
        self.save_personal(model)
        reported = oracle if math.isfinite(oracle) else moments.variance
        if "curvature" in extra and not math.isfinite(extra["curvature"]):
            extra["curvature"] = -1.0  # unknown
        reply = SelfFLReply(**extra, sigma_sq=reported if math.isfinite(reported) else -1.0,
                            local_steps=steps, init_coef=coef,
                            eta_m=self.spec.lr if eta_m is None else eta_m, steps_rule=why)
        return UploadTemplate(theta_new, upload).arrays, {**metrics, **reply.to_config()}
