"""Benchmark and measurement scripts (docs/BENCHMARKS.md).

A regular package, not a namespace one: opacus installs a top-level ``benchmarks`` package
of its own, which would otherwise shadow this folder.
"""
