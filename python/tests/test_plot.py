"""kvcache.plot turns the CLI's JSON into charts: each input kind is recognised and
gives its PNG/SVG files; unknown input is an error message, not a traceback."""
import json

import pytest

pytest.importorskip("matplotlib")
from kvcache import plot  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def attention_rows():
    rows = []
    for fmt, step, frac in [("bf16", 480.0, 0.8), ("turbo4", 900.0, 0.1)]:
        for layout in ["contiguous", "paged"]:
            rows.append({"case": "single", "k_format": fmt, "v_format": fmt, "layout": layout,
                         "block_size": 16, "step_us": step, "step_cpu_us": step,
                         "bandwidth_fraction_cpu": frac, "simd_target": "AVX2",
                         "context_tokens": 1024, "threads": 1})
    return rows


def test_every_kind(tmp_path):
    att = tmp_path / "att.jsonl"
    att.write_text("\n".join(json.dumps(r) for r in attention_rows()))
    enc = tmp_path / "enc.json"
    enc.write_text(json.dumps([{"format": f, "simd_target": t, "encode_gb_per_s": g,
                                "decode_gb_per_s": 2 * g, "append_token_us": 10.0}
                               for f, g in [("bf16", 15.0), ("q8_0", 4.2)] for t in ["AVX2", "SSE4"]]))
    ev = tmp_path / "eval.jsonl"
    ev.write_text("\n".join(json.dumps({"k_format": f, "v_format": f, "k_bits": b, "v_bits": b,
                                        "softmax_kl": kl, "data": "gaussian"})
                            for f, b, kl in [("f32", 32, 0.0), ("bf16", 16, 8e-7), ("turbo4", 4.5, 1e-3)]))
    ppl = tmp_path / "ppl.json"
    ppl.write_text(json.dumps([{"kv_format": f"{f}:{f}", "kl_vs_f32": kl, "k_bits_per_value": b,
                                "v_bits_per_value": b, "perplexity": 3.0}
                               for f, b, kl in [("f32", 32, 0.0), ("q8_0", 8.5, 1e-4)]]))
    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps({"results": [{"kv_format": f, "mean_concurrent": m, "peak_concurrent": 2 * m,
                                            "prefix_hit_rate": 0.5} for f, m in [("bf16", 8.0), ("turbo4", 28.0)]]}))
    out = tmp_path / "img"
    files = plot.plot_files([att, enc, ev, ppl, sim], out)
    names = sorted(f.name for f in files)
    assert names == ["attention_bandwidth.png", "attention_step.png", "encode.png",
                     "quality_eval.png", "quality_perplexity.png", "simulate.png"]
    for f in files:
        assert f.read_bytes()[:8] == PNG and f.stat().st_size > 5000
    svg = plot.plot_files([sim], out, ext="svg")
    assert svg[0].read_text().lstrip().startswith("<?xml")


def test_pareto_front():
    pts = [(32, 0.0, "f32"), (16, 1e-6, "bf16"), (8, 1e-3, "fp8"), (8.5, 1e-4, "q8_0"), (4.5, 1e-2, "t4"),
           (4.5, 5e-2, "q4_0")]
    assert [p[2] for p in plot.pareto(pts)] == ["t4", "fp8", "q8_0", "bf16", "f32"]


def test_eviction_is_a_second_series(tmp_path):
    rows = [{"kv_format": "bf16:bf16", "eviction": "none", "kl_vs_f32": 1e-6, "k_bits_per_value": 16,
             "v_bits_per_value": 16},
            {"kv_format": "turbo4:turbo4+s4+r120", "kl_vs_f32": 2e-3, "k_bits_per_value": 4.75,
             "v_bits_per_value": 4.75},
            {"kv_format": "bf16:bf16", "eviction": "h2o:512,64", "kl_vs_f32": 3e-2,
             "k_bits_per_value": 16, "v_bits_per_value": 16, "effective_bits_per_value": 2.0}]
    series = plot.quality_series(rows, "perplexity")
    assert [p[2] for p in series["formats"]] == ["bf16:bf16", "turbo4:turbo4+s4+r120"]
    assert series["eviction"] == [(2.0, 3e-2, "bf16:bf16 h2o:512,64")]
    src = tmp_path / "ppl.json"
    src.write_text(json.dumps(rows))
    files = plot.plot_files([src], tmp_path / "img")
    assert [f.name for f in files] == ["quality_perplexity.png"]
    assert files[0].read_bytes()[:8] == PNG and files[0].stat().st_size > 5000


def test_bad_input(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text('{"nothing": 1}')
    assert plot.main([str(bad), "--out", str(tmp_path)]) == 2
    assert "no kvcache" in capsys.readouterr().err
    assert plot.main([str(tmp_path / "missing.json")]) == 2


def test_serve_chart(tmp_path):
    """bench_serve's {"results": [...]} gives serve.png; a null TTFT (nothing completed) still plots."""
    doc = {"results": [{"kv_format": f, "concurrency": c, "output_tokens_per_s": t, "ttft_p50_ms": p50,
                        "ttft_p99_ms": p50 and 3 * p50, "requests": 8, "lost": 0}
                       for f, c, t, p50 in [("bf16", 1, 20.0, 150.0), ("bf16", 16, 90.0, 900.0),
                                            ("turbo4", 32, 150.0, None)]]}
    src = tmp_path / "serve.json"
    src.write_text(json.dumps(doc))
    files = plot.plot_files([src], tmp_path / "img")
    assert [f.name for f in files] == ["serve.png"]
    assert files[0].read_bytes()[:8] == PNG and files[0].stat().st_size > 5000


def test_spread_labels_separates_overlapping_boxes():
    # Two labels on the same spot and one far away: the lower of the pair
    # moves down by one step, the far one stays.
    boxes = [(0, 10, 50, 20), (5, 12, 55, 22), (200, 10, 250, 20)]
    shifts = plot.spread_labels(boxes, 10)
    assert shifts == [10, 0, 0]
    moved = [(x0, y0 - d, x1, y1 - d) for (x0, y0, x1, y1), d in zip(boxes, shifts)]
    a, b = moved[0], moved[1]
    assert not (a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3])
    # Nothing overlapping: nothing moves.
    assert plot.spread_labels([(0, 0, 10, 10), (0, 20, 10, 30)], 10) == [0, 0]


def test_short_pair_names_one_format_once():
    assert plot.short_pair("turbo4:turbo4+s4+r120") == "turbo4+s4+r120"
    assert plot.short_pair("bf16:bf16 streaming:4,252") == "bf16 streaming:4,252"
    assert plot.short_pair("q8_0:q8_0") == "q8_0"
    assert plot.short_pair("turbo4:turbo4i") == "turbo4:turbo4i"
    assert plot.short_pair("turbo4:turbo3+s4+r120") == "turbo4:turbo3+s4+r120"


def test_speed_memory_and_per_model_quality_charts(tmp_path):
    """bench step documents (their rows take the document's context, threads and
    products), llama-bench rows, info documents, and perplexity rows of two models
    give speed.png, memory.png and one quality chart per model and length."""
    steps = tmp_path / "steps.jsonl"
    steps.write_text("\n".join(json.dumps({
        "model": "/m/gemma.gguf", "matmul": m, "threads": 2, "context": c, "simd_target": "AVX3",
        "results": [{"kv_format": "bf16", "streams": 1, "step_ms": 10.0 + c / 4096, "ms_per_token": 10.0,
                     "tokens_per_s": 1e3 / (10.0 + c / 4096), "prefill_tokens": 512,
                     "prefill_tokens_per_s": 500.0 - c / 100}]})
        for m in ("auto", "int8") for c in (16, 4096, 16384)))
    llama = tmp_path / "llama.json"
    llama.write_text(json.dumps([{"model_filename": "/m/gemma.gguf", "n_threads": 2, "n_prompt": p, "n_gen": g,
                                  "n_depth": d, "avg_ts": 90.0 - d / 1000}
                                 for d in (0, 4096, 16384) for p, g in ((512, 0), (0, 32))]))
    info = tmp_path / "info.jsonl"
    info.write_text("\n".join(json.dumps({"model": "/m/gemma.gguf", "context": 32768, "kv_format": f,
                                          "bytes_per_sequence": b, "full_only_bytes_per_sequence": 5 * b,
                                          "groups": []})
                              for f, b in (("bf16", 3 << 20), ("q8_0", 2 << 20))))
    ppl = tmp_path / "ppl.json"
    ppl.write_text(json.dumps(
        [{"model": f"/m/{m}.gguf", "num_tokens": n, "scored_from": n // 2, "kv_format": f, "kl_vs_f32": kl,
          "k_bits_per_value": 4.5, "v_bits_per_value": 4.5, "cache_bits_per_value": cb}
         for m, n in (("gemma", 8192), ("smol", 1024))
         for f, kl, cb in (("bf16", 1e-5, 16.0), ("global=turbo4+s4+r120,local=q8_0", 1e-2, 4.85))]))
    rows = plot.load_rows(steps)
    assert len(rows) == 6 and rows[0]["context"] == 16 and rows[0]["matmul"] == "auto"
    assert plot.kind_of(rows[0]) == "step"
    # Whole-cache bits win over K's and V's.
    assert [p[0] for p in plot.quality_series(plot.load_rows(ppl)[:2], "perplexity")["formats"]] == [16.0, 4.85]
    files = plot.plot_files([steps, llama, info, ppl], tmp_path / "img")
    names = sorted(f.name for f in files)
    assert names == ["memory.png", "quality_perplexity_gemma-8192.png", "quality_perplexity_smol-1024.png",
                     "speed.png"]
    for f in files:
        assert f.read_bytes()[:8] == PNG and f.stat().st_size > 5000
    # One model's rows alone keep their model's name.
    one = tmp_path / "one.json"
    one.write_text(json.dumps([r for r in json.loads(ppl.read_text()) if "gemma" in r["model"]]))
    assert [f.name for f in plot.plot_files([one], tmp_path / "img1")] == ["quality_perplexity_gemma-8192.png"]


def test_passkey_chart(tmp_path):
    """kvcache passkey documents (one per cache and context; the rows take the
    document's context, format and eviction) give passkey.png, a matrix of
    caches by context and depth; documents without the answers (counts only)
    count alike, and a later row replaces an earlier one for the same cache,
    context and depth."""
    def doc(ctx, fmt, eviction, found, answers=True):
        return {"model": "/m/gemma.gguf", "context": ctx, "kv_format": fmt, "eviction": eviction, "trials": 20,
                "results": [{"depth": d, "found": f, "accuracy": f / 20,
                             **({"answers": [{"key": "12345", "answer": " 12345.", "found": True}]}
                                if answers else {})}
                            for d, f in zip((0.25, 0.5, 0.75), found)]}
    pk = tmp_path / "pk.jsonl"
    pk.write_text("\n".join(json.dumps(d) for d in (
        doc(4096, "f32", "none", (20, 20, 20)), doc(4096, "f32", "h2o:2048,256", (17, 8, 5)),
        doc(16384, "f32", "none", (11, 20, 20), answers=False),
        doc(4096, "global=turbo4+s4+r120,local=q8_0", "none", (20, 20, 20)),
        doc(4096, "turbo2i", "none", (1, 2, 3)), doc(4096, "q8_0", "none", (20, 19, 20)))))
    rows = plot.load_rows(pk)
    assert len(rows) == 18 and all(plot.kind_of(r) == "passkey" for r in rows)
    assert [plot.passkey_cache(r) for r in rows[2:4]] == ["f32", "f32 h2o"]
    # Whole caches by bits (mixes after single formats), eviction last.
    caches, cols, cells, notes = plot.passkey_matrix(rows)
    assert caches == ["f32", "q8_0", "turbo2i", "global=turbo4+s4+r120,local=q8_0", "f32 h2o"]
    assert cols == [(4096, 0.25), (4096, 0.5), (4096, 0.75), (16384, 0.25), (16384, 0.5), (16384, 0.75)]
    assert cells[("f32 h2o", 4096, 0.5)] == ("8/20", 0.4) and ("q8_0", 16384, 0.25) not in cells
    assert notes == ["eviction budgets: h2o:2048,256 at 4,096"]
    # Documents that record their bits per value order the caches by them
    # (a per-group mix among the single formats, by its most bits) and
    # label them; one cache without them (the earlier documents) falls
    # back to the names' order for every cache.
    def with_bits(d, *bits):
        return [{**d, "context": ctx, "cache_bits_per_value": b} for ctx, b in bits]
    measured = tmp_path / "bits.jsonl"
    measured.write_text("\n".join(json.dumps(d) for d in (
        *with_bits(doc(4096, "f32", "none", (20, 20, 20)), (4096, 32.0)),
        *with_bits(doc(4096, "q8_0", "none", (20, 20, 20)), (4096, 8.5)),
        *with_bits(doc(4096, "turbo4", "none", (20, 20, 20)), (4096, 4.5048), (8192, 4.5030)),
        *with_bits(doc(4096, "global=turbo4+s4+r120,local=q8_0", "none", (20, 20, 20)), (4096, 6.35), (16384, 5.15)),
        *with_bits(doc(4096, "f32", "h2o:2048,256", (17, 8, 5)), (4096, 32.0)))))
    brows = plot.load_rows(measured)
    assert plot.passkey_matrix(brows)[0] == ["f32", "q8_0", "global=turbo4+s4+r120,local=q8_0", "turbo4", "f32 h2o"]
    bits = plot.passkey_bits(brows)
    assert bits["global=turbo4+s4+r120,local=q8_0"] == (5.15, 6.35)
    assert plot.passkey_label("turbo4", bits) == "turbo4 (4.5 bits)"
    assert plot.passkey_label("global=turbo4+s4+r120,local=q8_0", bits) == "global=turbo4+s4+r120,local=q8_0 (5.2-6.3 bits)"
    assert plot.passkey_label("q4_0", bits) == "q4_0"
    mixed = plot.load_rows(measured) + plot.load_rows(pk)
    assert "turbo2i" not in plot.passkey_bits(mixed) and "f32" not in plot.passkey_bits(mixed)
    assert plot.passkey_matrix(mixed)[0][:3] == ["f32", "q8_0", "turbo4"]
    # Documents without "prompt" are of the earlier prompts, cut at any
    # token: their own chart; those of the whole-pass prompts draw
    # passkey.png.
    files = plot.plot_files([pk], tmp_path / "img")
    assert [f.name for f in files] == ["passkey_cut_anywhere.png"]
    assert files[0].read_bytes()[:8] == PNG and files[0].stat().st_size > 5000
    now = tmp_path / "now.json"
    now.write_text(json.dumps({**doc(4096, "bf16", "none", (20, 20, 20)), "prompt": "whole filler passes"}))
    files = plot.plot_files([pk, now], tmp_path / "img_now")
    assert [f.name for f in files] == ["passkey.png", "passkey_cut_anywhere.png"]
    # A document with answer_tokens 16 beside those without (8): theirs are
    # starred as lower bounds where they missed keys; a later row replaces
    # an earlier one.
    pk16 = tmp_path / "pk16.json"
    pk16.write_text(json.dumps({**doc(4096, "q8_0", "none", (20, 20, 20)), "answer_tokens": 16}))
    _, _, cells, notes = plot.passkey_matrix(plot.load_rows(pk) + plot.load_rows(pk16))
    assert cells[("q8_0", 4096, 0.5)] == ("20/20", 1.0) and cells[("q8_0", 4096, 0.25)] == ("20/20", 1.0)
    # (every key found: exact at any length, so no star)
    assert cells[("f32", 4096, 0.5)] == ("20/20", 1.0) and cells[("f32 h2o", 4096, 0.5)] == ("8/20*", 0.4)
    assert notes[0] == "* answered with 8 tokens, the others with 16: a lower bound"
    files = plot.plot_files([pk, pk16], tmp_path / "img16")
    assert files[0].read_bytes()[:8] == PNG
    # A document still being written (kvcache passkey --out) draws nothing.
    running = {**doc(32752, "bf16", "none", (20, 3, 0)), "complete": False}
    caches, cols, cells, _ = plot.passkey_matrix(plot.load_rows(pk) + [{**running, **r} for r in running["results"]])
    assert ("bf16", 32752, 0.25) not in cells and "bf16" not in caches and len(cols) == 6
    alone = tmp_path / "running.json"
    alone.write_text(json.dumps(running))
    assert plot.plot_files([alone, pk16], tmp_path / "img_running") != []  # pk16's chart, without it
    assert plot.plot_files([alone], tmp_path / "img_none") == []
