#include "ops/cuda/launch_stats.h"

#include <algorithm>
#include <mutex>

namespace gradfuzz::ops::cuda {

namespace {
std::mutex g_mutex;
std::map<std::string, KernelLaunches>& table() {
  static std::map<std::string, KernelLaunches> t;
  return t;
}
}  // namespace

void record_launch(const char* kernel, int64_t blocks) {
  std::lock_guard<std::mutex> lock(g_mutex);
  KernelLaunches& k = table()[kernel];
  ++k.launches;
  if (blocks > 1) ++k.multi_block;
  k.max_blocks = std::max(k.max_blocks, blocks);
}

std::map<std::string, KernelLaunches> kernel_launches() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return table();
}

}  // namespace gradfuzz::ops::cuda
