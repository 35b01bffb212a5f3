#!/usr/bin/env bash
# Generates Python code and mypy stubs for proto/ into ctxcc/ (committed, so an
# install needs no protoc). With --check, generates into a temp dir and fails
# when the committed files differ.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-.}
out=$(pwd)
if [ "$mode" = "--check" ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
protos=$(cd proto && find ctxcc -name '*.proto' | sort)
rm -rf "$out/ctxcc.new" && mkdir -p "$out/ctxcc.new"
(cd proto && python -m grpc_tools.protoc -I. \
  --python_out="$out/ctxcc.new" --grpc_python_out="$out/ctxcc.new" \
  --mypy_out="$out/ctxcc.new" --mypy_grpc_out="$out/ctxcc.new" $protos) >/dev/null
# Packages need __init__.py and a py.typed marker so mypy reads the stubs.
find "$out/ctxcc.new/ctxcc" -type d -exec sh -c 'touch "$1/__init__.py"' _ {} \;
touch "$out/ctxcc.new/ctxcc/py.typed"
if [ "$mode" = "--check" ]; then
  if ! diff -r "$out/ctxcc.new/ctxcc" ctxcc -x '__pycache__' >/dev/null; then
    diff -r "$out/ctxcc.new/ctxcc" ctxcc -x '__pycache__' | head -20
    echo "generated code in ctxcc/ is stale: run 'make proto' and commit" >&2
    exit 1
  fi
  echo "generated code is up to date"
else
  rm -rf ctxcc && mv "$out/ctxcc.new/ctxcc" ctxcc && rm -rf "$out/ctxcc.new"
fi
