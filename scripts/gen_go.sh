#!/usr/bin/env bash
# Generates the Go client's protocol code (client/go/ctxccv1) with protoc from grpcio-tools
# and pinned protoc-gen-go / protoc-gen-go-grpc (installed into .tools/go-bin from the Go
# module proxy). With --check, generates into a temp dir and fails when the committed
# code differs.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(pwd)/.tools/go-bin
if [ ! -x "$bin/protoc-gen-go" ] || [ ! -x "$bin/protoc-gen-go-grpc" ]; then
  GOBIN=$bin go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
  GOBIN=$bin go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
fi
pkg=github.com/ctxcc/ctxcc/client/go/ctxccv1
protos=$(cd proto && find ctxcc/v1 -name '*.proto' | sort)
maps=""
for p in $protos; do maps="$maps,M$p=$pkg;ctxccv1"; done
maps=${maps#,}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
(cd proto && python -m grpc_tools.protoc -I. \
  --plugin=protoc-gen-go="$bin/protoc-gen-go" --plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc" \
  --go_out="$out" --go_opt="paths=import,$maps" \
  --go-grpc_out="$out" --go-grpc_opt="paths=import,$maps" $protos)
gen="$out/$pkg"
if [ "${1:-}" = "--check" ]; then
  if ! diff -r "$gen" client/go/ctxccv1 >/dev/null; then
    echo "client/go/ctxccv1 is stale: run 'make proto' and commit" >&2
    exit 1
  fi
  echo "Go code is up to date"
else
  rm -rf client/go/ctxccv1 && cp -r "$gen" client/go/ctxccv1
fi
