"""Self-FL (Chen et al.): uncertainty-weighted aggregation."""

from __future__ import annotations

from flower_pfl.hyper import POS, Entry, Hyper, auto_or_positive

ENTRIES = [
    Entry(
        "selffl", "strategies.selffl:SelfFL", "clients.selffl:SelfFLClient",
        "Self-FL (Chen et al.): uncertainty-driven local initialisation (eq. 10), local steps "
        "(eq. 8) and variance-weighted aggregation (eq. 11) with smoothing under sampling.",
        {
            "eta": auto_or_positive(
                "step size eta of eqs. 5/8 (the local SGD learning rate); 'auto' = train.lr"),
            "l-max": Hyper(50, (int,), POS, "an integer >= 1",
                           "upper clip of the local steps l_m of eq. 8 (section 4.2)"),
            "warmup-rounds": Hyper(0, (int,), lambda v: v >= 0, "an integer >= 0",
                                   "FedAvg rounds before Self-FL starts (section 3.2)"),
            "oracle": Hyper(False, (bool,), None, "true or false",
                            "synthetic task only: use the true sigma_0^2 and sigma_m^2 = "
                            "noise^2/N_m instead of the estimates of eqs. 13-14"),
        },
        cross_check=lambda values, hyper: (
            ["'hyper.selffl.oracle' = true needs data.dataset 'synthetic-gaussian' (only there "
             "are the true variances known)"]
            if hyper.get("oracle") and values["data.dataset"] != "synthetic-gaussian" else []),
    ),
]
