"""Attention from Python against a float64 numpy reference, GIL release, busy caches."""
import threading

import numpy as np
import pytest

import kvcache
from conftest import reference_attention


def filled(rng, geometry, tokens, formats="f32", paged=False):
    if paged:
        pool = kvcache.BlockPool(geometry, formats, num_blocks=tokens // geometry.block_size + 2)
        seq = kvcache.SequenceCache.paged(pool)
    else:
        seq = kvcache.SequenceCache.contiguous(geometry, formats)
    shape = (geometry.n_layers, tokens, geometry.n_kv_heads, geometry.head_dim)
    k = rng.standard_normal(shape).astype(np.float32)
    v = rng.standard_normal(shape).astype(np.float32)
    seq.append(k, v)
    return seq, k, v


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("window,n_sink", [(0, 0), (5, 2)])
def test_decode_matches_reference(rng, geometry, paged, window, n_sink):
    seq, k, v = filled(rng, geometry, 13, paged=paged)
    group = 3
    q = rng.standard_normal((geometry.n_kv_heads * group, geometry.head_dim)).astype(np.float32)
    out, lse, probs = kvcache.attend_decode(seq, 1, q, window=window, n_sink=n_sink,
                                            return_lse=True, return_probs=True)
    assert out.shape == q.shape and lse.shape == (6,) and probs.shape == (6, 13)
    for h in range(geometry.n_kv_heads):
        want, want_lse, want_p = reference_attention(k[1, :, h], v[1, :, h],
                                                     q[h * group:(h + 1) * group],
                                                     window=window, n_sink=n_sink)
        np.testing.assert_allclose(out[h * group:(h + 1) * group], want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(lse[h * group:(h + 1) * group], want_lse, rtol=1e-5)
        np.testing.assert_allclose(probs[h * group:(h + 1) * group], want_p, atol=1e-6)


def test_multi_is_causal_and_matches_decode(rng, geometry):
    seq, k, v = filled(rng, geometry, 10)
    q = rng.standard_normal((3, 4, geometry.head_dim)).astype(np.float32)
    out, lse = kvcache.attend_multi(seq, 0, q, return_lse=True)
    assert out.shape == (3, 4, 32) and lse.shape == (3, 4)
    for t in range(3):
        pos = 10 - 3 + t
        for h in range(2):
            want, want_lse, _ = reference_attention(k[0, :, h], v[0, :, h], q[t, 2 * h:2 * h + 2],
                                                    query_pos=pos)
            np.testing.assert_allclose(out[t, 2 * h:2 * h + 2], want, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(lse[t, 2 * h:2 * h + 2], want_lse, rtol=1e-5)
    # the last query of a block sees what a decode call sees
    last = kvcache.attend_decode(seq, 0, q[2])
    np.testing.assert_allclose(out[2], last, rtol=1e-6, atol=1e-6)


def test_batch_matches_single_calls(rng, geometry):
    seqs = [filled(rng, geometry, n, formats=f)[0]
            for n, f in [(3, "f32"), (17, "bf16"), (9, "q8_0:turbo4")]]
    q = rng.standard_normal((3, 4, geometry.head_dim)).astype(np.float32)
    pool = kvcache.ThreadPool(2)
    out, lse = kvcache.attend_decode_batch(seqs, 1, q, return_lse=True, pool=pool)
    for i, s in enumerate(seqs):
        one, one_lse = kvcache.attend_decode(s, 1, q[i], return_lse=True)
        np.testing.assert_allclose(out[i], one, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lse[i], one_lse, rtol=1e-5, atol=1e-6)


def test_lossy_formats_match_reference_over_decoded_rows(rng):
    g = kvcache.Geometry(1, 2, 64, 16)
    for fmt in ["bf16", "fp8_e4m3", "q8", "q8_0", "q4_0", "turbo4", "turbo3", "bf16:turbo2",
                "turbo4i", "bf16:turbo3i", "bf16:turbo2i"]:
        seq, _, _ = filled(rng, g, 40, formats=fmt, paged=True)
        q = rng.standard_normal((4, 64)).astype(np.float32)
        out = kvcache.attend_decode(seq, 0, q)
        for h in range(2):
            want, _, _ = reference_attention(seq.head_keys(0, h), seq.head_values(0, h),
                                             q[2 * h:2 * h + 2])
            np.testing.assert_allclose(out[2 * h:2 * h + 2], want, rtol=2e-3, atol=2e-3,
                                       err_msg=fmt)


def test_threads_run_attention_concurrently(rng):
    g = kvcache.Geometry(1, 4, 64, 16)
    seq, _, _ = filled(rng, g, 2048, formats="bf16")
    q = rng.standard_normal((8, 64)).astype(np.float32)
    want = kvcache.attend_decode(seq, 0, q)
    results, errors = [], []

    def work():
        try:
            for _ in range(20):
                results.append(kvcache.attend_decode(seq, 0, q))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    # Mutating while attention may be reading: either it went through (no
    # reader at that instant) or it was refused; never a race.
    refused = 0
    for _ in range(50):
        try:
            seq.check_invariants()
            seq.reserve(0)
        except kvcache.FailedPrecondition:
            refused += 1
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 60
    for r in results:
        np.testing.assert_array_equal(r, want)


def test_busy_cache_refuses_mutation():
    """A cache marked busy by attention refuses mutation (checked deterministically
    by mutating from inside the window: a slow call on a big cache in a thread)."""
    g = kvcache.Geometry(1, 8, 128, 16)
    rng = np.random.default_rng(5)
    seq, _, _ = filled(rng, g, 16384, formats="f32")
    q = rng.standard_normal((32, 128)).astype(np.float32)
    started = threading.Event()
    done = threading.Event()

    def work():
        started.set()
        for _ in range(30):
            kvcache.attend_decode(seq, 0, q)
        done.set()

    t = threading.Thread(target=work)
    t.start()
    started.wait()
    saw_refusal = False
    k = np.zeros((1, 1, 8, 128), np.float32)
    while not done.is_set():
        try:
            seq.append(k, k)
            seq.truncate_last(1)
        except kvcache.FailedPrecondition as e:
            assert "attention" in str(e)
            saw_refusal = True
    t.join()
    assert saw_refusal
    seq.check_invariants()
    assert seq.num_tokens == 16384


@pytest.mark.parametrize("paged", [False, True])
def test_precision_window_rows_and_attention(rng, paged):
    """Sinks and recent positions read back as their bf16 rounding and
    attention equals the float64 reference over those rows; the rest are
    the format's own rows (a windowless twin decodes them the same)."""
    g = kvcache.Geometry(1, 2, 64, 16)
    sinks, recent, n = 4, 20, 60
    make = []
    for window in [(sinks, recent), (0, 0)]:
        if paged:
            pool = kvcache.BlockPool(g, "turbo3", num_blocks=16)
            make.append(kvcache.SequenceCache.paged(pool, sinks=window[0], recent=window[1]))
        else:
            make.append(kvcache.SequenceCache.contiguous(g, "turbo3", sinks=window[0],
                                                         recent=window[1]))
    seq, twin = make
    assert seq.precision_window == (sinks, recent, 0) and twin.precision_window == (0, 0, 0)
    shape = (1, n, 2, 64)
    k = rng.standard_normal(shape).astype(np.float32)
    v = rng.standard_normal(shape).astype(np.float32)
    for s in (seq, twin):
        s.append(k, v)
    held = np.zeros(n, bool)
    held[:sinks] = True
    held[n - recent:] = True

    def bf16(x):  # round to nearest even on the upper 16 bits
        u = x.view(np.uint32).astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return u.astype(np.uint32).view(np.float32)

    q = rng.standard_normal((4, 64)).astype(np.float32)
    out = kvcache.attend_decode(seq, 0, q)
    for h in range(2):
        got_k, cold_k = seq.head_keys(0, h), twin.head_keys(0, h)
        np.testing.assert_array_equal(got_k[held], bf16(k[0, held, h]))
        np.testing.assert_array_equal(got_k[~held], cold_k[~held])
        got_v = seq.head_values(0, h)
        np.testing.assert_array_equal(got_v[held], bf16(v[0, held, h]))
        want, _, _ = reference_attention(got_k, got_v, q[2 * h:2 * h + 2])
        np.testing.assert_allclose(out[2 * h:2 * h + 2], want, rtol=1e-4, atol=1e-4)
    seq.check_invariants()
    with pytest.raises(kvcache.InvalidArgument, match="precision window"):
        kvcache.SequenceCache.contiguous(g, "bf16", sinks=4, recent=8)
    with pytest.raises(kvcache.InvalidArgument, match="slack"):
        kvcache.SequenceCache.contiguous(g, "turbo3", sinks=4, slack=2)
    # With slack, a rejected draft leaves the window exactly as before.
    spec = kvcache.SequenceCache.contiguous(g, "turbo3", sinks=sinks, recent=recent, slack=3)
    spec.append(k, v)
    before = spec.head_keys(0, 1).copy()
    spec.append(k[:, :3], v[:, :3])
    spec.truncate(n)
    np.testing.assert_array_equal(spec.head_keys(0, 1), before)


@pytest.mark.parametrize("paged", [False, True])
def test_decode_head_is_the_heads_slice_over_its_stored_rows(rng, geometry, paged):
    seq, k, v = filled(rng, geometry, 21, paged=paged)
    group = 3
    q = rng.standard_normal((geometry.n_kv_heads * group, geometry.head_dim)).astype(np.float32)
    out, lse, probs = kvcache.attend_decode(seq, 1, q, return_lse=True, return_probs=True)
    for h in range(geometry.n_kv_heads):
        qh = q[h * group:(h + 1) * group]
        o, l, p = kvcache.attend_decode_head(seq, 1, h, qh, return_lse=True)
        # f32: bit for bit the multi-head call's slice
        np.testing.assert_array_equal(o, out[h * group:(h + 1) * group])
        np.testing.assert_array_equal(l, lse[h * group:(h + 1) * group])
        np.testing.assert_array_equal(p, probs[h * group:(h + 1) * group])
        want, _, want_p = reference_attention(k[1, :, h], v[1, :, h], qh)
        np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(p, want_p, atol=1e-6)
    # evicted rows: probabilities follow head_positions() and feed importance
    keep = np.array([0, 2, 7, 20], np.uint32)
    seq.keep_rows(1, 0, keep)
    o, p = kvcache.attend_decode_head(seq, 1, 0, q[:group])
    assert p.shape == (group, 4)
    np.testing.assert_array_equal(seq.head_positions(1, 0), keep)
    want, _, want_p = reference_attention(k[1, keep, 0], v[1, keep, 0], q[:group])
    np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(p, want_p, atol=1e-6)
    seq.accumulate_importance(1, 0, p.sum(axis=0))
    np.testing.assert_allclose(seq.head_importance(1, 0), p.sum(axis=0), rtol=1e-6)


def test_decode_head_bad_input(rng, geometry):
    seq, _, _ = filled(rng, geometry, 5)
    q = np.zeros((2, geometry.head_dim), np.float32)
    with pytest.raises(IndexError):
        kvcache.attend_decode_head(seq, 0, geometry.n_kv_heads, q)
    with pytest.raises(ValueError):
        kvcache.attend_decode_head(seq, 0, 0, q[:, :-1])
    bad = q.copy()
    bad[1, 3] = np.nan
    with pytest.raises(ValueError):
        kvcache.attend_decode_head(seq, 0, 0, bad)
    empty = kvcache.SequenceCache.contiguous(geometry, "f32")
    with pytest.raises(ValueError):
        kvcache.attend_decode_head(empty, 0, 0, q)
