"""The simulation's reply polling (flower_pfl.tuned.engine_wakeup.reply_poll_s / poll_faster)."""

from __future__ import annotations

from types import SimpleNamespace

from flower_pfl.tuned import engine_wakeup


def test_poll_interval_by_hand():
    # threads / 2,000 looks a second, clamped to [10 ms, Flower's 0.1 s]
    assert engine_wakeup.reply_poll_s(1) == 0.01
    assert engine_wakeup.reply_poll_s(20) == 0.01
    assert engine_wakeup.reply_poll_s(100) == 0.05
    assert engine_wakeup.reply_poll_s(256) == 0.1


def test_only_a_grid_that_polls_is_changed():
    in_memory = SimpleNamespace(pull_interval=0.1)
    engine_wakeup.poll_faster(in_memory, 100)
    assert in_memory.pull_interval == 0.05
    grpc = SimpleNamespace()
    engine_wakeup.poll_faster(grpc, 100)
    assert not hasattr(grpc, "pull_interval")
