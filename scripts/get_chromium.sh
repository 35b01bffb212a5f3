#!/usr/bin/env bash
# Makes Debian's headless-capable `chromium` available for the inspector's browser tests
# (driven by Playwright through executable_path, never a browser build Playwright downloads).
# Idempotent; prints the browser's path.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then command -v chromium; exit 0; fi
export DEBIAN_FRONTEND=noninteractive
# Other package installs on the machine may hold the dpkg lock for a while: wait for it.
apt_get() { apt-get -o DPkg::Lock::Timeout=600 "$@"; }
if ! apt_get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null; then
  apt_get update -qq >/dev/null
  apt_get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
command -v chromium
