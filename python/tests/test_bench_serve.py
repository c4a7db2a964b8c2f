"""kvcache.bench_serve, the load generator: its percentile helper against
hand-computed values, its /metrics parser and workloads, and a run against a
real `kvcache serve` (SmolLM2, short outputs) where every request completes
and the tokens it counts are the server's own (usage and /metrics).

Run by ctest (label server) with KVCACHE_CLI set; pytest --noconftest. The
module is loaded from its file, so the extension need not be built."""
import argparse
import asyncio
import importlib.util
import json
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import server_fixture as sf  # noqa: E402

pytest.importorskip("openai")
_spec = importlib.util.spec_from_file_location("bench_serve", HERE.parent / "kvcache" / "bench_serve.py")
bs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bs)

SERVE_ARGS = ["--kv-format", "bf16", "--context", "1024", "--pool-mib", "64", "--threads", "2"]


def test_percentile_hand_computed():
    v = [50, 15, 40, 20, 35]  # sorted: 15 20 35 40 50; rank = 4 * q / 100
    assert bs.percentile(v, 0) == 15
    assert bs.percentile(v, 25) == 20            # rank 1
    assert bs.percentile(v, 40) == pytest.approx(29.0)   # rank 1.6: 20 + 0.6 * 15
    assert bs.percentile(v, 50) == 35            # rank 2
    assert bs.percentile(v, 99) == pytest.approx(49.6)   # rank 3.96: 40 + 0.96 * 10
    assert bs.percentile(v, 100) == 50
    assert bs.percentile([7.5], 99) == 7.5
    assert bs.percentile([], 50) is None
    with pytest.raises(ValueError):
        bs.percentile(v, 101)
    with pytest.raises(ValueError):
        bs.percentile(v, -1)


def test_parse_metrics():
    text = ("# HELP kvcache_requests_running x\n# TYPE kvcache_requests_running gauge\n"
            "kvcache_requests_running 3\n"
            'kvcache_pool_blocks{state="free"} 12\n'
            'kvcache_step_seconds_bucket{le="+Inf"} 7\n\n')
    assert bs.parse_metrics(text) == {"kvcache_requests_running": 3.0,
                                      'kvcache_pool_blocks{state="free"}': 12.0,
                                      'kvcache_step_seconds_bucket{le="+Inf"}': 7.0}


def test_workloads():
    chat = bs.make_workload("chat", 20, seed=3, system_prompts=2, system_words=50)
    assert chat == bs.make_workload("chat", 20, seed=3, system_prompts=2, system_words=50)
    systems = {m[0]["content"] for m in chat}
    users = {m[1]["content"] for m in chat}
    assert len(systems) == 2 and len(users) == 20
    assert all(len(s.split()) > 50 for s in systems)
    fixed = bs.make_workload("fixed", 5, seed=3, prompt_words=40)
    assert len({m[0]["content"] for m in fixed}) == 5
    assert all(len(m[1]["content"].split()) == 40 for m in fixed)
    assert bs.make_workload("chat", 4, seed=4) != bs.make_workload("chat", 4, seed=3)
    with pytest.raises(ValueError):
        bs.make_workload("poisson", 4, seed=1)


def test_conversations_are_deterministic_per_seed():
    spec = bs.make_conversations(6, seed=7, system_prompts=2, system_tokens=100, turns=3, user_tokens=30)
    assert spec == bs.make_conversations(6, seed=7, system_prompts=2, system_tokens=100, turns=3, user_tokens=30)
    assert spec != bs.make_conversations(6, seed=8, system_prompts=2, system_tokens=100, turns=3, user_tokens=30)
    assert len(spec["systems"]) == 2 and len(set(spec["systems"])) == 2
    assert all(len(s.split()) == 98 for s in spec["systems"])  # a 6-word opening (8 tokens) + 92 words
    convs = spec["conversations"]
    assert [c["system"] for c in convs] == [0, 1, 0, 1, 0, 1]  # the first two open different prompts
    assert all(len(c["users"]) == 3 for c in convs)
    users = [u for c in convs for u in c["users"]]
    assert len(set(users)) == len(users) and all(len(u.split()) == 4 + 22 for u in users)
    assert convs[4]["users"][2].startswith("Conversation 4, turn 3: ")
    with pytest.raises(ValueError):
        bs.make_conversations(0, seed=1)


def test_history_grows_by_the_previous_answer():
    spec = bs.make_conversations(2, seed=1, system_prompts=1, system_tokens=40, turns=3, user_tokens=20)
    systems, conv = spec["systems"], spec["conversations"][1]
    first = bs.conversation_messages(systems, conv, [])
    assert first == [{"role": "system", "content": systems[0]}, {"role": "user", "content": conv["users"][0]}]
    second = bs.conversation_messages(systems, conv, ["answer one"])
    third = bs.conversation_messages(systems, conv, ["answer one", "answer two"])
    assert second[:2] == first and second[2:] == [{"role": "assistant", "content": "answer one"},
                                                  {"role": "user", "content": conv["users"][1]}]
    assert third[:4] == second and third[4:] == [{"role": "assistant", "content": "answer two"},
                                                 {"role": "user", "content": conv["users"][2]}]
    # Rendered as Gemma's turns, each prompt extends the previous one by its answer and the next turn.
    r1, r2, r3 = (bs.render_gemma(m) for m in (first, second, third))
    assert r1 == f"<start_of_turn>user\n{systems[0]}\n\n{conv['users'][0]}<end_of_turn>\n<start_of_turn>model\n"
    assert r2 == r1 + f"answer one<end_of_turn>\n<start_of_turn>user\n{conv['users'][1]}<end_of_turn>\n" \
                      "<start_of_turn>model\n"
    assert r3.startswith(r2 + "answer two<end_of_turn>\n")
    # The system prompt alone renders as the prefix every first turn on it shares.
    assert r1.startswith(bs.render_gemma(first[:1]))


def test_summarize_turns_counts_new_and_computed_tokens():
    def rec(conv, turn, prompt, cached, first=False, **extra):
        return {"conv": conv, "turn": turn, "system": 0, "first_on_system": first, "start": 0.0,
                "chunk_times": [0.1 * turn, 0.2 * turn], "finish_reason": "length", "completion_tokens": 8,
                "prompt_tokens": prompt, "cached_tokens": cached, **extra}
    records = [rec(0, 1, 120, 0, first=True), rec(1, 1, 121, 96),
               rec(0, 2, 150, 112), rec(1, 2, 152, 96, prompt_n=40)]  # prompt_n: llama-server's own count
    rows = bs.summarize_turns(records, {0: 100}, block_tokens=16)
    assert [r["turn"] for r in rows] == [1, 2]
    one, two = rows
    assert one["computed_tokens"] == 120 + 25 and one["computed_max"] == 120
    assert one["new_tokens_mean"] == pytest.approx((120 + 21) / 2)   # first: all new; then past the system
    assert one["over_target"] == 0 and one["target_known"] == 2
    assert two["computed_tokens"] == 38 + 40
    assert two["new_tokens_mean"] == pytest.approx(((150 - 128) + (152 - 129)) / 2)
    assert two["over_target"] == 1                                    # 40 > 23 + 16
    assert two["ttft_p50_ms"] == pytest.approx(200.0)
    assert bs.summarize_turns(records, None)[0]["target_known"] == 1  # turn 1 after the first: unknown


def test_summarize_counts_lost_and_latencies():
    ok = {"start": 0.0, "end": 1.0, "chunk_times": [0.2, 0.3, 0.5], "finish_reason": "length",
          "completion_tokens": 3, "prompt_tokens": 10, "cached_tokens": 4}
    err = {"start": 0.0, "end": 0.1, "chunk_times": [], "finish_reason": None, "error": "APIError: x"}
    cut = {"start": 0.0, "end": 0.4, "chunk_times": [0.4], "finish_reason": None}  # no usage, no finish
    before = {"kvcache_prompt_tokens_total": 100, "kvcache_prefix_hit_tokens_total": 10}
    after = {"kvcache_prompt_tokens_total": 110, "kvcache_prefix_hit_tokens_total": 14,
             "kvcache_generated_tokens_total": 3, "kvcache_preemptions_total": 0}
    row = bs.summarize([ok, err, cut], 2.0, before, after, 2)
    assert (row["requests"], row["completed"], row["lost"]) == (3, 1, 2)
    assert row["output_tokens"] == 3 and row["output_tokens_per_s"] == 1.5
    assert row["requests_per_s"] == 0.5
    assert row["prefix_hit_rate"] == pytest.approx(0.4)
    assert row["ttft_p50_ms"] == pytest.approx(200.0)
    assert row["itl_p50_ms"] == pytest.approx(150.0)  # gaps 0.1, 0.2
    assert row["errors"] == ["APIError: x"]


@pytest.fixture(scope="module")
def smol():
    sf.need_smollm()
    server = sf.Server(["--model", str(sf.SMOLLM), *SERVE_ARGS])
    yield server
    assert server.terminate() == 0, "".join(server.stderr_lines)


def args_for(*argv):
    return bs.parser().parse_args(list(argv))


def test_against_a_server(smol):
    requests, max_tokens = 12, 8
    args = args_for("--requests", str(requests), "--max-tokens", str(max_tokens), "--workload", "chat",
                    "--system-prompts", "2", "--system-words", "120", "--seed", "5")
    args.concurrency = 4
    before = smol.metrics()
    row = asyncio.run(bs.run_load(smol.base_url, args))
    after = smol.wait_idle()
    assert (row["completed"], row["lost"], row["errors"]) == (requests, 0, [])
    # ignore_eos: every request gets exactly max_tokens, and the server counted the same.
    assert row["output_tokens"] == requests * max_tokens
    assert row["server_generated_tokens"] == row["output_tokens"]
    assert after["kvcache_generated_tokens_total"] - before["kvcache_generated_tokens_total"] == row["output_tokens"]
    assert after["kvcache_prompt_tokens_total"] - before["kvcache_prompt_tokens_total"] >= row["prompt_tokens"]
    # Two system prompts among twelve requests: later ones adopt the shared blocks.
    assert 0 < row["prefix_hit_rate"] < 1
    assert row["cached_tokens"] > 0
    if row["preemptions"] == 0:
        assert row["prefix_hit_rate"] == pytest.approx(row["cached_tokens"] / row["prompt_tokens"])
    assert 1 <= row["peak_running"] <= 4
    assert 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"] < row["wall_s"] * 1000
    assert 0 < row["itl_p50_ms"] <= row["itl_p99_ms"]
    assert row["output_tokens_per_s"] == pytest.approx(row["output_tokens"] / row["wall_s"])
    assert row["requests_per_s"] == pytest.approx(requests / row["wall_s"])


def test_conversations_against_a_server(smol):
    args = args_for("--workload", "conversation", "--render", "gemma", "--conversations", "3",
                    "--system-prompts", "2", "--system-tokens", "80", "--user-tokens", "20", "--turns", "2",
                    "--max-tokens", "4", "--seed", "2")
    args.concurrency = 2
    row = asyncio.run(bs.run_conversations(smol.base_url, args))
    assert (row["completed"], row["lost"], row["server_kind"]) == (6, 0, "kvcache")
    assert row["output_tokens"] == 6 * 4
    assert set(row["system_prefix_tokens"]) == {0, 1} and all(n > 80 for n in row["system_prefix_tokens"].values())
    one, two = row["turns"]
    assert (one["turn"], one["completed"], two["turn"], two["completed"]) == (1, 3, 2, 3)
    assert one["target_known"] == 3 and two["target_known"] == 3
    # Turn 2 resends turn 1 and its answer: longer, and mostly served from the prefix cache.
    assert two["prompt_tokens_mean"] > one["prompt_tokens_mean"] + 4
    assert two["computed_mean"] < two["prompt_tokens_mean"] / 2
    assert row["computed_tokens"] == one["computed_tokens"] + two["computed_tokens"]


def test_ttft_probe(smol):
    args = args_for("--ttft-probe", "--base-url", smol.base_url, "--probe-words", "120",
                    "--probe-tail-words", "10", "--rounds", "2")
    row = asyncio.run(bs.probe_ttft(smol.base_url, args))
    assert row["uncached_cached_tokens"] == 0
    # The second prompt shares ~120 words with the first: every full block of them is adopted.
    assert row["cached_prompt_tokens"] > 100
    assert 64 <= row["cached_cached_tokens"] < row["cached_prompt_tokens"]
    assert row["uncached_ttft_ms"] > 0 and row["cached_ttft_ms"] > 0
    assert row["cached_over_uncached"] == pytest.approx(row["cached_ttft_ms"] / row["uncached_ttft_ms"])
    assert "replica_ttft_ms" not in row


def test_spawn_sweep_writes_json(tmp_path):
    sf.need_smollm()
    out = tmp_path / "bench.json"
    rc = bs.main(["--cli", sf.CLI, "--spawn", " ".join(["--model", str(sf.SMOLLM), *SERVE_ARGS[2:]]),
                  "--kv-formats", "bf16,turbo4", "--concurrency", "2", "--requests", "4",
                  "--max-tokens", "4", "--workload", "fixed", "--prompt-words", "30", "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["results"]
    assert [r["kv_format"] for r in rows] == ["bf16", "turbo4"]
    for r in rows:
        assert r["completed"] == 4 and r["lost"] == 0 and r["server_exit"] == 0
        assert r["output_tokens"] == 16 == r["server_generated_tokens"]
        assert r["cached_tokens"] == 0  # fixed: distinct prompts share nothing
        for key in ("output_tokens_per_s", "requests_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
                    "itl_p99_ms", "prefix_hit_rate", "peak_running", "preemptions"):
            assert r[key] is not None and r[key] >= 0, key


@pytest.mark.parametrize("argv", [
    ["--base-url", "http://127.0.0.1:9", "--requests", "0"],
    ["--base-url", "http://127.0.0.1:9", "--max-tokens", "0"],
    ["--base-url", "http://127.0.0.1:9", "--concurrency", "two"],
    ["--base-url", "http://127.0.0.1:9", "--concurrency", "0"],
    ["--base-url", "http://127.0.0.1:9", "--kv-formats", "bf16"],
    ["--requests", "2"],
    ["--spawn", "--model x", "--cli", "/nonexistent/kvcache", "--requests", "2"],
    ["--ttft-probe", "--spawn", "--model x"],
    ["--ttft-probe", "--base-url", "http://127.0.0.1:9", "--rounds", "0"],
])
def test_bad_arguments_are_errors(argv, capsys):
    assert bs.main(argv) == 2
    assert "kvcache.bench_serve:" in capsys.readouterr().err


def test_unknown_workload_is_rejected():
    with pytest.raises(SystemExit):
        args_for("--workload", "poisson")
