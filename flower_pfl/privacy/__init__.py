"""Differential privacy of what a client uploads (docs/privacy.md): the ``privacy.*`` keys
(:mod:`flower_pfl.privacy.fields`)."""
