"""One module per paper (or family of baselines), each with ``ENTRIES: list[Entry]``.

``flower_pfl.registry`` imports every module here; nothing here imports torch or Flower.
"""
