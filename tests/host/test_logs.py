"""Logs of a live ``processor run`` at debug level, on a Redis with a
password: JSON lines with the turn and correlation ids, and neither the
update text nor the password; ``--log-payloads`` lets the text in."""

from __future__ import annotations

import io
import json
import logging
import re
from urllib.parse import quote

from support.worker_harness import Harness

from processor import logs

PASSWORD = "pw-S3cr3t@x/y"
ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
TEXT = "user-data-7f3a9c"


def _turn(response_id: str) -> list[dict[str, object]]:
    update = {"type": "agent_response_update", "role": "assistant", "message_id": "m1",
              "contents": [{"type": "text", "text": f"{TEXT} said {response_id}"}]}
    ids = {"session_id": f"s-{response_id}", "task_id": "task-9"}
    return [{"response_id": response_id, "update": json.dumps(update), **ids},
            {"response_id": response_id, "update": json.dumps(update), **ids},
            {"response_id": response_id, "kind": "end"}]


async def _run(harness: Harness, tag: str, *extra: str) -> list[dict[str, object]]:
    sub = harness.spawn(None, *extra, log_level="debug")
    await harness.wait_started([sub])
    before = await harness.merged_count()
    await harness.add([*_turn(f"{tag}-ok"),
                       {"response_id": f"{tag}-failed", "update": json.dumps(
                           {"contents": [{"type": "text", "text": TEXT}]})},
                       {"response_id": f"{tag}-failed", "kind": "error",
                        "error": f"the model said {TEXT}", "code": "upstream"},
                       {"response_id": f"{tag}-bad", "update": json.dumps(
                           {"contents": [{"type": "text", "text": TEXT, "x": {"y": TEXT}}],
                            "role": 5})}])
    await harness.wait_merged(before + 2)
    await harness.wait_applied()
    assert harness.terminate(sub) == 0
    text = sub.log()
    lines = [json.loads(line) for line in text.splitlines()]  # every line is JSON
    assert PASSWORD not in text and quote(PASSWORD, safe="") not in text
    assert "S3cr3t" not in text
    return lines


async def test_logs_carry_ids_but_no_text_and_no_password(make_redis_server, namespace, tmp_path):
    server = make_redis_server(password=PASSWORD)
    async with Harness(server.url, namespace, log_dir=tmp_path) as harness:
        lines = await _run(harness, "quiet")
        text = "\n".join(json.dumps(line) for line in lines)
        assert TEXT not in text
        published = {line["response_id"]: line for line in lines
                     if line["msg"] == "turn published"}
        ok = published["quiet-ok"]
        assert ok["level"] == "debug" and ok["status"] == "completed"
        assert ok["synthesis_id"] == "quiet-ok:synthesis"
        assert (ok["session_id"], ok["task_id"]) == ("s-quiet-ok", "task-9")
        assert ok["counts"]["updates"] == 2
        failed = published["quiet-failed"]
        assert (failed["level"], failed["status"]) == ("info", "error")
        assert failed["error_code"] == "producer_error"
        connecting = next(line for line in lines if line["msg"] == "connecting")
        assert connecting["url"] == f"redis://:***@127.0.0.1:{server.port}"
        for line in lines:  # ISO 8601 UTC, to the millisecond, on every line
            assert ISO_UTC.fullmatch(str(line["ts"])), line

        # The debug flag lets the merged text in (so the check above can fail).
        loud = await _run(harness, "loud", "--log-payloads")
        contents = [line.get("content") for line in loud if line["msg"] == "turn published"]
        assert f"{TEXT} said loud-ok{TEXT} said loud-ok" in contents


def test_redis_urls_are_redacted_in_any_log_line() -> None:
    out = io.StringIO()
    logs.setup("info", stream=out)
    log = logging.getLogger("processor.test")
    log.info("connecting to redis://u:p@ss:w0rd@h:1/0 and rediss://:q@h2?password=zz&db=1",
             extra={"url": "unix://:sock-pw@/tmp/r.sock", "other": "redis://h:2"})
    line = json.loads(out.getvalue())
    assert line["msg"] == "connecting to redis://u:***@h:1/0 and rediss://:***@h2?password=***&db=1"
    assert line["url"] == "unix://:***@/tmp/r.sock"
    assert line["other"] == "redis://h:2"


def test_redact_masks_every_password_form() -> None:
    from processor.redis_io.options import redact

    assert redact("redis://:p%40ss@h:1/0") == "redis://:***@h:1/0"
    assert redact("rediss://user:p@ss@h:2") == "rediss://user:***@h:2"
    assert redact("redis://h:3?password=zz&db=1") == "redis://h:3?password=***&db=1"
    assert redact("redis://h:4/0") == "redis://h:4/0"


def test_ts_is_iso_8601_utc_with_milliseconds() -> None:
    out = io.StringIO()
    logs.setup("info", stream=out)
    record = logging.LogRecord("processor.test", logging.INFO, "", 0, "hi", (), None)
    record.created = 1795680340.1239  # 2026-11-26 08:05:40.1239 UTC
    line = json.loads(logs.JsonFormatter().format(record))
    assert line["ts"] == "2026-11-26T08:05:40.123Z"


def test_a_terminal_gets_one_human_line_per_record_and_a_pipe_json() -> None:
    """``--log-format auto`` (the default): text when the stream is a
    terminal, JSON otherwise; either, passwords masked."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    log = logging.getLogger("processor.test")
    for stream, fmt in [(Terminal(), "auto"), (io.StringIO(), "text")]:
        logs.setup("info", stream=stream, fmt=fmt)
        log.warning("redis unreachable, retrying",
                    extra={"url": "redis://u:pw@h:1", "retry_in": 0.4})
        assert re.fullmatch(r"\d\d:\d\d:\d\d warning redis unreachable, retrying "
                            r"\(url=redis://u:\*\*\*@h:1, retry_in=0\.4\)\n",
                            stream.getvalue()), stream.getvalue()
    for stream, fmt in [(io.StringIO(), "auto"), (Terminal(), "json")]:
        logs.setup("info", stream=stream, fmt=fmt)
        log.warning("redis unreachable, retrying", extra={"url": "redis://u:pw@h:1"})
        assert json.loads(stream.getvalue())["url"] == "redis://u:***@h:1"


def test_a_library_writes_one_line_of_a_kind_per_interval_then_says_how_many_it_left_out(
) -> None:
    """aiohttp writes an error line for each malformed request: a client could
    flood the log. One line of a kind (logger, level, template, error class)
    per interval; the next says how many were left out; other kinds and the
    processor's own lines pass."""
    now = [100.0]
    lines = logs.LibraryLines(every=60.0, clock=lambda: now[0])

    def record(name: str, msg: str, error: Exception | None = None) -> logging.LogRecord:
        exc_info = (type(error), error, None) if error else None
        return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, ("10.0.0.1",), exc_info)

    bad = "Error handling request from %s"
    assert lines.filter(record("aiohttp.server", bad, ValueError("x")))
    passed = [lines.filter(record("aiohttp.server", bad, ValueError("y"))) for _ in range(99)]
    assert not any(passed)
    assert lines.filter(record("aiohttp.server", bad, KeyError("other kind")))
    assert all(lines.filter(record("processor.serve", bad)) for _ in range(5))
    now[0] += 60.0
    later = record("aiohttp.server", bad, ValueError("z"))
    assert lines.filter(later)
    assert later.__dict__["suppressed"] == 99 and later.__dict__["error"] == "ValueError"
    assert later.exc_info is None
    fresh = record("aiohttp.server", bad, ValueError("again"))
    assert not lines.filter(fresh)
