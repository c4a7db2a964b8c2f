#!/usr/bin/env python3
"""Writes the long-context evaluation text to stdout: the Python 3 language
reference's help topics (pydoc_data.topics, which every Debian python3
ships in libpython3.X-stdlib; Python Software Foundation License), every
topic in sorted order, separated by blank lines. About 150k Gemma 3 tokens:
enough for llama-perplexity's two chunks of 32,768 and for kvcache's 32k runs.
Deterministic for a given Python minor version (docs/gemma3.md names it)."""
import sys

from pydoc_data.topics import topics

sys.stdout.write("\n\n".join(topics[k].rstrip() for k in sorted(topics)) + "\n")
