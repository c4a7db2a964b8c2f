"""Shared fixtures: small geometries, seeded generators, a numpy attention reference."""
import numpy as np
import pytest

import kvcache


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def geometry():
    return kvcache.Geometry(n_layers=2, n_kv_heads=2, head_dim=32, block_size=4)


def reference_attention(keys, values, q, positions=None, scale=0.0, window=0, n_sink=0,
                        query_pos=None):
    """Plain float64 attention of one query over one kv head's rows.

    keys, values: [rows, head_dim]; q: [group, head_dim]. Returns out [group, head_dim],
    lse [group], probs [group, rows]. Visibility follows attention.h: causal by
    position, with a window W rows at positions > p - W or < n_sink stay visible.
    """
    rows, d = keys.shape
    if scale == 0.0:
        scale = 1.0 / np.sqrt(d)
    positions = np.arange(rows) if positions is None else np.asarray(positions)
    p = positions.max() if query_pos is None else query_pos
    visible = positions <= p
    if window:
        visible &= (positions > p - window) | (positions < n_sink)
    s = scale * (q.astype(np.float64) @ keys.astype(np.float64).T)  # [group, rows]
    s = np.where(visible[None, :], s, -np.inf)
    m = s.max(axis=1, keepdims=True)
    e = np.exp(s - m)
    l = e.sum(axis=1, keepdims=True)
    probs = e / l
    out = probs @ values.astype(np.float64)
    lse = (m + np.log(l))[:, 0]
    return out, lse, probs
