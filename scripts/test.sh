#!/usr/bin/env bash
# Sets up (see setup.sh and ci-deps.sh), builds everything and runs the whole test suite with ctest.
# Fails when any test fails or when no test ran. Extra arguments go to ctest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${GRADFUZZ_BUILD:-$root/build}"
"$root/scripts/setup.sh"
# What some tests need beyond the build: headless Chromium (the HTML report) and Slurm with
# MUNGE (the nightly recipe's end-to-end test). Installed here so that this command passes
# on a bare machine by itself; GRADFUZZ_SKIP_CI_DEPS=1 leaves them out, and those tests fail.
[ "${GRADFUZZ_SKIP_CI_DEPS:-0}" = 1 ] || "$root/scripts/ci-deps.sh"
cd "$build"
# Each GoogleTest case is its own ctest test; two at a time fits the 2-core machines.
ctest --output-on-failure --no-tests=error -j "${GRADFUZZ_TEST_JOBS:-2}" "$@"
