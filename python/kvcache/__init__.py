"""kvcache: the key/value cache of LLM inference, from Python.

The C++ library's public API in Python's conventions: snake_case, keyword
arguments for options, numpy float32 arrays in and out (shapes are written as
``[tokens, kv_heads, head_dim]`` in the docstrings). Errors are exceptions:
``kvcache.Error`` and one subclass per status code (``InvalidArgument`` is
also a ``ValueError``, ``OutOfRange`` an ``IndexError``, ...).

Arrays handed out are copies that own their memory, except
``BlockPool.arena()``, a read-only zero-copy view that keeps its pool alive.

    >>> import numpy as np, kvcache
    >>> g = kvcache.Geometry(n_layers=2, n_kv_heads=2, head_dim=64, block_size=16)
    >>> pool = kvcache.BlockPool(g, "bf16:turbo4", num_blocks=64)
    >>> with kvcache.SequenceCache.paged(pool, reserve_tokens=100) as seq:
    ...     k = np.random.rand(2, 10, 2, 64).astype(np.float32)
    ...     seq.append(k, k)
    ...     out = kvcache.attend_decode(seq, 0, np.ones((4, 64), np.float32))
"""
from ._kvcache import *  # noqa: F401,F403
from ._kvcache import (  # noqa: F401  (named for readers and linters)
    BlockPool,
    CapacityExceeded,
    Corruption,
    Error,
    FailedPrecondition,
    Geometry,
    Internal,
    InvalidArgument,
    IoError,
    NotFound,
    OutOfRange,
    PoolExhausted,
    SequenceCache,
    ThreadPool,
    Unimplemented,
    attend_decode,
    attend_decode_batch,
    attend_decode_head,
    attend_multi,
)

__version__ = "0.1.0"
