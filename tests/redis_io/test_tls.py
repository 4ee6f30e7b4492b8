"""TLS: ``processor run`` on a TLS-only redis-server that requires client
certificates (all made by the test: a CA, the server's and a client's), with
the CA and the client certificate given as options (flags or environment)
and an ACL user and password in the ``rediss://`` URL. A certificate the
server or the worker does not trust stops the worker with one line.
The server does TLS itself where it was built with it, else the test TLS
proxy does it in front of a plain one (see ``redis_servers``)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from support.records import init_namespace_sync
from support.redis_servers import TlsServer, set_tls_auth_clients
from support.strategies import random_turn
from support.tls_certs import make_client_certificate, make_tls_files
from support.turn_reference import compare_with_offline, interleave, offline_results
from support.worker_harness import ROOT, Harness

from processor.embedded import TlsFiles
from processor.redis_io.connections import tls_refusal_probe
from processor.redis_io.options import RedisOptions
from processor.wire.keys import Namespace

USER, PASSWORD = "worker", "tls-and-acl-pw"
NO_RETRY = Retry(NoBackoff(), 0)


@dataclass
class TlsSetup:
    server: TlsServer
    ca: Path
    cert: Path
    key: Path
    foreign_ca: Path  # a CA nobody here trusts
    foreign_cert: Path  # a client certificate it signed
    foreign_key: Path

    @property
    def url(self) -> str:
        """The worker's URL: TLS, an ACL user and password, no file in it."""
        return f"rediss://{USER}:{quote(PASSWORD)}@127.0.0.1:{self.server.port}"

    def producer_url(self) -> str:
        return (f"{self.url}?ssl_ca_certs={self.ca}&ssl_certfile={self.cert}"
                f"&ssl_keyfile={self.key}")

    def flags(self) -> dict[str, str]:
        return {"ssl_ca_certs": str(self.ca), "ssl_certfile": str(self.cert),
                "ssl_keyfile": str(self.key)}


@pytest.fixture
def tls_setup(make_redis_server, tls_files: TlsFiles, tmp_path: Path) -> TlsSetup:
    server = make_redis_server(tls=True)
    cert, key = make_client_certificate(tls_files, tmp_path / "client")
    foreign = make_tls_files(tmp_path / "foreign")
    foreign_cert, foreign_key = make_client_certificate(foreign, tmp_path / "foreign-client")
    admin = redis.Redis(host="127.0.0.1", port=server.port, ssl=True,
                        ssl_ca_certs=str(tls_files.ca_file), ssl_certfile=str(cert),
                        ssl_keyfile=str(key))
    admin.execute_command("ACL", "SETUSER", USER, "on", f">{PASSWORD}", "~*", "&*", "+@all")
    # From now on a client needs a certificate the CA signed (the fixture's
    # own PING at start-up had none: it is switched on afterwards).
    set_tls_auth_clients(server, "yes", admin)
    admin.close()
    return TlsSetup(server, tls_files.ca_file, cert, key, foreign.ca_file, foreign_cert,
                    foreign_key)


async def test_workers_over_tls_with_client_certificates(
    tls_setup: TlsSetup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers on the TLS-only server, one given the CA and its client
    certificate as flags, the other as environment variables; random turns
    come out as ``processor merge`` makes them."""
    rng = random.Random(41)
    arrival = interleave([random_turn(rng, f"tls-{i}") for i in range(150)], rng)
    offline = offline_results(arrival)
    namespace = f"t{uuid.uuid4().hex[:8]}"
    async with Harness(tls_setup.producer_url(), namespace, log_dir=tmp_path) as harness:
        harness.url = tls_setup.url  # what the workers get: no file in the URL
        by_flags = harness.spawn(**tls_setup.flags())
        for name, value in tls_setup.flags().items():
            monkeypatch.setenv(f"PROCESSOR_{name.upper()}", value)
        by_env = harness.spawn()
        monkeypatch.undo()
        await harness.wait_started([by_flags, by_env])
        await harness.add(arrival)
        await harness.wait_merged(len(offline))
        await harness.wait_drained()
        harness.assert_workers_alive()
        outputs = await harness.outputs()
        logs = by_flags.log() + by_env.log()
        for sub in list(harness.procs):
            assert harness.terminate(sub) == 0
    compare_with_offline(outputs, offline, "over TLS")
    assert outputs.dlq == []
    assert PASSWORD not in logs and "rediss://worker:***@127.0.0.1" in logs
    # The server speaks TLS only, and only to clients with a certificate.
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=tls_setup.server.port, socket_timeout=2, retry=NO_RETRY).ping()
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=tls_setup.server.port, ssl=True, ssl_ca_certs=str(tls_setup.ca),
                    socket_timeout=2, retry=NO_RETRY).ping()


@pytest.mark.parametrize("case", ["no client certificate", "server not trusted",
                                  "client not trusted"])
def test_untrusted_certificates_stop_the_worker_with_one_line(tls_setup: TlsSetup,
                                                              case: str) -> None:
    s = tls_setup
    files = {"no client certificate": ["--ssl-ca-certs", str(s.ca)],
             "server not trusted": ["--ssl-ca-certs", str(s.foreign_ca), "--ssl-certfile",
                                    str(s.cert), "--ssl-keyfile", str(s.key)],
             "client not trusted": ["--ssl-ca-certs", str(s.ca), "--ssl-certfile",
                                    str(s.foreign_cert), "--ssl-keyfile", str(s.foreign_key)]}
    result = subprocess.run(
        [sys.executable, "-m", "processor.cli", "run", "--redis-url", s.url, *files[case]],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"processor: TLS with redis at rediss://{USER}:***@127.0.0.1:"), last
    words = {"no client certificate": "CERTIFICATE_REQUIRED",
             "server not trusted": "self-signed certificate",
             "client not trusted": "UNKNOWN_CA"}
    assert words[case] in last and "--ssl-ca-certs" in last
    assert PASSWORD not in result.stderr


@pytest.mark.parametrize("via", ["flags", "env"])
def test_cancel_over_tls_with_client_certificates(tls_setup: TlsSetup, namespace: str,
                                                  via: str) -> None:
    """``processor cancel`` takes the same --ssl-* flags / PROCESSOR_SSL_* as run and the tools."""
    flags = tls_setup.flags()
    check = redis.Redis.from_url(tls_setup.producer_url())
    try:
        init_namespace_sync(check, namespace)
    finally:
        check.close()
    argv = [sys.executable, "-m", "processor.cli", "cancel", "resp-tls", "--namespace",
            namespace, "--redis-url", tls_setup.url]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCESSOR_SSL_")}
    if via == "flags":
        for name, value in flags.items():
            argv += [f"--{name.replace('_', '-')}", value]
    else:
        env |= {f"PROCESSOR_{name.upper()}": value for name, value in flags.items()}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    check = redis.Redis.from_url(tls_setup.producer_url())
    try:
        key = Namespace(namespace).shard_for("resp-tls").cancel("resp-tls")
        assert check.get(key) == b"cancelled"
    finally:
        check.close()


async def test_the_probe_reads_the_servers_refusal_a_reset_would_hide(tls_setup: TlsSetup) -> None:
    """connect_retrying's probe: a connection that sends nothing gets the
    server's TLS 1.3 alert for a missing or untrusted client certificate,
    which a client that had sent a command could lose to a reset; a
    certificate the server trusts, or the same files in the URL, pass."""
    s = tls_setup
    missing = await tls_refusal_probe(RedisOptions(s.url, ssl_ca_certs=str(s.ca)))
    assert missing is not None and "CERTIFICATE_REQUIRED" in missing
    foreign = await tls_refusal_probe(RedisOptions(
        s.url, ssl_ca_certs=str(s.ca), ssl_certfile=str(s.foreign_cert),
        ssl_keyfile=str(s.foreign_key)))
    assert foreign is not None and "UNKNOWN_CA" in foreign
    for trusted in (RedisOptions(s.url, **s.flags()), RedisOptions(s.producer_url())):
        assert await tls_refusal_probe(trusted, wait=0.2) is None
    assert await tls_refusal_probe(RedisOptions(s.url.replace("rediss:", "redis:"))) is None
