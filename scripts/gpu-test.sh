#!/usr/bin/env bash
# Runs on the GPU machine (device tool, carry [".deps"], made by scripts/gpu-deps.sh): builds
# with CUDA against the machine's LibTorch, runs the test suite with the ops tests' tensors on
# CUDA, then a CUDA fuzz campaign, the fault self-test and the benchmark. Logs go to $OUT.
set -uo pipefail
out="${OUT:-/tmp/gradfuzz-gpu}"
mkdir -p "$out"
export CMAKE_PREFIX_PATH="$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)'):$PWD/.deps/root/usr"
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DTORCH_CUDA_ARCH_LIST=9.0 \
  -DGRADFUZZ_WERROR=OFF >"$out/configure.log" 2>&1 || { tail -50 "$out/configure.log"; exit 1; }
grep -E "GRADFUZZ_CUDA|CUDA" build-cuda/CMakeCache.txt | grep -E "^GRADFUZZ_CUDA" | tee "$out/cuda-option.txt"
cmake --build build-cuda -j16 >"$out/build.log" 2>&1 || { grep -E 'error|FAILED' -A5 "$out/build.log" | head -80; exit 1; }
echo "compiler warnings (gcc 13 there; CI builds with -Werror here): $(grep -c "warning:" "$out/build.log")"
nvidia-smi -L | tee "$out/device.txt"
status=0
(cd build-cuda && GRADFUZZ_TEST_DEVICE=cuda ctest --output-on-failure --no-tests=error -j8) >"$out/ctest.log" 2>&1 || status=1
tail -5 "$out/ctest.log"
gf=build-cuda/tools/gradfuzz
$gf fuzz --device cuda --cases 500 --seed 1 --corpus "$out/corpus" --report "$out/fuzz-cuda.json" >"$out/fuzz.log" 2>&1 || status=1
tail -2 "$out/fuzz.log"
$gf selftest --faults all --device cuda --corpus "$out/selftest" --report "$out/selftest-cuda.json" >"$out/selftest.log" 2>&1 || status=1
tail -7 "$out/selftest.log"
$gf bench --device cuda --cases 300 --seed 0 >"$out/bench-cuda.txt" 2>&1 || status=1
$gf bench --device cpu --cases 300 --seed 0 >"$out/bench-cpu.txt" 2>&1 || status=1
cat "$out/bench-cuda.txt" "$out/bench-cpu.txt"
exit $status
