"""Client-side NumPyClients: one file per algorithm, plumbing in base.py."""
