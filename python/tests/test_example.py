"""The numpy LLaMA of examples/python keeps its K/V in kvcache and agrees with the
C++ decoder (model/decoder/decoder.cc, through the kvcache CLI): the same greedy tokens and
the same teacher-forced mean NLL within float rounding.

Needs stories260K from the repository's testdata/ folder, and the CLI
(KVCACHE_CLI, set by ctest). Without them the test says so and skips; under CI
(CI=true) their absence is a failure."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "python"))
import llama_numpy  # noqa: E402

TESTDATA = pathlib.Path(os.environ.get("KVCACHE_TESTDATA_DIR", ROOT / "testdata"))
MODEL = TESTDATA / "stories260K"
CLI = os.environ.get("KVCACHE_CLI", str(ROOT / "build" / "release" / "tools" / "kvcache"))
PROMPT = "Once upon a time, there was a little dog named Tim. Tim liked to"


def need(path):
    if not pathlib.Path(path).exists():
        msg = f"{path} is absent: this test needs stories260K and the kvcache CLI"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


def cli_json(*args):
    out = subprocess.run([CLI, *args, "--model", str(MODEL / "stories260K_v1.bin"),
                          "--tokenizer", str(MODEL / "tokenizer.bin"), "--json"],
                         check=True, capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout)


@pytest.mark.parametrize("formats", ["f32", "bf16:q8"])
def test_numpy_llama_matches_cpp_decoder(formats):
    need(MODEL / "stories260K_v1.bin")
    need(CLI)
    gen = cli_json("generate", "--prompt", PROMPT, "--steps", "24", "--kv-format", formats, "--matmul", "f32")
    ppl = cli_json("perplexity", "--prompt", PROMPT, "--kv-format", formats)
    prompt = gen["prompt_tokens"]
    assert ppl["num_predictions"] == len(prompt) - 1

    model = llama_numpy.NumpyLlama(llama_numpy.Checkpoint(MODEL / "stories260K_v1.bin"), formats)
    nll, logits = [], None
    for t in prompt:
        if logits is not None:
            nll.append(-llama_numpy.log_softmax(logits)[t])
        logits = model.step(t)
    out = []
    for _ in range(24):
        out.append(int(np.argmax(logits)))
        logits = model.step(out[-1])
    assert out == gen["generated_tokens"]
    assert float(np.mean(nll)) == pytest.approx(ppl["mean_nll"], rel=1e-4, abs=1e-6)
    assert model.cache.num_tokens == len(prompt) + 24
    assert model.cache.formats == gen["kv_format"]
