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
distinct prompts of ``--prompt-words`` words each, so nothing is shared;
``conversation`` is ``--conversations`` multi-turn conversations, each on one
of ``--system-prompts`` shared system prompts (``--system-tokens`` long) with
``--turns`` user turns of ``--user-tokens``: every turn sends the whole
history (the system prompt, the earlier user turns and the model's actual
answers to them) plus the next user turn, a conversation's next turn only
after its previous answer, the conversations interleaved with at most
``--concurrency`` turns in flight. It reports per turn index TTFT p50/p99 and
the prompt tokens the server computed against the new ones (see
summarize_turns). All ask for ``--max-tokens`` tokens with ``ignore_eos``
(fixed output lengths) unless ``--allow-eos``.

``--render gemma`` sends /v1/completions of the turns rendered in Gemma's
format (render_gemma) instead of /v1/chat/completions, for a base model
without a chat template. ``--server-kind llama`` (detected by default: /metrics
with kvcache's counters, else llama-server's /props) measures llama-server:
no /metrics deltas; the computed prompt tokens are its ``timings.prompt_n``
(sent in the last chunk of a stream), kvcache's are prompt minus cached
tokens from the usage.

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


def detect_server_kind(base_url, timeout=10.0):
    """``kvcache`` when /metrics has kvcache's counters, ``llama`` when /props
    answers (llama-server), else a ValueError."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(base_url.rstrip("/") + "/metrics", timeout=timeout) as r:
            if "kvcache_" in r.read().decode():
                return "kvcache"
    except OSError:
        pass
    try:
        with opener.open(base_url.rstrip("/") + "/props", timeout=timeout) as r:
            json.loads(r.read().decode())
            return "llama"
    except (OSError, ValueError):
        pass
    raise ValueError(f"{base_url} is neither kvcache serve (/metrics) nor llama-server (/props)")


class _MetricsReader:
    """Reads /metrics of one server from the event loop (in a worker thread);
    an empty sample for a server without kvcache's metrics (llama-server)."""

    def __init__(self, base_url, kind="kvcache"):
        self.base_url = base_url
        self.kind = kind

    async def read(self):
        if self.kind != "kvcache":
            return {}
        return await asyncio.to_thread(read_metrics, self.base_url)

    async def close(self):
        pass


def render_gemma(messages):
    """Chat messages as Gemma's turns (``<start_of_turn>user\\n...<end_of_turn>``,
    the assistant's as ``model``), ending with the opened model turn. Gemma has
    no system role: a system message opens the first user turn, a blank line
    before the user's text. The server adds BOS."""
    out, pending = [], None
    for m in messages:
        role, content = m["role"], m["content"]
        if role == "system":
            pending = content
            continue
        if role == "user" and pending is not None:
            content, pending = pending + "\n\n" + content, None
        out.append(f"<start_of_turn>{'model' if role == 'assistant' else 'user'}\n{content}<end_of_turn>\n")
    if pending is not None:
        out.append(f"<start_of_turn>user\n{pending}\n\n")
        return "".join(out)
    return "".join(out) + "<start_of_turn>model\n"


def computed_tokens(record):
    """The prompt tokens the server computed for one request: llama-server's
    ``timings.prompt_n`` where it sent one, else prompt minus cached tokens."""
    if record.get("prompt_n") is not None:
        return record["prompt_n"]
    return record["prompt_tokens"] - record.get("cached_tokens", 0)


async def _one_request(client, messages, args, record):
    """Streams one completion of `messages` (a chat completion, or with
    ``--render gemma`` a completion of the rendered turns); fills `record`
    with its timings, text and usage."""
    extra = {} if args.allow_eos else {"ignore_eos": True}
    start = time.perf_counter()
    stamps, pieces = [], []
    finish = None
    usage = None
    timings = None
    try:
        common = dict(model="default", max_tokens=args.max_tokens, temperature=0, stream=True,
                      stream_options={"include_usage": True}, extra_body=extra)
        if getattr(args, "render", "chat") == "gemma":
            stream = await client.completions.create(prompt=render_gemma(messages), **common)
        else:
            stream = await client.chat.completions.create(messages=messages, **common)
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.usage is not None:
                usage = chunk.usage
            timings = (getattr(chunk, "model_extra", None) or {}).get("timings") or timings
            for c in chunk.choices:
                text = c.text if hasattr(c, "text") else (c.delta.content if c.delta is not None else None)
                if text:
                    stamps.append(now)
                    pieces.append(text)
                if c.finish_reason:
                    finish = c.finish_reason
    except Exception as e:  # a lost request, counted and described, never fatal
        cause = e.__cause__ or e.__context__
        record["error"] = f"{type(e).__name__}: {e}" + (f" ({type(cause).__name__}: {cause})" if cause else "")
    record["start"] = start
    record["end"] = time.perf_counter()
    record["chunk_times"] = stamps
    record["text"] = "".join(pieces)
    record["finish_reason"] = finish
    if usage is not None:
        record["completion_tokens"] = usage.completion_tokens
        record["prompt_tokens"] = usage.prompt_tokens
        details = getattr(usage, "prompt_tokens_details", None)
        record["cached_tokens"] = (getattr(details, "cached_tokens", None) or 0) if details else 0
    if timings and "prompt_n" in timings:
        record["prompt_n"] = int(timings["prompt_n"])


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
        "computed_tokens": sum(computed_tokens(r) for r in done),
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
    reader = _MetricsReader(base_url, _server_kind(base_url, args))
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
    row.update({"workload": args.workload, "server_kind": reader.kind, "concurrency": args.concurrency,
                "max_tokens": args.max_tokens, "seed": args.seed})
    return row


def _server_kind(base_url, args):
    kind = getattr(args, "server_kind", "auto") or "auto"
    return detect_server_kind(base_url) if kind == "auto" else kind


def make_conversations(n, seed, system_prompts=4, system_tokens=2000, turns=6, user_tokens=150):
    """`n` conversations of `turns` user turns each: ``{"systems": [text, ...],
    "conversations": [{"system": k, "users": [text, ...]}, ...]}``. Conversation
    c takes system prompt c mod `system_prompts` (the first `system_prompts`
    conversations each open a different one). Texts are words from WORDS,
    about one token each: a system prompt is about `system_tokens` tokens, a
    user turn about `user_tokens`. One seed, one set of texts."""
    if n < 1 or system_prompts < 1 or turns < 1 or system_tokens < 1 or user_tokens < 1:
        raise ValueError("conversations, system prompts, turns and token counts must be >= 1")
    rng = random.Random(seed)
    systems = [f"You are assistant number {k}. Background: " + _words(rng, max(1, system_tokens - 8))
               for k in range(system_prompts)]
    convs = [{"system": c % system_prompts,
              "users": [f"Conversation {c}, turn {t + 1}: " + _words(rng, max(1, user_tokens - 8))
                        for t in range(turns)]} for c in range(n)]
    return {"systems": systems, "conversations": convs}


def conversation_messages(systems, conv, answers):
    """The messages of `conv`'s next turn: its system prompt, each earlier user
    turn followed by the model's answer to it (`answers`, in order), then the
    next user turn."""
    msgs = [{"role": "system", "content": systems[conv["system"]]}]
    for t, answer in enumerate(answers):
        msgs += [{"role": "user", "content": conv["users"][t]}, {"role": "assistant", "content": answer}]
    msgs.append({"role": "user", "content": conv["users"][len(answers)]})
    return msgs


def summarize_turns(records, system_prefix_tokens=None, block_tokens=16):
    """One row per turn index (1-based) from a conversation run's records:
    TTFT p50/p99, prompt tokens, the tokens the server computed, and the new
    tokens it had to compute at best: for turn t >= 2 the prompt minus what the
    server saw at turn t-1 (its prompt and its answer); for turn 1 the whole
    prompt for the first conversation on a system prompt, else the prompt
    minus the system prompt's tokens (`system_prefix_tokens[k]`, None when
    unknown). `over_target` counts requests that computed more than their
    new tokens + `block_tokens`."""
    ok = [r for r in records if "error" not in r and r.get("finish_reason") and "completion_tokens" in r]
    by_key = {(r["conv"], r["turn"]): r for r in ok}
    rows = []
    for t in sorted({r["turn"] for r in records}):
        recs = [r for r in ok if r["turn"] == t]
        ttft = [r["chunk_times"][0] - r["start"] for r in recs if r["chunk_times"]]
        new = []
        for r in recs:
            if t == 1:
                prefix = (system_prefix_tokens or {}).get(r["system"])
                new.append(r["prompt_tokens"] if r["first_on_system"] else
                           (r["prompt_tokens"] - prefix if prefix is not None else None))
            else:
                prev = by_key.get((r["conv"], t - 1))
                new.append(r["prompt_tokens"] - prev["prompt_tokens"] - prev["completion_tokens"] if prev else None)
        computed = [computed_tokens(r) for r in recs]
        known = [(c, n) for c, n in zip(computed, new) if n is not None]
        row = {"turn": t, "requests": sum(1 for r in records if r["turn"] == t), "completed": len(recs),
               "prompt_tokens_mean": sum(r["prompt_tokens"] for r in recs) / len(recs) if recs else None,
               "computed_tokens": sum(computed), "computed_mean": sum(computed) / len(recs) if recs else None,
               "computed_max": max(computed) if computed else None,
               "new_tokens_mean": sum(n for _, n in known) / len(known) if known else None,
               "over_target": sum(1 for c, n in known if c > n + block_tokens),
               "target_known": len(known)}
        for q in (50, 99):
            p = percentile(ttft, q)
            row[f"ttft_p{q}_ms"] = p * 1000.0 if p is not None else None
        rows.append(row)
    return rows


async def _prompt_tokens(client, prompt):
    r = await client.completions.create(model="default", prompt=prompt, max_tokens=1, temperature=0)
    return r.usage.prompt_tokens


async def run_conversations(base_url, args, api_key="unused"):
    """The conversation workload against `base_url`: `args.conversations`
    conversations interleaved, at most `args.concurrency` turns in flight, a
    conversation's next turn sent only after its previous answer (round robin
    over the ready ones). Returns the run's row with its per-turn rows."""
    import openai

    kind = _server_kind(base_url, args)
    spec = make_conversations(args.conversations, args.seed, args.system_prompts, args.system_tokens,
                              args.turns, args.user_tokens)
    systems, convs = spec["systems"], spec["conversations"]
    client = openai.AsyncOpenAI(base_url=base_url.rstrip("/") + "/v1", api_key=api_key, max_retries=0,
                                http_client=openai.DefaultAsyncHttpxClient(trust_env=False,
                                                                           timeout=args.timeout))
    reader = _MetricsReader(base_url, kind)
    answers = [[] for _ in convs]
    records = []
    seen_systems = set()
    ready = asyncio.Queue()
    for c in range(len(convs)):
        ready.put_nowait(c)
    left = [len(convs)]
    workers = max(1, args.concurrency)

    async def worker():
        while True:
            c = await ready.get()
            if c is None:
                return
            conv = convs[c]
            rec = {"conv": c, "turn": len(answers[c]) + 1, "system": conv["system"],
                   "first_on_system": len(answers[c]) == 0 and conv["system"] not in seen_systems}
            seen_systems.add(conv["system"])
            records.append(rec)
            await _one_request(client, conversation_messages(systems, conv, answers[c]), args, rec)
            if "error" not in rec:
                answers[c].append(rec["text"])
            # A lost turn ends its conversation: the next one needs its answer.
            if "error" not in rec and len(answers[c]) < len(conv["users"]):
                ready.put_nowait(c)
            else:
                left[0] -= 1
                if left[0] == 0:
                    for _ in range(workers):
                        ready.put_nowait(None)

    try:
        before = await reader.read()
        stop, peak = asyncio.Event(), [0.0]
        poller = asyncio.create_task(_poll_running(reader, stop, peak))
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(workers)))
        wall = time.perf_counter() - t0
        stop.set()
        await poller
        after = await _wait_settled(reader)
        prefix_tokens = {}
        if getattr(args, "render", "chat") == "gemma":
            # Afterwards, so the run itself starts cold: each system prompt's
            # rendered tokens, as the server counts them (with its BOS).
            for k, text in enumerate(systems):
                try:
                    prefix_tokens[k] = await _prompt_tokens(client, render_gemma([{"role": "system",
                                                                                   "content": text}]))
                except Exception:  # the turn-1 targets stay unknown
                    pass
    finally:
        await reader.close()
        await client.close()
    row = summarize(records, wall, before, after, peak[0])
    row["turns"] = summarize_turns(records, prefix_tokens, args.block_tokens)
    row.update({"workload": "conversation", "server_kind": kind, "concurrency": args.concurrency,
                "conversations": args.conversations, "turns_per_conversation": args.turns,
                "system_prefix_tokens": prefix_tokens, "max_tokens": args.max_tokens, "seed": args.seed})
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
    if args.workload == "conversation" and min(args.conversations, args.turns, args.system_tokens,
                                               args.user_tokens, args.system_prompts) < 1:
        raise ValueError("--conversations, --turns, --system-tokens, --user-tokens and --system-prompts "
                         "must be >= 1")
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
    run = run_conversations if args.workload == "conversation" else run_load
    if args.spawn is None:
        for c in concurrencies:
            rows.append(asyncio.run(run(args.base_url, _with(args, c), args.api_key)))
        return rows
    cli = _find_cli(args.cli)
    base = shlex.split(args.spawn)
    formats = [f for f in (args.kv_formats or "").split(",") if f] or [None]
    for fmt in formats:
        for c in concurrencies:
            serve_args = base + (["--kv-format", fmt] if fmt else [])
            server = SpawnedServer(cli, serve_args)
            try:
                row = asyncio.run(run(server.base_url, _with(args, c), args.api_key))
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
          f"lookups {row.get('prefix_lookups', 0)}, computed {row.get('computed_tokens', 0)} of "
          f"{row['prompt_tokens']} prompt tokens, lost {row['lost']}", file=f)
    if row.get("turns"):
        print("  turn  requests  TTFT p50 ms  TTFT p99 ms  prompt  new  computed (mean, max)  over target",
              file=f)
        for t in row["turns"]:
            print(f"  {t['turn']:>4}  {t['completed']:>3}/{t['requests']:<4}  {_fmt(t['ttft_p50_ms'], '11.0f')}  "
                  f"{_fmt(t['ttft_p99_ms'], '11.0f')}  {_fmt(t['prompt_tokens_mean'], '6.0f')}  "
                  f"{_fmt(t['new_tokens_mean'], '4.0f')}  {_fmt(t['computed_mean'], '8.0f')} "
                  f"{_fmt(t['computed_max'], '6d')}  {t['over_target']}/{t['target_known']}", file=f)


def parser():
    ap = argparse.ArgumentParser(prog="python -m kvcache.bench_serve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", help="a running server, e.g. http://127.0.0.1:8000")
    ap.add_argument("--spawn", help="start `kvcache serve --port 0 SPAWN` for each run instead")
    ap.add_argument("--cli", help="the kvcache binary for --spawn (default $KVCACHE_CLI, then PATH)")
    ap.add_argument("--kv-formats", help="with --spawn: one server per format, e.g. bf16,turbo4")
    ap.add_argument("--concurrency", default="8", help="requests in flight (a list sweeps: 1,16)")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--workload", choices=["chat", "fixed", "conversation"], default="chat")
    ap.add_argument("--server-kind", choices=["auto", "kvcache", "llama"], default="auto",
                    help="kvcache serve or llama-server (auto: kvcache's /metrics, else llama-server's /props)")
    ap.add_argument("--render", choices=["chat", "gemma"], default="chat",
                    help="chat: /v1/chat/completions with messages; gemma: /v1/completions of Gemma's turns")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--system-prompts", type=int, default=4, help="chat: distinct system prompts")
    ap.add_argument("--system-words", type=int, default=300, help="chat: words per system prompt")
    ap.add_argument("--prompt-words", type=int, default=200, help="fixed: words per prompt")
    ap.add_argument("--conversations", type=int, default=16, help="conversation: how many")
    ap.add_argument("--turns", type=int, default=6, help="conversation: user turns per conversation")
    ap.add_argument("--system-tokens", type=int, default=2000, help="conversation: tokens per system prompt")
    ap.add_argument("--user-tokens", type=int, default=150, help="conversation: tokens per user turn")
    ap.add_argument("--block-tokens", type=int, default=16,
                    help="conversation: the slack over the new tokens a turn may compute (one block)")
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
