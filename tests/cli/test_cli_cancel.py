"""`processor cancel` sets the key the workers and the client read."""

from __future__ import annotations

import json
import subprocess
import sys

from support.cli_tools import arun
from support.records import init_namespace_sync
from support.worker_harness import Harness

from processor.wire.ids import response_id_for_turn
from processor.wire.keys import Namespace


def _cancel(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "processor.cli", "cancel", *args, "--redis-url", redis_url],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_cancel_sets_the_key_on_the_turns_shard_with_a_ttl(redis_url, namespace, redis_client):
    init_namespace_sync(redis_client, namespace, 4)
    proc = _cancel(
        redis_url,
        "turn-9",
        "--namespace",
        namespace,
        "--shards",
        "4",
        "--reason",
        "user pressed stop",
        "--ttl",
        "120",
    )
    assert proc.returncode == 0, proc.stderr
    key = Namespace(namespace, 4).shard_for("turn-9").cancel("turn-9")
    assert redis_client.get(key) == b"user pressed stop"
    assert 0 < redis_client.ttl(key) <= 120


def test_cancel_by_turn_id_routes_by_the_turn_id(redis_url, namespace, redis_client):
    rid = response_id_for_turn("tid-1")
    init_namespace_sync(redis_client, namespace, 4)
    proc = _cancel(redis_url, rid, "--turn-id", "tid-1", "--namespace", namespace)
    assert proc.returncode == 0, proc.stderr
    assert redis_client.exists(Namespace(namespace, 4).shard_for("tid-1").cancel(rid)) == 1


def test_cancel_rejects_a_response_id_that_does_not_match_the_turn_id(redis_url, namespace):
    proc = _cancel(redis_url, "not-it", "--turn-id", "tid-1", "--namespace", namespace)
    assert proc.returncode == 2
    assert "has the ResponseId" in proc.stderr


async def test_cancel_of_a_finished_turn_says_it_had_already_ended(
    redis_url, namespace, redis_client
):
    update = {"contents": [{"type": "text", "text": "done"}], "role": "assistant"}
    async with Harness(redis_url, namespace, 2) as harness:
        await harness.start_worker()
        await harness.add([{"response_id": "over", "update": json.dumps(update)},
                           {"response_id": "over", "kind": "end"}])
        await harness.wait_merged(1)
        code, out, err = await arun(redis_url, namespace, 2, "cancel", "over")
        assert code == 0, err
        assert out.strip() == "over had already ended (completed): nothing to cancel"
        assert redis_client.exists(Namespace(namespace, 2).shard_for("over").cancel("over")) == 0
        # A turn still open is cancelled as before.
        await harness.add([{"response_id": "open", "update": json.dumps(update)}])
        code, out, err = await arun(redis_url, namespace, 2, "cancel", "open")
        assert code == 0 and out.startswith("cancelled open ("), err
        await harness.wait_merged(2)
        code, out, err = await arun(redis_url, namespace, 2, "cancel", "open")
        assert out.strip() == "open had already ended (cancelled): nothing to cancel"
