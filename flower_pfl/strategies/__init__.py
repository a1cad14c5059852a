"""Server-side strategies: one file per algorithm; the shared plumbing in base.py (the fit
side), nodes.py (partition-ids, sampling), evaluation.py (evaluation and its report),
checkpointing.py (checkpoint/resume), federation.py (updates, store, errors) and
message_passing.py (the FedAMP family's model store)."""

if __name__ != f"flower_pfl.{__name__.rpartition('.')[2]}":
    raise ImportError(f"import flower_pfl.{__name__.rpartition('.')[2]}, not {__name__}: this "
                      f"folder is a subpackage of flower_pfl (a second copy of its classes "
                      f"would not be the registered ones)")
