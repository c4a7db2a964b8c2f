"""Randomized model-based test (hypothesis): cache operations on a small paged pool
against a trivially correct model (per sequence, the list of K/V rows it holds).

After every step: each live sequence's decoded rows equal the model exactly (f32),
the pool's used blocks equal the distinct blocks in live block tables, each block's
refcount equals the number of tables holding it, and the pool's invariants hold.
A failed operation (PoolExhausted) must change nothing. At the end everything
released leaves the pool full."""
import numpy as np
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import kvcache

G = kvcache.Geometry(n_layers=2, n_kv_heads=2, head_dim=16, block_size=4)
NUM_BLOCKS = 12


class CacheMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.pool = kvcache.BlockPool(G, "f32", num_blocks=NUM_BLOCKS, huge_pages=False)
        self.seqs = []   # [SequenceCache]
        self.model = []  # per sequence: K rows [layers][tokens][heads][dim] as one array
        self.counter = 0

    def rows(self, n):
        self.counter += 1
        r = np.random.default_rng(self.counter)
        return r.standard_normal((G.n_layers, n, G.n_kv_heads, G.head_dim)).astype(np.float32)

    @precondition(lambda self: len(self.seqs) < 5)
    @rule(reserve=st.integers(0, 24))
    def create(self, reserve):
        before = self.pool.stats()
        try:
            s = kvcache.SequenceCache.paged(self.pool, reserve_tokens=reserve)
        except kvcache.PoolExhausted:
            after = self.pool.stats()
            assert (after.free_blocks, after.reserved_blocks) == (before.free_blocks, before.reserved_blocks)
            return
        self.seqs.append(s)
        self.model.append(np.zeros((G.n_layers, 0, G.n_kv_heads, G.head_dim), np.float32))

    @precondition(lambda self: self.seqs)
    @rule(i=st.integers(0, 4), n=st.integers(1, 9))
    def append(self, i, n):
        i %= len(self.seqs)
        k = self.rows(n)
        try:
            self.seqs[i].append(k, -k)
        except kvcache.PoolExhausted:
            return  # checked by the invariants: the model did not change
        self.model[i] = np.concatenate([self.model[i], k], axis=1)

    @precondition(lambda self: self.seqs)
    @rule(i=st.integers(0, 4), keep=st.integers(0, 40))
    def truncate(self, i, keep):
        i %= len(self.seqs)
        n = self.model[i].shape[1]
        if keep > n:
            try:
                self.seqs[i].truncate(keep)
                raise AssertionError("truncate past the end succeeded")
            except kvcache.OutOfRange:
                return
        self.seqs[i].truncate(keep)
        self.model[i] = self.model[i][:, :keep]

    @precondition(lambda self: self.seqs and len(self.seqs) < 5)
    @rule(i=st.integers(0, 4))
    def fork(self, i):
        i %= len(self.seqs)
        try:
            child = self.seqs[i].fork()
        except kvcache.PoolExhausted:
            return
        self.seqs.append(child)
        self.model.append(self.model[i].copy())

    @precondition(lambda self: self.seqs and len(self.seqs) < 5)
    @rule(i=st.integers(0, 4))
    def clone_paged(self, i):
        i %= len(self.seqs)
        try:
            c = self.seqs[i].clone(same_layout=True)
        except kvcache.PoolExhausted:
            return
        self.seqs.append(c)
        self.model.append(self.model[i].copy())

    @precondition(lambda self: self.seqs)
    @rule(i=st.integers(0, 4))
    def release(self, i):
        i %= len(self.seqs)
        self.seqs.pop(i).release()
        self.model.pop(i)

    @precondition(lambda self: self.seqs)
    @rule(i=st.integers(0, 4))
    def clear(self, i):
        i %= len(self.seqs)
        self.seqs[i].clear()
        self.model[i] = self.model[i][:, :0]

    @precondition(lambda self: self.seqs)
    @rule(i=st.integers(0, 4), tokens=st.integers(0, 30))
    def reserve(self, i, tokens):
        i %= len(self.seqs)
        try:
            self.seqs[i].reserve(tokens)
        except kvcache.PoolExhausted:
            pass

    @invariant()
    def contents_match_model(self):
        for s, m in zip(self.seqs, self.model):
            assert s.num_tokens == m.shape[1]
            for layer in range(G.n_layers):
                for head in range(G.n_kv_heads):
                    np.testing.assert_array_equal(s.head_keys(layer, head), m[layer, :, head])
                    np.testing.assert_array_equal(s.head_values(layer, head), -m[layer, :, head])

    @invariant()
    def pool_accounting(self):
        held = {}
        for s in self.seqs:
            for b in s.block_table:
                held[int(b)] = held.get(int(b), 0) + 1
        stats = self.pool.stats()
        assert stats.used_blocks == len(held)
        for b, n in held.items():
            assert self.pool.refcount(b) == n
        assert stats.free_blocks + stats.cached_blocks + stats.used_blocks == NUM_BLOCKS
        assert stats.reserved_blocks == sum(s.reserved_blocks for s in self.seqs)
        self.pool.check_invariants()
        for s in self.seqs:
            s.check_invariants()

    def teardown(self):
        for s in self.seqs:
            s.release()
        assert self.pool.free_blocks == NUM_BLOCKS and self.pool.reserved_blocks == 0
        self.pool.check_invariants()


CacheMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40,
                                          deadline=None, derandomize=True)
TestCacheModel = CacheMachine.TestCase
