"""`kvcache serve` on Gemma 3 270M, a model with sliding-window layers: a
conversation's later turns and a second conversation on the same system
prompt are served from cached blocks of both layer groups (the window
group's included, after the window slid past them), each answer equal to
`kvcache generate`'s for the same whole prompt, and both pools go back to
their baseline after a client leaves mid-stream."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import server_fixture as sf  # noqa: E402

openai = pytest.importorskip("openai")

# f32 K/V: the answers must equal generate's bit for bit (bf16 products for
# speed, the same in both); passes of up to 512 tokens in both, so both keep
# the same window rows.
ARGS = ["--kv-format", "f32", "--matmul", "bf16", "--context", "4096", "--pool-mib", "192", "--threads", "2",
        "--max-batch-tokens", "512"]
STEPS = 16


@pytest.fixture(scope="module")
def gemma():
    sf.need_gemma()
    server = sf.Server(["--model", str(sf.GEMMA), *ARGS], startup_timeout=120)
    yield server
    assert server.terminate() == 0, "".join(server.stderr_lines)


def generate(prompt, steps=STEPS):
    cmd = [sf.CLI, "generate", "--model", str(sf.GEMMA), "--prompt", prompt, "--steps", str(steps),
           "--kv-format", "f32", "--matmul", "bf16", "--threads", "2", "--json"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


paragraph = sf.paragraph


SYSTEM = "You are a careful assistant. Here are the notes for today: " + paragraph(1, 520) + "\n"


def ask(client, prompt):
    r = client.completions.create(model="m", prompt=prompt, max_tokens=STEPS, temperature=0)
    return r.choices[0].text, r.usage


def test_conversation_turns_reuse_their_history_and_answer_as_generate(gemma):
    client = gemma.client()
    prompt = SYSTEM + "User: " + paragraph(2, 80) + "\nModel:"
    previous = None
    for turn in range(3):
        text, usage = ask(client, prompt)
        ref = generate(prompt)
        assert ref["text"].endswith(text), (turn, text)
        assert usage.completion_tokens == len(ref["generated_tokens"])
        if previous is not None:
            # Everything the previous turn computed, less at most one block.
            assert usage.prompt_tokens_details.cached_tokens >= previous.prompt_tokens - 16, (turn, usage)
        previous = usage
        prompt = prompt + text + "\nUser: " + paragraph(3 + turn, 60) + "\nModel:"
    # The history is longer than the 512-position window.
    assert previous.prompt_tokens > 700


def test_second_conversation_reuses_the_system_prompt_past_the_window(gemma):
    client = gemma.client()
    # The first conversation runs its window past the system prompt: from
    # 2,047 positions on (window 512, lookback 511, slack 512) its window
    # layers keep nothing before position 1,024.
    _, first = ask(client, SYSTEM + "User: " + paragraph(10, 1600) + "\nModel:")
    assert first.prompt_tokens > 2100
    prompt = SYSTEM + "User: " + paragraph(11, 40) + "\nModel:"
    text, usage = ask(client, prompt)
    system_tokens = len(generate(SYSTEM, steps=1)["prompt_tokens"])
    assert usage.prompt_tokens_details.cached_tokens >= system_tokens - 16, usage
    assert generate(prompt)["text"].endswith(text)


def test_both_pools_back_at_baseline_after_a_disconnect(gemma):
    base = gemma.wait_idle()
    groups = ("full", "window")
    for g in groups:
        assert base[f'kvcache_pool_group_blocks{{group="{g}",state="used"}}'] == 0
    s = sf.open_stream(gemma.port, {"prompt": SYSTEM + "User: tell me more.\nModel:", "max_tokens": 300,
                                    "stream": True, "ignore_eos": True}, timeout=60)
    during = gemma.metrics()
    for g in groups:
        assert during[f'kvcache_pool_group_blocks{{group="{g}",state="used"}}'] > 0
    s.close()
    m = gemma.wait_idle(timeout=30)
    assert m["kvcache_requests_running"] == 0
    for g in groups:
        assert m[f'kvcache_pool_group_blocks{{group="{g}",state="used"}}'] == 0
        assert m[f'kvcache_pool_group_blocks{{group="{g}",state="reserved"}}'] == 0
