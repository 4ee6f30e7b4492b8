"""The shell every operator tool shares: connecting, exit statuses, output.

A tool's body gets a connected client and the namespace's keys; bad
arguments and an unreachable Redis give one line on stderr and exit status 2
(bad arguments) or 1 (Redis); a closed stdout pipe ends the tool with 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from processor.redis_io.options import RedisOptions, redact
from processor.scripts.meta import Mismatch, NamespaceError, NotInitialised, require
from processor.wire.keys import Namespace

AddFlags = Callable[[argparse.ArgumentParser], None]


class Refused(Exception):
    """A one-line reason to stop with exit status 2."""


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def fail(prog: str, message: str, status: int) -> int:
    print(f"processor {prog}: {message}", file=sys.stderr)
    return status


def run_tool(
    prog: str, args: argparse.Namespace, body: Callable[[Any, Namespace], Awaitable[int]]
) -> int:
    """Resolve the options (flags, then environment variables: one line each
    for a bad one, exit 2), connect, read the namespace's record
    (processor.scripts.meta: its shard count, which ``--shards``, if given, must
    match; its group, unless ``--group`` is given), run ``body(client,
    keys)``, close; one line and a status on any failure. ``args`` then
    holds the resolved values."""
    from processor.host import config

    given = config.given(args)

    values, problems = config.resolve(args)
    if not values["redis_url"]:
        problems.append("give --redis-url or set REDIS_URL")
    for problem in problems:
        fail(prog, problem, 2)
    if problems:
        return 2
    # redis-py only now: building the command line, --help and bad options
    # or values never import it (a third of a second of start-up).
    from redis.exceptions import RedisError

    from processor.redis_io.connections import TRANSIENT, connect

    vars(args).update(values)
    url = values["redis_url"]
    options = redis_options(url, args)

    async def main() -> int:
        try:
            client = await connect(options)
        except TRANSIENT as exc:
            return fail(prog, f"cannot reach Redis at {redact(url)}: {exc}", 1)
        except ValueError as exc:  # a URL redis-py cannot read
            return fail(prog, f"bad Redis URL {redact(url)}: {exc}", 2)
        try:
            meta = await require(client, args.namespace,
                                 args.shards if "shards" in given else None,
                                 given.get("shards", ""))
            if "group" not in given:
                args.group = meta.group
            return await body(client, meta.keys)
        finally:
            await client.aclose()

    try:
        return asyncio.run(main())
    except Refused as exc:
        return fail(prog, str(exc), 2)
    except NotInitialised as exc:
        return fail(prog, str(exc), 1)
    except NamespaceError as exc:  # --shards disagrees with the record, or a bad record
        return fail(prog, str(exc), 2 if isinstance(exc, Mismatch) else 1)
    except BrokenPipeError as exc:
        if stdout_closed():  # the reader went away (| head): quietly
            return 0
        return fail(prog, f"Redis at {redact(url)} failed: {exc}", 1)
    except TRANSIENT as exc:
        return fail(prog, f"Redis at {redact(url)} failed: {exc}", 1)
    except RedisError as exc:  # an error reply: NOPERM for a user without the command, ...
        return fail(prog, f"Redis at {redact(url)} refused: {exc}", 1)
    except KeyboardInterrupt:  # before a tool installed its own handler
        return 130


def stdout_closed() -> bool:
    """After a ``BrokenPipeError``: whether it was stdout's reader that went
    away (``| head`` exited). If so, stdout now writes to /dev/null, so that
    nothing still buffered fails again at the interpreter's exit (Python's
    advice, docs.python.org/3/library/signal.html#note-on-sigpipe); a broken
    pipe elsewhere (a socket) is not this and is raised as it was. Not
    SIGPIPE's default action instead: it would also kill a command whose
    Redis connection breaks."""
    import select

    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # replaced (tests) or closed
        return False
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    if not any(events & select.POLLERR for _, events in poll.poll(0)):
        return False
    os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
    return True


def redis_options(url: str, args: argparse.Namespace) -> RedisOptions:
    """The URL plus the TLS files given by the flags ``with_tls`` adds."""
    return RedisOptions(url, args.ssl_ca_certs, args.ssl_certfile, args.ssl_keyfile)


def stdout_console() -> Any:
    """A rich console on stdout that lets ``_run`` handle a closed pipe (exit 0)."""
    from rich.console import Console

    class Stdout(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    return Stdout(highlight=False)


def stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


@contextmanager
def progress(what: str, total: int) -> Iterator[Callable[[], None]]:
    """A transient progress bar on stderr (only on a terminal); yields ``advance()``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    console = stderr_console()
    with Progress(
        TextColumn(what), BarColumn(), MofNCompleteColumn(), console=console, transient=True,
        disable=not console.is_terminal,
    ) as progress:
        task = progress.add_task(what, total=total)
        yield lambda: progress.advance(task)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
