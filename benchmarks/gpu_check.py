"""GPU check of the local-training path (models, training loop, device selection).

Trains the same client with the same seed on the CPU and on CUDA (``device: auto``) and
prints the loss trajectories side by side and the time per local epoch for the CNN and
ResNet-18 on one client's FMNIST data.  Needs no Flower runtime; run it where a GPU is:

    python benchmarks/gpu_check.py [--data-root DIR_WITH_FMNIST_GZ]
"""

from __future__ import annotations

import argparse
import time

import torch

from flower_pfl import config
from flower_pfl.learning.client_data import load_client_data
from flower_pfl.learning.models import model_for, resolve_device
from flower_pfl.learning.training import TrainSpec, evaluate, train


def run(cfg, device, steps, epochs=1):
    data = load_client_data(cfg.values, 0)
    model = model_for(cfg).to(device)
    spec = TrainSpec.from_config(cfg)
    g = torch.Generator()
    g.manual_seed(0)
    losses = []
    for _ in range(epochs):
        losses.append(train(model, data.x_train, data.y_train, spec, g, device,
                            num_steps=steps)["train_loss"])
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    train(model, data.x_train, data.y_train, spec, g, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    epoch_s = time.perf_counter() - start
    return losses, evaluate(model, data.x_test, data.y_test, device)[1], epoch_s, data.num_train


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data-root", default=None)
    args = p.parse_args()
    auto = resolve_device("auto")
    print(f"device auto -> {auto}; torch {torch.__version__}; "
          f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA'}")
    for model in ("cnn", "resnet18"):
        cfg = config.validate({"model": model, "clients": 4, "seed": 0, "data": {
            "dataset": "fmnist", "root": args.data_root, "partition": "practical",
            "subsample": 20000}, "train": {"batch-size": 64, "lr": 0.05}})
        rows = {}
        for dev in (torch.device("cpu"), auto):
            rows[dev.type] = run(cfg, dev, steps=20, epochs=3)
        for dev, (losses, acc, epoch_s, n) in rows.items():
            print(f"{model:9s} {dev:5s} losses {[round(x, 4) for x in losses]} "
                  f"test acc {acc:.4f} one epoch ({n} samples) {epoch_s:.3f}s")
        if "cuda" in rows:
            diff = max(abs(a - b) for a, b in zip(rows["cpu"][0], rows["cuda"][0]))
            print(f"{model:9s} max |loss_cpu - loss_cuda| over 60 steps: {diff:.2e}; "
                  f"epoch speed-up {rows['cpu'][2] / rows['cuda'][2]:.1f}x")


if __name__ == "__main__":
    main()
