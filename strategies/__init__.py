"""Server-side strategies: one file per algorithm, plumbing in base.py."""
