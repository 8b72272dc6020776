#pragma once
// Counts of the hand-written CUDA kernels' launches (issue: are the kernels' multi-block
// paths reached?). Plain C++: every build has it; only CUDA builds ever record launches.
#include <cstdint>
#include <map>
#include <string>

namespace gradfuzz::ops::cuda {

/// Launches of one kernel.
struct KernelLaunches {
  int64_t launches = 0;
  /// Launches with more than one block.
  int64_t multi_block = 0;
  /// Largest grid (blocks) seen.
  int64_t max_blocks = 0;
};

/// Records one launch of `kernel` with `blocks` blocks (thread-safe).
void record_launch(const char* kernel, int64_t blocks);
/// Every kernel's counts since the process started.
std::map<std::string, KernelLaunches> kernel_launches();

}  // namespace gradfuzz::ops::cuda
