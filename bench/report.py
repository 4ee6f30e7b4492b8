"""Rendering ``bench/run.py``'s figures as docs/benchmarks.md sections (the
PNG charts are ``charts``', the profile sections ``profile_sections``', the
memory section ``memory_section``').

Each generated section sits between its own marker comments; writing one
replaces only what is between its markers, so the other sections (the pure
merge's, the cancellation's, hand-written text) stay as they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from latency import Latency, percentile
from live_turns import PACED_DEFAULT, PACED_DRAIN, PACED_HELD, PACED_PEER, Live, per_update_us
from ratios import QUIET_ROW, Round, median_ratios, one_worker, stored_worker
from scenarios import Throughput

DRAIN_TARGET = 0.5
PEER_TARGET = 7.0  # backlog: processor / FastStream (issue 34)
LIVE_TARGET = 0.85  # the default worker with live progress on, over off (issue 28)
LATENCY_TARGET_MS = 20.0
MANY_LIVE_TARGET = 0.3  # many live turns: processor / drain (issue 34)
PACED_TARGET_US = 35.0  # paced long turns: worker + redis-server CPU per update
PACED_CLIFF = 1.1  # paced long turns: default / held throughout, at most
FULL_COMMAND = "python bench/run.py --profile 20000 --pyinstrument 20000"


def write_section(path: Path, name: str, body: str, after: str | None = None) -> None:
    """Put ``body`` between ``<!-- name:start -->`` and ``<!-- name:end -->``.
    A new section goes right after section ``after`` (or the title), else last."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    section = f"{start}\n{body.strip()}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    i, j = text.find(start), text.find(end)
    if i >= 0 and j > i:
        text = text[:i] + section + text[j + len(end):]
    else:
        anchor = f"<!-- {after}:end -->" if after else None
        k = text.find(anchor) if anchor else -1
        if k >= 0:
            k += len(anchor)  # type: ignore[arg-type]
        elif after is None and text.startswith("# "):
            k = text.find("\n") + 1
        if k >= 0:
            text = text[:k] + "\n\n" + section + "\n" + text[k:]
        else:
            text = text.rstrip("\n") + "\n\n" + section + "\n"
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    path.write_text(text)


def verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


# --------------------------------------------------------------------------- sections


def own_mirror_share(t: Throughput) -> str:
    """The share of turns a worker published from its own merge (held or mirror)
    (``processor_turns_settled_total``: ``source="held"``, a held turn, the
    default; ``"mirror"``, a stored turn's mirror kept beside its records), the
    rest (``"replay"``) replayed from the records read back from Redis; "-"
    for the other consumers."""
    mirror = t.settled.get("mirror", 0) + t.settled.get("held", 0)
    replay = t.settled.get("replay", 0)
    return f"{mirror / (mirror + replay):.0%}" if mirror + replay else "-"


def _cpu_per_update(t: Throughput) -> float:
    """Microseconds of CPU (consumers and redis-server) per update."""
    return 1e6 * sum(t.cpu.values()) / t.updates


def _redis_per_update(t: Throughput) -> float:
    """Microseconds of redis-server's CPU per update."""
    return 1e6 * t.cpu.get("redis", 0) / t.updates


def summary(r: dict[str, Any]) -> str:
    """The headline: command, machine, throughput and the two ratios."""
    runs: list[Throughput] = r["throughput"]
    drain = next(t for t in runs if t.name == "drain")
    peer = next((t for t in runs if t.name == "FastStream"), None)
    one = one_worker(runs)
    lines = [
        "## End to end: throughput against the limit and the peer",
        "",
        f"Regenerate every figure and chart on this page with `{r['command']}` "
        f"(from the repository root, after `pip install -e '.[test,bench]'`; about "
        f"{r['minutes']:.0f} minutes). It starts its own redis-server on a free port. "
        "`python bench/run.py --quick` (under a minute, docs untouched) prints the two "
        "ratios, and the same with `--no-hold-turns`, as its last line. The full run, "
        "every default (20,000 turns, a "
        f"1,000,000-update RSS run, the pure-merge and cancellation sections refreshed), is "
        f"`{FULL_COMMAND}`.",
        "",
        f"Measured {r['date']} at commit `{r['commit']}`. {r['load_note']}",
        "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in r["machine"].items()) + ".",
        "",
        f"Workload: {r['turns']:,} turns, {r['updates']:,} updates "
        f"({r['raw_mb']:.0f} MB of fields) plus one `end` entry per turn: the pure-merge "
        "benchmark's turns (2-3 agents per turn handing off, 10-40 updates per turn, text "
        "deltas of 2-20 characters, reasoning, tool calls in argument chunks with their "
        "results, usage and finish reason last; 8 turns in flight, interleaved). Each run "
        "gets the whole stream at once (a server-side `COPY` of a pre-filled stream, its "
        "consumers already up and idle) and is timed on Redis's clock from the `COPY` to "
        "the last output: the last `merged` entry, or the drain's last `XACK`. "
        + ("The rows with shards split the same entries over that many shard streams "
           "the way producers route them (`crc32(response_id) % S`), one `COPY` per "
           "shard, the clock starting at the first; their workers split the shards "
           "between them (shard affinity, docs/operations.md *Scaling*). "
           if any(t.name.endswith(" shards") for t in runs) else "")
        + (f"Every consumer ran in each of {r['repeat']} rounds, one after the other; the "
           "table keeps each one's fastest round (noise only slows a run down)."
           if r.get("repeat", 1) > 1 else ""),
        "",
        "| consumer | updates/s | seconds | CPU s: consumers | CPU s: redis-server "
        "| turns published from the worker's own merge (held or mirror) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for t in runs:
        lines.append(f"| {t.name} | {t.rate:,.0f} | {t.seconds:.2f} | "
                     f"{t.cpu.get('consumers', 0):.1f} | {t.cpu.get('redis', 0):.1f} | "
                     f"{own_mirror_share(t)} |")
    rounds = [Round.of(one_round) for one_round in r.get("rounds", [runs])]
    median = median_ratios(rounds)
    ratio_drain = median["drain"]
    judged = (f", the median of the {len(rounds)} rounds' ratios (*Ratios within each "
              "round*, below)" if len(rounds) > 1 else "")
    lines += [
        "",
        f"- **processor / drain (1 worker): {ratio_drain:.2f}** (target at least "
        f"{DRAIN_TARGET:g}: {verdict(ratio_drain >= DRAIN_TARGET)}){judged}. The worker "
        "holds turns, as by default (docs/design.md, *Held turns*). The drain is "
        "`XREADGROUP COUNT 500` + `XACK` per batch and nothing else (`bench/drain.py`).",
    ]
    if peer is not None:
        ratio_peer = median["peer"]
        lines.append(
            f"- **processor / FastStream (1 worker each): {ratio_peer:.2f}x** (target at "
            f"least {PEER_TARGET:g}x: {verdict(ratio_peer >= PEER_TARGET)}). The peer "
            "(`bench/peer_faststream.py`) is the same job written with FastStream's batch "
            "stream subscriber: consumer group, FastStream's ack after each batch, the "
            "turn's updates kept in a Redis hash (one pipeline per batch), merged with "
            "Agent Framework's `AgentResponse.from_updates` on the turn's `end` and "
            "published to a stream."
        )
    quiet = next((t for t in runs if t.name == QUIET_ROW), None)
    if quiet is not None and "live" in median:
        lines.append(
            f"- **Live progress on / off (1 worker): {median['live']:.2f}** (target at least "
            f"{LIVE_TARGET:g}: {verdict(median['live'] >= LIVE_TARGET)}), median round. The "
            "default worker publishes each running turn's coalesced live events and its "
            "live log once per batch (`publish_live.lua`); the row *no live progress* is "
            f"the same worker with `--no-progress`: {_cpu_per_update(one):.0f} µs of CPU per "
            f"update against {_cpu_per_update(quiet):.0f} µs (redis-server "
            f"{_redis_per_update(one):.0f} µs against {_redis_per_update(quiet):.0f} µs).")
    stored = stored_worker(runs)
    if stored is not None:
        also = f", processor / FastStream {median['stored_peer']:.2f}x" if peer else ""
        lines.append(
            "- **With `--no-hold-turns` (every entry stored in Redis as read): processor / "
            f"drain {median['stored_drain']:.2f}{also}** (1 worker, median round), "
            f"{stored.rate / one.rate:.2f}x the default worker (best rounds), with "
            f"{_cpu_per_update(stored):.0f} µs of CPU per update (consumers + redis-server; "
            f"redis-server {_redis_per_update(stored):.0f} µs) against the default's "
            f"{_cpu_per_update(one):.0f} µs ({_redis_per_update(one):.0f} µs).")
    ceiling = next((t for t in runs if t.name == "in-memory ceiling"), None)
    if ceiling is not None:
        storing = (f", one storing every entry {stored.rate / ceiling.rate:.2f}"
                   if stored is not None else "")
        lines.append(
            f"- **In-memory ceiling: {ceiling.rate / drain.rate:.2f} of the drain**; one worker "
            f"runs at {one.rate / ceiling.rate:.2f} of it{storing}. The ceiling "
            "(`bench/ceiling.py`) decodes and merges every entry on its own with processor's "
            "own code, as a worker storing every entry (`--no-hold-turns`) does, but keeps "
            "the turns in its memory only and writes nothing but the outputs and the acks "
            "(not crash safe, not shareable between consumers): what a design built on that "
            "per-entry decode and merge can reach with one process. Ceiling / drain is the "
            "price of decoding and merging each entry in Python; storing worker / ceiling "
            "the price of keeping every turn's state in Redis as well. The default worker, "
            "holding turns, is not bound by the ceiling: it decodes a turn's plain updates "
            "together and takes a batch a run of them at a time (docs/design.md, *Held "
            "turns*).")
    cpu = {t.name: sum(t.cpu.values()) / t.updates for t in runs if t.cpu}
    if peer is not None and all(n in cpu for n in (one.name, drain.name, peer.name)):
        lines.append(
            f"- Counted in CPU time instead (consumers + redis-server, less sensitive to "
            f"other load on the machine): {1e6 * cpu[one.name]:.0f} µs per update for one "
            f"worker (the default), {1e6 * cpu[drain.name]:.0f} µs for the drain, "
            f"{1e6 * cpu[peer.name]:.0f} µs for FastStream: processor / drain "
            f"{cpu[drain.name] / cpu[one.name]:.2f}, processor / FastStream "
            f"{cpu[peer.name] / cpu[one.name]:.2f}x.")
    if len(rounds) > 1:
        lines += ["", *_rounds_table(rounds)]
    lines += ["", "![throughput](bench-throughput.png)"]
    return "\n".join(lines)


def _rounds_table(rounds: list[Round]) -> list[str]:
    """Every round's rates and ratios (ratios.py says why the targets use them)."""
    stored = rounds[0].stored is not None
    lines = ["### Ratios within each round", "",
             "Each round ran every consumer one after the other within minutes; a ratio of "
             "one round compares the same minute of the machine, where the table above "
             "takes each consumer's fastest round, whichever minute it was. The targets "
             "are judged on the median of these ratios.", "",
             "| round | drain | 1 worker | / drain | / FastStream"
             + (" | stored turns | / drain | / FastStream |" if stored else " |"),
             "|---:|---:|---:|---:|---:" + ("|---:|---:|---:|" if stored else "|")]
    for i, one in enumerate(rounds, 1):
        found = one.ratios()
        row = (f"| {i} | {one.drain:,.0f} | {one.one:,.0f} | {found['drain']:.2f} | "
               f"{_times(found.get('peer'))} |")
        if one.stored is not None:
            row += (f" {one.stored:,.0f} | {found['stored_drain']:.2f} | "
                    f"{_times(found.get('stored_peer'))} |")
        lines.append(row)
    return lines


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def latency_section(lat: Latency, r: dict[str, Any]) -> str:
    p50, p99, p999 = (percentile(lat.samples, q) for q in (50, 99, 99.9))
    pace = ("set with `--latency-rate`" if r.get("latency_rate_set")
            else "half the 1-worker throughput above")
    rounds = r.get("latency_rounds", [lat])
    rows = [
        f"| {i + 1}{' (median)' if one is lat else ''} | "
        + " | ".join(f"{percentile(one.samples, q):.1f} ms" for q in (50, 99, 99.9))
        + f" | {max(one.samples):.1f} ms | {one.achieved:,.0f} |"
        for i, one in enumerate(rounds)
    ]
    return "\n".join([
        "## Latency at half the measured throughput",
        "",
        f"One worker (the default: holding turns), a producer pacing {lat.rate:,.0f} "
        f"updates/s ({pace}; it kept up "
        f"{lat.achieved:,.0f}/s) over {r['latency_turns']:,} "
        f"turns; time from sending a turn's `end` entry (XADD) to reading its `merged` "
        f"entry (XREAD BLOCK), both clocks in the harness process; {len(lat.samples):,} "
        "turns after the first 100. The producer writes XADD commands encoded before the "
        "clock starts, on a connection of its own, so that it takes as little as it can "
        "of the two cores the worker and redis-server run on. "
        f"{len(rounds)} rounds, one after the other, each with a new worker; the "
        "target is judged on the round of median p99 (one round can meet a busy moment "
        "of the machine, and the best round would flatter), whose distribution the chart "
        "shows.",
        "",
        "| round | p50 | p99 | p99.9 | max | updates/s kept up |",
        "|---|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"Target p99 under {LATENCY_TARGET_MS:g} ms: {verdict(p99 < LATENCY_TARGET_MS)} "
        f"(p50 {p50:.1f} ms, p99 {p99:.1f} ms, p99.9 {p999:.1f} ms in the median round).",
        *_stored_latency(r),
        "",
        "![latency](bench-latency.png)",
    ])


def _stored_latency(r: dict[str, Any]) -> list[str]:
    """The worker storing every entry (``--no-hold-turns``), if run: the same pace."""
    lat = r.get("latency_stored")
    if lat is None:
        return []
    return ["", "With `--no-hold-turns` (every entry stored in Redis as read), the same pace "
                f"(it kept up {lat.achieved:,.0f}/s) and rounds: "
                f"{_median_round(lat, r['latency_stored_rounds'])}."]


def _median_round(lat: Latency, rounds: list[Latency]) -> str:
    """The percentiles of the median round, and every round's p99."""
    p50, p99, p999 = (percentile(lat.samples, q) for q in (50, 99, 99.9))
    each = ", ".join(f"{percentile(one.samples, 99):.1f} ms" for one in rounds)
    return (f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, p99.9 {p999:.1f} ms in the median round "
            f"(p99 of each round: {each})")


# --------------------------------------------------------------------------- headline


def live_line(live: Live) -> str:
    """``bench/run.py``'s last lines for the two workloads of real turns."""
    peer = f", processor/FastStream {live.peer_ratio:.2f}x" if live.peer_ratio else ""
    default, held = live.paced_us(PACED_DEFAULT), live.paced_us(PACED_HELD)
    drain, fast = live.paced_us(PACED_DRAIN), live.paced_peer_us
    paced_peer = f", FastStream {fast:.1f} us ({fast / default:.2f}x)" if fast else ""
    return (f"many live turns: ratio processor/drain {live.ratio:.2f} (target >= "
            f"{MANY_LIVE_TARGET:g}){peer}; paced long turns: worker + redis CPU "
            f"{default:.1f} us/update (target <= {PACED_TARGET_US:g}), held throughout "
            f"{held:.1f} us, default/held {default / held:.2f} (target <= {PACED_CLIFF:g}), "
            f"drain {drain:.1f} us ({drain / default:.2f} of it){paced_peer}")


def _row(name: str, t: Throughput, drain: Throughput, ratio: str, peer: str,
         target: str) -> str:
    w, r = per_update_us(t)
    dw, dr = per_update_us(drain)
    return (f"| {name} | {t.rate:,.0f} | {t.seconds:.1f} | {ratio} | {peer} | {w:.1f} | "
            f"{r:.1f} | {w + r:.1f} | {dw + dr:.1f} | {target} |")


def headline(r: dict[str, Any]) -> str:
    """The three workloads side by side: the backlog of whole turns, many live
    turns, paced long turns; wall time and CPU time, each with the raw drain
    of the same input in the same run."""
    live: Live = r["live"]
    runs: list[Throughput] = r["throughput"]
    drain = next(t for t in runs if t.name == "drain")
    one = one_worker(runs)
    median = median_ratios([Round.of(x) for x in r.get("rounds", [runs])])
    backlog_ok = median["drain"] >= DRAIN_TARGET and median.get("peer", 0) >= 7
    many = max(live.rounds, key=lambda one_round: one_round[1].rate)
    many_peer = live.peer_ratio
    paced = {t.name: t for t in live.paced}
    default_us, held_us = live.paced_us(PACED_DEFAULT), live.paced_us(PACED_HELD)
    drain_us, fast_us = live.paced_us(PACED_DRAIN), live.paced_peer_us
    lines = [
        "## Headline: three workloads",
        "",
        f"From `{r['command']}` ({r['date']}, commit `{r['commit']}`). {r['load_note']} "
        "`python bench/run.py --quick` prints the same ratios as its last lines (30 updates "
        "per live turn, paced turns of 10 s). One worker, one shard, default settings (live "
        "progress "
        "on), each beside the raw drain (`XREADGROUP COUNT 500` + `XACK`) of the same "
        "input in the same run. CPU is per update, in µs: the consumer process's and "
        "redis-server's, less sensitive than wall time to the machine's other load.",
        "",
        "- **Backlog**: the whole-turn stream below (*End to end*), all at once: a read "
        "batch holds many updates of each of 8 turns in flight.",
        f"- **Many live turns**: {live.turns:,} turns x {live.updates} text updates, "
        "round-robin (update i of every turn before update i+1 of any), all at once: a "
        "read batch holds about one update of each of many turns.",
        f"- **Paced long turns**: {live.pace.turns:,} turns at once, each one update per "
        f"{live.pace.period * 1000:g} ms for {live.pace.seconds:g} s "
        f"({live.pace.turns / live.pace.period:,.0f} updates/s offered by a producer), so "
        "every turn outlives `--hold-ms` (5 s); the rate is the producer's, the CPU is "
        "what counts, so its ratios are of CPU per update (the drain's, FastStream's, "
        "over the default worker's). `--hold-ms 60000` holds the turns throughout: the "
        "default should cost no more (no cliff at `--hold-ms`).",
        "",
        "| workload | updates/s | seconds | / drain | / FastStream | worker µs | "
        "redis µs | together µs | drain's µs | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        _row("backlog", one, drain, f"{median['drain']:.2f}",
             _times(median.get("peer")),
             f">= {DRAIN_TARGET:g} of the drain and >= 7x FastStream: "
             f"{verdict(backlog_ok)}"),
        _row("many live turns", many[1], many[0], f"{live.ratio:.2f}", _times(many_peer),
             f">= {MANY_LIVE_TARGET:g} of the drain: {verdict(live.ratio >= MANY_LIVE_TARGET)}"),
        _row("paced long turns, default", paced[PACED_DEFAULT], paced[PACED_DRAIN],
             f"{drain_us / default_us:.2f} (CPU)",
             f"{fast_us / default_us:.2f}x (CPU)" if fast_us else "-",
             f"together <= {PACED_TARGET_US:g} µs: {verdict(default_us <= PACED_TARGET_US)}; "
             f"<= {PACED_CLIFF:g}x held throughout ({default_us / held_us:.2f}x): "
             f"{verdict(default_us <= PACED_CLIFF * held_us)}"),
        _row("paced long turns, `--hold-ms 60000`", paced[PACED_HELD], paced[PACED_DRAIN],
             "-", "-", "-"),
        *([_row("paced long turns, FastStream", paced[PACED_PEER], paced[PACED_DRAIN],
                "-", "-", "-")] if fast_us else []),
        "",
        "The ratios of the backlog and of the many live turns are the median of "
        f"{len(live.rounds)} rounds' (each round ran the drain, the worker and FastStream "
        "one after the other); the other columns are the fastest round's.",
    ]
    return "\n".join(lines)
