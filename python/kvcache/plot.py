"""Charts of kvcache's measurements: ``python -m kvcache.plot FILE.json ... --out DIR``.

Reads the JSON that the CLI prints and writes one PNG (or SVG) chart per idea:

- ``kvcache bench attention --json``: step time and bandwidth fraction per format
  pair, layout and SIMD target (``attention_step.png``, ``attention_bandwidth.png``);
- ``kvcache bench encode --json``: encode throughput per format and target
  (``encode.png``);
- ``kvcache eval --json`` and ``kvcache perplexity --formats ... --json``: quality
  against bits per value, one point per format pair (precision windows included),
  with the Pareto front, and eviction budgets as a second series with its own front
  (``quality_eval.png``, ``quality_perplexity.png``);
- ``kvcache simulate --json``: concurrent requests and prefix hit rate per format
  (``simulate.png``);
- ``python -m kvcache.bench_serve --json``: output tokens/s and time to first token
  per format and concurrency against ``kvcache serve`` (``serve.png``);
- ``kvcache bench step --streams 1 --prefill N --json`` at several ``--context``
  depths, with llama.cpp's ``llama-bench -o json`` rows as the yardstick when given:
  decode and prefill tokens/s against depth (``speed.png``);
- ``kvcache info --context C --kv-format F --json``, one per format: bytes per
  sequence at that context, the hybrid layout against every layer kept whole
  (``memory.png``);
- ``kvcache passkey --json``, one per cache and context: the keys found at each
  depth, a matrix of caches (format and eviction policy) by context and depth
  (``passkey.png``).

Perplexity rows give one quality chart per model and text length
(``quality_perplexity_<model>_<tokens>.png``; ``quality_perplexity.png`` for rows that
name neither), at the bits per value the whole cache holds where the rows say
(per-group formats and windows counted); the speed and memory charts split per model
when several are given.

Each input is recognised by its fields, so files can be given in any order; a file
may hold one JSON document or one object per line. Titles name the machine's CPU
and the SIMD target the rows were measured on.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import re
import sys
from collections import defaultdict


def load_rows(path):
    """Every JSON object in a file: a document (object or list) or JSON lines."""
    text = pathlib.Path(path).read_text()
    try:
        doc = json.loads(text)
        docs = doc if isinstance(doc, list) else [doc]
    except json.JSONDecodeError:
        docs = [json.loads(line) for line in text.splitlines() if line.strip()]
    rows = []
    for d in docs:
        inner = None
        if isinstance(d, dict) and isinstance(d.get("results"), list):
            inner = d["results"]  # simulate, bench step
        elif isinstance(d, dict) and isinstance(d.get("formats"), list) and \
                all(isinstance(x, dict) for x in d["formats"]):
            inner = d["formats"]  # perplexity over several formats
        elif isinstance(d, dict):
            rows.append(d)
        if inner is not None:
            # The document's own settings (model, context, threads, ...) hold for
            # each of its rows.
            shared = {k: v for k, v in d.items() if not isinstance(v, (list, dict))}
            for r in inner:
                if isinstance(r, dict):
                    rows.append({**shared, **r})
    return rows


def kind_of(row):
    if "step_us" in row and "bandwidth_fraction_cpu" in row:
        return "attention"
    if "encode_gb_per_s" in row:
        return "encode"
    if "softmax_kl" in row and "k_bits" in row:
        return "eval"
    if "kl_vs_f32" in row and "k_bits_per_value" in row:
        return "perplexity"
    if "mean_concurrent" in row and "kv_format" in row:
        return "simulate"
    if "output_tokens_per_s" in row and "ttft_p50_ms" in row:
        return "serve"
    if "step_ms" in row and "ms_per_token" in row and "context" in row:
        return "step"
    if "avg_ts" in row and "n_depth" in row and "n_gen" in row:
        return "llama_bench"
    if "bytes_per_sequence" in row and "full_only_bytes_per_sequence" in row:
        return "memory"
    if "depth" in row and "found" in row and "accuracy" in row and "context" in row:
        return "passkey"
    return None


def model_of(row):
    """The model file's name without its folder and extension ("" when unnamed)."""
    m = row.get("model") or row.get("model_filename") or ""
    return pathlib.Path(str(m)).stem


def slug(text):
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "model"


def split_by(rows, key):
    """{key(row): rows} in first-seen order."""
    groups = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return groups


def cpu_name():
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def pair_name(row):
    if "kv_format" in row:
        return row["kv_format"]
    return f"{row.get('k_format', '?')}:{row.get('v_format', '?')}"


def targets_of(rows):
    ts = sorted({r.get("simd_target") for r in rows if r.get("simd_target")})
    return ", ".join(ts) if ts else None


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(what, rows, machine):
    t = targets_of(rows)
    return f"{what}\n{machine}" + (f", SIMD {t}" if t else "")


def _grouped_bars(ax, labels, series, ylabel, colors=None, legend=True):
    """series: {name: [value per label]}; colors: {name: color}, or None for the cycle."""
    n = max(1, len(series))
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(labels))]
        ax.bar(xs, values, width, label=name, **({"color": colors[name]} if colors else {}))
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    if legend and len(series) > 1:
        ax.legend(fontsize=8)


def plot_attention(rows, out, ext, machine):
    plt = _plt()
    rows = [r for r in rows if r.get("case", "single") == "single"]
    if not rows:
        return []
    labels = list(dict.fromkeys(pair_name(r) for r in rows))
    keys = list(dict.fromkeys(
        f"{r['layout']}{'/' + str(r['block_size']) if r['layout'] == 'paged' else ''}"
        f" {r.get('simd_target', '')}".strip() for r in rows))
    files = []
    for field, ylabel, name, what in [
        ("step_cpu_us", "step time per layer (ms, CPU)", "attention_step", "Decode attention step"),
        ("bandwidth_fraction_cpu", "fraction of measured read bandwidth", "attention_bandwidth",
         "Decode attention: bytes read / (step x read bandwidth)")]:
        table = defaultdict(dict)
        for r in rows:
            key = (f"{r['layout']}{'/' + str(r['block_size']) if r['layout'] == 'paged' else ''}"
                   f" {r.get('simd_target', '')}").strip()
            v = r[field] / 1000.0 if field.endswith("_us") else r[field]
            table[key][pair_name(r)] = v
        series = {k: [table[k].get(lbl, 0.0) for lbl in labels] for k in keys}
        fig, ax = plt.subplots(figsize=(7, 4))
        _grouped_bars(ax, labels, series, ylabel)
        ctx = rows[0].get("context_tokens")
        ax.set_xlabel(f"K:V format ({ctx} tokens of context, {rows[0].get('threads', '?')} threads)")
        ax.set_title(_title(what, rows, machine), fontsize=10)
        fig.tight_layout()
        path = out / f"{name}.{ext}"
        fig.savefig(path)
        plt.close(fig)
        files.append(path)
    return files


def plot_encode(rows, out, ext, machine):
    plt = _plt()
    labels = list(dict.fromkeys(r["format"] for r in rows))
    targets = list(dict.fromkeys(r.get("simd_target", "") for r in rows))
    series = {t: [next((r["encode_gb_per_s"] for r in rows
                        if r["format"] == f and r.get("simd_target", "") == t), 0.0)
                  for f in labels] for t in targets}
    fig, ax = plt.subplots(figsize=(7, 4))
    _grouped_bars(ax, labels, series, "encode throughput (GB/s of f32 input, 1 thread)")
    ax.set_xlabel("format")
    ax.set_title(_title("Encoding rows into each format", rows, machine), fontsize=10)
    fig.tight_layout()
    path = out / f"encode.{ext}"
    fig.savefig(path)
    plt.close(fig)
    return [path]


def pareto(points):
    """Points (bits, err, label) on the lower-left front, by increasing bits."""
    front, best = [], float("inf")
    for p in sorted(points, key=lambda p: (p[0], p[1])):
        if p[1] < best:
            front.append(p)
            best = p[1]
    return front


def short_pair(name):
    """A chart label: "turbo4:turbo4+s4+r120" as "turbo4+s4+r120" (K and V alike)."""
    m = re.match(r"([^:\s]+):\1(?=$|[+\s])", name)
    return name[: m.end(1)] + name[m.end():] if m else name


def spread_labels(boxes, step):
    """Vertical shifts that keep label boxes apart: boxes[i] = (x0, y0, x1, y1)
    where label i would go (display units, y up). Labels are placed from the
    top down; each takes the nearest free place 1, 2, ... steps below or above
    (below first; 40 steps at most each way, else it stays where it is).
    Returns the downward shift of each (negative: moved up)."""
    placed, shifts = [], [0.0] * len(boxes)
    tries = [0.0] + [sign * k * step for k in range(1, 41) for sign in (1, -1)]
    for i in sorted(range(len(boxes)), key=lambda i: -boxes[i][3]):
        x0, y0, x1, y1 = boxes[i]
        for d in tries:
            if not any(x0 < px1 and px0 < x1 and y0 - d < py1 and py0 < y1 - d
                       for px0, py0, px1, py1 in placed):
                break
        else:
            d = 0.0
        shifts[i] = d
        placed.append((x0, y0 - d, x1, y1 - d))
    return shifts


def _unstack_labels(fig, labels):
    """Moves the annotations in `labels` down where they would overlap."""
    if not labels:
        return
    renderer = fig.canvas.get_renderer()
    boxes = [tuple(t.get_window_extent(renderer).extents) for t in labels]
    step_px = max(b[3] - b[1] for b in boxes)
    shifts = spread_labels(boxes, step_px)
    for t, d in zip(labels, shifts):
        if d:
            x, y = t.xyann
            t.xyann = (x, y - d * 72.0 / fig.dpi)


def is_eviction(row):
    return row.get("eviction") not in (None, "none")


def quality_series(rows, kind):
    """Points (bits, KL, label) per series: "formats" (every position kept, precision
    windows included) and "eviction" (perplexity rows with an eviction budget, at the
    bits per position they keep on average: the format's bits x kept / scored tokens)."""
    series = {"formats": [], "eviction": []}
    for r in rows:
        if kind == "eval":
            series["formats"].append(((r["k_bits"] + r["v_bits"]) / 2, r["softmax_kl"], pair_name(r)))
            continue
        if r.get("kl_vs_f32") is None:
            continue
        # The whole cache's bits where the row counts them (a precision window
        # or per-group formats at the measured length), else K's and V's mean.
        bits = r.get("cache_bits_per_value") or (r["k_bits_per_value"] + r["v_bits_per_value"]) / 2
        if is_eviction(r):
            bits = r.get("effective_bits_per_value", bits)
            series["eviction"].append((bits, r["kl_vs_f32"], f"{pair_name(r)} {r['eviction']}"))
        else:
            series["formats"].append((bits, r["kl_vs_f32"], pair_name(r)))
    return series


def plot_quality(rows, out, ext, machine, kind, file_name=None):
    plt = _plt()
    if kind == "eval":
        ylabel, what = "softmax KL vs f32 (nats, mean over queries)", "Attention quality vs bits"
    else:
        ylabel, what = "next-token KL vs f32 cache (nats)", "Model quality vs bits"
    series = quality_series(rows, kind)
    pts = series["formats"] + series["eviction"]
    floor = min([p[1] for p in pts if p[1] > 0] or [1e-12]) / 10
    fig, ax = plt.subplots(figsize=(7, 5.5))
    styles = {"formats": ("o", "every position kept"), "eviction": ("x", "eviction budgets")}
    labels = []
    for name, (marker, label) in styles.items():
        shown = [(b, max(e, floor), n) for b, e, n in series[name]]
        if not shown:
            continue
        ax.scatter([p[0] for p in shown], [p[1] for p in shown], s=18, marker=marker, label=label)
        for b, e, n in shown:
            # (the line shows which point a label moved away from belongs to)
            labels.append(ax.annotate(short_pair(n), (b, e), fontsize=7, xytext=(3, 2), textcoords="offset points",
                                      arrowprops=dict(arrowstyle="-", lw=0.4, color="0.6",
                                                      shrinkA=0, shrinkB=2)))
        front = pareto(shown)
        ax.plot([p[0] for p in front], [p[1] for p in front], "--", lw=1,
                label=f"Pareto front ({label})" if series["eviction"] else "Pareto front")
    ax.set_yscale("log")
    whole = any(r.get("cache_bits_per_value") for r in rows)
    ax.set_xlabel(("bits per value over the whole cache at the measured length" if whole else
                   "bits per value (mean of K and V, scales included")
                  + ("; eviction: per position of the text" if series["eviction"] else "")
                  + ("" if whole else ")"))
    ax.set_ylabel(ylabel + (f"; 0 drawn at {floor:.0e}" if any(p[1] == 0 for p in pts) else ""))
    ax.legend(fontsize=8)
    src = rows[0].get("model") or rows[0].get("data") or ""
    scope = ""
    if rows[0].get("num_tokens"):
        scope = f", {rows[0]['num_tokens']} tokens"
        if rows[0].get("scored_from"):
            scope += f", positions >= {rows[0]['scored_from']}"
    ax.set_title(_title(f"{what}" + (f" ({pathlib.Path(str(src)).name}{scope})" if src else ""), rows,
                        machine), fontsize=10)
    fig.tight_layout()
    _unstack_labels(fig, labels)
    path = out / f"{file_name or 'quality_' + kind}.{ext}"
    fig.savefig(path)
    plt.close(fig)
    return [path]


def _save(plt, fig, path, rect=None):
    """Lays out, writes and closes fig; rect: the part of the figure the axes
    may fill (room left for a figure legend)."""
    fig.tight_layout(**({"rect": rect} if rect else {}))
    fig.savefig(path)
    plt.close(fig)
    return [path]


def plot_simulate(rows, out, ext, machine):
    plt = _plt()
    labels = [pair_name(r) for r in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 4))
    _grouped_bars(a1, labels, {"mean": [r["mean_concurrent"] for r in rows],
                               "peak": [r["peak_concurrent"] for r in rows]},
                  "requests decoding at once")
    a1.set_xlabel("K:V format")
    _grouped_bars(a2, labels, {"prefix hit rate": [r["prefix_hit_rate"] for r in rows]},
                  "prompt tokens served from cache (fraction)")
    a2.set_ylim(0, 1)
    a2.set_xlabel("K:V format")
    fig.suptitle("Serving simulation: one pool, each format\n" + machine, fontsize=10)
    return _save(plt, fig, out / f"simulate.{ext}")


def plot_serve(rows, out, ext, machine):
    plt = _plt()
    labels = [f"{r.get('kv_format') or '?'} x{r['concurrency']}" for r in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 4))
    _grouped_bars(a1, labels, {"output": [r["output_tokens_per_s"] for r in rows]}, "output tokens/s")
    _grouped_bars(a2, labels, {"p50": [r["ttft_p50_ms"] or 0 for r in rows],
                               "p99": [r["ttft_p99_ms"] or 0 for r in rows]},
                  "time to first token (ms)")
    for ax in (a1, a2):
        ax.set_xlabel("K:V format x concurrent clients")
    fig.suptitle("kvcache serve under load (bench_serve)\n" + machine, fontsize=10)
    return _save(plt, fig, out / f"serve.{ext}")


def plot_speed(step_rows, llama_rows, out, ext, machine, name="speed"):
    """Decode (one sequence) and prefill tokens/s against the depth already in the
    cache: kvcache per products and threads, llama-bench per threads."""
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2))
    decode, prefill = defaultdict(list), defaultdict(list)
    for r in step_rows:
        if r.get("streams") != 1:
            continue
        label = f"kvcache {r.get('matmul', '?')}, {r.get('threads', '?')} thr"
        decode[label].append((r["context"], r["tokens_per_s"]))
        if r.get("prefill_tokens_per_s"):
            prefill[label].append((r["context"], r["prefill_tokens_per_s"]))
    for r in llama_rows:
        label = f"llama.cpp, {r.get('n_threads', '?')} thr"
        if r["n_gen"] > 0 and r.get("n_prompt", 0) == 0:
            decode[label].append((r["n_depth"], r["avg_ts"]))
        elif r.get("n_prompt", 0) > 0 and r["n_gen"] == 0:
            prefill[label].append((r["n_depth"], r["avg_ts"]))
    for ax, series, what in ((a1, decode, "decode, one sequence"), (a2, prefill, "prefill")):
        for label, pts in sorted(series.items()):
            pts.sort()
            style = "--" if label.startswith("llama.cpp") else "-"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3, label=label)
        ax.set_xlabel("depth (tokens already in the cache)")
        ax.set_ylabel("tokens/s")
        ax.set_title(what, fontsize=9)
        ax.set_ylim(bottom=0)
        if series:
            ax.legend(fontsize=7)
    rows = step_rows or llama_rows
    fig.suptitle(_title(f"Decode and prefill against depth ({model_of(rows[0]) or 'model'})", step_rows,
                        machine), fontsize=10)
    return _save(plt, fig, out / f"{name}.{ext}")


def plot_memory(rows, out, ext, machine, name="memory"):
    """Bytes per sequence at the rows' context: the layout kept (sliding layers
    holding their windows) against every layer holding every position."""
    plt = _plt()
    labels = [r.get("kv_format", "?") for r in rows]
    mib = 1 << 20
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows) + 2), 4.5))
    _grouped_bars(ax, labels, {"as kept (hybrid)": [r["bytes_per_sequence"] / mib for r in rows],
                               "every layer whole": [r["full_only_bytes_per_sequence"] / mib for r in rows]},
                  "MiB per sequence")
    ax.set_xlabel("K/V format (per layer group where named)")
    ctx = rows[0].get("context", "?")
    ax.set_title(_title(f"Cache bytes per {ctx}-token sequence ({model_of(rows[0]) or 'model'})", rows, machine),
                 fontsize=10)
    return _save(plt, fig, out / f"{name}.{ext}")


def passkey_cache(row):
    """A passkey row's cache: its format, and the eviction policy's name when
    there is one (its budget is in the panel's title)."""
    ev = row.get("eviction")
    policy = str(ev).split(":", 1)[0] if ev and ev != "none" else ""
    return str(row.get("kv_format", "?")) + (f" {policy}" if policy else "")


def _passkey_order(cache, bits=None):
    """Where a cache's row goes: whole caches first, from the most bits to the
    fewest, then eviction. `bits`: the cache's most bits per value
    (passkey_bits), where its documents record them; without, the rank of
    its format's name (per-group mixes after the single formats)."""
    fmt, _, policy = cache.partition(" ")
    if bits is not None:
        return (1 if policy else 0, 0, -bits, cache)
    rank = ["f32", "bf16", "f16", "q8_0", "q8", "fp8_e4m3", "turbo8", "q4_0", "turbo4", "turbo4i",
            "turbo3", "turbo3i", "turbo2", "turbo2i"]
    base = fmt.split("+", 1)[0]
    r = rank.index(base) if base in rank else len(rank)
    return (1 if policy else 0, 1 if "=" in fmt else 0, r, cache)


def passkey_bits(rows):
    """{cache: (fewest, most)} bits per stored value over the whole cache at
    the prompt's length (the documents' ``cache_bits_per_value``: a per-group
    mix spends more at a shorter context, its window layers being a larger
    share), for the caches whose finished documents all record them."""
    seen, missing = defaultdict(list), set()
    for r in passkey_finished(rows):
        b = r.get("cache_bits_per_value")
        if isinstance(b, (int, float)):
            seen[passkey_cache(r)].append(float(b))
        else:
            missing.add(passkey_cache(r))
    return {c: (min(v), max(v)) for c, v in seen.items() if c not in missing}


def passkey_label(cache, bits):
    """A row's label: the cache, and its bits per value when known (one
    decimal: 4.50 and 4.5017 alike read 4.5)."""
    if cache not in bits:
        return cache
    lo, hi = bits[cache]
    span = f"{lo:.1f}" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}-{hi:.1f}"
    return f"{cache} ({span} bits)"


def passkey_cut_anywhere(row):
    """Whether a pass-key row is of the earlier prompts, cut at any token:
    the documents of the whole-pass prompts say so in "prompt"."""
    return "prompt" not in row


def passkey_finished(rows):
    """The rows of finished pass-key documents: a document still being
    written (``"complete": false``, kvcache passkey --out) is left out; one
    without the field is a finished run's output."""
    return [r for r in rows if r.get("complete") is not False]


def passkey_matrix(rows):
    """The pass key's matrix: (caches, columns, cells, notes). caches: the row
    labels (passkey_cache), whole caches by bits per value (the documents'
    where every cache records them, else by the format's name, per-group
    mixes after the single formats), then eviction; columns: (context,
    depth) in order; cells: {(cache, context, depth): (text, fraction
    found)}, text "found/trials", starred when the answers had fewer tokens
    than the longest here and missed some keys (greedy: a longer answer
    starts with the shorter one, so a short one's count is a lower bound);
    notes: what the stars and the eviction budgets are. A cache measured
    twice at one context and depth keeps its last row; a document still
    being written (``"complete": false``, kvcache passkey --out) is left
    out."""
    at = {}
    for r in passkey_finished(rows):
        at[(passkey_cache(r), r["context"], r["depth"])] = r

    def tokens(r):
        return r.get("answer_tokens", 8)  # documents without it answered with 8

    most = max(tokens(r) for r in at.values())
    # A cell that found every key is exact whatever its answers' length.
    starred = {k for k, r in at.items() if tokens(r) < most and r["found"] != r.get("trials")}
    cells = {k: (f"{r['found']}/{r.get('trials', '?')}" + ("*" if k in starred else ""), r["accuracy"])
             for k, r in at.items()}
    notes = []
    short = sorted({tokens(at[k]) for k in starred})
    if short:
        notes.append(f"* answered with {'/'.join(map(str, short))} tokens, the others with {most}: "
                     "a lower bound")
    policies = sorted({(r["context"], r["eviction"]) for r in at.values() if r.get("eviction") not in (None, "none")})
    if policies:
        notes.append("eviction budgets: " + "; ".join(f"{ev} at {ctx:,}" for ctx, ev in policies))
    bits = passkey_bits(rows)
    names = {c for c, _, _ in at}
    # By bits where every cache says, else by the format's name.
    most = {c: bits[c][1] for c in names} if all(c in bits for c in names) else {}
    caches = sorted(names, key=lambda c: _passkey_order(c, most.get(c)))
    cols = sorted({(ctx, d) for _, ctx, d in at})
    return caches, cols, cells, notes


def plot_passkey(rows, out, ext, machine, name="passkey"):
    """Keys found at each depth (passkey_matrix): a row per cache (format, and
    the eviction policy's name when there is one), a column per context and
    depth, each cell its count of found keys out of the trials, coloured by
    the fraction; blank where not measured; the notes below."""
    import numpy as np

    plt = _plt()
    caches, cols, cells, notes = passkey_matrix(rows)
    contexts = sorted({ctx for ctx, _ in cols})
    grid = [[cells[(c, ctx, d)][1] if (c, ctx, d) in cells else float("nan") for ctx, d in cols]
            for c in caches]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.62 * len(cols) + 3.4), max(2.8, 0.36 * len(caches) + 2.0)))
    cmap = plt.get_cmap("RdYlGn").with_extremes(bad="#eeeeee")
    ax.imshow(np.ma.masked_invalid(np.array(grid, dtype=float)), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
    for i, c in enumerate(caches):
        for j, (ctx, d) in enumerate(cols):
            if (c, ctx, d) in cells:
                text, frac = cells[(c, ctx, d)]
                dark = not 0.15 <= frac <= 0.85  # the colormap's dark ends
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    ax.set_yticks(range(len(caches)))
    bits = passkey_bits(rows)
    ax.set_yticklabels([passkey_label(c, bits) for c in caches], fontsize=8)
    ax.set_xticks(range(len(cols)))
    ax.set_xticklabels([f"{d:.0%}" for _, d in cols], fontsize=8)
    ax.set_xlabel("depth of the key, per context (tokens)")
    for k, ctx in enumerate(contexts):
        idx = [j for j, (c2, _) in enumerate(cols) if c2 == ctx]
        ax.text((idx[0] + idx[-1]) / 2, 1.02, f"{ctx:,}", ha="center", va="bottom", fontsize=8,
                fontweight="bold", transform=ax.get_xaxis_transform())  # above the axes, whatever the rows
        if k:
            ax.axvline(idx[0] - 0.5, color="white", linewidth=3)
    if notes:
        fig.text(0.01, 0.01, "\n".join(notes), fontsize=7, wrap=True)
    prompts = ", earlier prompts cut at any token" if passkey_cut_anywhere(rows[0]) else ""
    ax.set_title(_title(f"Pass key: keys found ({model_of(rows[0]) or 'model'}{prompts})", rows, machine),
                 fontsize=10, pad=22)
    return _save(plt, fig, out / f"{name}.{ext}", rect=(0, 0.04 * len(notes), 1, 1))


def _names(groups, base):
    """One file name per group: `base` alone for a single group, else base_<slug>."""
    if len(groups) == 1:
        return {k: base for k in groups}
    return {k: f"{base}_{slug('_'.join(str(x) for x in k if x not in (None, '')))}" for k in groups}


def plot_files(paths, out_dir, ext="png", machine=None):
    """Charts for every recognised row in `paths`; returns the files written."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    machine = machine or cpu_name()
    by_kind = defaultdict(list)
    for p in paths:
        for r in load_rows(p):
            k = kind_of(r)
            if k:
                by_kind[k].append(r)
    if not by_kind:
        raise ValueError("no kvcache bench/eval/perplexity/simulate/bench_serve/info/passkey rows in " + ", ".join(map(str, paths)))
    files = []
    if by_kind["attention"]:
        files += plot_attention(by_kind["attention"], out, ext, machine)
    if by_kind["encode"]:
        files += plot_encode(by_kind["encode"], out, ext, machine)
    if by_kind["eval"]:
        files += plot_quality(by_kind["eval"], out, ext, machine, "eval")
    if by_kind["perplexity"]:
        # One chart per model and text length, named by them where the rows
        # say (a stable name whatever else is drawn in the same run).
        groups = split_by(by_kind["perplexity"], lambda r: (model_of(r), r.get("num_tokens")))
        for key, rows in groups.items():
            named = "_".join(str(x) for x in key if x not in (None, ""))
            name = f"quality_perplexity_{slug(named)}" if named else "quality_perplexity"
            files += plot_quality(rows, out, ext, machine, "perplexity", name)
    if by_kind["step"] or by_kind["llama_bench"]:
        groups = split_by(by_kind["step"] + by_kind["llama_bench"], lambda r: (model_of(r),))
        for key, name in _names(groups, "speed").items():
            rows = groups[key]
            files += plot_speed([r for r in rows if kind_of(r) == "step"],
                                [r for r in rows if kind_of(r) == "llama_bench"], out, ext, machine, name)
    if by_kind["memory"]:
        groups = split_by(by_kind["memory"], lambda r: (model_of(r), r.get("context")))
        for key, name in _names(groups, "memory").items():
            files += plot_memory(groups[key], out, ext, machine, name)
    finished = passkey_finished(by_kind["passkey"])
    if finished:
        groups = split_by(finished, lambda r: (model_of(r),))
        for key, name in _names(groups, "passkey").items():
            # Documents of the whole-pass prompts (cut only between passes of the
            # filler; they say so in "prompt") and those of the earlier
            # ones, cut at any token, are other measurements: a chart each.
            earlier = [r for r in groups[key] if passkey_cut_anywhere(r)]
            current = [r for r in groups[key] if not passkey_cut_anywhere(r)]
            if current:
                files += plot_passkey(current, out, ext, machine, name)
            if earlier:
                files += plot_passkey(earlier, out, ext, machine, name + "_cut_anywhere")
    if by_kind["simulate"]:
        files += plot_simulate(by_kind["simulate"], out, ext, machine)
    if by_kind["serve"]:
        files += plot_serve(by_kind["serve"], out, ext, machine)
    return files


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kvcache.plot", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="JSON files printed by the kvcache CLI")
    ap.add_argument("--out", default="docs/img", help="folder for the charts (default docs/img)")
    ap.add_argument("--format", choices=["png", "svg"], default="png")
    ap.add_argument("--machine", help="machine name for the titles (default: this CPU)")
    args = ap.parse_args(argv)
    try:
        files = plot_files(args.inputs, args.out, args.format, args.machine)
    except (OSError, ValueError) as e:
        print(f"kvcache.plot: {e}", file=sys.stderr)
        return 2
    for f in files:
        print(os.fspath(f))
    return 0


if __name__ == "__main__":
    sys.exit(main())
