#!/usr/bin/env bash
# Runs the commands the README shows, as shown, so that none of them rots:
# every line of a ```sh block in README.md that starts with ./run.sh, with
# its continuation lines, in one shell, after the variable assignments
# (NAME=...) that stand before it in those blocks. Other lines (pip, cmake)
# are the reader's, not run here. CI runs `./run.sh test`,
# `./run.sh fuzz SECONDS` and `./run.sh sanitize ...` on its own, in full, so
# here those lines are checked to be well-formed and skipped; every other
# command runs and must exit 0. Fails if the README shows no command at all.
set -euo pipefail
cd "$(dirname "$0")/.."
script="$(mktemp)"
trap 'rm -f "$script"' EXIT
awk '
  /^```sh[[:space:]]*$/ { inblock = 1; next }
  /^```/ { inblock = 0; next }
  !inblock { next }
  cont || /^\.\/run\.sh / || /^[A-Za-z_][A-Za-z0-9_]*=/ {
    print
    cont = /\\$/
  }
' README.md > "$script"
[ -s "$script" ] || { echo "readme_commands: README.md has no \`\`\`sh block" >&2; exit 1; }
# Lines CI runs on its own become checks that the subcommand exists.
sed -i -E 's@^(\./run\.sh (test|sanitize|fuzz)\b.*)$@grep -q "^  \2)" run.sh  # CI runs: \1@' "$script"
ran=$(grep -c '^\./run\.sh' "$script" || true)
echo "readme_commands: running $ran README command(s):" >&2
grep -E '^\./run\.sh|# CI runs' "$script" | sed 's/^/  /' >&2
bash -x -euo pipefail "$script"
