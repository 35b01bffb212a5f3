#!/usr/bin/env bash
# Puts promtool (from Debian's prometheus package) at .tools/promtool without installing
# the Prometheus server: apt-get download + dpkg -x. Idempotent; prints the path.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.tools
if [ -x "$dest/promtool" ]; then echo "$dest/promtool"; exit 0; fi
if command -v promtool >/dev/null 2>&1; then
  mkdir -p "$dest" && ln -sf "$(command -v promtool)" "$dest/promtool" && echo "$dest/promtool" && exit 0
fi
mkdir -p "$dest/deb"
cd "$dest/deb"
if ! apt-get download prometheus >/dev/null 2>&1; then
  apt-get update -qq >/dev/null
  apt-get download prometheus >/dev/null
fi
dpkg -x prometheus_*.deb root
cd ../..
ln -sf "deb/root/usr/bin/promtool" "$dest/promtool"
"$dest/promtool" --version >/dev/null
echo "$dest/promtool"
