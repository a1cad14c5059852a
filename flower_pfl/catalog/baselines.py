"""Baselines the papers compare against: FedAvg, Local (Separate), FedAvg-FT."""

from __future__ import annotations

from flower_pfl.hyper import POS, Entry, Hyper

ENTRIES = [
    Entry(
        "fedavg", "strategies.fedavg:FedAvg", "clients.fedavg:FedAvgClient",
        "FedAvg (McMahan et al. 2017): one global model, sample-weighted mean of client models.",
    ),
    Entry(
        "local", "strategies.local:Local", "clients.local:LocalClient",
        "Separate/Local training: every client trains only its own model; no weights exchanged.",
    ),
    Entry(
        "fedavg-ft", "strategies.fedavg:FedAvgFT", "clients.fedavg:FedAvgFTClient",
        "FedAvg + local fine-tuning: the global model fine-tuned for `finetune-steps` SGD steps "
        "on the client's data before personalized evaluation.",
        {"finetune-steps": Hyper(10, (int,), POS, "an integer >= 1",
                                 "local SGD steps (mini-batches) of fine-tuning before evaluation")},
    ),
]
