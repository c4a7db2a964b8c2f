"""Starting `kvcache serve` for the tests: a free loopback port, the process,
its /metrics parsed, raw HTTP exchanges for the malformed-input tests, and
an `openai` client that never goes through a proxy."""
import os
import pathlib
import re
import signal
import socket
import subprocess
import threading
import time

import pytest

CLI = os.environ.get("KVCACHE_CLI", "")
TESTDATA = pathlib.Path(os.environ.get("KVCACHE_TESTDATA_DIR",
                                       pathlib.Path(__file__).resolve().parents[2] / "testdata"))
# Where scripts/fetch_model.sh puts it (model/io/model_store.h: KVCACHE_MODEL_DIR overrides the folder).
SMOLLM = pathlib.Path(os.environ.get("KVCACHE_MODEL_DIR") or pathlib.Path.home() / ".cache/kvcache/models") \
    / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = SMOLLM.parent / "gemma-3-270m-q4_k_m.gguf"
STORIES = ["--model", str(TESTDATA / "stories260K/stories260K_v1.bin"),
           "--tokenizer", str(TESTDATA / "stories260K/tokenizer.bin")]


def need_cli():
    if not CLI or not os.access(CLI, os.X_OK):
        pytest.skip("KVCACHE_CLI (the kvcache binary) is not set")


def need_smollm():
    need_cli()
    if not SMOLLM.exists():  # as the SmolLM2 tests of tests/model_smollm: a failure, not a skip
        pytest.fail(f"{SMOLLM} missing: fetch it with scripts/fetch_model.sh")


def need_gemma():
    need_cli()
    if not GEMMA.exists():  # as the Gemma tests of tests/model_gemma: a failure, not a skip
        pytest.fail(f"{GEMMA} missing: fetch it with scripts/fetch_model.sh gemma3")


class Server:
    """One `kvcache serve` process on 127.0.0.1 and a free port (--port 0)."""

    def __init__(self, args, startup_timeout=60.0):
        self.proc = subprocess.Popen([CLI, "serve", "--port", "0", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.stderr_lines = []
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_thread.start()
        line = self._read_listening_line(startup_timeout)
        m = re.search(r"listening on http://([\d.]+):(\d+)", line)
        if not m:
            self.proc.kill()
            self.proc.wait()
            self._stderr_thread.join(5)  # all of what it said before it ended
            raise RuntimeError(f"kvcache serve did not start: {line!r} {''.join(self.stderr_lines)}")
        self.host, self.port = m.group(1), int(m.group(2))
        self.base_url = f"http://{self.host}:{self.port}"

    def _drain_stderr(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line)

    def _read_listening_line(self, timeout):
        result = []
        t = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        return result[0] if result else ""

    def client(self, api_key="unused", **kw):
        import openai
        # trust_env=False: loopback never goes through a configured proxy.
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=api_key, max_retries=0,
                             http_client=openai.DefaultHttpxClient(trust_env=False, timeout=120), **kw)

    def alive(self):
        return self.proc.poll() is None

    def metrics(self):
        """/metrics as {sample name with labels: float}."""
        status, _, body = raw_request(self.port, "GET", "/metrics")
        assert status == 200
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def wait_idle(self, timeout=20.0):
        """Waits until no request runs or waits; returns the last metrics."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if m["kvcache_requests_running"] == 0 and m["kvcache_requests_waiting"] == 0:
                return m
            if time.monotonic() > deadline:
                return m
            time.sleep(0.05)

    def terminate(self, timeout=60.0):
        """SIGTERM; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def paragraph(seed, words):
    """Deterministic filler text of `words` words (a fixed vocabulary, an LCG)."""
    vocab = ("cache window layer token block memory model answer question river garden music light "
             "history market engine paper winter summer city ocean forest stone letter story").split()
    out, x = [], seed * 7919 + 1
    for _ in range(words):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(vocab[x % len(vocab)])
    return " ".join(out)


def raw_exchange(port, data, timeout=15.0):
    """Sends `data` (bytes) on a fresh connection, reads one response.
    Returns (status, headers dict lower-cased, body bytes); status 0 when
    the server closed the connection without a response."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):  # the server answered early and closed
            pass
        chunks = []
        while True:
            try:
                b = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not b:
                break
            chunks.append(b)
    raw = b"".join(chunks)
    if not raw:
        return 0, {}, b""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for h in lines[1:]:
        k, _, v = h.partition(":")
        headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        body = body[:int(headers["content-length"])]
    return status, headers, body


def raw_request(port, method, path, body=b"", headers=None, timeout=15.0):
    """One well-formed HTTP/1.1 request with Connection: close."""
    hdrs = {"Host": "127.0.0.1", "Connection": "close", "Content-Length": str(len(body))}
    hdrs.update(headers or {})
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
    return raw_exchange(port, head.encode("latin-1") + body, timeout)


def open_stream(port, doc, events=3, timeout=30.0):
    """POSTs `doc` (a streamed /v1/completions request) on a raw socket and
    returns the socket once `events` SSE events have arrived: a client the
    test can drop mid-stream."""
    import json
    body = json.dumps(doc).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < events:
        got += s.recv(4096)
    return s
