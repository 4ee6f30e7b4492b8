"""The operator tools' command line: ``processor stats`` and ``tail`` here,
``processor dlq`` in :mod:`processor.dlq_cli`; the shared shell (connecting,
exit statuses, consoles, progress) is :mod:`processor.tool_shell`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Any

from processor.keys import Namespace
from processor.tool_shell import (
    AddFlags,
    Refused,
    positive,
    print_json,
    progress,
    run_tool,
    stderr_console,
    stdout_console,
    with_tls,
)

# --------------------------------------------------------------------------- stats


def _cmd_stats(args: argparse.Namespace) -> int:

    from processor import stats

    async def body(client: Any, keys: Namespace) -> int:
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
    parser.add_argument(
        "--group", default=os.environ.get("PROCESSOR_GROUP"),
        help="consumer group (env PROCESSOR_GROUP; default: the namespace's, from its record)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON document instead of tables")
    parser.set_defaults(func=_cmd_stats)


# --------------------------------------------------------------------------- tail


def _cmd_tail(args: argparse.Namespace) -> int:
    from processor.tail import Tail, TailError, as_json, line, parse_from

    async def body(client: Any, keys: Namespace) -> int:
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
        if not args.quiet:
            note.print(f"following merged and events of {keys.shards} shard(s) of "
                       f"{keys.name}; Ctrl-C stops", style="dim")
        seen = await tail.run(emit)
        if not args.quiet:
            resume = " ".join(tail.resume_args())
            note.print(f"{seen} entries; resume with: {resume}", style="dim", soft_wrap=True)
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


def register(sub: Any, redis_flags: AddFlags) -> None:
    """Add ``stats``, ``tail`` and ``dlq`` to the ``processor`` subcommands."""
    from processor.dlq_cli import add_dlq

    redis_flags = with_tls(redis_flags)
    _add_stats(sub, redis_flags)
    _add_tail(sub, redis_flags)
    add_dlq(sub, redis_flags)
