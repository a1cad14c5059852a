"""A ClientApp that raises under Ray (issue 67): the user's exception -- its type and
message -- comes first in the console, failures.csv and summary.json, ANSI codes stripped,
a long traceback cut in the middle, and the summary's coverage counts the failed fits of
the round that ended the run.  The error text is the one Flower's Ray backend makes
(vce_api's worker: ``str(type(ex)) + ":<'" + str(ex) + "'>"`` of Ray's ``RayTaskError``
for the actor's ``ClientAppException``) and its grid proxy raises."""

from __future__ import annotations

import csv
import json
import logging
import traceback

import pytest

from flower_pfl.running import inprocess
from flower_pfl.strategies.base import RoundError
from flower_pfl.strategies.federation import MAX_REASON, failure_reason, root_exception
from tests.conftest import small_config

MESSAGE = "5-D input is not supported by MyNet.forward"


def ray_error(padding: int = 0) -> ValueError:
    """The grid proxy's ValueError for a ClientApp whose ``fit`` raised NotImplementedError
    in a Ray actor (``padding`` frames of a deep stack make the traceback long)."""
    from flwr.clientapp.client_app import ClientAppException
    from ray.exceptions import RayTaskError

    def deep(n):  # two functions in turn: Python folds only a frame repeated in a row
        if n:
            return other(n - 1)
        raise NotImplementedError(MESSAGE)

    def other(n):
        return deep(n)

    try:
        try:
            deep(padding)
        except Exception as ex:  # what flwr's ClientAppActor.run does
            raise ClientAppException(str(ex)) from ex
    except ClientAppException as exc:
        ray_exc = RayTaskError("ClientAppActor.run", "".join(traceback.format_exception(exc)),
                               exc, proctitle="ray::ClientAppActor.run", pid=7,
                               ip="127.0.0.1").as_instanceof_cause()
    reason = str(type(ray_exc)) + ":<'" + str(ray_exc) + "'>"
    return ValueError(f"Message contains an Error (reason: {reason}). It originated during "
                      f"client-side execution of a message.")


def test_the_exception_line_comes_first_ansi_stripped_and_the_middle_cut():
    short = failure_reason(ray_error())
    assert short.splitlines()[0] == f"client raised NotImplementedError: {MESSAGE}"
    assert "\x1b[" not in short and "ray::ClientAppActor.run()" in short
    long = failure_reason(ray_error(padding=120))  # a traceback of ~10,000 characters
    first, rest = long.split("\n", 1)
    assert first == f"client raised NotImplementedError: {MESSAGE}"
    assert "characters cut) ..." in rest and len(rest) < MAX_REASON + 100
    assert rest.rstrip().endswith(f"Message: {MESSAGE}")  # the end kept, not cut
    # a traceback without Flower's wrapper, and none at all
    assert root_exception("Traceback (most recent call last):\n  File \"a.py\", line 1\n"
                          "mylib.errors.BadShape: (3, 5)") == "BadShape: (3, 5)"
    assert root_exception("no traceback here") is None


class RaisingUnderRay(inprocess.InProcessProxy):
    """Every fit fails as a ClientApp raising in a Ray actor does."""

    def _send(self, content, message_type, group_id):
        if content.config_records.get("fitins.config") is not None:
            raise ray_error()
        return super()._send(content, message_type, group_id)


def test_a_raising_client_app_is_named_in_the_console_failures_csv_and_summary(tmp_path,
                                                                                caplog):
    cfg = small_config(strategy="fedavg", rounds=2, clients=3, model="mclr",
                       **{"data.subsample": 600})
    with caplog.at_level(logging.WARNING), pytest.raises(RoundError):
        inprocess.run(cfg, tmp_path,
                      manager=inprocess.make_federation(3, proxy_cls=RaisingUnderRay))
    line = f"NotImplementedError: {MESSAGE}"
    warned = [r.getMessage() for r in caplog.records if "failed:" in r.getMessage()]
    assert len(warned) == 3 and all(w.splitlines()[0].endswith(line) for w in warned)
    with open(tmp_path / "failures.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3 and all(r["reason"].startswith(f"client raised {line}")
                                  for r in rows)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["error"]["message"].startswith(
        f"round 1: 0 valid update(s) from 3 sampled client(s), fewer than min-fit-answers = 1; "
        f"failures: partition-id 0: client raised {line}; partition-id 1: client raised")
    assert summary["coverage"]["fit_failed"] == 3 and summary["coverage"]["fit_sampled"] == 3
