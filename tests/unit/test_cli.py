"""The `raftkv` command line: parsing, --help, bad flags, and the client commands against a
scripted KV server on 127.0.0.1 (the same one tests/unit/test_client.py uses)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kv import TLS
from kv.tools import cli, data_commands
from kv.tools.client_options import tls_of
from kv.tools.serve_command import EXIT_REMOVED, node_config
from kv.tools.cluster_up import SOURCE_ROOT, child_env, local_specs, serve_command, with_tls
from raft.node.config import NodeConfig
from tests.unit.test_client import free_address, start_node  # noqa: F401 - start_node is a fixture

COMMANDS = [["serve"], ["put"], ["get"], ["delete"], ["scan"], ["status"], ["endpoint"], ["endpoint", "health"],
            ["cluster"], ["cluster", "up"], ["cluster", "restart"]]


def parse(*argv: str):
    return cli.build_parser().parse_args(list(argv))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_serve_defaults_are_a_single_node_store_on_7001():
    config = node_config(parse("serve"))
    expected = NodeConfig()
    assert config.node_id == "n1"
    assert config.listen == config.advertised_client_address == "127.0.0.1:7001"
    assert config.data_dir == Path("./raftkv-data")
    assert config.peers == {} and config.members == ["n1"]  # a single node: no peers, no peer listener
    assert config.peer_listen_address is None
    assert config.storage.fsync is True
    assert (config.core, config.storage, config.limits, config.tuning) == (expected.core, expected.storage,
                                                                             expected.limits, expected.tuning)
    assert config.tuning.read_spin_us > 0


def test_serve_flags_map_onto_node_config():
    args = parse("serve", "--id", "n2", "--listen", "127.0.0.1:7002", "--data-dir", "/tmp/d2", "--peers",
                 "n1=127.0.0.1:7101,n2=127.0.0.1:7102,n3=127.0.0.1:7103", "--cluster-id", "c1",
                 "--snapshot-threshold", "50", "--election-timeout-ms", "300", "--heartbeat-interval-ms", "30",
                 "--max-value-bytes", "1000", "--no-fsync", "--log-level", "debug", "--grpc-servers", "3",
                 "--read-hold-ms", "0.5", "--read-hold-siblings", "0", "--read-spin-us", "0",
                 "--lazy-push-ms", "50", "--eager-timeout-ms", "30", "--eager-trial-every-ms", "0")
    config = node_config(args)
    assert config.listen == config.advertised_client_address == "127.0.0.1:7002"
    assert config.peer_listen_address == "127.0.0.1:7102"  # its own --peers entry
    assert config.members == ["n1", "n2", "n3"]
    assert config.data_dir == Path("/tmp/d2")
    assert config.cluster_id == "c1"
    assert config.storage.snapshot_threshold == 50
    assert (config.core.election_timeout_ms, config.core.heartbeat_interval_ms) == (300, 30)
    assert config.core.lease_ms < 300
    assert config.limits.max_value_bytes == 1000
    assert config.storage.fsync is False
    assert config.tuning.grpc_servers == 3
    assert (config.tuning.read_hold_ms, config.tuning.read_hold_siblings) == (0.5, 0)
    assert config.tuning.read_spin_us == 0
    assert (config.core.lazy_push_ms, config.core.eager_timeout_ms, config.core.eager_trial_every_ms) == (50, 30, 0)


def test_max_request_bytes_must_hold_the_largest_put(capsys):
    assert node_config(parse("serve")).limits.max_request_bytes == 1572864  # etcd's default
    config = node_config(parse("serve", "--max-request-bytes", "4MiB", "--max-value-bytes", str(3 << 20)))
    assert (config.limits.max_request_bytes, config.limits.max_value_bytes) == (4 << 20, 3 << 20)
    for argv, message in [(["--max-value-bytes", str(2 << 20)], "--max-value-bytes 2097152 does not fit in "
                                                                "--max-request-bytes 1572864"),
                          (["--max-request-bytes", "64KiB"], "--max-request-bytes must be at least 1048576")]:
        with pytest.raises(SystemExit) as exited:
            cli.main(["serve", *argv])
        assert exited.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("flag, value", [("--read-hold-ms", "-1"), ("--read-hold-ms", "nan"),
                                         ("--read-hold-siblings", "-1"), ("--read-hold-siblings", "1.5"),
                                         ("--read-spin-us", "-1"), ("--read-spin-us", "0.5")])
def test_serve_refuses_a_bad_read_hold(flag, value, capsys):
    with pytest.raises(SystemExit) as exited:
        parse("serve", flag, value)
    assert exited.value.code == 2
    assert flag in capsys.readouterr().err


def test_listen_listen_peer_and_advertise_client_are_separate_addresses():
    config = node_config(parse("serve", "--listen", "0.0.0.0:9000", "--advertise-client", "db1.example:9000",
                                   "--peers", "n1=10.0.0.1:7101,n2=10.0.0.2:7101", "--listen-peer", "0.0.0.0:7101"))
    assert (config.listen, config.advertised_client_address) == ("0.0.0.0:9000", "db1.example:9000")
    assert config.peers == {"n1": "10.0.0.1:7101", "n2": "10.0.0.2:7101"}
    assert config.peer_listen_address == "0.0.0.0:7101"


def test_listen_peer_with_join_is_the_readme_recipe_for_a_new_member():
    """--join fills in the peers from the cluster later (kv/server/join.py): --listen-peer is no
    error before it has."""
    config = node_config(parse("serve", "--id", "n4", "--listen", "10.0.0.4:7001", "--listen-peer", "10.0.0.4:7101",
                               "--data-dir", "./data/n4", "--join", "10.0.0.1:7001,10.0.0.2:7001"))
    assert (config.join, config.peers, config.peer_listen_address) == (True, {}, "10.0.0.4:7101")


def test_serve_help_says_a_removed_member_exits_with_a_code_systemd_should_not_restart(capsys):
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert f"exits with code {EXIT_REMOVED}" in help_text
    assert f"RestartPreventExitStatus={EXIT_REMOVED}" in help_text and "Restart=on-failure" in help_text
    assert EXIT_REMOVED not in (0, 1, 2, 130)  # success, failure, bad flags, Ctrl-C


def test_the_serve_example_is_a_three_member_cluster_with_client_and_peer_ports(capsys):
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    out = capsys.readouterr().out
    example = ("raftkv serve --id n1 --listen 127.0.0.1:7001 --data-dir ./data/n1 \\\n"
               "               --peers n1=127.0.0.1:7101,n2=127.0.0.1:7102,n3=127.0.0.1:7103")
    assert example in out
    assert "PEER address" in out and "--advertise-client" in out and "--listen-peer" in out
    args = example.replace("\\\n", "").split()[2:]
    config = node_config(parse("serve", *args))
    assert (config.listen, config.peer_listen_address, config.members) == ("127.0.0.1:7001", "127.0.0.1:7101",
                                                                            ["n1", "n2", "n3"])


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main([*command, "--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0
    assert out.startswith(f"usage: raftkv {' '.join(command)}")
    assert len(out.splitlines()) > 4


def test_help_shows_useful_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    out = capsys.readouterr().out
    for text in ("127.0.0.1:7001", "./raftkv-data", "--help-tuning", "--snapshot-threshold", "(default: 1000)"):
        assert text in out
    with pytest.raises(SystemExit):
        cli.main(["get", "--help"])
    out = capsys.readouterr().out
    assert "--endpoints" in out and "--consistency" in out and "stale" in out
    for command, defaults in ((["export"], ("(default: 4)", "(default: 30.0)")),
                              (["import"], ("(default: 1000)", "(default: 30.0)"))):
        with pytest.raises(SystemExit):
            cli.main([*command, "--help"])
        out = capsys.readouterr().out
        assert all(text in out for text in defaults), out


def test_machine_tuning_flags_are_accepted_but_listed_only_by_help_tuning(capsys):
    tuning = ("--grpc-servers", "--read-hold-ms", "--read-hold-siblings", "--read-spin-us", "--follower-yield-entries",
              "--lazy-push-ms",
              "--eager-timeout-ms", "--eager-trial-every-ms", "--event-loop", "--no-fsync")
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    main_help = capsys.readouterr().out
    assert not [flag for flag in tuning if flag in main_help]
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--help-tuning"])
    tuning_help = capsys.readouterr().out
    assert exited.value.code == 0
    assert [flag for flag in tuning if flag in tuning_help] == list(tuning)
    assert "docs/tuning.md" in tuning_help and "(default: 8)" in tuning_help
    assert node_config(parse("serve", "--grpc-servers", "2")).tuning.grpc_servers == 2


@pytest.mark.parametrize("argv, message", [
    (["serve", "--peers", "n2=127.0.0.1:7002"], "must name this node"),
    (["serve", "--peers", "n1"], "expected id=host:port"),
    (["serve", "--election-timeout-ms", "100", "--heartbeat-interval-ms", "100"],
     "--heartbeat-interval-ms < --election-timeout-ms"),
    (["serve", "--election-timeout-ms", "abc"], "expected a whole number"),
    (["serve", "--listen", "nowhere"], "--listen: bad address 'nowhere': expected host:port"),
    (["serve", "--listen", "0.0.0.0:7001"], "give --advertise-client HOST:PORT"),
    (["serve", "--listen", "[::]:7001"], "give --advertise-client HOST:PORT"),
    (["serve", "--advertise-client", "0.0.0.0:7001"], "--advertise-client 0.0.0.0:7001: give the address"),
    (["serve", "--advertise-client", "db1"], "--advertise-client: bad address"),
    (["serve", "--peers", "n1=127.0.0.1:7101,n2=somewhere"], "expected id=host:port"),
    (["serve", "--peers", "n1=127.0.0.1:7101,n2=h:port"], "--peers: n2: bad address"),
    (["serve", "--peers", "n1=127.0.0.1:7101", "--listen-peer", "nowhere"], "--listen-peer: bad address"),
    (["serve", "--listen-peer", "127.0.0.1:7101"], "--listen-peer needs --peers or --join"),
    (["serve", "--peer-port", "7101"], "unrecognized arguments"),
    (["serve", "--peer-transport", "tcp"], "unrecognized arguments"),
    (["cluster", "up", "--base-port", "7001", "--base-peer-port", "7002"], "overlap"),
    (["serve", "--frobnicate"], "unrecognized arguments"),
    (["get", "k", "--consistency", "eventual"], "invalid choice"),
    (["put", "k"], "required"),
    (["scan", "--limit", "-1"], "at least 0"),
    (["get", "k", "--timeout", "-1"], "must be positive"),
    (["cluster", "up", "--base-port", "70000"], "not a port"),
    (["scan", "--prefix", "a", "--start", "b"], "either --prefix or --start/--end"),
    ([], "required"),
])
def test_bad_flags_exit_2_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert message in err
    assert "Traceback" not in err


def test_put_get_delete_scan_print_results(start_node, capsys):  # noqa: F811
    node = start_node()
    endpoints = ["--endpoints", node.address, "--timeout", "2"]
    assert run(capsys, "put", "user/1", "alice", *endpoints) == (0, "OK index=1\n", "")
    assert run(capsys, "put", "user/2", "bob", *endpoints)[0] == 0
    assert run(capsys, "get", "user/1", *endpoints) == (0, "alice\n", "")
    assert run(capsys, "get", "user/1", "--consistency", "stale", *endpoints)[1] == "alice\n"
    assert run(capsys, "scan", "--prefix", "user/", *endpoints)[1] == "user/1\talice\nuser/2\tbob\n"
    assert run(capsys, "scan", "--start", "user/2", *endpoints)[1] == "user/2\tbob\n"
    assert run(capsys, "delete", "user/1", *endpoints) == (0, "deleted\n", "")
    code, out, err = run(capsys, "get", "user/1", *endpoints)
    assert (code, out) == (1, "") and "not found" in err


def test_status_table_and_json(start_node, capsys):  # noqa: F811
    node = start_node("n9")
    down = free_address()
    endpoints = ["--endpoints", f"{node.address},{down}", "--timeout", "0.5"]
    code, out, _ = run(capsys, "status", *endpoints)
    header, rule, up_row, down_row = out.splitlines()
    assert code == 1  # what it could reach is printed, and the exit code says one was missing
    assert header.split() == ["ADDRESS", "ID", "ROLE", "TERM", "LEADER", "COMMIT_INDEX", "APPLIED_INDEX", "SNAPSHOT_INDEX",
                              "ERROR"]
    assert set(rule.strip()) == {"─"}
    assert up_row.split()[:5] == [node.address, "n9", "leader", "3", "n9"]
    assert down_row.split()[:8] == [down] + ["-"] * 7 and len(down_row.split()) > 8  # then its error
    assert run(capsys, "status", "--endpoints", node.address)[0] == 0
    code, out, _ = run(capsys, "status", "--json", *endpoints)
    statuses = json.loads(out)
    assert code == 1
    assert statuses[0]["id"] == "n9" and statuses[0]["peers"] == {"n9": 0}
    assert statuses[1]["address"] == down and "error" in statuses[1]


def test_unreachable_cluster_is_one_line_on_stderr_and_exit_1(capsys):
    down = ["--endpoints", free_address(), "--timeout", "0.2"]
    for argv in (["put", "k", "v"], ["get", "k"], ["delete", "k"], ["scan"], ["status"]):
        code, out, err = run(capsys, *argv, *down)
        assert code == 1, argv
        assert len(err.strip().splitlines()) <= 1 and "Traceback" not in err
        if argv != ["status"]:
            assert err.startswith(f"raftkv {argv[0]}: error: UNAVAILABLE"), err


@pytest.mark.parametrize("command", [["put", "k", "v"], ["get", "k"], ["delete", "k"], ["scan"], ["status"]])
def test_data_commands_give_up_after_5_seconds_by_default_snapshot_save_after_600(command):
    # argparse shares a parent parser's option objects between the commands built from it: a
    # default set on one command must not become every command's.
    assert parse(*command).timeout == 5.0
    assert parse("snapshot", "save", "backup.snap").timeout == 600.0


def test_python_dash_m_kv_is_the_cli():
    result = subprocess.run([sys.executable, "-m", "kv", "get", "k", "--endpoints", free_address(), "--timeout", "0.2"],
                            capture_output=True, text=True, env=child_env(), cwd="/", timeout=30)
    assert result.returncode == 1
    assert result.stderr.startswith("raftkv get: error:") and "Traceback" not in result.stderr


def test_cluster_up_specs_give_every_member_all_peers(tmp_path):
    specs = local_specs(3, 7001, tmp_path, ["--no-fsync"])
    assert [s.listen for s in specs] == ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]
    command = serve_command(specs[1])
    assert command[:4] == [sys.executable, "-m", "kv", "serve"]
    args = cli.build_parser().parse_args(command[3:])
    config = node_config(args)
    assert config.node_id == "n2" and config.listen == "127.0.0.1:7002"
    assert config.peers == {"n1": "127.0.0.1:7101", "n2": "127.0.0.1:7102", "n3": "127.0.0.1:7103"}
    assert config.peer_listen_address == "127.0.0.1:7102"
    assert config.listen_metrics_urls == "http://127.0.0.1:7202"  # client port + 200
    assert config.listen_client_http_urls == "http://127.0.0.1:7302"  # client port + 300: etcd's JSON gateway
    assert [s.peers["n1"] for s in local_specs(2, 7001, tmp_path, base_peer_port=9000)] == ["127.0.0.1:9000"] * 2
    assert config.data_dir == tmp_path / "n2" and config.storage.fsync is False
    assert str(SOURCE_ROOT) in child_env()["PYTHONPATH"].split(":")
    # ... and that is the directory holding the kv package (its child imports the same code).
    assert (SOURCE_ROOT / "kv" / "tools" / "cluster_up.py").is_file()


def test_version_prints_the_installed_distributions_version(capsys, monkeypatch):
    import importlib.metadata
    import tomllib
    expected = tomllib.loads((Path(cli.__file__).parents[2] / "pyproject.toml").read_text())["project"]["version"]
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out == f"raftkv {expected}\n"

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert cli.package_version() == expected  # read from the source tree's pyproject.toml


def test_raftkv_endpoints_in_the_environment_is_the_default_and_the_flag_wins(start_node, capsys,  # noqa: F811
                                                                             monkeypatch):
    node = start_node()
    monkeypatch.setenv("RAFTKV_ENDPOINTS", node.address)
    for command in (["put", "k", "v"], ["get", "k"], ["delete", "k"], ["scan"], ["status"],
                    ["snapshot", "save", "x.snap"], ["export", "--out", "d"], ["import", "--parquet", "d"]):
        assert parse(*command).endpoints == node.address, command
    assert run(capsys, "put", "k", "v", "--timeout", "2")[0] == 0
    assert run(capsys, "get", "k", "--timeout", "2")[:2] == (0, "v\n")
    code, _, err = run(capsys, "get", "k", "--endpoints", free_address(), "--timeout", "0.2")
    assert code == 1 and "UNAVAILABLE" in err  # the flag wins over the environment
    monkeypatch.setenv("RAFTKV_ENDPOINTS", "")
    assert parse("get", "k").endpoints == "127.0.0.1:7001"  # empty: as if unset
    with pytest.raises(SystemExit):
        cli.main(["get", "--help"])
    assert "RAFTKV_ENDPOINTS" in capsys.readouterr().out


def test_scan_limit_0_lists_every_page(start_node, capsys, monkeypatch):  # noqa: F811
    node = start_node()
    endpoints = ["--endpoints", node.address, "--timeout", "2"]
    for key in ("a", "p/1", "p/2", "p/3", "p/4", "p/5", "q"):
        assert run(capsys, "put", key, "v", *endpoints)[0] == 0
    monkeypatch.setattr(data_commands, "SCAN_ALL_PAGE", 2)  # so that five keys take three pages
    code, out, err = run(capsys, "scan", "--prefix", "p/", "--limit", "0", *endpoints)
    assert (code, err) == (0, "") and out == "".join(f"p/{i}\tv\n" for i in range(1, 6))
    assert run(capsys, "scan", "--limit", "0", *endpoints)[1].count("\n") == 7


@pytest.mark.parametrize("fields, reason", [({"unhealthy": "ALARM NOSPACE (member n1)"}, "unhealthy: ALARM NOSPACE"),
                                            ({"unhealthy": "RAFT NO LEADER"}, "unhealthy: RAFT NO LEADER"),
                                            ({"unhealthy": ""}, "healthy: took")])
def test_endpoint_health_reports_the_members_own_verdict(start_node, capsys, fields, reason):  # noqa: F811
    from raftkv_proto import kv_pb2
    node = start_node()
    status = {"id": "n1", "role": "follower", "term": 3, "leader": "n1", **fields}
    node.kv.script["Status"] = lambda request, context: kv_pb2.StatusResponse(**status)
    code, out, _ = run(capsys, "endpoint", "health", "--endpoints", node.address, "--timeout", "2")
    assert code == (0 if fields["unhealthy"] == "" else 1) and out.startswith(f"{node.address} is {reason}"), out


def test_snapshot_save_into_a_missing_directory_and_import_of_a_missing_file_are_one_line_errors(tmp_path, capsys):
    missing = tmp_path / "no-such-dir"
    code, _, err = run(capsys, "snapshot", "save", str(missing / "backup.snap"), "--endpoints", free_address(),
                       "--timeout", "0.2")
    assert code == 1 and "is not a directory" in err and not missing.exists(), err
    pytest.importorskip("pyarrow")
    code, _, err = run(capsys, "import", "--parquet", str(missing), "--endpoints", free_address(), "--timeout", "0.2")
    assert code == 1 and "no such file or directory" in err and len(err.strip().splitlines()) == 1, err


CLIENT_COMMANDS = (["put", "k", "v"], ["get", "k"], ["delete", "k"], ["scan"], ["status"], ["endpoint", "health"],
                   ["snapshot", "save", "x.snap"], ["export", "--out", "d"], ["import", "--parquet", "d"])


def test_every_client_command_takes_cacert_cert_and_key_defaulting_to_the_environment(monkeypatch, capsys):
    for variable in ("RAFTKV_CACERT", "RAFTKV_CERT", "RAFTKV_KEY"):
        monkeypatch.delenv(variable, raising=False)
    for command in CLIENT_COMMANDS:
        assert tls_of(parse(*command)) is None, command  # nothing given: plaintext
        args = parse(*command, "--cacert", "ca.pem", "--cert", "me.pem", "--key", "me-key.pem")
        assert tls_of(args) == TLS(Path("ca.pem"), Path("me.pem"), Path("me-key.pem")), command
    assert parse("put", "--key", "me-key.pem", "--cert", "me.pem", "k", "v").key == "k"  # --key is not KEY

    monkeypatch.setenv("RAFTKV_CACERT", "/env/ca.pem")
    monkeypatch.setenv("RAFTKV_CERT", "/env/me.pem")
    monkeypatch.setenv("RAFTKV_KEY", "/env/me-key.pem")
    for command in CLIENT_COMMANDS:
        assert tls_of(parse(*command)) == TLS(Path("/env/ca.pem"), Path("/env/me.pem"), Path("/env/me-key.pem"))
    assert tls_of(parse("get", "k", "--cacert", "flag.pem")).ca_file == Path("flag.pem")  # the flag wins
    with pytest.raises(SystemExit):
        cli.main(["get", "--help"])
    shown = capsys.readouterr().out
    assert all(v in shown for v in ("$RAFTKV_CACERT", "$RAFTKV_CERT", "$RAFTKV_KEY"))


def test_a_certificate_without_its_key_is_a_one_line_error(monkeypatch, capsys):
    monkeypatch.delenv("RAFTKV_KEY", raising=False)
    code, _, err = run(capsys, "get", "k", "--endpoints", free_address(), "--cert", "me.pem")
    assert code == 1 and err.startswith("raftkv get: error:") and "--cert and --key" in err


def test_cluster_up_tls_makes_certificates_and_starts_members_with_both_ports_secured(tmp_path):
    specs, files = with_tls(local_specs(3, 7001, tmp_path), tmp_path / "certs")
    config = node_config(cli.build_parser().parse_args(serve_command(specs[1])[3:]))
    security = config.security
    assert security.client.cert_file == tmp_path / "certs" / "n2.pem" and security.client.trusted_ca_file == files.ca
    assert not security.client.client_cert_auth
    assert security.peer.cert_file == tmp_path / "certs" / "n2.pem" and security.peer.client_cert_auth
    assert files.export_lines() == [f"export RAFTKV_CACERT={tmp_path}/certs/ca.pem",
                                    f"export RAFTKV_CERT={tmp_path}/certs/root.pem",
                                    f"export RAFTKV_KEY={tmp_path}/certs/root-key.pem"]
    assert all(path.exists() for path in (files.ca, files.cert, files.key))
