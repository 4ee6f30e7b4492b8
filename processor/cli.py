"""The ``processor`` command line (contract section 8)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import msgspec

from processor import __version__


def _cmd_merge(args: argparse.Namespace) -> int:
    from processor.lifecycle import Limits
    from processor.offline import merge_lines

    limits = Limits(turn_timeout=args.turn_timeout)
    if args.file == "-":
        merge = merge_lines(sys.stdin.buffer, limits=limits, progress=args.progress)
    else:
        try:
            with open(args.file, "rb") as handle:
                merge = merge_lines(handle, limits=limits, progress=args.progress)
        except OSError as exc:
            print(f"processor merge: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
            return 2
    out = sys.stdout.buffer
    for result in merge.results():
        out.write(msgspec.json.encode(result) + b"\n")
    for dead in merge.dead:
        sys.stderr.write(json.dumps({"dlq": msgspec.to_builtins(dead)}) + "\n")
    out.flush()
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    from processor.schema import SCHEMAS, document, schema_for

    if args.name and args.name not in SCHEMAS:
        names = ", ".join(SCHEMAS)
        print(f"processor schema: unknown schema {args.name!r} (one of: {names})", file=sys.stderr)
        return 2
    doc = schema_for(args.name) if args.name else document()
    print(json.dumps(doc, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="processor",
        description="Merge streaming AI agent output from Redis Streams into final responses.",
    )
    parser.add_argument("--version", action="version", version=f"processor {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    merge = sub.add_parser(
        "merge",
        help="merge a JSONL file of input entries offline",
        description="Merge a file of input entries (one JSON object per line, file order is "
        "arrival order) and print one JSON line per turn. Entries that cannot be merged are "
        "reported on stderr as {\"dlq\": ...} lines.",
    )
    merge.add_argument("file", help="JSONL file, or - for stdin")
    merge.add_argument("--progress", action="store_true", help="include progress events")
    merge.add_argument(
        "--turn-timeout", type=float, default=300.0, metavar="SECONDS",
        help="reported in the message of turns that end as turn_timeout (default 300)",
    )
    merge.set_defaults(func=_cmd_merge)

    schema = sub.add_parser("schema", help="print the JSON Schemas of inputs and outputs")
    schema.add_argument("name", nargs="?", help="print only this schema (default: all)")
    schema.set_defaults(func=_cmd_schema)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
