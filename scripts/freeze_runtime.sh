#!/usr/bin/env bash
# Regenerates deploy/requirements.txt: the daemon's runtime dependencies, resolved in a
# clean venv under constraints.txt, without the dev tools.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install --quiet -c constraints.txt .
{
  echo "# Runtime dependencies of the ctxcc daemon, pinned: the container image installs exactly these."
  echo "# Regenerate with scripts/freeze_runtime.sh after changing pyproject.toml."
  "$tmp/venv/bin/pip" freeze | grep -v "^ctxcc"
} > deploy/requirements.txt
