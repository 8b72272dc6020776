#!/usr/bin/env bash
# Runs on the GPU machine (device tool, carry [".deps"]): builds with CUDA against the
# machine's LibTorch and runs the test suite with tensors on CUDA. Logs go to $OUT.
set -uo pipefail
out="${OUT:-/tmp/gradfuzz-gpu}"
mkdir -p "$out"
export CMAKE_PREFIX_PATH="$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)'):$PWD/.deps/root/usr"
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DTORCH_CUDA_ARCH_LIST=9.0 \
  -DGRADFUZZ_WERROR=ON >"$out/configure.log" 2>&1 || { tail -50 "$out/configure.log"; exit 1; }
cmake --build build-cuda -j16 >"$out/build.log" 2>&1 || { grep -E 'error|FAILED' -A5 "$out/build.log" | head -80; exit 1; }
nvidia-smi -L | tee "$out/device.txt"
(cd build-cuda && GRADFUZZ_TEST_DEVICE=cuda ctest --output-on-failure --no-tests=error -j8) >"$out/ctest.log" 2>&1
rc=$?
tail -30 "$out/ctest.log"
exit $rc
