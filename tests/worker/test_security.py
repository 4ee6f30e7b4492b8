"""What a hostile producer or a leaked log could show.

- The DLQ keeps a bad entry whole (copied inside Redis, never by the
  worker), so that it can be replayed: a 2 MiB field name or 18 MB of 60 KB
  fields come back as written.
- Logs (even at debug) and DLQ details never echo more than a bounded prefix
  of a bad payload.
- No secret (the Redis password in the URL) in logs, metrics or error
  messages, through connection errors, a Redis restart and refused
  credentials.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import quote

from support.scrape import fetch
from support.turn_reference import simple_turn
from support.worker_harness import ROOT, Harness

from processor.embedded import free_port
from processor.wire.ids import TurnKey


async def test_the_dlq_keeps_a_bad_entry_whole(redis_url: str, namespace: str) -> None:
    """A bad entry is dead-lettered whole, inside Redis (the worker copies
    nothing): a 2 MiB field name and 18 MB of 60 KB fields come back as the
    producer wrote them, so ``dlq replay`` can bring them back (they used to
    be cut to 64 KiB, which lost them)."""
    huge_name = {"response_id": "a", "N" * (2 << 20): "v", "update": "{}"}
    wide = {"update": "{}", **{f"f{i}": "x" * 60_000 for i in range(300)},
            "response_id": "b", "step_id": "s-1"}
    small = {"response_id": "c", "update": "[1, 2]"}
    async with Harness(redis_url, namespace) as harness:
        await harness.start_workers(1)
        shard = harness.shards[0]
        ids = [await harness.add_raw(shard, fields) for fields in (huge_name, wide, small)]
        await harness.wait_applied()
        outputs = await harness.outputs()
    dead = {d["source_id"]: d for d in outputs.dlq}
    for entry_id, fields, reason in zip(ids, (huge_name, wide, small),
                                        ("too_large", "too_large", "invalid_update"),
                                        strict=True):
        got = dead[entry_id]
        assert got["reason"] == reason and "truncated" not in got
        assert {k: got[k] for k in fields} == fields


def _payload() -> tuple[str, str]:
    """A long payload and a window of it no log or detail may hold (longer
    than the 120 characters a detail may quote)."""
    period = "P" + secrets.token_hex(8)
    return period * 20_000, period * 9


async def test_logs_and_details_never_echo_a_bad_payload(redis_url: str, namespace: str,
                                                         tmp_path: Path) -> None:
    payload, window = _payload()
    update = json.dumps({"contents": [{"type": "text", "text": payload}]})
    bad = [
        {"response_id": "bad-json", "update": payload + "}{"},
        {"response_id": "bad-kind", "kind": payload[:5000], "update": "{}"},
        {"response_id": "bad-enc", "enc": payload[:5000], "update": "{}"},
        {"response_id": "bad-type", "update": json.dumps({"contents": payload})},
        {"response_id": "bad-id", "step_id": payload[:5000], "update": "{}"},
        {"response_id": payload[:5000], "update": "{}"},
        {"response_id": "bad-key", "update": json.dumps(
            {"contents": [], "additional_properties": {payload[:5000]: 2**70}})},
        {"response_id": "too-big", "update": json.dumps({"contents": [{"type": "text",
                                                                       "text": payload * 4}]})},
    ]
    good = [{"response_id": "good", "update": update}, {"response_id": "good", "kind": "end"}]
    async with Harness(redis_url, namespace, log_dir=tmp_path) as harness:
        sub = harness.spawn(log_level="debug", progress=True)
        await harness.wait_started([sub])
        await harness.add(bad + good)
        await harness.wait_merged(1)
        await harness.wait_drained()
        outputs = await harness.outputs()
        log = sub.log()
        assert harness.terminate(sub) == 0
    assert len(outputs.dlq) == len(bad)
    assert payload in json.loads(outputs.turns[TurnKey("good")].response)["messages"][0][
        "contents"][0]["text"]  # the valid turn's text is merged whole ...
    assert window not in log  # ... but never logged, nor any bad payload
    assert '"level": "debug"' in log  # debug lines were written
    for dead in outputs.dlq:
        assert window not in dead["detail"], dead["reason"]


async def test_no_secret_in_logs_metrics_or_errors(make_redis_server, tmp_path: Path) -> None:
    """The password of the Redis URL never shows, through a Redis restart
    (connection errors logged), /metrics, and refused or unreachable URLs."""
    password = f"s3cr@t/{secrets.token_hex(6)}:x"
    server = make_redis_server(password=password, appendonly=True)
    assert quote(password, safe="") in server.url
    namespace = f"t{uuid.uuid4().hex[:8]}"
    port = free_port()
    async with Harness(server.url, namespace, log_dir=tmp_path) as harness:
        sub = harness.spawn(log_level="debug", metrics_port=port, metrics_host="127.0.0.1")
        await harness.wait_started([sub])
        await harness.add(simple_turn("before", 5))
        await harness.wait_merged(1)
        await server.akill()  # the worker logs connection errors, then reconnects
        await asyncio.sleep(1.0)
        await server.astart()
        await harness.client.connection_pool.disconnect()
        await harness.add(simple_turn("after", 5))
        await harness.wait_merged(2, timeout=60)
        status, metrics = await fetch(port, "/metrics")
        assert status == 200 and "processor_" in metrics
        _, ready = await fetch(port, "/readyz")
        log = sub.log()
        assert harness.terminate(sub) == 0
    assert "retrying" in log  # the restart was seen and logged
    assert ":***@127.0.0.1" in log  # the URL is logged, its password masked
    wrong = f"wr0ng/{secrets.token_hex(6)}"
    bad_url = server.url.replace(quote(password, safe=""), quote(wrong, safe=""))
    refused = _cli("run", "--redis-url", bad_url, "--namespace", namespace)
    stats = _cli("stats", "--redis-url", bad_url, "--namespace", namespace)
    cancel = _cli("cancel", "x", "--redis-url", bad_url, "--namespace", namespace)
    unreachable = _cli("run", "--redis-url", f"redis://:{quote(password, safe='')}@127.0.0.1:"
                       f"{free_port()}", "--namespace", namespace, timeout=3)
    assert refused.returncode != 0 and stats.returncode != 0 and cancel.returncode != 0
    for text in (log, metrics, ready, refused.stderr, stats.stderr, stats.stdout,
                 cancel.stderr, unreachable.stderr):
        for secret in (password, quote(password, safe=""), wrong, quote(wrong, safe="")):
            assert secret not in text, text[-2000:]


def _cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``processor ARGS``; a process still running after ``timeout`` is
    stopped with SIGTERM and what it wrote so far is returned."""
    proc = subprocess.Popen([sys.executable, "-m", "processor.cli", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
