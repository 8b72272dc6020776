#!/usr/bin/env bash
# Unpacks the Debian packages the GPU machine lacks (RapidCheck, GoogleTest, nlohmann/json,
# CLI11) into .deps/root so a device run can carry them (shared/gpu.md). Run here, once.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="$root/.deps"
if [ -d "$deps/root/usr/include/rapidcheck" ] && [ -d "$deps/root/usr/include/CLI" ]; then exit 0; fi
mkdir -p "$deps/debs"
(cd "$deps/debs" && apt-get download librapidcheck-dev libgtest-dev libgmock-dev googletest \
  nlohmann-json3-dev libcli11-dev)
for f in "$deps"/debs/*.deb; do dpkg -x "$f" "$deps/root"; done
