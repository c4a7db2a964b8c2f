"""Two `kvcache serve` replicas sharing one Redis tier: a long system prompt
served by replica A is written to Redis; the same request to replica B (its
own pool, never saw the prompt) adopts those blocks -- usage reports
cached_tokens > 0, /metrics counts tier hits -- and gives A's greedy answer.
For a plain format (bf16) and a calibrated one (turbo4, whose per-block
calibration travels with the blocks), and for Gemma 3, a model with
sliding-window layers: replica B continues a conversation replica A served,
past the 512-position window, from both layer groups' blocks in Redis.

Starts its own redis-server (loopback, a free port, a temporary folder, no
persistence); skips without one. Run by ctest (label server) with
KVCACHE_CLI set; pytest --noconftest."""
import pathlib
import shutil
import socket
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import server_fixture as sf  # noqa: E402

pytest.importorskip("openai")

MAX_TOKENS = 12
SYSTEM = ("You are the archivist of a small mountain library. " +
          " ".join(f"Shelf {i} holds books about rivers, stones, winter gardens and old maps." for i in range(24)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_command(port, *words):
    """One RESP command; returns the reply's first line (e.g. ':12', '+PONG')."""
    req = f"*{len(words)}\r\n" + "".join(f"${len(w)}\r\n{w}\r\n" for w in words)
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(req.encode())
        return s.recv(4096).decode().split("\r\n", 1)[0]


@pytest.fixture(scope="module")
def redis_port(tmp_path_factory):
    exe = shutil.which("redis-server")
    if not exe:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    folder = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(folder)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                if redis_command(port, "PING") == "+PONG":
                    break
            except OSError:
                time.sleep(0.02)
        else:
            pytest.fail("redis-server did not answer")
        yield port
    finally:
        proc.kill()
        proc.wait()


def wait_for_keys(port, timeout=20.0):
    """Waits until Redis holds keys and their count stops growing; returns it."""
    deadline = time.monotonic() + timeout
    last, stable = -1, 0
    while time.monotonic() < deadline:
        n = int(redis_command(port, "DBSIZE")[1:])
        stable = stable + 1 if n == last and n > 0 else 0
        if stable >= 5:
            return n
        last = n
        time.sleep(0.05)
    return last


@pytest.fixture
def replicas(request, redis_port):
    sf.need_smollm()
    servers = []

    def start(kv_format):
        s = sf.Server(["--model", str(sf.SMOLLM), "--kv-format", kv_format, "--context", "1024",
                       "--pool-mib", "48", "--threads", "1", "--tiers", f"redis://127.0.0.1:{redis_port}"])
        servers.append(s)
        return s

    yield start
    for s in servers:
        assert s.terminate() == 0, "".join(s.stderr_lines)


def ask(server, user):
    c = server.client()
    r = c.chat.completions.create(model="m", max_tokens=MAX_TOKENS, temperature=0,
                                  messages=[{"role": "system", "content": SYSTEM},
                                            {"role": "user", "content": user}])
    details = r.usage.prompt_tokens_details
    return r.choices[0].message.content, r.usage.prompt_tokens, (details.cached_tokens if details else 0)


@pytest.mark.parametrize("kv_format", ["bf16", "turbo4"])
def test_second_replica_adopts_the_first_ones_blocks(replicas, redis_port, kv_format):
    assert redis_command(redis_port, "FLUSHALL") == "+OK"
    a, b = replicas(kv_format), replicas(kv_format)
    user = f"Which shelf holds maps? ({kv_format})"
    text_a, prompt_tokens, cached_a = ask(a, user)
    assert prompt_tokens > 400 and cached_a == 0
    assert wait_for_keys(redis_port) > 0, "replica A wrote nothing to Redis"
    before = b.metrics()
    text_b, prompt_b, cached_b = ask(b, user)
    after = b.metrics()
    assert prompt_b == prompt_tokens
    # Every full block of the shared system prompt, at least, came from Redis.
    assert cached_b >= 400, (cached_b, prompt_tokens)
    assert after["kvcache_tier_hits_total"] - before["kvcache_tier_hits_total"] > 0
    assert text_b == text_a
    # And B without the tier would have computed it all (its own pool was empty).
    assert before["kvcache_prefix_hit_tokens_total"] == 0


def test_second_replica_continues_a_gemma_conversation_past_the_window(redis_port):
    sf.need_gemma()
    assert redis_command(redis_port, "FLUSHALL") == "+OK"
    # f32 K/V and the same passes in both: A's and B's answers are bit-equal.
    args = ["--model", str(sf.GEMMA), "--kv-format", "f32", "--matmul", "bf16", "--context", "4096",
            "--pool-mib", "160", "--threads", "1", "--max-batch-tokens", "512",
            "--tiers", f"redis://127.0.0.1:{redis_port}"]
    steps = 12

    def complete(server, prompt):
        r = server.client().completions.create(model="m", prompt=prompt, max_tokens=steps, temperature=0)
        return r.choices[0].text, r.usage

    a = sf.Server(args, startup_timeout=120)
    try:
        turn1 = "Notes for today: " + sf.paragraph(1, 600) + "\nUser: " + sf.paragraph(2, 60) + "\nModel:"
        text1, usage1 = complete(a, turn1)
        assert usage1.prompt_tokens > 600  # past the window
        turn2 = turn1 + text1 + "\nUser: " + sf.paragraph(3, 40) + "\nModel:"
        text2_a, usage2_a = complete(a, turn2)
        assert wait_for_keys(redis_port) > 0, "replica A wrote nothing to Redis"
    finally:
        assert a.terminate() == 0, "".join(a.stderr_lines)
    b = sf.Server(args, startup_timeout=120)
    try:
        before = b.metrics()
        text2_b, usage2_b = complete(b, turn2)
        after = b.metrics()
    finally:
        assert b.terminate() == 0, "".join(b.stderr_lines)
    assert usage2_b.prompt_tokens == usage2_a.prompt_tokens
    # At least turn 1's prompt and answer, less one block, came from Redis.
    assert usage2_b.prompt_tokens_details.cached_tokens >= usage1.prompt_tokens - 16, usage2_b
    assert after["kvcache_tier_hits_total"] - before["kvcache_tier_hits_total"] > 0
    assert before["kvcache_prefix_hit_tokens_total"] == 0
    assert text2_b == text2_a
