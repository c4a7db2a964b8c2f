"""Calling overhead of the Python bindings against the same calls looped in C++.

Both sides run in one process over the same objects, in alternating rounds (the
machines are shared and noisy); the C++ loops are kvcache._kvcache._bench_*_cpp,
which make exactly the library calls the binding makes:
- append of one f32 token for all layers (Llama-3-8B geometry: 32 layers, 8 kv heads,
  head_dim 128, paged, block 16, cleared every 256 tokens, as BM_CacheAppendToken);
- attend_decode of 32 q heads over one bf16 layer of CONTEXT tokens (contiguous, one
  thread; the cache stays in the CPU caches at small contexts, which is where a
  per-call overhead shows most).

    PYTHONPATH=build/release/python python3 python/bench/overhead.py [--context 4096] [--rounds 7]

Prints one JSON object with the medians and the Python / C++ ratios.
"""
import argparse
import json
import statistics
import time

import numpy as np

import kvcache
from kvcache import _kvcache


def append_case():
    g = kvcache.Geometry(32, 8, 128, 16)
    pool = kvcache.BlockPool(g, "f32", num_blocks=20)
    seq = kvcache.SequenceCache.paged(pool)
    k = np.full((32, 1, 8, 128), 0.25, np.float32)
    return seq, k


def time_append_py(seq, k, calls):
    seq.clear()
    n = 0
    t0 = time.perf_counter()
    for _ in range(calls):
        n += 1
        if n == 256:
            seq.clear()
            n = 0
        seq.append(k, k)
    return (time.perf_counter() - t0) / calls * 1e6


def attend_case(context):
    g = kvcache.Geometry(1, 8, 128, 16)
    seq = kvcache.SequenceCache.contiguous(g, "bf16")
    rng = np.random.default_rng(1)
    for start in range(0, context, 1024):
        n = min(1024, context - start)
        k = rng.standard_normal((1, n, 8, 128)).astype(np.float32)
        seq.append(k, k)
    q = rng.standard_normal((32, 128)).astype(np.float32)
    return seq, q


def time_attend_py(seq, q, calls):
    t = []
    for _ in range(calls):
        t0 = time.perf_counter()
        kvcache.attend_decode(seq, 0, q)
        t.append(time.perf_counter() - t0)
    return statistics.median(t) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    seq_a, k = append_case()
    seq_t, q = attend_case(args.context)
    py_a, cc_a, py_t, cc_t = [], [], [], []
    for _ in range(args.rounds):
        py_a.append(time_append_py(seq_a, k, 1000))
        seq_a.clear()
        cc_a.append(_kvcache._bench_append_cpp(seq_a, k, k, 1000))
        py_t.append(time_attend_py(seq_t, q, 30))
        cc_t.append(_kvcache._bench_attend_decode_cpp(seq_t, 0, q, 30))
    m = statistics.median
    print(json.dumps({
        "simd_target": kvcache.simd_target(),
        "append_token_us_python": m(py_a), "append_token_us_cpp": m(cc_a),
        "append_ratio": m(py_a) / m(cc_a),
        "attend_decode_us_python": m(py_t), "attend_decode_us_cpp": m(cc_t),
        "attend_ratio": m(py_t) / m(cc_t), "context_tokens": args.context,
    }, indent=2))


if __name__ == "__main__":
    main()
