"""The operator tools' command line: ``processor stats``, ``tail``, ``capture``
and ``repair-stream`` here, ``processor dlq`` in ``processor.cli.dlq``; the
shared shell (connecting, exit statuses, consoles, progress) is
``processor.host.tool_shell``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import TYPE_CHECKING, Any

from processor.host.config import add_option
from processor.host.tool_shell import (
    AddFlags,
    Refused,
    positive,
    print_json,
    progress,
    run_tool,
    stderr_console,
    stdout_console,
)
from processor.wire.keys import Namespace

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient

# --------------------------------------------------------------------------- stats


def _cmd_stats(args: argparse.Namespace) -> int:

    async def body(client: RedisClient, keys: Namespace) -> int:
        from processor.cli import stats

        with progress("reading shards", keys.shards) as advance:
            figures = await stats.collect(client, keys, args.group, advance)
        if args.json:
            sys.stdout.buffer.write(stats.to_json(figures) + b"\n")
        else:
            stats.render(figures, stdout_console())
        return 0

    return run_tool("stats", args, body)


def _add_stats(sub: Any, redis_flags: AddFlags) -> None:
    parser = sub.add_parser(
        "stats",
        help="show lag, pending, consumers, active turns and DLQ size per shard",
        description="One row per shard: the updates stream's length, the group's lag (entries "
        "not delivered yet) and pending (delivered, not acked), its consumers and their idle "
        "time, active and closing turns, and the lengths of the dlq, merged and events streams.",
    )
    redis_flags(parser)
    add_option(parser, "group")  # (default: the namespace's, from its record)
    parser.add_argument("--json", action="store_true", help="one JSON document instead of tables")
    parser.set_defaults(func=_cmd_stats)


# --------------------------------------------------------------------------- tail


def _cmd_tail(args: argparse.Namespace) -> int:
    from processor.cli.tail import Tail, TailError, as_json, line, parse_from

    async def body(client: RedisClient, keys: Namespace) -> int:
        try:
            start = parse_from(args.start, keys)
        except TailError as exc:
            raise Refused(str(exc)) from None
        tail = Tail(client, keys, start, follow=not args.no_follow, limit=args.limit)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, tail.stop)
        note = stderr_console()
        if args.json:
            def emit(item: Any) -> None:
                print_json(as_json(item))
                sys.stdout.flush()
        else:
            out = stdout_console()

            def emit(item: Any) -> None:
                out.print(line(item, args.width), soft_wrap=True)
        if not args.quiet and tail.follow:
            note.print(f"following merged and events of {keys.shards} shard(s) of "
                       f"{keys.name}; Ctrl-C stops", style="dim")
        seen = await tail.run(emit)
        if not args.quiet:
            resume = " ".join(tail.resume_args())
            note.print(f"{seen} entries" + (f"; resume with: {resume}" if resume else ""),
                       style="dim", soft_wrap=True)
        return 0

    return run_tool("tail", args, body)


def _add_tail(sub: Any, redis_flags: AddFlags) -> None:
    parser = sub.add_parser(
        "tail",
        help="follow merged responses and events of every shard",
        description="Print each merged response and event of every shard as it is published: "
        "one readable line each (time, shard, type, turn, status, short content), or one JSON "
        "line each with --json. SIGINT or SIGTERM stops it (exit 0) and prints --from "
        "arguments that resume where it stopped.",
    )
    redis_flags(parser)
    parser.add_argument(
        "--from", dest="start", action="append", metavar="WHERE",
        help="beginning, now (default), an entry id (every stream from there), or "
        "STREAM=ID for one stream (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON line per entry")
    parser.add_argument("--limit", type=positive, default=None, help="stop after this many entries")
    parser.add_argument(
        "--no-follow", action="store_true", help="stop once the entries present at start are read"
    )
    parser.add_argument(
        "--width", type=positive, default=80, help="characters of content per line (default 80)"
    )
    parser.add_argument("--quiet", action="store_true", help="no notes on stderr")
    parser.set_defaults(func=_cmd_tail)


# --------------------------------------------------------------------------- capture


def _cmd_capture(args: argparse.Namespace) -> int:
    from processor.scripts.capture import Capture, CaptureError, start_position

    async def body(client: RedisClient, keys: Namespace) -> int:
        try:
            start = start_position(args.start)
        except CaptureError as exc:
            raise Refused(str(exc)) from None
        capture = Capture(client, keys, start, turn=args.turn, follow=not args.no_follow,
                          limit=args.limit)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, capture.stop)
        out = sys.stdout.buffer

        def write(line: bytes) -> None:
            out.write(line + b"\n")
            out.flush()

        def warn(message: str) -> None:
            print(f"processor capture: {message}", file=sys.stderr, flush=True)

        note = stderr_console()
        await capture.begin()
        if capture.follow:
            what = f"turn {args.turn} of " if args.turn else ""
            note.print(f"capturing the input of {what}{len(capture.shards)} shard(s) of "
                       f"{keys.name}; Ctrl-C stops", style="dim", soft_wrap=True)
        written = await capture.run(write, warn)
        note.print(f"{written} entries captured", style="dim")
        return 1 if capture.missed else 0

    return run_tool("capture", args, body)


def _add_capture(sub: Any, redis_flags: AddFlags) -> None:
    parser = sub.add_parser(
        "capture",
        help="write the input entries as they arrive, for processor merge",
        description="Follow the updates stream of every shard (or of one turn) and write each "
        "input entry as one JSON line, the format processor merge reads. It reads without a "
        "consumer group: the workers lose nothing. Workers delete the entries they applied, "
        "so run it while the entries arrive; an entry deleted before it could be read is "
        "reported (exit status 1). SIGINT or SIGTERM stops it (exit 0).",
    )
    redis_flags(parser)
    parser.add_argument("--turn", default=None, metavar="RESPONSE_ID",
                        help="only this turn's entries; stop after its end or error entry, or "
                        'when it is cancelled (then a {"kind": "cancel"} line is written)')
    parser.add_argument("--from", dest="start", default=None, metavar="WHERE",
                        help="now (default: entries added from now on), beginning (every "
                        "entry still in the streams) or an entry id")
    parser.add_argument("--no-follow", action="store_true",
                        help="stop once the entries present are written")
    parser.add_argument("--limit", type=positive, default=None,
                        help="stop after this many entries")
    parser.set_defaults(func=_cmd_capture)


# --------------------------------------------------------------------------- repair-stream


def _cmd_repair(args: argparse.Namespace) -> int:
    from redis.exceptions import ResponseError

    from processor.scripts.repair import repair, running_workers

    async def body(client: RedisClient, keys: Namespace) -> int:
        if args.shard is not None and not 0 <= args.shard < keys.shards:
            raise Refused(f"--shard {args.shard} is not one of the {keys.shards} shard(s)")
        shards = keys.all() if args.shard is None else [keys.shard(args.shard)]
        running = [] if args.dry_run else await running_workers(client, keys, args.group)
        if running:
            print(f"processor repair-stream: {len(running)} worker(s) of group {args.group!r} "
                  f"are running ({', '.join(running)}): stop every worker of the namespace "
                  "first, repair, then start them (one that died drops out of "
                  f"{keys.workers(args.group)} within twice its --worker-ttl)", file=sys.stderr)
            return 1
        changed = 0
        for shard in shards:
            try:
                result = await repair(client, shard, max_ahead_ms=args.max_ahead_ms,
                                      dry_run=args.dry_run)
            except ResponseError as exc:
                print(f"processor repair-stream: shard {shard.index}: {exc}", file=sys.stderr)
                return 1
            changed += result.status in ("plan", "repaired")
            print("\n".join(result.lines()), flush=True)
        if args.dry_run:
            print(f"{changed} shard(s) to repair; nothing changed (--dry-run)")
        else:
            print(f"{changed} shard(s) repaired" + (
                "; dlq list --reason bad_id shows the entries moved" if changed else ""))
        return 0

    return run_tool("repair-stream", args, body)


def _add_repair(sub: Any, redis_flags: AddFlags) -> None:
    from processor.wire.stream_ids import MAX_AHEAD_MS

    parser = sub.add_parser(
        "repair-stream",
        help="bring an updates stream back from exhausted or far-future ids",
        description="For each shard whose updates stream (or its consumer group) has an id "
        "past Redis's clock plus --max-ahead-ms (an XADD with an explicit id: at the last "
        "possible id every later XADD fails), in one atomic step per shard: move the entries "
        "past it to the DLQ whole (reason bad_id; dlq replay adds them back with new ids), "
        "keep every other entry, pending entry (same consumer, delivery count) and group, and "
        "set the stream's and groups' last ids back below it, so that producers can send "
        "again, no acked entry is delivered again and no undelivered one is skipped. Shards "
        "that need nothing are left alone. Stop the workers first (it refuses while any "
        "beats): a worker that reads across the repair may hold entries back until they are "
        "reclaimed. Run it as a Redis user "
        "with XINFO, XRANGE, XREVRANGE, XPENDING, XADD, XDEL, XGROUP CREATE, XCLAIM, XSETID, "
        "DEL, RENAME, EXISTS, TIME, ZRANGE and EVALSHA/SCRIPT LOAD (an administrator).",
    )
    redis_flags(parser)
    parser.add_argument("--shard", type=int, default=None, help="only this shard")
    add_option(parser, "group")  # the workers' group, to see whether any runs
    parser.add_argument(
        "--max-ahead-ms", type=positive, default=MAX_AHEAD_MS,
        help=f"ids further ahead of Redis's clock are bad (default {MAX_AHEAD_MS}, an hour; "
        "as the workers' check)")
    parser.add_argument("--dry-run", action="store_true",
                        help="only say what would be done")
    parser.set_defaults(func=_cmd_repair)


def register(sub: Any, redis_flags: AddFlags) -> None:
    """Add ``stats``, ``tail``, ``capture``, ``repair-stream`` and ``dlq`` to the
    ``processor`` subcommands."""
    from processor.cli.dlq import add_dlq

    _add_stats(sub, redis_flags)
    _add_tail(sub, redis_flags)
    _add_capture(sub, redis_flags)
    _add_repair(sub, redis_flags)
    add_dlq(sub, redis_flags)
