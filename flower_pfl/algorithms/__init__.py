"""The papers' mathematics: pure functions on numpy arrays and torch tensors, no Flower import.

Each module opens with its paper's equations and the choices the paper leaves open; strategies
and clients call these, and the unit tests check them against hand computations.
"""
