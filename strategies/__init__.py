"""Server-side strategies: one file per algorithm; the shared plumbing in base.py (the fit
side), nodes.py (partition-ids, sampling), evaluation.py (evaluation and its report),
checkpointing.py (checkpoint/resume), federation.py (updates, store, errors) and
message_passing.py (the FedAMP family's model store)."""
