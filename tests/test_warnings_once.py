"""flower_pfl.warnings_once: the one "warn once" of the project (strategies' mechanism-off
warnings; tests/test_selffl.py checks a real run warns once)."""

from __future__ import annotations

import logging

from flower_pfl.warnings_once import first_time, warn_once


def test_warn_once_logs_each_key_once_per_owner(caplog):
    mine, theirs = set(), set()
    with caplog.at_level(logging.WARNING):
        assert warn_once(mine, "off", "mechanism %s is off", "X")
        assert not warn_once(mine, "off", "mechanism %s is off", "X")  # said already
        assert warn_once(mine, "other", "another thing")
        assert warn_once(theirs, "off", "mechanism %s is off", "X")  # another run says it too
    said = [r.getMessage() for r in caplog.records]
    assert said == ["mechanism X is off", "another thing", "mechanism X is off"]
    assert all(r.levelno == logging.WARNING for r in caplog.records)
    assert mine == {"off", "other"}


def test_first_time_remembers_what_it_saw():
    seen: set[str] = set()
    assert [first_time(seen, k) for k in ("a", "b", "a")] == [True, True, False]
