"""The operator tools' command line: ``processor stats``, ``tail`` and ``dlq``.

Parsers and the shell around :mod:`processor.stats`, :mod:`processor.tail`
and :mod:`processor.dlq`: connect, run, print, exit status. Bad arguments
and an unreachable Redis give one line on stderr and exit status 2 (bad
arguments) or 1 (Redis); a tool stopped by SIGINT/SIGTERM exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from processor.connections import TRANSIENT, RedisOptions, connect, redact
from processor.keys import DEFAULT_GROUP, Namespace

AddFlags = Callable[[argparse.ArgumentParser], None]


class Refused(Exception):
    """A one-line reason to stop with exit status 2."""


def _fail(prog: str, message: str, status: int) -> int:
    print(f"processor {prog}: {message}", file=sys.stderr)
    return status


def _run(
    prog: str, args: argparse.Namespace, body: Callable[[Any, Namespace], Awaitable[int]]
) -> int:
    """Connect, run ``body(client, keys)``, close; one line and a status on any failure."""
    url = args.redis_url or os.environ.get("REDIS_URL")
    if not url:
        return _fail(prog, "give --redis-url or set REDIS_URL", 2)
    if args.shards < 1:
        return _fail(prog, f"--shards must be at least 1, not {args.shards}", 2)

    options = RedisOptions(url, args.ssl_ca_certs, args.ssl_certfile, args.ssl_keyfile)

    async def main() -> int:
        try:
            client = await connect(options)
        except TRANSIENT as exc:
            return _fail(prog, f"cannot reach Redis at {redact(url)}: {exc}", 1)
        try:
            return await body(client, Namespace(args.namespace, args.shards))
        finally:
            await client.aclose()

    try:
        return asyncio.run(main())
    except Refused as exc:
        return _fail(prog, str(exc), 2)
    except BrokenPipeError:
        # The reader went away (| head): stop quietly, and keep the interpreter's
        # final flush of stdout from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except TRANSIENT as exc:
        return _fail(prog, f"Redis at {redact(url)} failed: {exc}", 1)
    except KeyboardInterrupt:  # before a tool installed its own handler
        return 130


def _with_tls(redis_flags: AddFlags) -> AddFlags:
    """The shared Redis flags plus the TLS files of ``processor run`` (same env names)."""

    def add(parser: argparse.ArgumentParser) -> None:
        redis_flags(parser)
        for name, what in (("ca_certs", "CA bundle"), ("certfile", "client certificate"),
                           ("keyfile", "client key")):
            env = f"PROCESSOR_SSL_{name.upper()}"
            parser.add_argument(f"--ssl-{name.replace('_', '-')}", default=os.environ.get(env),
                                metavar="FILE", help=f"{what} for rediss:// URLs (env {env})")

    return add


def _stdout_console() -> Any:
    """A rich console on stdout that lets :func:`_run` handle a closed pipe (exit 0)."""
    from rich.console import Console

    class Stdout(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    return Stdout(highlight=False)


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


@contextmanager
def _progress(what: str, total: int) -> Iterator[Callable[[], None]]:
    """A transient progress bar on stderr (only on a terminal); yields ``advance()``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    console = _stderr_console()
    with Progress(
        TextColumn(what), BarColumn(), MofNCompleteColumn(), console=console, transient=True,
        disable=not console.is_terminal,
    ) as progress:
        task = progress.add_task(what, total=total)
        yield lambda: progress.advance(task)


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")


# --------------------------------------------------------------------------- stats


def _cmd_stats(args: argparse.Namespace) -> int:

    from processor import stats

    async def body(client: Any, keys: Namespace) -> int:
        with _progress("reading shards", keys.shards) as advance:
            figures = await stats.collect(client, keys, args.group, advance)
        if args.json:
            sys.stdout.buffer.write(stats.to_json(figures) + b"\n")
        else:
            stats.render(figures, _stdout_console())
        return 0

    return _run("stats", args, body)


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
        "--group", default=os.environ.get("PROCESSOR_GROUP", DEFAULT_GROUP),
        help="consumer group (env PROCESSOR_GROUP, default processor)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON document instead of tables")
    parser.set_defaults(func=_cmd_stats)


# --------------------------------------------------------------------------- tail


def _cmd_tail(args: argparse.Namespace) -> int:
    from processor.tail import Tail, TailError, as_json, line, parse_from

    if args.limit is not None and args.limit < 1:
        return _fail("tail", f"--limit must be at least 1, not {args.limit}", 2)

    async def body(client: Any, keys: Namespace) -> int:
        try:
            start = parse_from(args.start, keys)
        except TailError as exc:
            raise Refused(str(exc)) from None
        tail = Tail(client, keys, start, follow=not args.no_follow, limit=args.limit)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, tail.stop)
        note = _stderr_console()
        if args.json:
            def emit(item: Any) -> None:
                _print_json(as_json(item))
                sys.stdout.flush()
        else:
            out = _stdout_console()

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

    return _run("tail", args, body)


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
    parser.add_argument("--limit", type=int, default=None, help="stop after this many entries")
    parser.add_argument(
        "--no-follow", action="store_true", help="stop once the entries present at start are read"
    )
    parser.add_argument(
        "--width", type=int, default=80, help="characters of content per line (default 80)"
    )
    parser.add_argument("--quiet", action="store_true", help="no notes on stderr")
    parser.set_defaults(func=_cmd_tail)


# --------------------------------------------------------------------------- dlq


def _shard_list(args: argparse.Namespace) -> list[int]:
    if args.shard is None:
        return list(range(args.shards))
    if not 0 <= args.shard < args.shards:
        raise Refused(f"--shard {args.shard} is not one of the {args.shards} shard(s)")
    return [args.shard]


def _cmd_dlq_list(args: argparse.Namespace) -> int:
    from rich.table import Table

    from processor.dlq import clip, listing

    async def body(client: Any, keys: Namespace) -> int:
        shards = _shard_list(args)
        with _progress("reading dead letters", len(shards)) as advance:
            letters = await listing(client, keys, shards, args.limit, args.reason, advance)
        if args.json:
            for letter in letters:
                _print_json(letter.to_json(args.width))
            return 0
        table = Table(title=f"{len(letters)} dead letter(s) of {keys.name}", title_justify="left")
        for name in ("shard", "id", "reason", "source id", "turn", "deliveries", "detail",
                     "payload"):
            table.add_column(name, overflow="fold")
        for d in letters:
            table.add_row(str(d.shard), d.id, d.reason, d.added["source_id"], d.turn(),
                          d.added["deliveries"], clip(d.added["detail"], args.width),
                          clip(d.payload(), args.width))
        _stdout_console().print(table)
        return 0

    return _run("dlq list", args, body)


def _cmd_dlq_show(args: argparse.Namespace) -> int:
    from rich.table import Table

    from processor.dlq import DlqError, find

    async def body(client: Any, keys: Namespace) -> int:
        _shard_list(args)
        try:
            letter = await find(client, keys, args.id, args.shard)
        except DlqError as exc:
            raise Refused(str(exc)) from None
        if args.original:
            _print_json(letter.original_fields())
        elif args.json:
            _print_json(letter.to_json())
        else:
            table = Table(title=f"dead letter {letter.id} of shard {letter.shard}",
                          title_justify="left", show_header=False)
            table.add_column("field", style="bold")
            table.add_column("value", overflow="fold")
            for name, value in letter.added.items():
                table.add_row(name, value)
            for name, value in letter.original_fields().items():
                table.add_row(name, _pretty(value) if name == "update" else value)
            _stdout_console().print(table)
        return 0

    return _run("dlq show", args, body)


def _pretty(value: str) -> str:
    try:
        return json.dumps(json.loads(value), indent=2, ensure_ascii=False)
    except ValueError:
        return value


def _read_fields(path: str) -> list[tuple[str, str]]:
    from processor.dlq import DlqError, fields_from_json

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise Refused(f"cannot read {path}: {exc.strerror}") from None
    try:
        return fields_from_json(text)
    except DlqError as exc:
        raise Refused(f"{path}: {exc}") from None


def _cmd_dlq_replay(args: argparse.Namespace) -> int:
    from processor.dlq import DlqError, find, listing, replay

    if bool(args.ids) == bool(args.all):
        return _fail("dlq replay", "give DLQ entry ids or --all (not both)", 2)
    if args.from_file and len(args.ids) != 1:
        return _fail("dlq replay", "--from-file replays exactly one DLQ entry id", 2)
    try:
        fields = _read_fields(args.from_file) if args.from_file else None
    except Refused as exc:
        return _fail("dlq replay", str(exc), 2)

    async def body(client: Any, keys: Namespace) -> int:
        shards = _shard_list(args)
        if args.all:
            letters = await listing(client, keys, shards, 10**9, args.reason)
        else:
            try:
                letters = [await find(client, keys, i, args.shard) for i in args.ids]
            except DlqError as exc:
                raise Refused(str(exc)) from None
        failed = 0
        with _progress("replaying", len(letters)) as advance:
            for letter in letters:
                try:
                    new_id = await replay(client, keys, letter, fields, force=args.force)
                    print(f"replayed {letter.id} of shard {letter.shard} as {new_id} on "
                          f"{keys.shard(letter.shard).updates}")
                except DlqError as exc:
                    failed += 1
                    print(f"processor dlq replay: {letter.id} of shard {letter.shard}: {exc}",
                          file=sys.stderr)
                advance()
        return 1 if failed else 0

    return _run("dlq replay", args, body)


def _add_dlq(sub: Any, redis_flags: AddFlags) -> None:
    dlq = sub.add_parser(
        "dlq",
        help="list, show and replay dead letters",
        description="Read the dlq streams and put fixed entries back on their input stream.",
    )
    actions = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")

    def action(name: str, help: str, description: str) -> argparse.ArgumentParser:
        parser = actions.add_parser(name, help=help, description=description)
        redis_flags(parser)
        parser.add_argument("--shard", type=int, default=None, help="only this shard")
        return parser

    listed = action("list", "one line per dead letter",
                    "Dead letters, oldest first: shard, DLQ id, reason, source id, turn, "
                    "deliveries, detail and a bounded prefix of the payload.")
    listed.add_argument("--reason", default=None, help="only entries with this reason")
    listed.add_argument("--limit", type=int, default=100, help="per shard (default 100)")
    listed.add_argument("--width", type=int, default=60, help="characters of detail/payload")
    listed.add_argument("--json", action="store_true", help="one JSON line per entry")
    listed.set_defaults(func=_cmd_dlq_list)

    show = action("show", "one dead letter in full",
                  "Every field of one dead letter; --original prints only its original fields "
                  "as a JSON object, ready to fix and replay with --from-file.")
    show.add_argument("id", metavar="ID", help="the DLQ entry id (from dlq list)")
    form = show.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="as one JSON object")
    form.add_argument("--original", action="store_true", help="only the original fields")
    show.set_defaults(func=_cmd_dlq_show)

    again = action("replay", "put dead letters back on their input stream",
                   "Add each entry's original fields (or the fixed fields of --from-file) to "
                   "its shard's updates stream and delete it from the DLQ, atomically. An "
                   "entry that would be dead-lettered again (it does not decode, belongs to "
                   "another shard, or its turn already ended) is refused unless --force.")
    again.add_argument("ids", nargs="*", metavar="ID", help="DLQ entry ids")
    again.add_argument("--all", action="store_true", help="every dead letter (of --reason)")
    again.add_argument("--reason", default=None, help="with --all: only this reason")
    again.add_argument("--from-file", default=None, metavar="FILE",
                       help="a JSON object of fixed fields (- for stdin), for one ID")
    again.add_argument("--force", action="store_true", help="replay without the checks")
    again.set_defaults(func=_cmd_dlq_replay)


def register(sub: Any, redis_flags: AddFlags) -> None:
    """Add ``stats``, ``tail`` and ``dlq`` to the ``processor`` subcommands."""
    redis_flags = _with_tls(redis_flags)
    _add_stats(sub, redis_flags)
    _add_tail(sub, redis_flags)
    _add_dlq(sub, redis_flags)
