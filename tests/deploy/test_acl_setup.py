"""Setting up with deploy/redis/users.acl (deploy/README.md): ``processor
init``, ``processor run``, the producers and KEDA each as their user, on one
redis-server (7.0+) and on a Cluster whose nodes load the file, with no
refused command; refused credentials or rights stop with one line; a worker
user from before FUNCTION LOAD; and the README's recipe makes a file that
Redis loads."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import redis.asyncio
from support.acl_users import (
    ADMIN_PASSWORD,
    NAMESPACE,
    PASSWORDS,
    PRODUCERS,
    acl_log,
    cli,
    redis7_binary,
    rendered_acl,
    run_every_scenario,
    shipped_lines,
    url_for,
)
from support.live_scenarios import TURN_TIMEOUT
from support.scrape import scrape, wait_status
from support.worker_harness import ROOT, Harness

from processor.client import Producer, Subscriber
from processor.embedded import EmbeddedRedis, free_port
from processor.redis_io.connections import connect
from processor.redis_io.options import RedisOptions
from processor.scripts.library import library_name
from processor.wire.keys import Namespace


async def test_init_worker_producer_and_keda_each_as_their_user(
    acl_server: EmbeddedRedis, tmp_path: Path
) -> None:
    """The compose/Kubernetes setup on one Redis with the ACL: `processor init`
    and `processor run` as processor, a trusted producer as producer-trusted,
    the demo producer (`--inbox`) as producer, KEDA's reads as keda; KEDA
    sees the backlog, then none once the workers caught up. The worker serves
    its metrics port: readiness and the sampled gauges work with the user's
    rights too."""
    shards, worker_url = 2, url_for(acl_server, "processor")
    ns = Namespace(NAMESPACE, shards)
    init = cli("init", "--redis-url", worker_url, "--shards", str(shards))
    assert init.returncode == 0, init.stderr
    producer_client = redis.asyncio.Redis.from_url(url_for(acl_server, "producer-trusted"))
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
             "--interval", "0", "--timeout", "30", "--inbox"],
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
    SLOTS, COMMAND, ...) merge every scenario, carry out the producer users'
    cancels, and no node refused anything."""
    path = tmp_path / "users.acl"
    path.write_text(rendered_acl())
    cluster = make_redis_cluster(3, binary=redis7_binary(), use_redis_cli=False,
                                 password=ADMIN_PASSWORD, args=["--aclfile", str(path)])
    worker_url = url_for(cluster.nodes[1], "processor")  # any node works
    async with Harness(cluster.url, NAMESPACE, shards=6, cluster=True,
                       log_dir=tmp_path) as harness:
        harness.url = worker_url
        # Held turns spill within 1 s (as in the other scenario runs), well
        # inside the 3 s turn timeout: waiting for the entries before a cancel
        # to be applied must not outlast the cancelled turn's own timeout.
        procs = [harness.spawn(turn_timeout=TURN_TIMEOUT, hold_ms=1000, log_level="info")
                 for _ in range(2)]
        await harness.wait_started(procs, timeout=60)
        await run_every_scenario(harness)
        # Each producer user's client works on the cluster too (Producer and its
        # function): the least-privilege one's turns go through the inboxes,
        # which the workers admit (BLPOP, admit_inbox) on every shard's node.
        for user, inbox in PRODUCERS.items():
            client = await connect(RedisOptions(url_for(cluster.nodes[2], user)))
            try:
                producer = Producer(client, namespace=NAMESPACE, shards=6, inbox=inbox)
                rids = [f"{user}-{i}" for i in range(12)]
                for rid in rids:
                    await producer.send(rid, {"contents": [{"type": "text", "text": "x"}]})
                    await producer.end(rid)
                subscriber = Subscriber(client, NAMESPACE, 6)
                for rid in rids:
                    assert (await subscriber.wait_for(rid, 30)).status == "completed"
                # A cancel: asked of the workers (on whichever node they
                # subscribed), set by one of them on the key's node.
                await producer.send(f"{user}-stop", {"contents": [{"type": "text", "text": "x"}]})
                assert await producer.cancel(f"{user}-stop", reason=f"stop {user}") == "asked"
                item = await subscriber.wait_for(f"{user}-stop", 30)
                assert (item.status, item.meta["cancel_reason"]) == ("cancelled", f"stop {user}")
            finally:
                await client.aclose()
        for sub in list(harness.procs):
            assert harness.terminate(sub) == 0
    for node in cluster.nodes:
        assert acl_log(node) == [], f"node {node.port} refused something"


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


async def test_a_worker_user_without_function_load(acl_server: EmbeddedRedis,
                                                   tmp_path: Path) -> None:
    """A processor user from before the function library (no FUNCTION LOAD):
    `processor init` stops with one line naming the library; a worker logs
    it once and keeps merging (producers would fail until it is loaded)."""
    line = shipped_lines()["processor"].replace(" +function|load", "")
    with redis.Redis(**acl_server.client_kwargs()) as admin:
        admin.execute_command("ACL", "SETUSER", "old-worker", *line.split()[2:], ">pw")
    url = f"redis://old-worker:pw@{acl_server.host}:{acl_server.port}"
    init = cli("init", "--redis-url", url)
    assert init.returncode == 1
    (message,) = init.stderr.strip().splitlines()
    assert message.startswith(f"processor init: redis refused to load the producers' "
                              f"function library {library_name()}: ")
    assert "no permissions" in message
    async with Harness(acl_server.url, NAMESPACE, 1, log_dir=tmp_path) as harness:
        harness.url = url
        worker = harness.spawn(None, "--log-level", "info")
        await harness.wait_started([worker])
        await harness.add([{"response_id": "r", "kind": "end"}])
        await harness.wait_merged(1)
        assert harness.terminate(worker) == 0
        refusals = [json.loads(x) for x in worker.log().splitlines()
                    if "cannot load the producers' function library" in x]
    assert len(refusals) == 1 and refusals[0]["library"] == library_name()


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
           **{f"{user.upper().replace('-', '_')}_PASSWORD": pw for user, pw in PASSWORDS.items()}}
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
