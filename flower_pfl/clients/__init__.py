"""Client-side NumPyClients: one file per algorithm, plumbing in base.py."""

if __name__ != f"flower_pfl.{__name__.rpartition('.')[2]}":
    raise ImportError(f"import flower_pfl.{__name__.rpartition('.')[2]}, not {__name__}: this "
                      f"folder is a subpackage of flower_pfl (a second copy of its classes "
                      f"would not be the registered ones)")
