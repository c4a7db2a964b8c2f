"""Hybrid sequences (drafts), eviction policies, prefix cache, simulate and eval
from Python."""
import numpy as np
import pytest

import kvcache
from conftest import reference_attention


def rows(rng, layers, tokens, heads, dim):
    return rng.standard_normal((layers, tokens, heads, dim)).astype(np.float32)


def test_policies_and_select_rows():
    w = kvcache.EvictionPolicy.window(2, 3)
    assert w.kind == "window" and (w.sink_tokens, w.window_tokens) == (2, 3)
    np.testing.assert_array_equal(kvcache.select_rows(w, 10), np.array([0, 1, 7, 8, 9], np.uint32))
    h = kvcache.EvictionPolicy.heavy_hitter(2, 1)
    imp = np.array([5, 0, 9, 1, 0, 0], np.float32)
    np.testing.assert_array_equal(kvcache.select_rows(h, 6, imp), np.array([0, 2, 5], np.uint32))
    with pytest.raises(kvcache.InvalidArgument):
        kvcache.EvictionPolicy.window(0, 0).validate()
    assert kvcache.EvictionPolicy.keep_all() == kvcache.EvictionPolicy.keep_all()


def test_speculative_commit_and_abort_are_exact(rng):
    g = kvcache.Geometry(3, 2, 16, 4)
    model = kvcache.HybridModel(g, "f32", [kvcache.LayerSpec.full(), kvcache.LayerSpec.window(1, 4),
                                           kvcache.LayerSpec.full()])
    pools = model.create_pools([16, 16])
    seq = kvcache.HybridSequence.paged(model, pools)
    base = rows(rng, 3, 6, 2, 16)
    seq.append(base, base)
    q = rng.standard_normal((4, 16)).astype(np.float32)
    before = seq.attend(0, q)
    keys_before = seq.head_keys(2, 1)

    seq.begin_draft()
    assert seq.in_draft and seq.draft_base == 6
    draft = rows(rng, 3, 3, 2, 16)
    seq.append(draft, draft)
    assert seq.num_tokens == 9
    seq.abort()
    assert seq.num_tokens == 6 and not seq.in_draft
    np.testing.assert_array_equal(seq.head_keys(2, 1), keys_before)
    np.testing.assert_array_equal(seq.attend(0, q), before)

    seq.begin_draft()
    seq.append(draft, draft)
    seq.commit(2)
    assert seq.num_tokens == 8
    np.testing.assert_array_equal(seq.head_keys(0, 0),
                                  np.concatenate([base[0, :, 0], draft[0, :2, 0]]))
    # the window layer keeps its sink and the last rows it needs
    assert seq.head_positions(1, 0)[0] == 0
    with pytest.raises(kvcache.FailedPrecondition):
        seq.commit(1)  # no draft open
    seq.check_invariants()
    seq.release()
    for p in pools:
        assert p is None or p.free_blocks == p.num_blocks


def test_hybrid_eviction_h2o(rng):
    g = kvcache.Geometry(1, 2, 16, 4)
    policy = kvcache.EvictionPolicy.heavy_hitter(2, 2)
    model = kvcache.HybridModel(g, "f32", [kvcache.LayerSpec.full([policy, kvcache.EvictionPolicy.keep_all()])])
    seq = kvcache.HybridSequence.contiguous(model)
    k = rows(rng, 1, 8, 2, 16)
    seq.append(k, k)
    imp = np.zeros(8, np.float32)
    imp[[1, 4]] = 1.0
    seq.accumulate_importance(0, 0, imp)
    seq.evict()
    np.testing.assert_array_equal(seq.head_positions(0, 0), np.array([1, 4, 6, 7], np.uint32))
    assert len(seq.head_positions(0, 1)) == 8
    with pytest.raises(kvcache.InvalidArgument):
        seq.accumulate_importance(0, 0, np.zeros(3, np.float32))


def test_hybrid_attention_matches_reference(rng):
    g = kvcache.Geometry(1, 2, 16, 4)
    model = kvcache.HybridModel(g, "f32", [kvcache.LayerSpec.window(2, 5)])
    seq = kvcache.HybridSequence.contiguous(model)
    k, v = rows(rng, 1, 20, 2, 16), rows(rng, 1, 20, 2, 16)
    seq.append(k, v)
    q = rng.standard_normal((2, 16)).astype(np.float32)
    out = seq.attend(0, q)
    for h in range(2):
        want, _, _ = reference_attention(k[0, :, h], v[0, :, h], q[h:h + 1], window=5, n_sink=2)
        np.testing.assert_allclose(out[h:h + 1], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("paged", [False, True])
def test_hybrid_precision_window_on_full_layers(rng, paged):
    """A full layer of a hybrid sequence with sinks and recent positions
    attends as a plain cache with the same window and rows; the window
    layer as without the window; a model whose full layer evicts refuses."""
    g = kvcache.Geometry(2, 2, 32, 4)
    model = kvcache.HybridModel(g, "turbo4", [kvcache.LayerSpec.full(), kvcache.LayerSpec.window(2, 5)])
    if paged:
        seq = kvcache.HybridSequence.paged(model, model.create_pools([16, 16]), sinks=2, recent=6)
        bare = kvcache.HybridSequence.paged(model, model.create_pools([16, 16]))
    else:
        seq = kvcache.HybridSequence.contiguous(model, sinks=2, recent=6)
        bare = kvcache.HybridSequence.contiguous(model)
    plain = kvcache.SequenceCache.contiguous(kvcache.Geometry(1, 2, 32, 4), "turbo4", sinks=2, recent=6)
    k, v = rows(rng, 2, 24, 2, 32), rows(rng, 2, 24, 2, 32)
    seq.append(k, v)
    bare.append(k, v)
    plain.append(k[:1], v[:1])
    q = rng.standard_normal((4, 32)).astype(np.float32)
    np.testing.assert_array_equal(seq.attend(0, q), kvcache.attend_decode(plain, 0, q))
    assert not np.array_equal(seq.attend(0, q), bare.attend(0, q))
    np.testing.assert_array_equal(seq.attend(1, q), bare.attend(1, q))
    h2o = kvcache.EvictionPolicy.heavy_hitter(2, 4)
    keep = kvcache.EvictionPolicy.keep_all()
    evicting = kvcache.HybridModel(g, "turbo4", [kvcache.LayerSpec.full(), kvcache.LayerSpec.full([keep, h2o])])
    with pytest.raises(kvcache.InvalidArgument, match="keep every row"):
        kvcache.HybridSequence.contiguous(evicting, sinks=2)


def test_prefix_cache_reuses_blocks(rng):
    g = kvcache.Geometry(2, 2, 16, 4)
    pool = kvcache.BlockPool(g, "f32", num_blocks=16)
    pc = kvcache.PrefixCache(pool)
    tokens = np.arange(10, dtype=np.uint32)
    a = kvcache.SequenceCache.paged(pool)
    k = rows(rng, 2, 10, 2, 16)
    a.append(k, k)
    assert pc.publish_sequence(a, tokens) == 2
    assert pc.peek(tokens) == 8 and pc.peek(tokens, salt="other") == 0
    b = kvcache.SequenceCache.paged(pool)
    assert pc.adopt_into(b, tokens) == 8
    np.testing.assert_array_equal(b.block_table, a.block_table[:2])
    np.testing.assert_array_equal(b.head_keys(1, 1), k[1, :8, 1])
    s = pc.stats()
    assert s["lookups"] == 1 and s["hit_tokens"] == 8 and s["hit_rate"] == pytest.approx(0.8)
    assert sum(s["miss_tokens"].values()) == 2
    a.release()
    b.release()
    assert pool.cached_blocks == 2  # parked for reuse, not freed
    pc.check_invariants()
    c = kvcache.SequenceCache.paged(pool)
    assert pc.adopt_into(c, tokens) == 8


def test_simulate_and_eval(rng):
    r = kvcache.simulate("turbo4", workload="shared-prefix", num_requests=40,
                         pool_bytes=256 << 20)
    assert r["kv_format"] == "turbo4:turbo4" and r["requests"] == 40
    assert 0 < r["prefix_hit_rate"] <= 1 and r["num_blocks"] > 0
    bf = kvcache.simulate("bf16", workload="shared-prefix", num_requests=40, pool_bytes=256 << 20)
    assert r["num_blocks"] > 3 * bf["num_blocks"]
    with pytest.raises(kvcache.InvalidArgument):
        kvcache.simulate("bf16", model="nope")

    keys = rng.standard_normal((256, 2, 64)).astype(np.float32)
    values = rng.standard_normal((256, 2, 64)).astype(np.float32)
    queries = rng.standard_normal((8, 4, 64)).astype(np.float32)
    res = kvcache.eval(keys, values, queries, ["f32", "bf16", "turbo4", "q4_0"])
    by = {x["kv_format"]: x for x in res}
    assert by["f32:f32"]["k_nmse"] == 0 and by["f32:f32"]["attn_kl"] == 0
    assert by["bf16:bf16"]["k_nmse"] < 1e-4 < by["turbo4:turbo4"]["k_nmse"]
    assert by["turbo4:turbo4"]["k_bits"] == pytest.approx(4.5)
    with pytest.raises(kvcache.InvalidArgument):
        kvcache.eval(keys, values[:10], queries, ["f32"])
    with pytest.raises(kvcache.InvalidArgument):
        kvcache.eval(keys[:, :, :8], values[:, :, :8], queries[:, :, :8], ["turbo4"])


def test_offload_tiers_serve_a_fresh_pool(rng, tmp_path):
    """Blocks published in one pool come back bit-exact into another pool through
    the disk tier (as a second process would see them); another model misses."""
    g = kvcache.Geometry(2, 2, 32, 4)
    tokens = np.arange(100, 110, dtype=np.uint32)
    k = rows(rng, 2, 10, 2, 32)
    pool_a = kvcache.BlockPool(g, "bf16:q8_0", num_blocks=8)
    host = kvcache.host_tier(64 << 20)
    disk = kvcache.disk_tier(str(tmp_path / "tier"), 64 << 20)
    oc_a = kvcache.OffloadCache(pool_a, [host, disk], model="test-model")
    a = kvcache.SequenceCache.paged(pool_a)
    a.append(k, -k)
    assert oc_a.publish_sequence(a, tokens) == 2
    oc_a.flush()
    st = oc_a.stats()
    assert [t["name"] for t in st["tiers"]] == [host.name, disk.name]
    assert all(t["stored_blocks"] == 2 for t in st["tiers"])
    assert disk.usage()["objects"] == 2

    disk_again = kvcache.disk_tier(str(tmp_path / "tier"), 64 << 20)  # reopened: index rebuilt
    assert disk_again.usage()["recovered_objects"] == 2
    pool_b = kvcache.BlockPool(g, "bf16:q8_0", num_blocks=8)
    oc_b = kvcache.OffloadCache(pool_b, [disk_again], model="test-model")
    b = kvcache.SequenceCache.paged(pool_b)
    n, by = oc_b.adopt_into(b, tokens)
    assert n == 8 and by["pool"] == 0 and by[disk_again.name] == 8
    for layer in range(2):
        for head in range(2):
            np.testing.assert_array_equal(b.head_keys(layer, head), a.head_keys(layer, head)[:8])
            np.testing.assert_array_equal(b.head_values(layer, head), a.head_values(layer, head)[:8])
    b.check_invariants()

    pool_c = kvcache.BlockPool(g, "bf16:q8_0", num_blocks=8)
    oc_c = kvcache.OffloadCache(pool_c, [kvcache.disk_tier(str(tmp_path / "tier"))], model="other")
    c = kvcache.SequenceCache.paged(pool_c)
    assert oc_c.adopt_into(c, tokens)[0] == 0
    with pytest.raises(kvcache.Error):
        kvcache.disk_tier("/proc/no-such-dir/x")
    with pytest.raises(kvcache.InvalidArgument):
        kvcache.redis_tier("http://nope")


def test_offload_carries_a_turbo4_sequences_calibration(rng, tmp_path):
    """A turbo4 sequence calibrates per head (rows with channel offsets get a mean);
    its blocks and its calibration go to the disk tier, and a fresh pool over the
    reopened folder adopts them: the decoded rows are the same floats."""
    g = kvcache.Geometry(2, 2, 32, 4)
    tokens = np.arange(200, 222, dtype=np.uint32)  # 5 full blocks and 2 tokens
    offsets = np.linspace(-3.0, 3.0, 32, dtype=np.float32)
    k = rows(rng, 2, 22, 2, 32) * 0.3 + offsets
    v = rows(rng, 2, 22, 2, 32) * 0.3 - offsets
    pool_a = kvcache.BlockPool(g, "turbo4:turbo4", num_blocks=16)
    oc_a = kvcache.OffloadCache(pool_a, [kvcache.disk_tier(str(tmp_path / "t"))], model="m")
    a = kvcache.SequenceCache.paged(pool_a)
    a.append(k, v)
    assert oc_a.publish_sequence(a, tokens) == 5
    oc_a.flush()
    assert oc_a.stats()["tiers"][0]["stored_blocks"] == 5

    disk = kvcache.disk_tier(str(tmp_path / "t"))  # reopened: blocks + the calibration object
    assert disk.usage()["recovered_objects"] == 6
    pool_b = kvcache.BlockPool(g, "turbo4:turbo4", num_blocks=16)
    oc_b = kvcache.OffloadCache(pool_b, [disk], model="m")
    b = kvcache.SequenceCache.paged(pool_b)
    n, by = oc_b.adopt_into(b, tokens)
    assert n == 20 and by[disk.name] == 20
    for layer in range(2):
        for head in range(2):
            np.testing.assert_array_equal(b.head_keys(layer, head), a.head_keys(layer, head)[:20])
            np.testing.assert_array_equal(b.head_values(layer, head), a.head_values(layer, head)[:20])
    assert oc_b.stats()["tiers"][0]["misses"]["incompatible"] == 0
    b.check_invariants()
