#!/usr/bin/env bash
# Generates the TypeScript client's protocol code (client/typescript/src/gen) with protoc
# from grpcio-tools and ts-proto from the client's node_modules. With --check, fails when
# the committed code differs.
set -euo pipefail
cd "$(dirname "$0")/.."
plugin=client/typescript/node_modules/.bin/protoc-gen-ts_proto
[ -x "$plugin" ] || (cd client/typescript && npm ci --silent)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
protos=$(cd proto && find ctxcc/v1 -name '*.proto' | sort)
(cd proto && python -m grpc_tools.protoc -I. --plugin=protoc-gen-ts_proto="../$plugin" \
  --ts_proto_out="$out" \
  --ts_proto_opt=outputServices=grpc-js,env=node,esModuleInterop=true,importSuffix=.js,forceLong=number,useOptionals=messages,oneof=unions-value \
  $protos)
# ts-proto leaves out a double or float field that is 0 with `!== 0`, -0 included. Proto3
# leaves out only the default, +0 (protobuf-go, Python's upb and protobuf-es compare the
# bits): -0.0 is written, and a view's digest covers the daemon's bytes, which hold it.
find "$out" -name '*.ts' -exec perl -0pi -e \
  's/if \(message\.(\w+) !== 0\) \{(\s*writer\.uint32\(\d+\)\.(?:double|float)\()/if (!Object.is(message.$1, 0)) {$2/g' {} +
if [ "${1:-}" = "--check" ]; then
  if ! diff -r "$out" client/typescript/src/gen >/dev/null; then
    echo "client/typescript/src/gen is stale: run 'make proto' and commit" >&2
    exit 1
  fi
  echo "TypeScript code is up to date"
else
  rm -rf client/typescript/src/gen && cp -r "$out" client/typescript/src/gen
fi
