#!/usr/bin/env bash
# Compares proto/ with the main branch. Skips with a note where there is no main
# to compare with (a fresh repository before its first commit of proto/).
set -euo pipefail
buf=${1:-buf}
cd "$(dirname "$0")/.."
if git rev-parse --verify -q main >/dev/null && git cat-file -e main:buf.yaml 2>/dev/null; then
  "$buf" breaking --against '.git#branch=main'
  echo "buf breaking: no breaking change against main"
else
  echo "buf breaking: no main branch with buf.yaml to compare against"
fi
