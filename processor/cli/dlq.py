"""``processor dlq list|show|replay``: the command line of ``processor.scripts.dlq``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from processor.host.tool_shell import (
    AddFlags,
    Refused,
    fail,
    positive,
    print_json,
    progress,
    run_tool,
    stdout_console,
)
from processor.wire.keys import Namespace

if TYPE_CHECKING:
    from processor.redis_io.client import RedisClient


def _shard_list(args: argparse.Namespace, keys: Namespace) -> list[int]:
    if args.shard is None:
        return list(range(keys.shards))
    if not 0 <= args.shard < keys.shards:
        raise Refused(f"--shard {args.shard} is not one of the {keys.shards} shard(s)")
    return [args.shard]


def _cmd_dlq_list(args: argparse.Namespace) -> int:
    from processor.cli.tables import Column, print_table
    from processor.scripts.dlq import clip, listing

    async def body(client: RedisClient, keys: Namespace) -> int:
        shards = _shard_list(args, keys)
        with progress("reading dead letters", len(shards)) as advance:
            letters = await listing(client, keys, shards, args.limit, args.reason, advance)
        if args.json:
            for letter in letters:
                print_json(letter.to_json(args.width))
            return 0
        columns = [Column("shard"), Column("id"), Column("reason"), Column("source id"),
                   Column("turn"), Column("deliveries", right=True),
                   Column("detail", wrap=True), Column("payload", wrap=True)]
        rows = [[str(d.shard), d.id, d.reason, d.added["source_id"], d.turn(),
                 d.added["deliveries"], clip(d.added["detail"], args.width),
                 clip(d.payload(), args.width)] for d in letters]
        print_table(stdout_console(), f"{len(letters)} dead letter(s) of {keys.name}", columns,
                    rows)
        return 0

    return run_tool("dlq list", args, body)


def _cmd_dlq_show(args: argparse.Namespace) -> int:
    from rich.table import Table

    from processor.scripts.dlq import DlqError, find

    async def body(client: RedisClient, keys: Namespace) -> int:
        _shard_list(args, keys)
        try:
            letter = await find(client, keys, args.id, args.shard)
        except DlqError as exc:
            raise Refused(str(exc)) from None
        if args.original:
            print_json(letter.original_fields())
        elif args.json:
            print_json(letter.to_json())
        else:
            table = Table(title=f"dead letter {letter.id} of shard {letter.shard}",
                          title_justify="left", show_header=False)
            table.add_column("field", style="bold")
            table.add_column("value", overflow="fold")
            for name, value in letter.added.items():
                table.add_row(name, value)
            for name, value in letter.original_fields().items():
                table.add_row(name, _pretty(value) if name == "update" else value)
            stdout_console().print(table)
        return 0

    return run_tool("dlq show", args, body)


def _pretty(value: str) -> str:
    try:
        return json.dumps(json.loads(value), indent=2, ensure_ascii=False)
    except ValueError:
        return value


def _read_fields(path: str) -> list[tuple[str, str]]:
    from processor.scripts.dlq import DlqError, fields_from_json

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise Refused(f"cannot read {path}: {exc.strerror}") from None
    try:
        return fields_from_json(text)
    except DlqError as exc:
        raise Refused(f"{path}: {exc}") from None


def _cmd_dlq_replay(args: argparse.Namespace) -> int:
    from processor.scripts.dlq import DlqError, find, listing, replay

    if bool(args.ids) == bool(args.all):
        return fail("dlq replay", "give DLQ entry ids or --all (not both)", 2)
    if args.from_file and len(args.ids) != 1:
        return fail("dlq replay", "--from-file replays exactly one DLQ entry id", 2)
    try:
        fields = _read_fields(args.from_file) if args.from_file else None
    except Refused as exc:
        return fail("dlq replay", str(exc), 2)

    async def body(client: RedisClient, keys: Namespace) -> int:
        shards = _shard_list(args, keys)
        if args.all:
            letters = await listing(client, keys, shards, 10**9, args.reason)
        else:
            try:
                letters = [await find(client, keys, i, args.shard) for i in args.ids]
            except DlqError as exc:
                raise Refused(str(exc)) from None
        failed = 0
        with progress("replaying", len(letters)) as advance:
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

    return run_tool("dlq replay", args, body)


def add_dlq(sub: Any, redis_flags: AddFlags) -> None:
    dlq = sub.add_parser(
        "dlq",
        help="list, show and replay dead letters",
        description="Read the dlq streams and put fixed entries back on their input stream.",
    )
    actions = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")

    def action(name: str, help: str, description: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = actions.add_parser(name, help=help,
                                                             description=description)
        redis_flags(parser)
        parser.add_argument("--shard", type=int, default=None, help="only this shard")
        return parser

    listed = action("list", "one line per dead letter",
                    "Dead letters, oldest first: shard, DLQ id, reason, source id, turn, "
                    "deliveries, detail and a bounded prefix of the payload.")
    listed.add_argument("--reason", default=None, help="only entries with this reason")
    listed.add_argument("--limit", type=positive, default=100, help="per shard (default 100)")
    listed.add_argument("--width", type=positive, default=60, help="characters of detail/payload")
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
