#!/usr/bin/env python3
"""Writes the long-context evaluation text to stdout: the Python 3 language
reference's help topics (pydoc_data/topics.py, which Debian 12 ships in
libpython3.11-stdlib; Python Software Foundation License), every topic in
sorted order, separated by blank lines. About 112k Gemma 3 tokens: enough
for kvcache's 32k runs and for llama-perplexity's chunks.

The topics differ between Python releases, so the text is read from one
named file: --topics FILE, else Debian's /usr/lib/python3.11/pydoc_data/
topics.py where it exists, else the running interpreter's (with a note on
stderr naming its version). docs/gemma3.md gives each table's text by its
sha256."""
import argparse
import importlib.util
import os
import sys

DEBIAN_TOPICS = "/usr/lib/python3.11/pydoc_data/topics.py"


def load_topics(path):
    if not os.path.isfile(path):
        raise OSError(f"{path}: no such file")
    spec = importlib.util.spec_from_file_location("kvcache_eval_topics", path)
    if spec is None or spec.loader is None:
        raise OSError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    topics = getattr(module, "topics", None)
    if not isinstance(topics, dict):
        raise OSError(f"{path}: defines no topics dictionary")
    return topics


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", help="a pydoc_data/topics.py to read (default: Debian's, else this Python's)")
    args = ap.parse_args(argv)
    path = args.topics
    if path is None and os.path.exists(DEBIAN_TOPICS):
        path = DEBIAN_TOPICS
    try:
        if path is None:
            from pydoc_data.topics import topics

            print(f"long_text: {DEBIAN_TOPICS} is absent: using Python {sys.version.split()[0]}'s topics",
                  file=sys.stderr)
        else:
            topics = load_topics(path)
    except (OSError, SyntaxError, ImportError) as e:
        print(f"long_text: {e}", file=sys.stderr)
        return 2
    sys.stdout.write("\n\n".join(topics[k].rstrip() for k in sorted(topics)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
