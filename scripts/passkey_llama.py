#!/usr/bin/env python3
"""Asks llama.cpp's llama-server the prompts a `kvcache passkey --json` run
answered, token id for token id, and prints both answers side by side: a
yardstick for whether a key the model misses is the model's own limit or
the engine's. llama.cpp is not a dependency; run its llama-server yourself
with the same GGUF file and a context of at least the run's:

  llama-server -m MODEL -c 32768 -np 1 -t 2 --port 8090
  kvcache passkey --model MODEL --context 16384 --trials 20 --json > pk.json
  scripts/passkey_llama.py --model MODEL --passkey-json pk.json \\
      --server http://127.0.0.1:8090 [--depths 0.25] [--kvcache build/release/tools/kvcache]

Each prompt comes from `kvcache passkey --prompt-key KEY` (the very ids the
run fed its decoder) and goes to /completion as ids, greedy, as many tokens
as the run answered with (its answer_tokens; 8 for runs older than the
option).
Prints one JSON object a trial: depth, key, both answers, whether each holds
the key; a summary per depth on stderr."""
import argparse
import json
import subprocess
import sys
import urllib.request


def prompt_ids(kvcache, model, context, depth, key):
    out = subprocess.run([kvcache, "passkey", "--model", model, "--context", str(context), "--depths",
                          repr(depth), "--prompt-key", key], check=True, capture_output=True, text=True).stdout
    return json.loads(out)["prompts"][0]["ids"]


def complete(server, ids, n_predict):
    body = json.dumps({"prompt": ids, "n_predict": n_predict, "temperature": 0, "top_k": 1,
                       "cache_prompt": False}).encode()
    req = urllib.request.Request(server.rstrip("/") + "/completion", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as resp:
        return json.load(resp)["content"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the GGUF file both engines run")
    ap.add_argument("--passkey-json", required=True, help="output of kvcache passkey --json")
    ap.add_argument("--server", default="http://127.0.0.1:8090", help="llama-server's address")
    ap.add_argument("--kvcache", default="build/release/tools/kvcache", help="the kvcache binary")
    ap.add_argument("--depths", type=float, nargs="*", help="only these depths (default: all in the run)")
    ap.add_argument("--answer-tokens", type=int, help="tokens to generate (default: the run's)")
    args = ap.parse_args()
    run = json.load(open(args.passkey_json))
    n_predict = args.answer_tokens or run.get("answer_tokens", 8)
    for r in run["results"]:
        if args.depths and r["depth"] not in args.depths:
            continue
        same = found = 0
        for a in r["answers"]:
            ids = prompt_ids(args.kvcache, args.model, run["context"], r["depth"], a["key"])
            text = complete(args.server, ids, n_predict)
            row = {"depth": r["depth"], "key": a["key"], "tokens": len(ids), "llama": text,
                   "llama_found": a["key"] in text, "kvcache": a["answer"], "kvcache_found": a["found"]}
            same += text == a["answer"]
            found += row["llama_found"]
            print(json.dumps(row), flush=True)
        print(f"depth {r['depth']}: llama.cpp found {found} of {len(r['answers'])} keys, kvcache {r['found']}; "
              f"{same} answers identical", file=sys.stderr)


if __name__ == "__main__":
    main()
