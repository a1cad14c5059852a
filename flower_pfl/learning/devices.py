"""Which device a client trained on: reported with every fit and evaluate reply.

Client side (clients/base.py): :func:`start_fit` resets CUDA's peak-memory counter when a
fit starts; :func:`fit_report` reads the GPU's name and the peak memory allocated since
then and returns :func:`device_metrics` -- a pure function of (device, GPU name, peak
bytes), so the reporting is testable without a GPU.  The values travel as fit/evaluate
metrics, all plain ``str``/``float`` (never None: a missing value is a missing key):

* ``device``        -- ``cpu`` or ``cuda:N`` (``mps``, ... as torch names them)
* ``gpu_name``      -- CUDA only: ``torch.cuda.get_device_name``
* ``gpu_peak_mib``  -- CUDA only: ``torch.cuda.max_memory_allocated`` of that fit, in MiB

Server side (strategies/base.py): the keys go to ``fit.csv`` and ``clients.csv`` and
:func:`describe` turns a round's reports into the log line's
``devices cuda:0 (NVIDIA H100) x3, cpu x1, GPU peak 812.4 MiB``.

No Flower import; torch only inside the client-side functions.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable, Mapping

if TYPE_CHECKING:  # torch only inside the client-side functions (above)
    import torch

DEVICE = "device"
GPU_NAME = "gpu_name"
GPU_PEAK_MIB = "gpu_peak_mib"
#: the metric keys this module reports (strings: ``device``, ``gpu_name``; float: peak)
KEYS = (DEVICE, GPU_NAME, GPU_PEAK_MIB)

MIB = 2 ** 20


def device_metrics(device: Any, gpu_name: str | None = None,
                   peak_bytes: int | float | None = None) -> dict[str, str | float]:
    """The metrics a client reports for one fit (pure: no torch call).

    ``device`` is a ``torch.device`` or its string (``cpu``, ``cuda:0``).  The GPU name and
    the peak memory are reported only for a CUDA device and only when known: a CPU fit
    gets ``{"device": "cpu"}`` and nothing else (no zero or empty stand-ins)."""
    label = str(device)
    out: dict[str, str | float] = {DEVICE: label}
    if label.split(":")[0] != "cuda":
        return out
    if gpu_name:
        out[GPU_NAME] = str(gpu_name)
    if peak_bytes is not None:
        out[GPU_PEAK_MIB] = round(float(peak_bytes) / MIB, 1)
    return out


def _cuda(device: str | torch.device) -> torch.device | None:
    """``device`` as a ``torch.device`` with an index when it is a usable CUDA device
    (a bare ``cuda`` gets the current device's index), else None."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def start_fit(device: str | torch.device) -> None:
    """Reset the peak-memory counter of ``device`` (CUDA only) before a fit."""
    cuda = _cuda(device)
    if cuda is not None:
        import torch

        torch.cuda.reset_peak_memory_stats(cuda)


def fit_report(device: str | torch.device, peak: bool = True) -> dict[str, str | float]:
    """:func:`device_metrics` of ``device`` now: on CUDA its name and (``peak``) the peak
    memory allocated since :func:`start_fit`."""
    import torch

    cuda = _cuda(device)
    if cuda is None:
        return device_metrics(torch.device(device))
    return device_metrics(cuda, torch.cuda.get_device_name(cuda),
                          int(torch.cuda.max_memory_allocated(cuda)) if peak else None)


def select(metrics: Mapping[str, Any]) -> dict[str, str | float]:
    """The device keys of a reply's metrics, with plain Python types."""
    out: dict[str, str | float] = {}
    for key in KEYS:
        if key in metrics:
            out[key] = float(metrics[key]) if key == GPU_PEAK_MIB else str(metrics[key])
    return out


def describe(reports: Iterable[Mapping[str, Any]]) -> str:
    """``cuda:0 (NVIDIA H100) x3, cpu x1, GPU peak 812.4 MiB``: how many clients used each
    device (most used first) and, when any used CUDA, the largest peak memory.  A report
    without a ``device`` key counts as ``unknown``."""
    counts: Counter[str] = Counter()
    peaks: list[float] = []
    for r in reports:
        label = str(r.get(DEVICE, "unknown"))
        if r.get(GPU_NAME):
            label += f" ({r[GPU_NAME]})"
        counts[label] += 1
        if r.get(GPU_PEAK_MIB) is not None:
            peaks.append(float(r[GPU_PEAK_MIB]))
    text = ", ".join(f"{label} x{n}" for label, n in
                     sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    if peaks:
        text += f", GPU peak {max(peaks):.1f} MiB"
    return text or "none"


def cuda_devices() -> tuple[int, str]:
    """``(count, why_none)``: how many CUDA devices torch can train on in this process
    (``torch.cuda.device_count()``; 0 where ``torch.cuda.is_available()`` is False) and,
    when none, why in words -- torch built without CUDA, ``CUDA_VISIBLE_DEVICES`` hiding
    every device, or no device found.  ``why_none`` is ``""`` when ``count > 0``.  Imports
    torch: the launcher calls it in a child (:mod:`flower_pfl.reliability.preflight`)."""
    import os

    import torch

    if torch.cuda.is_available():
        count = int(torch.cuda.device_count())
        if count > 0:
            return count, ""
    if torch.version.cuda is None:
        return 0, f"torch {torch.__version__} is built without CUDA"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0, f"CUDA_VISIBLE_DEVICES={visible!r} hides every CUDA device"
    return 0, f"torch {torch.__version__} finds no CUDA device"
