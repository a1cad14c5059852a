"""Sample-level DP before start: the run's own model takes one DP-SGD step here
(:func:`~flower_pfl.learning.training.dp_train`, opacus' per-sample clipping and noise) on a
batch of the run's data, so a model opacus cannot train per sample is refused before any
client starts, with the fix -- not in every client in round 1 with opacus' long message.

Two kinds are named before the step is tried:

* normalisation over the batch (``BatchNorm*``, ``SyncBatchNorm``, ``InstanceNorm`` with
  running statistics): sample i's output depends on the other samples, so no per-sample
  gradient exists (opacus' ``ModuleValidator``).  Fix: ``GroupNorm`` / ``LayerNorm``;
  ``opacus.validators.ModuleValidator.fix(model)`` swaps BatchNorm for GroupNorm.
* in-place activations (``nn.ReLU(inplace=True)``, any module with ``inplace=True``): they
  overwrite the output opacus' backward hooks read (meta-pytorch/opacus#828, #319), and
  ``ModuleValidator.fix`` leaves them.  Fix: ``inplace=False``.

Anything else the step raises is refused with its type and first line.  CPU, a copy of
the model, a few milliseconds for a small model.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

#: what to do about the model opacus refuses, by its validator's error class name
FIXES = {"ShouldReplaceModuleError": "replace each BatchNorm with GroupNorm or LayerNorm "
         "(opacus.validators.ModuleValidator.fix(model) does it for BatchNorm)"}


def inplace_modules(model: Any) -> list[str]:
    """The names of ``model``'s submodules with ``inplace=True`` (e.g. ``ReLU``)."""
    return [name or type(model).__name__ for name, m in model.named_modules()
            if getattr(m, "inplace", False) is True]


def dp_step_problem(model: Any, batch: Any, classes: int, values: Mapping[str, Any]
                    ) -> str | None:
    """Why ``model`` (a torch module) cannot take a DP-SGD step under the run's sample-level
    settings (``values``: ``privacy.noise-multiplier``, ``privacy.max-grad-norm``, the
    ``train.*`` keys), on ``batch`` (``(B, *input)``; labels ``i mod classes``); None where
    the step runs.  The model itself is not changed (a deep copy trains)."""
    import torch
    from opacus.validators import ModuleValidator

    from flower_pfl.learning.training import TrainSpec, dp_train

    name = values["model"]
    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        kind = type(errors[0]).__name__
        fix = FIXES.get(kind, "change those layers")
        return (f"model {name!r} cannot train under privacy.mode sample-level: opacus "
                f"refuses it ({len(errors)} problem(s), the first: {errors[0]}). Fix: {fix}")
    inplace = inplace_modules(model)
    if inplace:
        return (f"model {name!r} cannot train under privacy.mode sample-level: its in-place "
                f"module(s) {inplace[:5]} overwrite the outputs opacus' per-sample hooks "
                f"read (opacus' ModuleValidator.fix leaves them). Fix: inplace=False (e.g. "
                f"nn.ReLU() for nn.ReLU(inplace=True))")
    trial = copy.deepcopy(model).cpu()
    labels = torch.arange(len(batch)) % classes
    spec = TrainSpec(lr=float(values["train.lr"]), batch_size=len(batch),
                     optimizer=values["train.optimizer"])  # the step's form, not its size
    try:
        dp_train(trial, batch.cpu(), labels, spec, torch.Generator().manual_seed(0),
                 torch.device("cpu"), float(values["privacy.noise-multiplier"]),
                 float(values["privacy.max-grad-norm"]), num_steps=1)
    except Exception as exc:  # noqa: BLE001 - whatever opacus or the model raises
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        return (f"model {name!r} fails one DP-SGD step under privacy.mode sample-level "
                f"(the clients would fail in round 1): {type(exc).__name__}: {first}")
    return None
