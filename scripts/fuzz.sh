#!/usr/bin/env bash
# Sets up (see setup.sh) and runs the default fuzz campaign on the best device available.
# Findings land in gradfuzz-out/corpus, the report in gradfuzz-out/report.json.
# Extra arguments go to `gradfuzz fuzz` and replace these defaults
# (e.g. scripts/fuzz.sh --cases 5000 --seed 7, or --fault slot-order).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${GRADFUZZ_BUILD:-$root/build}"
"$root/scripts/setup.sh"

given() {  # given OPTION ARGS...: whether the user passed OPTION
  local option="$1"; shift
  for arg in "$@"; do [[ "$arg" == "$option" || "$arg" == "$option="* ]] && return 0; done
  return 1
}
defaults=()
given --device "$@" || defaults+=(--device auto)
given --cases "$@" || given --time "$@" || defaults+=(--cases 500)
given --corpus "$@" || defaults+=(--corpus "$root/gradfuzz-out/corpus")
given --report "$@" || defaults+=(--report "$root/gradfuzz-out/report.json")
mkdir -p "$root/gradfuzz-out"
exec "$build/tools/gradfuzz" fuzz "${defaults[@]}" "$@"
