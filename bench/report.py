"""Markdown from a benchmark's results.json: the tables `bench.run` prints and writes to table.md, and
the sections of docs/benchmarks.md that ``python -m tools.sync_chart`` regenerates from the committed
results (so the document never carries numbers its own run did not produce).

Standard library only: the docs check runs without the benchmark's dependencies.
"""
from __future__ import annotations

import statistics

# The targets the server is held to; docs/benchmarks.md reports each against the latest run.
MIN_SERVER_OVER_ENGINE = 0.9  # at concurrency >= 16
MIN_BATCHED_OVER_UNBATCHED = 3.0  # at concurrency 32
P50_OVERHEAD_MS, P50_OVERHEAD_FRACTION = 2.0, 0.05  # at concurrency 1, against the engine alone
MAX_TTFA_RATIO_WHILE_REGISTERING = 1.2  # streams' TTFA while voices are registered, over an idle run


def table(res: dict) -> str:
    peers = [k for k in res["peers"]["kinds"] if k not in res["peers"]["unavailable"]]
    lines = ["| concurrency | engine req/s | server req/s | server ÷ engine | unbatched req/s | batched ÷ unbatched "
             "| p50 ms engine / server | p99 ms server / unbatched | TTFA p50 ms server | RTF server |"
             + "".join(f" {k} req/s (p99 ms) |" for k in peers),
             "|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(peers)]
    for c, row in res["closed_loop"].items():
        e, s, u = row["engine"], row["server"], row["server_unbatched"]
        cells = "".join(f" {row[k]['rps']:.1f} ({row[k]['p99_ms']:.0f}) |" if "rps" in row.get(k, {}) else " n/a |" for k in peers)
        lines.append(
            f"| {c} | {e['rps']:.1f} | {s['rps']:.1f} | {s['rps'] / e['rps']:.2f} | {u['rps']:.1f} | {s['rps'] / u['rps']:.2f} "
            f"| {e['p50_ms']:.1f} / {s['p50_ms']:.1f} | {s['p99_ms']:.0f} / {u['p99_ms']:.0f} | {s['ttfa_p50_ms']:.1f} | {s['rtf']:.3f} |" + cells)
    for k, why in res["peers"]["unavailable"].items():
        lines.append(f"\n{k} could not run here: {why}")
    if res["open_loop"]:
        lines += ["", "| Poisson rate (req/s) | served req/s | p50 ms | p99 ms | TTFA p95 ms | codes |", "|---|---|---|---|---|---|"]
        for rate, s in res["open_loop"].items():
            lines.append(f"| {rate} | {s.get('rps', 0):.1f} | {s.get('p50_ms', 0):.0f} | {s.get('p99_ms', 0):.0f} "
                         f"| {s.get('ttfa_p95_ms') or 0:.0f} | {_codes(s['codes'])} |")
    return "\n".join(lines) + "\n"


def _codes(codes: dict) -> str:
    """HTTP status counts, e.g. ``200 × 36, 429 × 2``."""
    return ", ".join(f"{code} × {n}" for code, n in sorted(codes.items()))


def run_line(res: dict) -> str:
    return (f"Run on {res['date']} on {res['machine']}; device `{res['device']}`, max batch size "
            f"{res['max_batch_size']}, max queue delay {res['max_queue_delay_ms']:g} ms, "
            f"{'streamed' if res['stream'] else 'whole'} WAV responses, {res['duration_s']:g} s measured per point, "
            f"text \"{res['text']}\":\n\n```sh\n{res['command']}\n```\n")


def _ratio(row: dict, a: str, b: str) -> float | None:
    if "rps" not in row.get(a, {}) or "rps" not in row.get(b, {}):
        return None
    return row[a]["rps"] / row[b]["rps"]


def targets(res: dict) -> str:
    """The targets table: each target, what this run measured, and whether it is met."""
    rows = {int(c): r for c, r in res["closed_loop"].items()}
    lines = ["| target | this run | met? |", "|---|---|---|"]

    high = {c: _ratio(r, "server", "engine") for c, r in rows.items() if c >= 16}
    high = {c: v for c, v in high.items() if v is not None}
    if high:
        ok = all(v >= MIN_SERVER_OVER_ENGINE for v in high.values())
        lines.append(f"| server ≥ {MIN_SERVER_OVER_ENGINE:g} × engine limit at concurrency ≥ 16 | "
                     + ", ".join(f"{v:.2f} (c={c})" for c, v in sorted(high.items()))
                     + f" | {'yes' if ok else '**no**'} |")

    batched = {c: _ratio(r, "server", "server_unbatched") for c, r in rows.items() if c >= 16}
    batched = {c: v for c, v in batched.items() if v is not None}
    if 32 in batched:
        ok = batched[32] >= MIN_BATCHED_OVER_UNBATCHED
        lines.append(f"| batched ≥ {MIN_BATCHED_OVER_UNBATCHED:g} × unbatched at concurrency 32 | "
                     + ", ".join(f"{v:.2f} × (c={c})" for c, v in sorted(batched.items()))
                     + f" | {'yes' if ok else '**no**'} |")

    one = rows.get(1)
    if one and "p50_ms" in one.get("engine", {}) and "p50_ms" in one.get("server", {}):
        e, s = one["engine"]["p50_ms"], one["server"]["p50_ms"]
        ok = s - e <= max(P50_OVERHEAD_MS, P50_OVERHEAD_FRACTION * e)
        lines.append(f"| p50 at concurrency 1 within {P50_OVERHEAD_MS:g} ms or {P50_OVERHEAD_FRACTION:.0%} of the "
                     f"engine alone | {s:.1f} vs {e:.1f} ms: +{s - e:.1f} ms, {(s - e) / e:+.1%} | "
                     f"{'yes' if ok else '**no**'} |")

    peers = [k for k in res["peers"]["kinds"] if k not in res["peers"]["unavailable"]]
    if peers:
        wins, points, ratios = 0, 0, []
        for r in rows.values():
            for k in peers:
                if "rps" in r.get(k, {}) and "rps" in r.get("server", {}):
                    points += 1
                    ratios.append(r["server"]["rps"] / r[k]["rps"])
                    wins += r["server"]["rps"] >= r[k]["rps"] and r["server"]["p99_ms"] <= r[k]["p99_ms"]
        if points:
            lines.append(f"| at least the peers' throughput at equal or better p99 | {wins} of {points} "
                         f"(concurrency, peer) points; throughput {min(ratios):.1f}–{max(ratios):.1f} × the peers' | "
                         f"{'yes' if wins == points else '**no**'} |")
    return "\n".join(lines) + "\n"


def voices_table(res: dict) -> str:
    """bench.voices: the streams' time to first audio while voices are registered, against idle windows."""
    idle, busy, reg = res["phases"]["idle"], res["phases"]["registering"], res["registrations"]
    p50, p95 = busy["ttfa_p50_ms"] / idle["ttfa_p50_ms"], busy["ttfa_p95_ms"] / idle["ttfa_p95_ms"]
    ok = max(p50, p95) <= MAX_TTFA_RATIO_WHILE_REGISTERING
    load = res.get("load_avg_1m")
    lines = [f"Run on {res['date']} on {res['machine']}; device `{res['device']}`, {res['streams']} streams, "
             f"{res['voices']} voices from {res['clip_s']:g} s clips per registering window, {res['rounds']} rounds"
             + (f", about {res['duration_s'] / 60:.0f} min" if "duration_s" in res else "")
             + (f"; 1-minute load average {load[0]:.1f} before, {load[1]:.1f} after" if load else "") + ":\n",
             f"```sh\n{res['command']}\n```\n",
             "| window | seconds | requests (errors) | TTFA p50 ms | TTFA p95 ms | TTFA mean ms |",
             "|---|---|---|---|---|---|"]
    for name, ph in (("idle", idle), ("registering", busy)):
        lines.append(f"| {name} | {ph['window_s']:.0f} | {ph['requests']} ({ph['errors']}) | {ph['ttfa_p50_ms']:.0f} "
                     f"| {ph['ttfa_p95_ms']:.0f} | {ph['ttfa_mean_ms']:.0f} |")
    rounds = res.get("p50_ratio_per_round") or []
    if rounds:
        lines += ["", "TTFA p50 while registering ÷ in the idle window paired with it, per round: "
                  + ", ".join(f"{r:.2f}" for r in rounds) + f" (median {statistics.median(rounds):.2f})."]
    if "p50_ratio_interval_90" in res:
        lo, hi = res["p50_ratio_interval_90"]
        lines += ["", f"Pooled p50 ratio, 90 % bootstrap interval over the rounds: {lo:.2f}–{hi:.2f}."]
    lines += ["", f"Registrations: {reg['ok']} of {reg['count']} stored (HTTP {', '.join(map(str, reg['codes']))}; "
              f"{reg['retries_on_429']} retries after 429), {reg['p50_s']:.2f} s median, {reg['max_s']:.2f} s at most.", "",
              "| target | this run | met? |", "|---|---|---|",
              f"| streams' TTFA while registering ≤ {MAX_TTFA_RATIO_WHILE_REGISTERING:g} × idle | p50 {p50:.2f} ×, "
              f"p95 {p95:.2f} × | {'yes' if ok else '**no**'} |"]
    return "\n".join(lines) + "\n"


# The streamed-text benchmark (bench/bistream.py): its done-when, held against its latest run.
BISTREAM_SESSIONS, BISTREAM_RATE = 32, 25.0  # sessions, LLM tokens/s: the first conversation plays without underrun


def bistream_section(res: dict) -> str:
    """docs/benchmarks.md's streamed-text section from bench/bistream.py's bistream.json."""
    lines = [f"Run on {res['date']} on {res['machine']}; device `{res['device']}`, max batch size "
             f"{res['max_batch_size']}, {res['rate']:g} LLM tokens/s ({res['tokens']} tokens), turns started for "
             f"{res['duration_s']:g} s per point, {res['pause_s']:g} s of user speech between turns, "
             f"{res['device_buffer_ms']:g} ms device buffer, reply \"{res['text']}\":", "",
             f"```sh\n{res['command']}\n```", "",
             "| conversations | path | turns (errors) | text-to-first-audio p50 / p95 ms | turns with an underrun "
             "| underruns, seconds stalled | first conversation: TTFA ms, underruns |",
             "|---|---|---|---|---|---|---|"]
    for n, modes in res["points"].items():
        for mode, label in (("stream", "WebSocket, streamed text"), ("http", "HTTP, whole text")):
            s = modes[mode]
            ok = s["turns"] - s["errors"]
            first = s["first_turn"] or {}
            lines.append(f"| {n} | {label} | {s['turns']} ({s['errors']}) | {s['ttfa_p50_ms']} / {s['ttfa_p95_ms']} "
                         f"| {s['turns_with_underrun']} of {ok} | {s['underruns']}, {s['stalled_s']:g} s "
                         f"| {first.get('ttfa_ms')}, {first.get('underruns')} |")
    lines += ["", "| target | this run | met? |", "|---|---|---|"]
    point = res["points"].get(str(BISTREAM_SESSIONS), {}).get("stream")
    if point and res["rate"] == BISTREAM_RATE:
        first = point["first_turn"] or {}
        ok = first.get("error") is None and first.get("underruns") == 0
        lines.append(f"| {BISTREAM_SESSIONS} concurrent sessions at {BISTREAM_RATE:g} tokens/s: the first conversation "
                     f"plays without an underrun | TTFA {first.get('ttfa_ms')} ms, {first.get('underruns')} underruns "
                     f"| {'yes' if ok else '**no**'} |")
        every = point["turns_with_underrun"] == 0 and point["errors"] == 0
        lines.append(f"| … and so does every turn of every conversation | {point['turns_with_underrun']} of "
                     f"{point['turns'] - point['errors']} turns with an underrun, {point['errors']} errors "
                     f"| {'yes' if every else '**no**'} |")
    else:
        lines.append(f"| {BISTREAM_SESSIONS} sessions at {BISTREAM_RATE:g} tokens/s | not measured in this run | **no** |")
    return "\n".join(lines) + "\n"


MAX_HIT_OVER_MISS = 1 / 3  # a pod starting on a node whose cache holds the model, over the first pod there

STARTUP_ROWS = (  # (phase key, label); fetch step first, then the server's
    ("download", "download (SHA-256 checked on the way)"), ("unpack", "unpack"),
    ("cache_fill", "cache fill (files hashed, entry renamed in)"), ("cache_verify", "cache check (files re-hashed)"),
    ("fetch_s", "**fetch step**"),
    ("session_llm", "session: LLM"), ("session_flow_encoder", "session: flow encoder"),
    ("session_flow_estimator", "session: flow estimator"), ("session_vocoder", "session: vocoder (HiFT)"),
    ("sessions", "sessions, wall"), ("voices", "voices"), ("text_workers", "text workers"), ("warmup", "warm-up"),
    ("healthz_s", "server: process up (/healthz)"), ("ready_s", "**server: ready (/readyz)**"),
    ("total_to_ready_s", "**pod start to ready** (fetch + server)"), ("first_request_s", "first request after ready"),
    ("second_request_s", "the same request again"),
)


def startup_section(res: dict) -> str:
    """bench.startup --fetch: each measurement's phases, before the cache and on a cache miss and hit."""
    out = []
    for m in res["measurements"]:
        link = f"paced to {m['bandwidth_mib_s']:g} MiB/s" if m["bandwidth_mib_s"] else "over the loopback, unpaced"
        load = m.get("load_avg_1m")
        out += [f"Run on {m['date']} on {m['machine']}, `--device {m['device']}`, model {m['model']['bytes'] / 1e9:.2f} GB "
                f"(archive {m['model']['archive_bytes'] / 1e9:.2f} GB, uncompressed tar); download {link}; "
                f"{m['runs']} runs of each start, interleaved, medians in seconds"
                + (f"; 1-minute load average {load[0]:.1f} before, {load[1]:.1f} after" if load else "") + ":\n",
                f"```sh\n{m['command']}\n```\n",
                "| phase | before | cache miss | cache hit |", "|---|---|---|---|"]
        s = m["scenarios"]
        for key, label in STARTUP_ROWS:
            cells = []
            for name in ("before", "miss", "hit"):
                v = s[name].get(key, s[name]["phases"].get(key))
                cells.append("–" if v is None else f"{v:.2f}")
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        ratio = m["hit_over_miss"]
        out += ["", f"Cache hit ÷ miss, pod start to ready: {ratio:.2f} (target ≤ {MAX_HIT_OVER_MISS:.2f}: "
                f"{'met' if ratio <= MAX_HIT_OVER_MISS else 'not met'}).", ""]
    return "\n".join(out)
