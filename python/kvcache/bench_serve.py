"""A load generator for ``kvcache serve``: ``python -m kvcache.bench_serve``.

Sends ``--requests`` streamed chat completions through the ``openai``
package's ``AsyncOpenAI`` with ``--concurrency`` of them in flight at once and
reports what a serving configuration delivers:

- output tokens/s and requests/s over the run's wall time;
- time to first token (TTFT) and inter-token latency (ITL), p50 and p99;
- the prefix hit rate (``kvcache_prefix_hit_tokens_total`` over
  ``kvcache_prompt_tokens_total``, deltas of /metrics across the run);
- the peak of ``kvcache_requests_running`` (polled during the run) and the
  preemptions (delta of ``kvcache_preemptions_total``);
- the requests held back to adopt a prefix another request was prefilling
  (delta of ``kvcache_prefix_holds_total``) and the prefix-cache lookups
  (``kvcache_prefix_lookups_total``);
- lost requests: errors, or streams that ended without a finish reason or
  without their usage.

Workloads (``--workload``): ``chat`` is a few long shared system prompts and a
short distinct user turn per request (the prefix cache serves the system
prompt after its first use, as the simulator's chat workload); ``fixed`` is
distinct prompts of ``--prompt-words`` words each, so nothing is shared. Both
ask for ``--max-tokens`` tokens with ``ignore_eos`` (fixed output lengths)
unless ``--allow-eos``.

``--base-url`` measures a running server; ``--spawn "ARGS"`` starts
``kvcache serve --port 0 ARGS`` itself for each run (a free port) and stops it
after. With ``--spawn``, ``--kv-formats bf16,turbo4`` and ``--concurrency
1,16`` sweep: one fresh server and one run per (format, concurrency). ``--json
OUT`` writes ``{"results": [row, ...]}``; ``python -m kvcache.plot OUT`` charts
it. Text words are drawn from a fixed list with ``--seed``: one seed, one
workload.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

WORDS = ("time river light stone garden window morning silver forest music paper city "
         "winter summer ocean bridge market story letter mountain road candle voice cloud "
         "table friend doctor engine harbor island kitchen ladder meadow number orange "
         "pencil question rabbit school thunder valley wagon yellow zebra anchor basket "
         "castle desert feather glass honey iron jacket kettle lemon mirror needle").split()


def percentile(values, q):
    """The q-th percentile (0..100) of `values`, linearly interpolated between the
    two nearest ranks (numpy's default); None for an empty list."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not in [0, 100]")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def parse_metrics(text):
    """Prometheus text as {sample name with its labels: float}."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                continue
    return out


def _words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def make_workload(kind, n, seed, system_prompts=4, system_words=300, prompt_words=200):
    """`n` chat message lists. chat: one of `system_prompts` shared system prompts
    of `system_words` words + a distinct short user turn; fixed: a distinct
    one-line system turn + `prompt_words` words (none share a block)."""
    rng = random.Random(seed)
    if n < 0:
        raise ValueError("requests must be >= 0")
    if kind == "chat":
        systems = [f"You are assistant number {i}. Background: " + _words(rng, system_words)
                   for i in range(system_prompts)]
        return [[{"role": "system", "content": systems[rng.randrange(system_prompts)]},
                 {"role": "user", "content": f"Question {i}: tell me about the {_words(rng, 6)}."}]
                for i in range(n)]
    if kind == "fixed":
        # The distinct number opens the system turn, ahead of any template default.
        return [[{"role": "system", "content": f"Request {i}."},
                 {"role": "user", "content": _words(rng, prompt_words)}] for i in range(n)]
    raise ValueError(f"unknown workload {kind!r} (chat, fixed)")


def read_metrics(base_url, timeout=10.0):
    """GET /metrics (never through a proxy) as parse_metrics() gives it."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(base_url.rstrip("/") + "/metrics", timeout=timeout) as r:
        return parse_metrics(r.read().decode())


class _MetricsReader:
    """Reads /metrics of one server from the event loop (in a worker thread)."""

    def __init__(self, base_url):
        self.base_url = base_url

    async def read(self):
        return await asyncio.to_thread(read_metrics, self.base_url)

    async def close(self):
        pass


async def _one_request(client, messages, args, record):
    """Streams one chat completion; fills `record` with its timings and usage."""
    extra = {} if args.allow_eos else {"ignore_eos": True}
    start = time.perf_counter()
    stamps = []
    finish = None
    usage = None
    try:
        stream = await client.chat.completions.create(
            model="default", messages=messages, max_tokens=args.max_tokens, temperature=0,
            stream=True, stream_options={"include_usage": True}, extra_body=extra)
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                if c.delta is not None and c.delta.content:
                    stamps.append(now)
                if c.finish_reason:
                    finish = c.finish_reason
    except Exception as e:  # a lost request, counted and described, never fatal
        cause = e.__cause__ or e.__context__
        record["error"] = f"{type(e).__name__}: {e}" + (f" ({type(cause).__name__}: {cause})" if cause else "")
    record["start"] = start
    record["end"] = time.perf_counter()
    record["chunk_times"] = stamps
    record["finish_reason"] = finish
    if usage is not None:
        record["completion_tokens"] = usage.completion_tokens
        record["prompt_tokens"] = usage.prompt_tokens
        details = getattr(usage, "prompt_tokens_details", None)
        record["cached_tokens"] = (getattr(details, "cached_tokens", None) or 0) if details else 0


async def _poll_running(reader, stop, peak):
    while not stop.is_set():
        try:
            m = await reader.read()
            peak[0] = max(peak[0], m.get("kvcache_requests_running", 0))
        except Exception:  # a missed poll only lowers the observed peak
            pass
        try:
            await asyncio.wait_for(stop.wait(), 0.02)
        except asyncio.TimeoutError:
            pass


def summarize(records, wall_s, before, after, peak_running):
    """One result row from the per-request records and the /metrics deltas."""
    done = [r for r in records if "error" not in r and r.get("finish_reason") and
            "completion_tokens" in r]
    ttft = [r["chunk_times"][0] - r["start"] for r in done if r["chunk_times"]]
    itl = [b - a for r in done for a, b in zip(r["chunk_times"], r["chunk_times"][1:])]
    out_tokens = sum(r["completion_tokens"] for r in done)

    def delta(name):
        return after.get(name, 0.0) - before.get(name, 0.0)

    prompt_delta = delta("kvcache_prompt_tokens_total")
    ms = 1000.0
    row = {
        "requests": len(records),
        "completed": len(done),
        "lost": len(records) - len(done),
        "wall_s": wall_s,
        "output_tokens": out_tokens,
        "prompt_tokens": sum(r["prompt_tokens"] for r in done),
        "cached_tokens": sum(r["cached_tokens"] for r in done),
        "output_tokens_per_s": out_tokens / wall_s if wall_s > 0 else 0.0,
        "requests_per_s": len(done) / wall_s if wall_s > 0 else 0.0,
        "prefix_hit_rate": delta("kvcache_prefix_hit_tokens_total") / prompt_delta if prompt_delta else 0.0,
        "peak_running": int(peak_running),
        "preemptions": int(delta("kvcache_preemptions_total")),
        # Requests held back for another's prefill of their shared prefix,
        # and prefix-cache lookups (one per admission).
        "prefix_holds": int(delta("kvcache_prefix_holds_total")),
        "prefix_lookups": int(delta("kvcache_prefix_lookups_total")),
        "server_generated_tokens": int(delta("kvcache_generated_tokens_total")),
        "errors": sorted({r["error"] for r in records if "error" in r})[:5],
    }
    for name, vals in (("ttft", ttft), ("itl", itl)):
        for q in (50, 99):
            p = percentile(vals, q)
            row[f"{name}_p{q}_ms"] = p * ms if p is not None else None
    return row


async def run_load(base_url, args, api_key="unused"):
    """Runs `args.requests` requests of `args.workload` against `base_url` with
    `args.concurrency` in flight; returns the result row."""
    import openai

    workload = make_workload(args.workload, args.requests, args.seed, args.system_prompts,
                             args.system_words, args.prompt_words)
    client = openai.AsyncOpenAI(base_url=base_url.rstrip("/") + "/v1", api_key=api_key, max_retries=0,
                                http_client=openai.DefaultAsyncHttpxClient(trust_env=False,
                                                                           timeout=args.timeout))
    reader = _MetricsReader(base_url)
    records = [{} for _ in workload]
    queue = list(range(len(workload)))
    queue.reverse()

    async def worker():
        while queue:
            i = queue.pop()
            await _one_request(client, workload[i], args, records[i])

    try:
        before = await reader.read()
        stop, peak = asyncio.Event(), [0.0]
        poller = asyncio.create_task(_poll_running(reader, stop, peak))
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(max(1, args.concurrency))))
        wall = time.perf_counter() - t0
        stop.set()
        await poller
        after = await _wait_settled(reader)
    finally:
        await reader.close()
        await client.close()
    row = summarize(records, wall, before, after, peak[0])
    row.update({"workload": args.workload, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
                "seed": args.seed})
    return row


async def _wait_settled(reader, timeout=10.0):
    """/metrics once nothing runs (the last counters are published)."""
    deadline = time.monotonic() + timeout
    while True:
        m = await reader.read()
        if m.get("kvcache_requests_running", 0) == 0 and m.get("kvcache_requests_waiting", 0) == 0:
            return m
        if time.monotonic() > deadline:
            return m
        await asyncio.sleep(0.02)


async def _ttft_once(client, prompt):
    """Streams a one-token completion; returns (TTFT seconds, usage)."""
    start = time.perf_counter()
    first, usage = None, None
    stream = await client.completions.create(model="default", prompt=prompt, max_tokens=1, temperature=0,
                                             stream=True, stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True})
    async for chunk in stream:
        if first is None and any(c.text for c in chunk.choices):
            first = time.perf_counter() - start
        if chunk.usage is not None:
            usage = chunk.usage
    if first is None or usage is None:
        raise RuntimeError("a probe stream ended without its token or its usage")
    return first, usage


def _cached_of(usage):
    d = getattr(usage, "prompt_tokens_details", None)
    return (getattr(d, "cached_tokens", None) or 0) if d else 0


async def probe_ttft(base_url, args, replica_url=None, api_key="unused"):
    """TTFT of a long completion prompt whose shared part is new (uncached),
    then of the same shared part with another tail (cached in this server's
    pool), then, with `replica_url`, of the same shared part with a third tail
    on that server (adopted from a tier they share). `args.rounds` rounds, each
    on fresh text; medians. Prompts are words from WORDS, about one token
    each; the reported token counts are the server's."""
    import openai

    rng = random.Random(args.seed)

    def make_client(url):
        return openai.AsyncOpenAI(base_url=url.rstrip("/") + "/v1", api_key=api_key, max_retries=0,
                                  http_client=openai.DefaultAsyncHttpxClient(trust_env=False,
                                                                             timeout=args.timeout))

    clients = [make_client(base_url)] + ([make_client(replica_url)] if replica_url else [])
    samples = {"uncached": [], "cached": [], "replica": []}
    tokens = {}
    try:
        for r in range(args.rounds):
            shared = f"Record {r} {rng.random()}: " + _words(rng, args.probe_words)
            tails = [" Then: " + _words(rng, args.probe_tail_words) for _ in range(3)]
            for kind, client, tail in (("uncached", clients[0], tails[0]), ("cached", clients[0], tails[1]),
                                       ("replica", clients[-1], tails[2])):
                if kind == "replica" and replica_url is None:
                    continue
                if kind == "replica":
                    await asyncio.sleep(args.replica_delay)  # the tier writes land
                ttft, usage = await _ttft_once(client, shared + tail)
                samples[kind].append(ttft)
                tokens[kind] = (usage.prompt_tokens, _cached_of(usage))
    finally:
        for c in clients:
            await c.close()
    row = {"probe": "ttft", "rounds": args.rounds, "seed": args.seed}
    for kind, vals in samples.items():
        if vals:
            row[f"{kind}_ttft_ms"] = percentile(vals, 50) * 1000.0
            row[f"{kind}_prompt_tokens"], row[f"{kind}_cached_tokens"] = tokens[kind]
    row["cached_over_uncached"] = row["cached_ttft_ms"] / row["uncached_ttft_ms"]
    if replica_url:
        row["replica_over_uncached"] = row["replica_ttft_ms"] / row["uncached_ttft_ms"]
    return row


class SpawnedServer:
    """`kvcache serve --port 0 ARGS` on a free port, stopped by stop()."""

    def __init__(self, cli, args, startup_timeout=120.0):
        self.proc = subprocess.Popen([cli, "serve", "--port", "0", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.stderr = []
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()
        line = []
        t = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(startup_timeout)
        m = re.search(r"listening on (http://[\d.]+:\d+)", line[0] if line else "")
        if not m:
            self.stop()
            raise RuntimeError(f"kvcache serve {' '.join(args)} did not start: {''.join(self.stderr)[-2000:]}")
        self.base_url = m.group(1)

    def stop(self, timeout=60.0):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _find_cli(explicit):
    cli = explicit or os.environ.get("KVCACHE_CLI") or shutil.which("kvcache")
    if not cli:
        raise ValueError("no kvcache binary: give --cli PATH or set KVCACHE_CLI")
    return cli


def _int_list(text, name):
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--{name} takes integers separated by commas, not {text!r}")
    if not vals or min(vals) < 1:
        raise ValueError(f"--{name} needs values >= 1")
    return vals


def _validate(args):
    """Raises ValueError for arguments that cannot make a run; returns the concurrencies."""
    concurrencies = _int_list(args.concurrency, "concurrency")
    if args.requests < 1 or args.max_tokens < 1:
        raise ValueError("--requests and --max-tokens must be >= 1")
    if args.ttft_probe:
        if not args.base_url or args.spawn is not None:
            raise ValueError("--ttft-probe needs --base-url (and optionally --replica-url), not --spawn")
        if args.rounds < 1 or args.probe_words < 1:
            raise ValueError("--rounds and --probe-words must be >= 1")
    elif args.spawn is None:
        if args.kv_formats:
            raise ValueError("--kv-formats needs --spawn")
        if not args.base_url:
            raise ValueError("give --base-url or --spawn")
    return concurrencies


def run_all(args):
    """Every run the arguments ask for; returns the result rows."""
    concurrencies = _validate(args)
    if args.ttft_probe:
        return [asyncio.run(probe_ttft(args.base_url, args, args.replica_url, args.api_key))]
    rows = []
    if args.spawn is None:
        for c in concurrencies:
            rows.append(asyncio.run(run_load(args.base_url, _with(args, c), args.api_key)))
        return rows
    cli = _find_cli(args.cli)
    base = shlex.split(args.spawn)
    formats = [f for f in (args.kv_formats or "").split(",") if f] or [None]
    for fmt in formats:
        for c in concurrencies:
            serve_args = base + (["--kv-format", fmt] if fmt else [])
            server = SpawnedServer(cli, serve_args)
            try:
                row = asyncio.run(run_load(server.base_url, _with(args, c), args.api_key))
            finally:
                rc = server.stop()
            row.update({"kv_format": fmt or _flag_value(base, "--kv-format"), "serve_args": serve_args,
                        "server_exit": rc})
            rows.append(row)
            _print_row(row, sys.stderr)
    return rows


def _flag_value(argv, flag):
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _with(args, concurrency):
    ns = argparse.Namespace(**vars(args))
    ns.concurrency = concurrency
    return ns


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def _print_row(row, f):
    print(f"{row.get('kv_format') or '':>8} c={row['concurrency']:<3} {row['completed']}/{row['requests']} ok, "
          f"{row['output_tokens_per_s']:.1f} tok/s, {row['requests_per_s']:.2f} req/s, "
          f"TTFT p50 {_fmt(row['ttft_p50_ms'], '.0f')} p99 {_fmt(row['ttft_p99_ms'], '.0f')} ms, "
          f"ITL p50 {_fmt(row['itl_p50_ms'], '.1f')} p99 {_fmt(row['itl_p99_ms'], '.1f')} ms, "
          f"hit {row['prefix_hit_rate']:.2f}, peak running {row['peak_running']}, "
          f"preemptions {row['preemptions']}, holds {row.get('prefix_holds', 0)}, "
          f"lookups {row.get('prefix_lookups', 0)}, lost {row['lost']}", file=f)


def parser():
    ap = argparse.ArgumentParser(prog="python -m kvcache.bench_serve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", help="a running server, e.g. http://127.0.0.1:8000")
    ap.add_argument("--spawn", help="start `kvcache serve --port 0 SPAWN` for each run instead")
    ap.add_argument("--cli", help="the kvcache binary for --spawn (default $KVCACHE_CLI, then PATH)")
    ap.add_argument("--kv-formats", help="with --spawn: one server per format, e.g. bf16,turbo4")
    ap.add_argument("--concurrency", default="8", help="requests in flight (a list sweeps: 1,16)")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--workload", choices=["chat", "fixed"], default="chat")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--system-prompts", type=int, default=4, help="chat: distinct system prompts")
    ap.add_argument("--system-words", type=int, default=300, help="chat: words per system prompt")
    ap.add_argument("--prompt-words", type=int, default=200, help="fixed: words per prompt")
    ap.add_argument("--allow-eos", action="store_true", help="let a request end at EOS (no ignore_eos)")
    ap.add_argument("--api-key", default="unused")
    ap.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    ap.add_argument("--ttft-probe", action="store_true",
                    help="instead of a load: TTFT of a long prompt uncached, cached, and on --replica-url")
    ap.add_argument("--replica-url", help="--ttft-probe: a second server sharing a tier with --base-url")
    ap.add_argument("--probe-words", type=int, default=950, help="--ttft-probe: words of the shared part")
    ap.add_argument("--probe-tail-words", type=int, default=40, help="--ttft-probe: words of each tail")
    ap.add_argument("--rounds", type=int, default=3, help="--ttft-probe: rounds (medians reported)")
    ap.add_argument("--replica-delay", type=float, default=1.0,
                    help="--ttft-probe: seconds between the first server's requests and the replica's")
    ap.add_argument("--json", help="write {\"results\": [row, ...]} here")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        rows = run_all(args)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"kvcache.bench_serve: {e}", file=sys.stderr)
        return 2
    if args.spawn is None and not args.ttft_probe:
        for r in rows:
            _print_row(r, sys.stderr)
    doc = {"results": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    else:
        json.dump(doc, sys.stdout, indent=1)
        print()
    return 0 if all(r.get("lost", 0) == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
