"""Local training and evaluation loops shared by every client.

Data stays in memory (client datasets are small; the pooled images as the shared uint8 map,
normalised per batch by :class:`flower_pfl.learning.data.NormalizedImages`), so mini-batches
are index slices of a seeded permutation -- no DataLoader workers to start per round.
A regulariser callable is added to the loss and differentiated with the data term; a
:class:`flower_pfl.algorithms.prox.Prox` (the squared proximal term of FedAMP, FedProx,
pFedMe and Ditto) is instead added as a gradient after the data loss's backward pass,
bit for bit autograd's (:func:`~flower_pfl.algorithms.prox.add_prox_grad_`).

``train_lwsam`` loops PLGU's SAM / LWSAM step (:func:`flower_pfl.algorithms.lwsam.lwsam_step`,
PLGU Algorithm 1) over the same mini-batch schedule as ``train``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from flower_pfl.algorithms.lwsam import lwsam_step
from flower_pfl.algorithms.prox import PROX_VALUE_EVERY, Prox, add_prox_grad_
from flower_pfl.learning.schedule import lr_of_config


@dataclass(frozen=True)
class TrainSpec:
    """How many local updates and with what optimiser settings."""

    lr: float
    batch_size: int
    epochs: int = 1
    steps: int | None = None  # if set, overrides epochs: exactly this many mini-batches
    momentum: float = 0.0
    weight_decay: float = 0.0
    drop_last: bool = False  # True: every step a full batch (the pass's remainder is skipped)
    optimizer: str = "sgd"  # sgd | adam | adamw (make_optimizer)
    betas: tuple[float, float] = (0.9, 0.999)  # adam / adamw
    eps: float = 1e-8  # adam / adamw

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], server_round: int = 1) -> "TrainSpec":
        """The spec of ``server_round``: ``lr`` is that round's rate of
        ``train.lr-schedule`` (:func:`flower_pfl.learning.schedule.lr_of_config`)."""
        values = getattr(cfg, "values", cfg)
        return cls(lr=lr_of_config(values, server_round), batch_size=cfg["train.batch-size"],
                   epochs=cfg["train.epochs"], steps=cfg["train.steps"],
                   momentum=cfg["train.momentum"], weight_decay=cfg["train.weight-decay"],
                   drop_last=cfg["train.drop-last"], optimizer=cfg["train.optimizer"],
                   betas=(float(cfg["train.betas"][0]), float(cfg["train.betas"][1])),
                   eps=float(cfg["train.eps"]))

    def num_steps(self, num_samples: int) -> int:
        if self.steps is not None:
            return self.steps
        return self.epochs * self.steps_per_pass(num_samples)

    def steps_per_pass(self, num_samples: int, batches_per_step: int = 1) -> int:
        """Steps of ``batches_per_step`` batches in one pass over ``num_samples`` (at least
        1): the remainder counts as a step unless ``drop_last``."""
        size = batches_per_step * self.batch_size
        return max(1, num_samples // size if self.drop_last else -(-num_samples // size))


def batches(num_samples: int, batch_size: int, num_steps: int,
            generator: torch.Generator, drop_last: bool = False) -> Iterator[torch.Tensor]:
    """Yield ``num_steps`` index batches, reshuffling after each pass over the data.

    ``drop_last``: a pass ends where fewer than ``batch_size`` samples are left (they wait
    for a later pass), so every batch is full -- unless the client holds fewer samples than
    one batch, then each batch is all of them.  Without it the last batch of a pass holds
    the remainder (``num_samples % batch_size``, as few as 1): one step at the full learning
    rate on that many samples, which can swing a model trained on skewed data (the PLGU
    lowest-5% run in docs/RESULTS.md)."""
    perm = torch.randperm(num_samples, generator=generator)
    pos = 0
    full = drop_last and num_samples >= batch_size
    for _ in range(num_steps):
        if pos >= num_samples or (full and pos + batch_size > num_samples):
            perm, pos = torch.randperm(num_samples, generator=generator), 0
        yield perm[pos:pos + batch_size]
        pos += batch_size


def make_optimizer(params: Iterable[torch.Tensor], spec: TrainSpec,
                   lr: float | None = None) -> torch.optim.Optimizer:
    """The local optimizer of ``spec`` at ``lr`` (default ``spec.lr``): SGD with momentum
    and (L2) weight decay, Adam (L2 weight decay added to the gradient) or AdamW (decoupled
    weight decay, Loshchilov & Hutter) with ``betas``, ``eps``.  A fresh optimizer per call:
    Adam's moments start at zero each round (nothing is carried between rounds).
    Raises ValueError for an unknown optimizer."""
    lr = spec.lr if lr is None else lr
    if spec.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=spec.momentum,
                               weight_decay=spec.weight_decay)
    if spec.optimizer in ("adam", "adamw"):
        cls = torch.optim.Adam if spec.optimizer == "adam" else torch.optim.AdamW
        return cls(params, lr=lr, betas=spec.betas, eps=spec.eps,
                   weight_decay=spec.weight_decay)
    raise ValueError(f"unknown optimizer {spec.optimizer!r}: sgd, adam or adamw")


def params_of(model: nn.Module) -> list[torch.Tensor]:
    """Detached copies of the trainable parameters (e.g. a prox center)."""
    return [p.detach().clone() for p in model.parameters()]


def gaussian_nll(noise_sq: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Self-FL eq. 4: sum_i (theta - z_i)^2 / (2 noise^2); its gradient is (theta - z)/sigma_m^2
    with sigma_m^2 = noise^2 / N (the SUM, not the mean, so eq. 8 applies as written)."""
    return lambda out, z: ((out - z) ** 2).sum() / (2.0 * noise_sq)


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, spec: TrainSpec,
          generator: torch.Generator, device: torch.device,
          regularizer: Callable[[nn.Module], torch.Tensor] | Prox | None = None,
          num_steps: int | None = None, lr: float | None = None,
          loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
          stop: Callable[[nn.Module], bool] | None = None) -> dict[str, float]:
    """Mini-batch steps of ``spec``'s optimizer (:func:`make_optimizer`; SGD by default) on
    ``loss_fn`` (+ ``regularizer(model)``); returns mean losses.

    A :class:`Prox` regularizer is applied as its gradient after the data loss's backward
    pass (:func:`add_prox_grad_`, the same gradient as autograd's); any other callable is
    added to the loss.  ``stop(model)``, if given, is called after each step's backward
    pass (gradients in ``model``, prox term included); True ends training after that step
    (an early-stop rule; ``num_steps`` is then the cap and ``local_steps`` the steps
    actually taken)."""
    model.to(device).train()
    opt = make_optimizer(model.parameters(), spec, lr)
    steps = num_steps if num_steps is not None else spec.num_steps(len(y))
    prox = regularizer if isinstance(regularizer, Prox) else None
    if prox is not None:  # the trainable parameters and their centres
        pairs = [(p, c) for p, c in zip(model.parameters(), prox.center) if p.requires_grad]
        prox_params, prox_center = [p for p, _ in pairs], [c for _, c in pairs]
    total, total_reg, done, valued = 0.0, 0.0, 0, 0
    for idx in batches(len(y), spec.batch_size, steps, generator, spec.drop_last):
        xb, yb = x[idx].to(device, non_blocking=True), y[idx].to(device, non_blocking=True)
        loss = loss_fn(model(xb), yb)
        total += float(loss.detach())
        if regularizer is not None and prox is None:
            reg = regularizer(model)
            total_reg += float(reg.detach())
            loss = loss + reg
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if prox is not None:
            value = done % PROX_VALUE_EVERY == 0
            out = add_prox_grad_(prox_params, prox_center, prox.coef, value=value)
            if value:
                assert out is not None  # value=True: the penalty's value came back
                total_reg, valued = total_reg + out, valued + 1
        halt = stop is not None and stop(model)
        opt.step()
        done += 1
        if halt:
            break
    reg_steps = valued if prox is not None else done
    return {"train_loss": total / max(done, 1), "reg_loss": total_reg / max(reg_steps, 1),
            "local_steps": float(done)}


def train_lwsam(model: nn.Module, x: torch.Tensor, y: torch.Tensor, spec: TrainSpec,
                generator: torch.Generator, device: torch.device,
                perturbed: Sequence[torch.Tensor], scales: Sequence[float], rho: float,
                plain: Sequence[torch.Tensor] = (), num_steps: int | None = None,
                lr: float | None = None,
                loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy
                ) -> dict[str, float]:
    """``num_steps`` LWSAM steps (:func:`lwsam_step`) over the same mini-batch schedule and
    with the same optimiser settings as :func:`train`; returns mean loss and step count."""
    model.to(device).train()
    tensors = list(perturbed) + list(plain)
    steps = num_steps if num_steps is not None else spec.num_steps(len(y))
    if not tensors:  # nothing to train (e.g. a one-layer model's empty FedRep body)
        return {"train_loss": float("nan"), "reg_loss": 0.0, "local_steps": 0.0}
    opt = make_optimizer(tensors, spec, lr)
    total = 0.0
    for idx in batches(len(y), spec.batch_size, steps, generator, spec.drop_last):
        xb, yb = x[idx].to(device, non_blocking=True), y[idx].to(device, non_blocking=True)
        total += lwsam_step(model, xb, yb, opt, perturbed, scales, rho, plain, loss_fn)
    return {"train_loss": total / max(steps, 1), "reg_loss": 0.0, "local_steps": float(steps)}


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device,
             batch_size: int = 1024) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of ``model`` on (x, y)."""
    model.to(device).eval()
    loss, correct = 0.0, 0
    for start in range(0, len(y), batch_size):
        xb = x[start:start + batch_size].to(device)
        yb = y[start:start + batch_size].to(device)
        out = model(xb)
        loss += float(F.cross_entropy(out, yb, reduction="sum"))
        correct += int((out.argmax(1) == yb).sum())
    n = max(len(y), 1)
    return loss / n, correct / n


def dp_train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, spec: TrainSpec,
             generator: torch.Generator, device: torch.device, noise_multiplier: float,
             max_grad_norm: float,
             regularizer: Callable[[nn.Module], torch.Tensor] | Prox | None = None,
             num_steps: int | None = None, lr: float | None = None,
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy
             ) -> tuple[dict[str, float], float]:
    """DP-SGD (Abadi et al., CCS 2016, Algorithm 1) with opacus: ``num_steps`` steps (default
    ``spec.num_steps``), each on a Poisson-sampled batch (every sample in with probability
    q = batch_size / n, what opacus' accountant assumes), per-sample gradients clipped to
    ``max_grad_norm`` (factor ``min(1, C / (||g_i|| + 1e-6))``, opacus'), Gaussian noise of
    std ``noise_multiplier x max_grad_norm`` on their sum, divided by the expected batch size
    q n, then a step of :func:`make_optimizer`'s optimizer.

    The clipped sum is formed by opacus' ghost clipping (Li et al., ICLR 2022; opacus
    ``GradSampleModuleFastGradientClipping`` + ``DPOptimizerFastGradientClipping``, the latter's
step without its copies: :mod:`flower_pfl.learning.dp_optimizer`) instead of
    per-sample gradients: a first backward pass gives each sample's gradient norm (for a
    Linear layer ||g_i|| ||a_i||, its output gradient times its input; layers without such a
    rule get per-sample gradients), a second one the gradient of sum_i c_i l_i (c_i the clip
    factor) -- the same clipped sum, without a (batch x parameters) tensor per step
    (:func:`_clipped_backward`).  ``loss_fn`` must be the MEAN of per-sample losses, sample
    i's depending only on output row i (no BatchNorm: refused below).
    A regulariser must not read data (a prox term, SCAFFOLD's linear term): its gradient is
    added after the noise (post-processing).  Returns (the metrics of :func:`train`, q).
    Raises ValueError for a model opacus cannot train per sample (BatchNorm).  Source of
    the sampling rate: opacus' ``make_private`` (poisson_sampling)."""
    from opacus.grad_sample.grad_sample_module_fast_gradient_clipping import (  # noqa: E501
        GradSampleModuleFastGradientClipping,
    )
    from opacus.validators import ModuleValidator

    from flower_pfl.learning.dp_optimizer import LeanDPOptimizer

    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        raise ValueError(f"privacy.mode sample-level: opacus cannot train this model per "
                         f"sample: {errors[0]}")
    model.to(device).train()
    n = len(y)
    q = min(1.0, spec.batch_size / n)
    steps = num_steps if num_steps is not None else spec.num_steps(n)
    gsm = GradSampleModuleFastGradientClipping(model, loss_reduction="mean",
                                               max_grad_norm=max_grad_norm,
                                               use_ghost_clipping=True)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = LeanDPOptimizer(
        make_optimizer(params, spec, lr), noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm, expected_batch_size=max(1, round(q * n)),
        loss_reduction="mean")
    norm_inputs = _norm_pass_inputs(gsm)
    prox = regularizer if isinstance(regularizer, Prox) else None
    total, total_reg = 0.0, 0.0
    try:
        with warnings.catch_warnings():
            # torch notes that the first layer's hook fires with no input gradient
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            for _ in range(steps):
                idx = torch.nonzero(torch.rand(n, generator=generator) < q).flatten()
                opt.zero_grad(set_to_none=True)
                if len(idx):
                    xb, yb = x[idx].to(device), y[idx].to(device)
                    total += _clipped_backward(gsm, opt, xb, yb, loss_fn, norm_inputs)
                else:  # an empty Poisson batch still gets its noise (a zero clipped sum)
                    for p in params:
                        p.grad = torch.zeros_like(p)
                if not opt.pre_step():  # summed, noised, / expected batch size
                    continue
                if prox is not None:
                    total_reg += float(add_prox_grad_(params, [c for p, c in zip(
                        model.parameters(), prox.center) if p.requires_grad], prox.coef,
                        value=True) or 0.0)
                elif regularizer is not None:
                    reg = regularizer(model)
                    total_reg += float(reg.detach())
                    for p, g in zip(params, torch.autograd.grad(reg, params, allow_unused=True)):
                        if g is not None and p.grad is not None:
                            p.grad = p.grad + g
                opt.original_optimizer.step()
    finally:
        gsm._close()  # hooks and per-sample buffers off: the model is a plain module again
    return ({"train_loss": total / max(steps, 1), "reg_loss": total_reg / max(steps, 1),
             "local_steps": float(steps)}, q)


def _norm_pass_inputs(gsm: Any) -> list[torch.Tensor]:
    """The tensors pass 1 of :func:`_clipped_backward` differentiates: the smallest trainable
    parameter of each module that owns one (a Linear layer's bias).  Asking for these makes
    autograd reach every such module's output -- where opacus' hooks take the gradients the
    ghost norms need -- without computing the other parameters' gradients, which pass 1
    would throw away (for a Linear layer its weight's, the largest matrix product of the
    backward pass)."""
    inputs = []
    for module in gsm.modules():
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if own:
            inputs.append(min(own, key=lambda p: p.numel()))
    return inputs


def _clipped_backward(gsm: Any, opt: Any, xb: torch.Tensor, yb: torch.Tensor,
                      loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                      norm_inputs: Sequence[torch.Tensor]) -> float:
    """Leave sum_i c_i grad l_i in each parameter's ``.grad`` (c_i = opacus' clip factor of
    sample i's gradient norm) for the batch (xb, yb) of b samples; returns the batch's mean
    loss.  Pass 1: ``loss.backward`` with the hooks on, which store each sample's gradient
    norm (ghost norms), restricted to ``norm_inputs`` (:func:`_norm_pass_inputs`: the hooks
    fire on every trainable module, the gradients of its other parameters are not
    computed); pass 2 (hooks off): the output's gradient dL/dout = (1/b) dl_i/dout_i
    scaled row by row by b c_i and back-propagated -- the gradient of sum_i c_i l_i, as
    opacus' ``DPTensorFastGradientClipping.backward`` (which needs per-sample losses; this
    needs only the mean ``loss_fn``)."""
    out = gsm(xb)
    out.retain_grad()
    loss = loss_fn(out, yb)
    loss.backward(inputs=[out, *norm_inputs], retain_graph=True)
    coef = gsm.get_clipping_coef()  # min(1, C / (||g_i|| + 1e-6)), shape (b,)
    opt.zero_grad(set_to_none=True)  # pass 1's gradients are not clipped: dropped
    assert out.grad is not None
    scale = (coef * len(yb)).to(out.grad.dtype).reshape(-1, *([1] * (out.dim() - 1)))
    gsm.disable_hooks()
    try:
        out.backward(out.grad * scale)
    finally:
        gsm.enable_hooks()
    return float(loss.detach())
