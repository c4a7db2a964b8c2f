"""A LLaMA forward pass in numpy whose K/V live in kvcache.

Runs a llama2.c "version 1" checkpoint (stories260K: dim 64, 5 layers, 8 q heads,
4 kv heads, head_dim 8) token by token: embedding, per layer RMSNorm, Q/K/V
projections, RoPE (pairs (2i, 2i+1) rotated by pos * 10000^(-i/head_dim)),
K/V appended to a kvcache.SequenceCache, GQA attention by kvcache.attend_decode,
the output projection and a SwiGLU MLP; then the final norm and the classifier.
This is the same model as model/decoder/decoder.cc, written independently in numpy, so
tests can check that the two agree (python/tests/test_example.py).

    python3 examples/python/llama_numpy.py CHECKPOINT.bin --tokens 1,403,407,261,378 --steps 8

The checkpoint ships with the repository as test data:
testdata/stories260K/stories260K_v1.bin (see testdata/stories260K/README.md).
"""
import argparse
import sys

import numpy as np

import kvcache

MAGIC = 0x616B3432  # "ak42"


class Checkpoint:
    """llama2.c version 1 checkpoint: 256-byte header, then f32 weights (out x in)."""

    def __init__(self, path):
        raw = np.fromfile(path, dtype=np.uint8)
        if raw.size < 256:
            raise ValueError(f"{path}: {raw.size} bytes is shorter than the 256-byte header")
        head = raw[:256]
        magic, version = head[:8].view(np.uint32)[0], head[4:8].view(np.int32)[0]
        if magic != MAGIC or version != 1:
            raise ValueError(f"{path}: not a llama2.c version 1 checkpoint")
        (self.dim, self.hidden, self.n_layers, self.n_heads, self.n_kv_heads, self.vocab,
         self.max_seq_len) = (int(x) for x in head[8:36].view(np.int32))
        shared = bool(head[36])
        self.head_dim = self.dim // self.n_heads
        kv_dim = self.head_dim * self.n_kv_heads
        w = raw[256:].view(np.float32)
        off = 0

        def take(*shape):
            nonlocal off
            n = int(np.prod(shape))
            if off + n > w.size:
                raise ValueError(f"{path}: truncated weights")
            a = w[off:off + n].reshape(shape)
            off += n
            return a

        L, d, h = self.n_layers, self.dim, self.hidden
        self.rms_att, self.rms_ffn, self.rms_final = take(L, d), take(L, d), take(d)
        self.embedding = take(self.vocab, d)
        self.wq, self.wk, self.wv, self.wo = take(L, d, d), take(L, kv_dim, d), take(L, kv_dim, d), take(L, d, d)
        self.w1, self.w2, self.w3 = take(L, h, d), take(L, d, h), take(L, h, d)
        self.classifier = self.embedding if shared else take(self.vocab, d)
        if off != w.size:
            raise ValueError(f"{path}: {w.size - off} weights left over")


def rms_norm(x, weight):
    return weight * (x / np.sqrt(np.mean(x * x, dtype=np.float32) + np.float32(1e-5)))


def rope(vec, n_heads, head_dim, pos):
    """Rotates pairs (2i, 2i+1) of vec [n_heads * head_dim] for position pos."""
    v = vec.reshape(n_heads, head_dim // 2, 2)
    i = np.arange(0, head_dim, 2, dtype=np.float32)
    angle = np.float32(pos) * (np.float32(1.0) / np.power(np.float32(10000.0), i / np.float32(head_dim)))
    c, s = np.cos(angle), np.sin(angle)
    a, b = v[..., 0], v[..., 1]
    return np.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(-1)


class NumpyLlama:
    """The model with its K/V in a kvcache cache of the given formats."""

    def __init__(self, ckpt, formats="f32", block_size=16):
        self.m = ckpt
        self.geometry = kvcache.Geometry(ckpt.n_layers, ckpt.n_kv_heads, ckpt.head_dim, block_size)
        self.cache = kvcache.SequenceCache.contiguous(self.geometry, formats)

    def step(self, token):
        """Runs one token at the next position; returns its logits [vocab] (f32)."""
        m, c = self.m, self.cache
        pos = c.num_tokens
        x = m.embedding[token].copy()
        for layer in range(m.n_layers):
            xb = rms_norm(x, m.rms_att[layer])
            q = rope(m.wq[layer] @ xb, m.n_heads, m.head_dim, pos)
            k = rope(m.wk[layer] @ xb, m.n_kv_heads, m.head_dim, pos)
            v = m.wv[layer] @ xb
            c.append(k.reshape(1, m.n_kv_heads, m.head_dim), v.reshape(1, m.n_kv_heads, m.head_dim),
                     layer=layer)
            att = kvcache.attend_decode(c, layer, q.reshape(m.n_heads, m.head_dim)).reshape(-1)
            x = x + m.wo[layer] @ att
            xb = rms_norm(x, m.rms_ffn[layer])
            a = m.w1[layer] @ xb
            x = x + m.w2[layer] @ (a / (np.float32(1) + np.exp(-a)) * (m.w3[layer] @ xb))
        return m.classifier @ rms_norm(x, m.rms_final)


def log_softmax(logits):
    z = logits.astype(np.float64)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--tokens", required=True, help="prompt token ids, comma-separated (BOS first)")
    ap.add_argument("--steps", type=int, default=16, help="greedy tokens to generate")
    ap.add_argument("--formats", default="f32", help="K:V formats of the cache")
    args = ap.parse_args(argv)
    model = NumpyLlama(Checkpoint(args.checkpoint), args.formats)
    prompt = [int(t) for t in args.tokens.split(",")]
    nll = []
    logits = None
    for i, t in enumerate(prompt):
        if logits is not None:
            nll.append(-log_softmax(logits)[t])
        logits = model.step(t)
    out = []
    for _ in range(args.steps):
        t = int(np.argmax(logits))
        out.append(t)
        logits = model.step(t)
    print("prompt mean nll:", float(np.mean(nll)) if nll else float("nan"))
    print("generated:", ",".join(map(str, out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
