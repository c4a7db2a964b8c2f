"""Bad input from Python is an exception with the library's message; nothing crashes,
nothing changes."""
import numpy as np
import pytest

import kvcache


@pytest.fixture
def seq(geometry):
    pool = kvcache.BlockPool(geometry, "f32", num_blocks=8)
    s = kvcache.SequenceCache.paged(pool)
    s.append(np.ones((2, 3, 2, 32), np.float32), np.ones((2, 3, 2, 32), np.float32))
    return s


def unchanged(seq):
    assert seq.num_tokens == 3
    seq.check_invariants()


@pytest.mark.parametrize("shape", [(2, 3, 2), (2, 3, 2, 31), (1, 3, 2, 32), (2, 0, 2, 32),
                                   (2, 3, 3, 32), (6, 2, 32)])
def test_wrong_shapes(seq, shape):
    a = np.zeros(shape, np.float32)
    with pytest.raises(kvcache.InvalidArgument, match="shape"):
        seq.append(a, a)
    unchanged(seq)


def test_mismatched_k_v(seq):
    with pytest.raises(ValueError, match="same shape"):
        seq.append(np.zeros((2, 1, 2, 32), np.float32), np.zeros((2, 2, 2, 32), np.float32))
    unchanged(seq)


def test_non_finite_values(seq):
    k = np.zeros((2, 1, 2, 32), np.float32)
    k[1, 0, 1, 7] = np.nan
    with pytest.raises(kvcache.InvalidArgument):
        seq.append(k, np.zeros_like(k))
    unchanged(seq)
    q = np.ones((2, 32), np.float32)
    q[0, 3] = np.inf
    with pytest.raises(kvcache.InvalidArgument):
        kvcache.attend_decode(seq, 0, q)


def test_conversions_copy(seq):
    """float64, strided and Fortran-ordered inputs are copied into float32."""
    k = np.asfortranarray(np.ones((2, 1, 2, 32)))
    seq.append(k, k[:, :, :, :])
    big = np.ones((2, 2, 2, 64), np.float32)[:, :1, :, ::2]
    seq.append(big, big)
    assert seq.num_tokens == 5
    np.testing.assert_array_equal(seq.head_keys(0, 0), np.ones((5, 32), np.float32))


@pytest.mark.parametrize("bad", ["abc", None, 3, [[1, 2]], object()])
def test_unconvertible(seq, bad):
    with pytest.raises((TypeError, ValueError)):
        seq.append(bad, bad)
    unchanged(seq)


def test_indices_out_of_range(seq):
    with pytest.raises(kvcache.OutOfRange):
        seq.head_keys(2, 0)
    with pytest.raises(IndexError):
        seq.head_keys(0, 2)
    with pytest.raises(kvcache.OutOfRange):
        kvcache.attend_decode(seq, 5, np.ones((2, 32), np.float32))
    with pytest.raises(kvcache.OutOfRange):
        seq.append(np.zeros((1, 2, 32), np.float32), np.zeros((1, 2, 32), np.float32), layer=9)
    with pytest.raises(TypeError):
        seq.truncate(-1)
    unchanged(seq)


def test_attention_bad_queries(seq):
    with pytest.raises(kvcache.InvalidArgument, match="shape"):
        kvcache.attend_decode(seq, 0, np.ones((2, 31), np.float32))
    with pytest.raises(kvcache.InvalidArgument):
        kvcache.attend_decode(seq, 0, np.ones((3, 32), np.float32))  # not a multiple of kv heads
    with pytest.raises(kvcache.InvalidArgument, match="shape"):
        kvcache.attend_multi(seq, 0, np.ones((2, 32), np.float32))
    with pytest.raises(kvcache.InvalidArgument):
        kvcache.attend_multi(seq, 0, np.ones((4, 2, 32), np.float32))  # more queries than tokens
    with pytest.raises(kvcache.InvalidArgument):
        kvcache.attend_decode_batch([], 0, np.ones((0, 2, 32), np.float32))
    with pytest.raises(kvcache.InvalidArgument):
        kvcache.attend_decode_batch([seq], 0, np.ones((2, 2, 32), np.float32))
    with pytest.raises(kvcache.InvalidArgument):
        kvcache.attend_decode(seq, 0, np.ones((2, 32), np.float32), window=99)


def test_alive_mask_shapes(seq):
    a = np.zeros((2, 1, 2, 32), np.float32)
    with pytest.raises(kvcache.InvalidArgument, match="alive"):
        seq.append(a, a, alive=np.ones(3, np.uint8))
    seq.append(a, a, alive=np.array([1, 0], np.uint8))
    assert seq.head_len(0, 1) == 3 and seq.head_len(0, 0) == 4


def test_released_cache(seq):
    seq.release()
    with pytest.raises(kvcache.FailedPrecondition):
        seq.head_keys(0, 0)
    with pytest.raises(kvcache.FailedPrecondition):
        kvcache.attend_decode(seq, 0, np.ones((2, 32), np.float32))
    with pytest.raises(kvcache.FailedPrecondition):
        seq.fork()


def test_paged_without_pool():
    with pytest.raises((TypeError, ValueError)):
        kvcache.SequenceCache.paged(None)
