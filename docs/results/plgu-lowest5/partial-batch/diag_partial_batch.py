"""Client 31 of the PLGU lowest-5% matrix (seed 0, PLGU-LF, drop-last off), rounds 1-8:
after every local step, the loss and accuracy of the model on the client's WHOLE training
set.  Shows that the last step of each pass -- a partial batch of 772 % 32 = 4 samples at
lr 0.05 -- can undo the pass (round 8: train accuracy 0.73 -> 0.33).

    cd <a snapshot of the repository> && PYTHONPATH=. OMP_NUM_THREADS=1 python \
        docs/results/plgu-lowest5/partial-batch/diag_partial_batch.py CELL.yaml OUT_DIR

CELL.yaml: runs/dir03/plgu-lf/seed-0/cell.yaml of `matrix_inprocess.py
benchmarks/plgu-lowest5.yaml --seeds 0 --strategies plgu-lf --set train.drop-last=false`.
"""
import sys

import numpy as np
import torch
import torch.nn.functional as F

import clients.plgu as P
from flower_pfl import config as C, inprocess, training

cfg = C.load(sys.argv[1], [f"output-dir={sys.argv[2]}", "checkpoint-every=0", "rounds=8",
                           "train.drop-last=false"])
WATCH, CUR = 31, {}
orig_step = training.lwsam_step


def step(model, xb, yb, opt, perturbed, scales, rho, plain=(), loss_fn=F.cross_entropy):
    loss = orig_step(model, xb, yb, opt, perturbed, scales, rho, plain=plain, loss_fn=loss_fn)
    if CUR.get("on"):
        c = CUR["client"]
        with torch.no_grad():
            out = model(c.data.x_train)
            full = float(F.cross_entropy(out, c.data.y_train))
            acc = float((out.argmax(1) == c.data.y_train).float().mean())
        print(f"  batch of {len(yb):2d}: loss before the step {loss:.3f} | whole training set "
              f"after it: loss {full:.3f} accuracy {acc:.3f}", flush=True)
    return loss


training.lwsam_step = step
orig = P.PLGULFClient.fit_round


def fit_round(self, parameters, config):
    CUR.update(on=self.pid == WATCH, client=self)
    if CUR["on"]:
        print(f"round {self.round}: client {WATCH}, {self.data.num_train} training samples, "
              f"labels {torch.bincount(self.data.y_train, minlength=10).tolist()}", flush=True)
    arrays, metrics = orig(self, parameters, config)
    if CUR["on"]:
        print(f"  personal layers: {metrics['personal_layers']}", flush=True)
    CUR["on"] = False
    return arrays, metrics


P.PLGULFClient.fit_round = fit_round
inprocess.run(cfg, sys.argv[2])
