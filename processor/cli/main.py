"""The ``processor`` command line (docs/contract.md §8)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence

import msgspec

from processor import __version__, stopping


def _cmd_merge(args: argparse.Namespace) -> int:
    from processor.engine.lifecycle import Limits
    from processor.engine.offline import merge_lines

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
    from processor.wire.schema import SCHEMAS, document, schema_for

    if args.name and args.name not in SCHEMAS:
        names = ", ".join(SCHEMAS)
        print(f"processor schema: unknown schema {args.name!r} (one of: {names})", file=sys.stderr)
        return 2
    doc = schema_for(args.name) if args.name else document()
    print(json.dumps(doc, indent=2))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from processor import logs
    from processor.host import config

    values, problems = config.resolve(args)
    for problem in problems:
        print(f"processor run: {problem}", file=sys.stderr)
    if problems:
        return 2
    logs.setup(values["log_level"], fmt=values["log_format"])
    from processor.host.run import run_worker

    return asyncio.run(run_worker(values, config.given(args)))


def _cmd_serve(args: argparse.Namespace) -> int:
    from processor.serve import config

    values, problems = config.resolve(args)
    for problem in problems:
        print(f"processor serve: {problem}", file=sys.stderr)
    if values is None:
        return 2
    from processor.serve.run import main as serve

    return serve(values)


def _cmd_token(args: argparse.Namespace) -> int:
    import time

    from processor.serve.tokens import MIN_SECRET_LENGTH, issue

    secret = args.secret or os.environ.get("PROCESSOR_TOKEN_SECRET")
    problems = []
    if not secret:
        problems.append("give --secret or set PROCESSOR_TOKEN_SECRET (the server's secret)")
    elif len(secret) < MIN_SECRET_LENGTH:
        problems.append(f"the secret must be at least {MIN_SECRET_LENGTH} characters")
    if args.ttl < 1:
        problems.append(f"--ttl must be at least 1, got {args.ttl}")
    for problem in problems:
        print(f"processor token: {problem}", file=sys.stderr)
    if problems or not secret:
        return 2
    print(issue(secret, args.response_id, int(time.time()) + args.ttl))
    return 0


def _cmd_init(args: argparse.Namespace) -> int:
    from processor import logs
    from processor.host import config

    values, problems = config.resolve(args)
    if not values["redis_url"]:
        problems.append("give --redis-url or set REDIS_URL (init never starts an embedded Redis)")
    for problem in problems:
        print(f"processor init: {problem}", file=sys.stderr)
    if problems:
        return 2
    from processor.host.run import init_groups

    logs.setup(values["log_level"], fmt=values["log_format"])
    return asyncio.run(init_groups(values, config.given(args), args.reshard))


def _cmd_cancel(args: argparse.Namespace) -> int:
    from processor.host.run import cancel

    return cancel(args)


def _redis_flags(parser: argparse.ArgumentParser) -> None:
    """The options every tool takes: --redis-url, --namespace, --shards and the TLS files."""
    from processor.host.config import TOOL_OPTIONS, add_options

    add_options(parser, TOOL_OPTIONS)


class CommandParser(argparse.ArgumentParser):
    """The parser of a command (``processor run``, ``processor dlq list``):
    an argument it does not know is its error, with its usage, not the
    top-level ``usage: processor [-h] ...`` argparse gives by default (a
    command's leftovers go up to the top-level parser, which reports them
    with its own usage). A mistyped option names the one it resembles."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._did_you_mean(extras)}")
        return parsed, extras

    def _did_you_mean(self, extras: Sequence[str]) -> str:
        import difflib

        known = [flag for action in self._actions for flag in action.option_strings]
        for extra in extras:
            if extra.startswith("--"):
                close = difflib.get_close_matches(extra.partition("=")[0], known, n=1)
                if close:
                    return f" (did you mean {close[0]}?)"
        return ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="processor",
        description="Merge streaming AI agent output from Redis Streams into final responses.",
    )
    parser.add_argument("--version", action="version", version=f"processor {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=CommandParser)

    merge = sub.add_parser(
        "merge",
        help="merge a JSONL file of input entries offline",
        description="Merge a file of input entries (one JSON object per line, file order is "
        "arrival order) and print one JSON line per turn. Entries that cannot be merged are "
        'reported on stderr as {"dlq": ...} lines.',
    )
    merge.add_argument("file", help="JSONL file, or - for stdin")
    merge.add_argument("--progress", action="store_true", help="include progress events")
    merge.add_argument(
        "--turn-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="reported in the message of turns that end as turn_timeout (default 300)",
    )
    merge.set_defaults(func=_cmd_merge)

    run = sub.add_parser(
        "run",
        help="run one worker",
        description="Run one worker: consume every shard's updates stream with a consumer "
        "group and publish merged responses, events and dead letters. Every option can also "
        "be set with the environment variable named in its help. SIGTERM or SIGINT drains "
        "(stop reading, finish and ack what was read) and exits 0.",
    )
    from processor.host.config import add_options

    add_options(run)
    run.set_defaults(func=_cmd_run)

    init = sub.add_parser(
        "init",
        help="write the namespace's record, create every shard's consumer group and load "
        "the producers' functions (idempotent), then exit",
        description="Write the namespace's record (its shard count, group and epoch, "
        "{ns:0}:meta) if there is none, create the updates stream and consumer group of every "
        "shard if missing, and load the producers' Redis Function library (Redis 7+), as a "
        "worker does at start, and exit 0. Run it before autoscalers read the groups "
        "(e.g. a Kubernetes Job before KEDA polls). An unreachable Redis is retried for "
        "--connect-timeout seconds, then it exits 1.",
    )
    from processor.host.config import INIT_OPTIONS

    add_options(init, INIT_OPTIONS)
    init.add_argument(
        "--reshard", action="store_true",
        help="change the namespace's shard count to --shards; refused unless every shard "
        "is drained (no entries, nothing pending, no active or closing turn) and no worker "
        "is live (docs/cluster.md)")
    init.set_defaults(func=_cmd_init)

    from processor.wire.cancels import DEFAULT_REASON, DEFAULT_TTL, MAX_TTL

    cancel = sub.add_parser(
        "cancel",
        help="cancel a turn (sets its cancellation key)",
        description="Set {ns:s}:cancel:<RESPONSE_ID> with a TTL (the cancel_turn Redis "
        "Function: a cancel already set keeps its reason, and its TTL if longer): cancels "
        "every attempt of the ResponseId, including turns not started yet. A user that may not "
        "set cancel keys (the serve and producer ACL users) asks the workers and waits for the "
        "key. A turn (without attempt id) that has already ended, within the workers' "
        "--done-ttl, is left alone: it says so and exits 0.",
    )
    cancel.add_argument("response_id", metavar="RESPONSE_ID")
    cancel.add_argument("--reason", default=DEFAULT_REASON,
                        help="stored as the key's value: 1 to 1024 bytes (the turn's "
                        "cancel_reason)")
    cancel.add_argument(
        "--ttl", type=int, default=DEFAULT_TTL,
        help=f"seconds the key lives (default {DEFAULT_TTL}, at most {MAX_TTL})"
    )
    cancel.add_argument(
        "--turn-id",
        default=None,
        help="route by this turn_id (for turns whose ResponseId the processor assigned)",
    )
    _redis_flags(cancel)
    cancel.set_defaults(func=_cmd_cancel)

    serve = sub.add_parser(
        "serve",
        help="serve turns to UIs over HTTP (server-sent events, a page to watch a turn)",
        description="Serve each turn's events as server-sent events, its outcome, its "
        "cancellation and a page that watches it, read from what the workers write to "
        "Redis (docs/serve.md). Stateless: run as many replicas as you like. Every "
        "request for a turn needs a token for it (processor token) unless --no-auth. "
        "Every option can also be set with the environment variable named in its help.",
    )
    from processor.serve.config import add_options as add_serve_options

    add_serve_options(serve)
    serve.set_defaults(func=_cmd_serve)

    token = sub.add_parser(
        "token",
        help="print a token that lets its bearer read one turn from processor serve",
        description="Print (on its last line) a token for RESPONSE_ID, signed with the "
        "server's --token-secret, valid for --ttl seconds: for backends and tests.",
    )
    token.add_argument("response_id", metavar="RESPONSE_ID")
    token.add_argument("--secret", default=None,
                       help="the server's token secret (env PROCESSOR_TOKEN_SECRET)")
    token.add_argument("--ttl", type=int, default=3600,
                       help="seconds the token is valid (default 3600)")
    token.set_defaults(func=_cmd_token)

    demo = sub.add_parser(
        "demo",
        help="run two workers and a simulated producer on an embedded Redis",
        description="Start a private redis-server, two workers, processor serve and a "
        "producer streaming a multi-agent handoff with a tool call (its watch page's URL "
        "printed first, to see it live), a cancelled turn and a failing turn; print the "
        "merged responses and events.",
    )
    _demo_options(demo)
    demo.set_defaults(func=lambda args: __import__("processor.cli.demo").cli.demo.main(args))

    from processor.wire.schema import SCHEMAS

    schema = sub.add_parser("schema", help="print the JSON Schemas of inputs and outputs",
                            description="Print the JSON Schema (2020-12) of every input and "
                            "output of the wire contract, or of one: " + ", ".join(SCHEMAS))
    schema.add_argument("name", nargs="?", metavar="NAME",
                        help="print only this schema: " + ", ".join(SCHEMAS) + " (default: all)")
    schema.set_defaults(func=_cmd_schema)

    from processor.cli.tools import register as register_tools

    register_tools(sub, _redis_flags)  # stats, tail, capture, dlq
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status. A closed stdout (``processor schema
    | head``: the reader exited) ends any command quietly with 0, as it
    does ``cat`` or ``grep`` (``stdout_closed``)."""
    from processor.host.tool_shell import stdout_closed

    try:
        return _main(argv)
    except BrokenPipeError:
        if not stdout_closed():
            raise
        return 0


def _main(argv: Sequence[str] | None) -> int:
    # Before anything slow: a SIGTERM during start-up must not kill a worker
    # (see processor/stopping.py). Other commands get the usual handling back.
    stopping.catch_early()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except BaseException:  # --help, a usage error
        stopping.release()
        raise
    if getattr(args, "func", None) not in (_cmd_run, _cmd_serve):
        stopping.release()
    status = int(args.func(args) or 0)
    sys.stdout.flush()  # what is still buffered fails here, not at the interpreter's exit
    return status


def _demo_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=0,
                        help="port of the processor serve the demo starts (default 0: any "
                        "free port; the page's URL names it)")
    parser.add_argument("--pace", type=float, default=0.5,
                        help="seconds between the handoff's updates (default 0.5), so the "
                        "page shows it streaming")
    parser.add_argument("--linger", type=float, default=None, metavar="SECONDS",
                        help="seconds to keep serving the pages after the turns end "
                        "(default: until Ctrl-C when stdout is a terminal, else 0: exit "
                        "once the turns are printed)")
    parser.add_argument("--redis-url", default=None,
                        help="use this Redis instead of an embedded one (namespace 'demo')")
    parser.add_argument("--serve-url", default=None,
                        help="a processor serve already running on that Redis and namespace "
                        "'demo' (its secret: --token-secret or PROCESSOR_TOKEN_SECRET); "
                        "the demo then starts none")
    parser.add_argument("--token-secret", default=None,
                        help="the --serve-url server's token secret")



if __name__ == "__main__":
    sys.exit(main())
