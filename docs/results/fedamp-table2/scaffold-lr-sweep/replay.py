"""SCAFFOLD on FedAMP Table 2 (the diverged cell's cell.yaml), in-process, at a given lr for a
given number of rounds; per round: median/max client training loss, |c_i| and |x - y_i|
(argmax = the client that moved most).  Run from the repository root:

    OMP_NUM_THREADS=1 python docs/results/fedamp-table2/scaffold-lr-sweep/replay.py LR ROUNDS OUT_DIR
"""
import sys, time, numpy as np
sys.path.insert(0, ".")
from flower_pfl import config as C, inprocess
import clients.scaffold as S
from flower_pfl.models import get_arrays
lr, rounds, out = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
extra = sys.argv[4:]
cfg = C.load("docs/results/fedamp-table2/diverged-scaffold/cell.yaml",
             [f"train.lr={lr}", f"rounds={rounds}", f"output-dir={out}", "eval-global=false"] + extra)
orig = S.ScaffoldClient.fit_round
rows = {}
def fit_round(self, parameters, config):
    y, m = orig(self, parameters, config)
    d = float(np.sqrt(sum(((np.asarray(a, np.float64) - b) ** 2).sum() for a, b in zip(parameters, y))))
    rows.setdefault("cur", []).append((self.pid if hasattr(self, "pid") else -1, m["train_loss"], m["ci_norm"], d))
    return y, m
S.ScaffoldClient.fit_round = fit_round
def on_round(strategy, r):
    rs = rows.pop("cur", [])
    tl = np.array([x[1] for x in rs]); ci = np.array([x[2] for x in rs]); dd = np.array([x[3] for x in rs])
    acc = strategy.results.rows[-1] if hasattr(strategy.results, "rows") else None
    print(f"r{r} loss med {np.nanmedian(tl):.3f} max {np.nanmax(tl):.3f} | ci med {np.nanmedian(ci):.2f} max {np.nanmax(ci):.2f} | move med {np.nanmedian(dd):.2f} max {np.nanmax(dd):.2f} argmax {int(np.nanargmax(dd))}", flush=True)
t = time.time()
inprocess.run(cfg, out, on_round=on_round)
print("done", time.time() - t)
