"""SequenceCache and BlockPool from Python: exact f32 round trips, accounting,
lifetimes of handed-out arrays, fork/clone/reserve, the context manager."""
import gc

import numpy as np
import pytest

import kvcache


def kv(rng, geometry, tokens):
    shape = (geometry.n_layers, tokens, geometry.n_kv_heads, geometry.head_dim)
    return (rng.standard_normal(shape).astype(np.float32),
            rng.standard_normal(shape).astype(np.float32))


def test_geometry_and_formats():
    g = kvcache.Geometry(32, 8, 128)
    assert (g.n_layers, g.n_kv_heads, g.head_dim, g.block_size, g.kv_dim) == (32, 8, 128, 16, 1024)
    assert g == kvcache.Geometry(32, 8, 128, 16)
    assert "bf16" in kvcache.format_names() and "turbo4" in kvcache.format_names()
    assert kvcache.parse_formats("bf16") == "bf16:bf16"
    assert kvcache.parse_formats("q8_0:turbo4") == "q8_0:turbo4"
    assert kvcache.bits_per_value("q8_0", 128) == pytest.approx(8.5)
    assert kvcache.row_bytes("bf16", 128) == 256
    with pytest.raises(kvcache.InvalidArgument, match="turbo"):
        kvcache.row_bytes("turbo4", 8)
    with pytest.raises(ValueError):
        kvcache.Geometry(0, 8, 128)
    assert kvcache.simd_target() in kvcache.supported_simd_targets()


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_f32_round_trip_is_exact(rng, geometry, layout):
    pool = kvcache.BlockPool(geometry, "f32", num_blocks=16) if layout == "paged" else None
    seq = (kvcache.SequenceCache.paged(pool) if pool else
           kvcache.SequenceCache.contiguous(geometry))
    k, v = kv(rng, geometry, 7)
    seq.append(k, v)
    k1, v1 = kv(rng, geometry, 1)
    seq.append(k1[1, 0], v1[1, 0], layer=1)  # one token, one layer
    assert seq.num_tokens == 8 and seq.layer_tokens(0) == 7 and seq.layer_tokens(1) == 8
    for layer in range(2):
        for head in range(2):
            want_k = k[layer, :, head]
            want_v = v[layer, :, head]
            if layer == 1:
                want_k = np.concatenate([want_k, k1[1, 0, head][None]])
                want_v = np.concatenate([want_v, v1[1, 0, head][None]])
            np.testing.assert_array_equal(seq.head_keys(layer, head), want_k)
            np.testing.assert_array_equal(seq.head_values(layer, head), want_v)
            np.testing.assert_array_equal(seq.head_positions(layer, head),
                                          np.arange(len(want_k), dtype=np.uint32))
    seq.check_invariants()
    if pool:
        assert seq.block_table.dtype == np.uint32 and len(seq.block_table) == 2
        np.testing.assert_array_equal(seq.context_lens, np.array([8], np.uint32))
        assert pool.used_blocks == 2
        assert seq.allocated_bytes == 2 * pool.block_bytes
    else:
        assert len(seq.block_table) == 0 and len(seq.context_lens) == 0
    assert seq.used_bytes == (7 + 8) * 2 * 2 * 32 * 4


def test_pool_accounting_and_exhaustion(rng, geometry):
    pool = kvcache.BlockPool(geometry, "bf16:q8_0", num_blocks=3)
    assert pool.formats == "bf16:q8_0" and pool.num_blocks == 3
    a = kvcache.SequenceCache.paged(pool, reserve_tokens=8)
    assert pool.reserved_blocks == 2 and pool.available_blocks == 1
    with pytest.raises(kvcache.PoolExhausted):
        kvcache.SequenceCache.paged(pool, reserve_tokens=8)
    s = pool.stats()
    assert (s.free_blocks, s.reserved_blocks, s.available_blocks) == (3, 2, 1)
    k, v = kv(rng, geometry, 8)
    a.append(k, v)
    assert pool.used_blocks == 2 and pool.reserved_blocks == 0
    b = kvcache.SequenceCache.paged(pool)
    k, v = kv(rng, geometry, 5)
    before = pool.stats()
    with pytest.raises(kvcache.PoolExhausted):
        b.append(k, v)  # needs 2 blocks, 1 left: nothing changes
    assert b.num_tokens == 0 and pool.stats().free_blocks == before.free_blocks
    a.release()
    a.release()  # idempotent
    assert pool.free_blocks == 3
    pool.check_invariants()
    with pytest.raises(kvcache.FailedPrecondition):
        a.append(k, v)
    assert isinstance(kvcache.PoolExhausted("x"), kvcache.Error)


def test_bytes_sizing():
    g = kvcache.Geometry(32, 8, 128, 16)
    block = kvcache.BlockPool.block_bytes_for(g, "bf16")
    assert block == 32 * 2 * 8 * 16 * 256
    pool = kvcache.BlockPool(g, "bf16", bytes=10 * block + 5, huge_pages=False)
    assert pool.num_blocks == 10 and pool.storage_bytes == 10 * block
    with pytest.raises(kvcache.InvalidArgument):
        kvcache.BlockPool(g, "bf16", bytes=block - 1)
    with pytest.raises(kvcache.InvalidArgument, match="exactly one"):
        kvcache.BlockPool(g, "bf16", bytes=block, num_blocks=1)
    with pytest.raises(kvcache.InvalidArgument):
        kvcache.BlockPool(g, "nope", num_blocks=1)


def test_fork_shares_blocks_and_copies_on_write(rng, geometry):
    pool = kvcache.BlockPool(geometry, "f32", num_blocks=8)
    parent = kvcache.SequenceCache.paged(pool)
    k, v = kv(rng, geometry, 6)
    parent.append(k, v)
    child = parent.fork()
    assert pool.used_blocks == 2
    assert all(pool.refcount(int(b)) == 2 for b in parent.block_table)
    k2, v2 = kv(rng, geometry, 1)
    child.append(k2, v2)  # writes the shared partial block: copied first
    assert pool.used_blocks == 3
    np.testing.assert_array_equal(parent.head_keys(0, 0), k[0, :, 0])
    np.testing.assert_array_equal(child.head_keys(0, 0), np.concatenate([k[0, :, 0], k2[0, :, 0]]))
    clone = child.clone()
    assert clone.layout == "contiguous" and clone.num_tokens == 7
    paged_clone = child.clone(same_layout=True)
    assert paged_clone.layout == "paged" and pool.used_blocks == 5
    np.testing.assert_array_equal(paged_clone.head_values(1, 1), child.head_values(1, 1))
    for s in (parent, child, clone, paged_clone):
        s.release()
    assert pool.free_blocks == 8
    pool.check_invariants()


def test_truncate_clear_advance_reserve(rng, geometry):
    pool = kvcache.BlockPool(geometry, "f32", num_blocks=8)
    seq = kvcache.SequenceCache.paged(pool)
    k, v = kv(rng, geometry, 9)
    seq.append(k, v)
    seq.truncate(5)
    assert seq.num_tokens == 5 and pool.used_blocks == 2
    np.testing.assert_array_equal(seq.head_keys(1, 0), k[1, :5, 0])
    seq.truncate_last(2)
    assert seq.num_tokens == 3
    with pytest.raises(kvcache.OutOfRange):
        seq.truncate(4)
    with pytest.raises(IndexError):
        seq.truncate_last(4)
    seq.advance_len(2)
    np.testing.assert_array_equal(seq.head_keys(0, 1)[3:], np.zeros((2, 32), np.float32))
    seq.reserve(16)
    assert seq.is_fully_reserved and seq.reserved_blocks == 2
    seq.clear()
    assert seq.num_tokens == 0
    seq.release()
    assert pool.free_blocks == 8 and pool.reserved_blocks == 0


def test_context_manager_releases(rng, geometry):
    pool = kvcache.BlockPool(geometry, "bf16", num_blocks=4)
    with kvcache.SequenceCache.paged(pool) as seq:
        k, v = kv(rng, geometry, 4)
        seq.append(k, v)
        assert pool.used_blocks == 1
    assert seq.released and pool.free_blocks == 4


def test_handed_out_arrays_stay_valid(rng, geometry):
    """Outputs are copies that own their memory, except arena(), which keeps its pool."""
    pool = kvcache.BlockPool(geometry, "f32", num_blocks=4)
    seq = kvcache.SequenceCache.paged(pool)
    k, v = kv(rng, geometry, 4)
    seq.append(k, v)
    keys = seq.head_keys(0, 0)
    table = seq.block_table
    arena = pool.arena(0, "k")
    assert arena.shape == (4, 2, 4, 32 * 4) and arena.dtype == np.uint8
    assert not arena.flags.writeable
    with pytest.raises(ValueError):
        arena[0, 0, 0, 0] = 1
    block = int(table[0])
    row = arena[block, 1, 2].view(np.float32)  # f32 rows: bytes are the values
    np.testing.assert_array_equal(row, k[0, 2, 1])
    seq.release()
    del seq, pool
    gc.collect()
    np.testing.assert_array_equal(keys, k[0, :, 0])  # a copy: still the same
    assert table.shape == (1,)
    np.testing.assert_array_equal(arena[block, 1, 2].view(np.float32), k[0, 2, 1])  # pool kept alive
    with pytest.raises(kvcache.InvalidArgument):
        kvcache.BlockPool(geometry, "f32", num_blocks=1).arena(0, "x")


def test_importance_and_keep_rows(rng, geometry):
    seq = kvcache.SequenceCache.contiguous(geometry)
    k, v = kv(rng, geometry, 5)
    seq.append(k, v)
    p = np.array([0.1, 0.2, 0.3, 0.2, 0.2], np.float32)
    seq.accumulate_importance(0, 1, p)
    seq.accumulate_importance(0, 1, p)
    np.testing.assert_allclose(seq.head_importance(0, 1), 2 * p)
    np.testing.assert_allclose(seq.importance(0), 2 * p)
    np.testing.assert_array_equal(seq.head_importance(0, 0), np.zeros(5, np.float32))
    seq.keep_rows(0, 1, np.array([0, 2, 4], np.uint32))
    assert seq.head_len(0, 1) == 3
    np.testing.assert_array_equal(seq.head_positions(0, 1), np.array([0, 2, 4], np.uint32))
    np.testing.assert_array_equal(seq.head_keys(0, 1), k[0, [0, 2, 4], 1])
    with pytest.raises(kvcache.InvalidArgument):
        seq.keep_rows(0, 1, np.array([2, 1], np.uint32))


def test_lossy_formats_store_close_values(rng):
    g = kvcache.Geometry(1, 2, 64, 16)
    k = rng.standard_normal((1, 20, 2, 64)).astype(np.float32)
    for fmt, tol in [("bf16", 1e-2), ("q8_0", 3e-2), ("turbo8", 8e-2), ("turbo4", 0.3)]:
        seq = kvcache.SequenceCache.contiguous(g, fmt)
        seq.append(k, k)
        err = np.abs(seq.head_keys(0, 1) - k[0, :, 1]).max() / np.abs(k).max()
        assert err < tol, (fmt, err)


class DlpackOnly:
    """An array known only through the DLPack protocol (as a torch CPU tensor is)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, *args, **kwargs):
        return self._a.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_in_and_out(rng, geometry):
    seq = kvcache.SequenceCache.contiguous(geometry)
    k, v = kv(rng, geometry, 3)
    seq.append(DlpackOnly(k), DlpackOnly(v))
    keys = seq.head_keys(1, 1)
    np.testing.assert_array_equal(keys, k[1, :, 1])
    back = np.from_dlpack(keys)  # what torch.from_dlpack does with an output
    np.testing.assert_array_equal(back, k[1, :, 1])
