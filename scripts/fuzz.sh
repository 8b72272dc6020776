#!/usr/bin/env bash
# Sets up (see setup.sh) and runs the default fuzz campaign on the best device available.
# Findings land in gradfuzz-out/corpus, the report in gradfuzz-out/report.json.
# Extra arguments go to `gradfuzz fuzz` (e.g. --cases 2000 --seed 7 --fault slot-order).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${GRADFUZZ_BUILD:-$root/build}"
"$root/scripts/setup.sh"
mkdir -p "$root/gradfuzz-out"
exec "$build/tools/gradfuzz" fuzz --device auto --cases 500 \
  --corpus "$root/gradfuzz-out/corpus" --report "$root/gradfuzz-out/report.json" "$@"
