"""Deployment set-up that needs no running process: paths as typed, GPUs that exist."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Flower installs tomli on 3.10
    import tomli as tomllib

from flower_pfl.running.certs import make_ca
from flower_pfl.running.deploy import Deployment, check_gpus
from flower_pfl.running.procs import LaunchError


def test_relative_certificate_paths_reach_flower_absolute(tmp_path, monkeypatch):
    """`flower-pfl deploy --certs certs/` as the README types it: Flower's config.toml
    refuses a relative root-certificates path, so it must arrive resolved."""
    monkeypatch.chdir(tmp_path)
    make_ca("certs")
    certs = {"ca": "certs/ca.crt", "cert": "certs/server.pem", "key": "certs/server.key"}
    dep = Deployment("work", 3, certs, data_root="data")
    toml = tomllib.loads((tmp_path / "work" / "flwr-home" / "config.toml").read_text())
    root = toml["superlink"]["deploy"]["root-certificates"]
    assert root == str(tmp_path / "certs" / "ca.crt")
    assert all(p.is_absolute() and p.is_file() for p in dep.certs.values())
    assert dep.data_root == str(tmp_path / "data") and dep.workdir.is_absolute()


def test_gpus_on_a_machine_without_cuda_is_an_error(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(LaunchError, match=r"--gpus 0,1: this machine has no CUDA device"):
        check_gpus(["0", "1"])
    check_gpus([])  # no --gpus: the CPU, silently and rightly


def test_gpus_naming_a_device_that_is_not_there_is_an_error(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_gpus(["0", "1"])
    with pytest.raises(LaunchError, match=r"no such device \['2'\]; this machine has 2"):
        check_gpus(["1", "2"])


def test_certs_for_a_host_name_it_and_loopback(tmp_path):
    """The server certificate names the SuperLink's address (what the SuperNodes check) and
    loopback (a SuperLink on 0.0.0.0 starts its ServerApp against 127.0.0.1)."""
    import ipaddress

    from cryptography import x509
    from cryptography.x509.oid import ExtensionOID

    paths = make_ca(tmp_path, ["10.213.7.1", "server.example.org"])
    cert = x509.load_pem_x509_certificate(paths["cert"].read_bytes())
    san = cert.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.213.7.1"),
                                                       ipaddress.ip_address("127.0.0.1"),
                                                       ipaddress.ip_address("::1")]
    assert san.get_values_for_type(x509.DNSName) == ["server.example.org", "localhost"]


def test_site_commands_refuse_bad_arguments_before_starting_anything(tmp_path, monkeypatch,
                                                                     capsys):
    from flower_pfl import cli

    monkeypatch.chdir(tmp_path)
    make_ca("certs")
    assert cli.main(["superlink", "--certs", "certs"]) == 2  # no key to register
    assert "no public keys to register" in capsys.readouterr().out
    assert cli.main(["superlink", "--certs", "nope", "--public-keys", "a.pub"]) == 2
    assert "missing certificate files" in capsys.readouterr().out
    assert cli.main(["supernode", "--superlink", "h:9092", "--partition-id", "0",
                        "--num-partitions", "2", "--state-dir", "s"]) == 2
    assert "--ca ca.crt and --key <node key> are needed" in capsys.readouterr().out
    assert cli.main(["supernode", "--superlink", "h:9092", "--insecure", "--partition-id",
                        "2", "--num-partitions", "2", "--state-dir", "s"]) == 2
    assert "--partition-id 2 is outside [0, 2)" in capsys.readouterr().out
    assert cli.main(["submit", "--superlink", "h:9092", "--ca", "certs/ca.crt",
                        "--set", "bogus=1"]) == 2
    assert "bogus" in capsys.readouterr().out
    assert not (tmp_path / "superlink").exists() and not (tmp_path / "s").exists()


def test_supernode_gpu_on_a_machine_without_cuda_names_its_own_option(tmp_path, monkeypatch,
                                                                     capsys):
    import torch

    from flower_pfl import cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["supernode", "--superlink", "h:9092", "--insecure", "--partition-id", "0",
                     "--num-partitions", "2", "--state-dir", "s", "--gpu", "0"]) == 2
    out = capsys.readouterr().out
    assert "--gpu 0: this machine has no CUDA device" in out and "leave --gpu out" in out
    assert "--gpus" not in out


def test_certs_says_which_names_the_certificate_holds(tmp_path, capsys):
    """`certs --host` ADDS the SuperLink's names to the loopback ones (help and output)."""
    from flower_pfl import cli

    assert cli.main(["certs", str(tmp_path / "c"), "--host", "10.213.7.1"]) == 0
    assert ("the server certificate names: 10.213.7.1, 127.0.0.1, localhost, ::1"
            in capsys.readouterr().out)
    with pytest.raises(SystemExit):
        cli.main(["certs", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "repeatable); the certificate names these AND always 127.0.0.1, localhost and ::1" \
        in help_text


# --------------------------------------------------------------- deployment messages
# a child process logging through Flower's own logger (ANSI colours included)
FLOWER_LOG = ("import logging; from flwr.common.logger import log; "
              "log(logging.INFO, 'Starting Flower SuperNode'); "
              "log(logging.WARNING, 'Connection attempt failed'); "
              "log(logging.ERROR, 'Exit Code: 305')")


def test_no_colour_codes_in_log_files_or_piped_output(tmp_path, capsys):
    """Flower's logger colours its level names into any stream (a pipe, a file): every log
    file and every output that is not a terminal written here is without them."""
    from flower_pfl.running import node_console, procs

    raw = subprocess.run([sys.executable, "-c", FLOWER_LOG], capture_output=True, text=True,
                         timeout=120)
    assert "\x1b[" in raw.stderr  # what it would be without the stripping below

    ps = procs.ProcessSet()  # the SuperLink/SuperNode logs of `flower-pfl run` / `deploy`
    proc = ps.start([sys.executable, "-c", FLOWER_LOG], dict(os.environ),
                    tmp_path / "started.log")
    proc.wait(timeout=120)
    ps.stop()
    # `flwr run --stream` into <results>/flwr-run.log, echoed (submit, deploy)
    procs.stream_run([sys.executable, "-c", FLOWER_LOG], dict(os.environ),
                     tmp_path / "flwr-run.log", True, 120, procs.ProcessSet())
    echoed = capsys.readouterr().out
    # `flower-pfl superlink` / `supernode`: their log and their piped output
    rc = node_console.foreground([sys.executable, "-c", FLOWER_LOG], dict(os.environ),
                                 "SuperNode", lambda line: None, tmp_path / "site.log",
                                 console=node_console.NodeConsole())
    piped = capsys.readouterr().out
    assert rc == 0
    for name in ("started.log", "flwr-run.log", "site.log"):
        text = (tmp_path / name).read_text()
        assert "\x1b[" not in text and "WARNING :   Connection attempt failed" in text, name
    for text in (echoed, piped):
        assert "\x1b[" not in text and "ERROR :     Exit Code: 305" in text, text


# A SuperNode's output for two messages whose ClientApp raised (as Flower 1.42 prints it:
# the SuperNode's log lines, then per message a flwr-clientapp process that logs the
# exception with its traceback and exits with code 800), the error a real refused shard's.
CLIENTAPP = """
import logging, sys
from flwr.common.logger import log
from flwr.supercore.exit import ExitCode, flwr_exit
from flower_pfl.config import APP_DIR, load
from flower_pfl.learning import shards
cfg = load(APP_DIR / "simulation.yaml").values
manifest = {"partition-id": 1, "settings-hash": "0123", "settings": {**shards.settings_of(cfg),
            "seed": 1}, "command": "flower-pfl partition --set seed=1 --out shards"}
try:
    shards.check_shard(manifest, cfg, 1, "data")
except Exception as ex:
    log(logging.ERROR, "%s raised an exception", "ClientApp", exc_info=ex)
    # the SuperNode may send the reply before the task's exit code is logged (a fast node)
    log(logging.INFO, "")
    log(logging.INFO, "[RUN 7, ROUND 3]")
    log(logging.INFO, "Sending: train message (ID: cd34)")
    flwr_exit(ExitCode.TASK_PROC_EXCEPTION, "")
"""
SUPERNODE = f"""
import logging, subprocess, sys
from flwr.common.logger import log
log(logging.INFO, "SuperNode ID: 42")
for kind in ("train", "evaluate"):
    log(logging.INFO, "[RUN 7, ROUND 3]")
    log(logging.INFO, "Receiving: %s message (ID: ab12)", kind)
    log(logging.INFO, "Start `flwr-clientapp` process")
    subprocess.run([sys.executable, "-c", {CLIENTAPP!r}])
    log(logging.INFO, "Sent successfully")
"""


def test_supernode_console_shows_one_line_per_failed_message_and_logs_the_traceback(
        tmp_path, capsys):
    from flower_pfl.config import APP_DIR, load
    from flower_pfl.learning import shards
    from flower_pfl.running import node_console

    cfg = load(APP_DIR / "simulation.yaml").values
    with pytest.raises(shards.ShardError) as err:
        shards.check_shard({"partition-id": 1, "settings-hash": "0123",
                            "settings": {**shards.settings_of(cfg), "seed": 1},
                            "command": "flower-pfl partition --set seed=1 --out shards"},
                           cfg, 1, "data")
    error = str(err.value)
    assert error.endswith("and give this machine <DIR>/1")  # the fix is at the very end
    log = tmp_path / "supernode.log"
    assert node_console.foreground([sys.executable, "-c", SUPERNODE], dict(os.environ),
                                   "SuperNode", lambda line: None, log,
                                   console=node_console.NodeConsole(log)) == 0
    console = capsys.readouterr().out.splitlines()
    ours = [line for line in console if line.startswith("flower-pfl: ")]
    assert ours == [
        f"flower-pfl: the train message of round 3 failed on this node: ShardError: {error} "
        f"(the server records this reason in failures.csv; the traceback is in {log})",
        "flower-pfl: the evaluate message of round 3 failed on this node with the same error "
        "(2 messages so far)"]
    assert not any("Traceback" in line or "Exit Code" in line or "File " in line
                   for line in console), console
    assert sum("Receiving:" in line for line in console) == 2  # the rest is shown as it is
    assert sum("Sent successfully" in line for line in console) == 2
    text = log.read_text()  # the log keeps everything, without colour codes
    assert text.count("Traceback (most recent call last)") == 2
    assert text.count("Exit Code: 800") == 2 and "\x1b[" not in text


def test_supernode_console_holds_a_refused_retry_and_shows_an_accepted_one():
    from flower_pfl.running import node_console

    refused = ["INFO :      Starting Flower SuperNode", "ERROR :     Exit Code: 305",
               "Failed to initialize the connection to the SuperLink.",
               "[code: 2004] Failed to activate SuperNode."]
    console = node_console.NodeConsole(hold=True)
    assert [console.feed(line) for line in refused] == [[], [], [], []]
    assert console.close() == []  # refused again: said once already, in the log only
    console = node_console.NodeConsole(hold=True)
    assert console.feed(refused[0]) == []
    assert console.feed("INFO :      SuperNode ID: 42") == [refused[0], None]
    assert console.feed("INFO :      Receiving: train message (ID: 1)") == [None]


def _refused_shard_error():
    from flower_pfl.config import APP_DIR, load
    from flower_pfl.learning import shards

    cfg = load(APP_DIR / "simulation.yaml").values
    try:
        shards.check_shard({"partition-id": 1, "settings-hash": "0123",
                            "settings": {**shards.settings_of(cfg), "seed": 1},
                            "command": "flower-pfl partition --set seed=1 --out shards"},
                           cfg, 1, "/srv/client-1/shard")
    except shards.ShardError as exc:
        return exc
    raise AssertionError("the shard was not refused")


class _OneReply:
    """The Grid's side of one message: the reply the SuperLink hands the ServerApp back
    (an error reply, as Flower builds it)."""

    def __init__(self, code: int, reason: str) -> None:
        self.code, self.reason = code, reason

    def send_and_receive(self, messages, timeout=None):
        from flwr.app import Error, Message

        (msg,) = messages
        msg.metadata.__dict__["_message_id"] = "m1"
        return [Message(Error(code=self.code, reason=self.reason), reply_to=msg)]


def _failure_of(code: int, reason: str, monkeypatch) -> str:
    """The reason failures.csv records when a client's message comes back with this error,
    through Flower's GridClientProxy (the ServerApp's side in deployment)."""
    from flwr.common import FitIns, ndarrays_to_parameters
    from flwr.server.compat.grid_client_proxy import GridClientProxy
    from flwr.supercore.task_identity import TaskIdentity

    from flower_pfl.strategies.federation import ClientFailure, TaggedProxy

    for name in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)
    proxy = TaggedProxy(GridClientProxy(5, _OneReply(code, reason), 1), pid=1)
    with pytest.raises(ClientFailure) as failure:
        proxy.fit(FitIns(ndarrays_to_parameters([]), {}), 60, 2)
    assert failure.value.pid == 1
    return failure.value.reason


def test_a_refused_shard_reaches_the_server_with_its_whole_reason(monkeypatch):
    from flwr.common.constant import ErrorCode

    exc = _refused_shard_error()
    # the reply's reason as Flower's run_clientapp writes a ClientApp's exception
    flower_reason = str(type(exc)) + ":<'" + str(exc) + "'>"
    reason = _failure_of(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, flower_reason, monkeypatch)
    assert reason == f"client raised: ShardError: {exc}"
    assert len(str(exc)) > 400 and reason.endswith(
        "(it was made by `flower-pfl partition --set seed=1 --out shards`), and give this "
        "machine <DIR>/1")
    huge = ValueError("x" * 5000)  # a message that would flood the log is cut, and says so
    reason = _failure_of(ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                         str(type(huge)) + ":<'" + str(huge) + "'>", monkeypatch)
    assert reason.startswith("client raised: ValueError: xxx")  # the middle cut: the end
    assert f" ... ({5000 + len('ValueError: ') - 4000} characters cut) ... xxx" in reason
    assert reason.endswith("x" * 2000) and len(reason) < 4100  # stays (what was raised)


def test_a_node_that_went_away_is_reported_as_gone_with_the_fix(monkeypatch):
    from flwr.common.constant import ErrorCode
    from flwr.server.superlink.linkstate.utils import (
        MESSAGE_UNAVAILABLE_ERROR_REASON,
        NODE_UNAVAILABLE_ERROR_REASON,
    )

    rejoin = ("start its `flower-pfl supernode` again with the same command (it rejoins "
              "under its node id with its state from --state-dir)")
    # no heartbeat for 2 x 30 s: the SuperLink answers for the node
    gone = _failure_of(ErrorCode.NODE_UNAVAILABLE, NODE_UNAVAILABLE_ERROR_REASON, monkeypatch)
    assert gone.startswith("node gone: its SuperNode stopped sending heartbeats")
    assert "Flower: Node Unavailable" in gone and rejoin in gone
    # killed after it took the message: the message expires at round-timeout
    for code, reason in ((ErrorCode.MESSAGE_UNAVAILABLE, MESSAGE_UNAVAILABLE_ERROR_REASON),
                         (ErrorCode.MESSAGE_UNAVAILABLE, "Reply message objects are "
                          "unavailable. The sender may not have completed the upload before "
                          "the object-push session expired. ...")):
        expired = _failure_of(code, reason, monkeypatch)
        assert expired.startswith("node gone or too slow: no reply before the message "
                                  "expired at round-timeout"), expired
        assert rejoin in expired and "if it is slow, raise round-timeout" in expired
        assert "client raised" not in expired and "client-side execution" not in expired


def test_the_superlinks_superexec_polls_every_half_second_unless_the_user_set_it(monkeypatch):
    """The SuperLink's SuperExec starts one ServerApp per run: 0.5 s, not the nodes' 0.1 s
    (flwr_env); a value in the environment is the user's and is kept."""
    from flower_pfl.running import deploy
    from flower_pfl.running.procs import flwr_env

    key = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
    monkeypatch.delenv(key, raising=False)
    env = flwr_env(Path("home"), 9092)
    assert env[key] == "0.1" and deploy.superlink_env(env)[key] == "0.5"
    assert env[key] == "0.1"  # the nodes' environment is not changed
    monkeypatch.setenv(key, "0.25")
    assert deploy.superlink_env(flwr_env(Path("home"), 9092))[key] == "0.25"


def test_flower_pfl_deploys_superlink_keeps_its_state_in_memory(tmp_path, monkeypatch):
    """One run's SuperLink on this machine: Flower's in-memory state, no SQLite file (each
    request's SQL was most of the SuperLink's time, docs/deployment.md); the SuperLink of
    `flower-pfl superlink`, which may be restarted, keeps its file."""
    from flower_pfl.running import deploy

    started = []
    dep = Deployment(tmp_path / "w", 2, None)
    monkeypatch.setattr(dep.procs, "start", lambda cmd, env, log: started.append((cmd, env)))
    monkeypatch.setattr(deploy, "wait_superlink", lambda *a, **k: None)
    dep.start_superlink()
    ((cmd, env),) = started
    assert cmd[cmd.index("--database") + 1] == ":flwr-in-memory:" == deploy.DEPLOY_DATABASE
    assert env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] in ("0.5", os.environ.get(
        "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"))
    site = deploy.superlink_command("0.0.0.0", 9092, None, tmp_path / "s" / "superlink.db")
    assert site[site.index("--database") + 1] == str(tmp_path / "s" / "superlink.db")
