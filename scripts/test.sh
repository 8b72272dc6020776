#!/usr/bin/env bash
# Sets up (see setup.sh), builds everything and runs the whole test suite with ctest.
# Fails when any test fails or when no test ran. Extra arguments go to ctest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${GRADFUZZ_BUILD:-$root/build}"
"$root/scripts/setup.sh"
cd "$build"
# Each GoogleTest case is its own ctest test; two at a time fits the 2-core machines.
ctest --output-on-failure --no-tests=error -j "${GRADFUZZ_TEST_JOBS:-2}" "$@"
