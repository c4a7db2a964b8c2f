"""Time to first token of a conversation's second turn on a second `kvcache
serve` replica that adopts the first replica's blocks from Redis, against the
first replica's own pool and a replica without tiers that recomputes it.

Starts its own redis-server (loopback, a free port, no persistence) and the
servers one at a time (python/tests/server_fixture.py). Prints JSON: per
run, the TTFT in seconds, the prompt tokens and the cached tokens, and
whether the greedy answers are equal.

    KVCACHE_CLI=build/release/tools/kvcache build/venv/bin/python scripts/replica_ttft.py \\
        --model ~/.cache/kvcache/models/gemma-3-270m-q4_k_m.gguf --kv-format bf16 --words 3000
"""
import argparse
import json
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "python" / "tests"))
import server_fixture as sf  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def first_token(server, prompt, max_tokens):
    """Streams one completion: (seconds to the first text, text, usage)."""
    t0 = time.monotonic()
    first, text, usage = None, "", None
    stream = server.client().completions.create(model="m", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                                stream=True, stream_options={"include_usage": True})
    for ev in stream:
        if ev.choices and ev.choices[0].text:
            if first is None:
                first = time.monotonic() - t0
            text += ev.choices[0].text
        if ev.usage:
            usage = ev.usage
    details = usage.prompt_tokens_details
    return first, text, {"prompt_tokens": usage.prompt_tokens, "cached_tokens": details.cached_tokens if details else 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(sf.GEMMA))
    ap.add_argument("--kv-format", default="bf16")
    ap.add_argument("--words", type=int, default=3000, help="filler words of the first turn")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    port = free_port()
    folder = tempfile.mkdtemp()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", folder], stdout=subprocess.DEVNULL)
    args = ["--model", a.model, "--kv-format", a.kv_format, "--context", "8192", "--pool-mib", "256",
            "--threads", str(a.threads)]
    tiers = ["--tiers", f"redis://127.0.0.1:{port}"]
    out = {}

    def run(name, extra, prompt):
        server = sf.Server(args + extra, startup_timeout=120)
        try:
            t, text, usage = first_token(server, prompt, a.max_tokens)
        finally:
            server.terminate()
        out[name] = {"ttft_s": round(t, 3), **usage}
        return text

    try:
        time.sleep(0.5)
        turn1 = "Notes for today: " + sf.paragraph(1, a.words) + "\nUser: " + sf.paragraph(2, 60) + "\nModel:"
        server = sf.Server(args + tiers, startup_timeout=120)
        try:
            t, text1, usage = first_token(server, turn1, a.max_tokens)
            out["replica A, turn 1 (cold)"] = {"ttft_s": round(t, 3), **usage}
            turn2 = turn1 + text1 + "\nUser: " + sf.paragraph(3, 120) + "\nModel:"
            t, text_a, usage = first_token(server, turn2, a.max_tokens)
            out["replica A, turn 2 (its own pool)"] = {"ttft_s": round(t, 3), **usage}
            time.sleep(3)  # the writes reach Redis
        finally:
            server.terminate()
        text_b = run("replica B, turn 2 (from Redis)", tiers, turn2)
        text_c = run("replica C, turn 2 (no tiers: recomputed)", [], turn2)
        out["answers equal: B and A"] = text_b == text_a
        out["answers equal: C and A"] = text_c == text_a
    finally:
        redis.kill()
        shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
