#!/usr/bin/env bash
# Puts the Prometheus server and promtool (from Debian's prometheus package) at
# .tools/prometheus and .tools/promtool without installing or starting anything:
# apt-get download + dpkg -x. Tests start the server themselves, on temporary ports and
# directories. Idempotent; prints the two paths.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.tools
mkdir -p "$dest"
if [ -x "$dest/promtool" ] && [ -x "$dest/prometheus" ]; then
  echo "$dest/prometheus $dest/promtool"; exit 0
fi
if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
  ln -sf "$(command -v promtool)" "$dest/promtool"
  ln -sf "$(command -v prometheus)" "$dest/prometheus"
else
  mkdir -p "$dest/deb"
  (
    cd "$dest/deb"
    if ! ls prometheus_*.deb >/dev/null 2>&1; then
      if ! apt-get download prometheus >/dev/null 2>&1; then
        apt-get update -qq >/dev/null
        apt-get download prometheus >/dev/null
      fi
    fi
    dpkg -x prometheus_*.deb root
  )
  ln -sf "deb/root/usr/bin/promtool" "$dest/promtool"
  ln -sf "deb/root/usr/bin/prometheus" "$dest/prometheus"
fi
"$dest/promtool" --version >/dev/null
"$dest/prometheus" --version >/dev/null
echo "$dest/prometheus $dest/promtool"
