#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradfuzz::campaign {

/// A compute-sanitizer tool (`--sanitize TOOL`).
enum class SanitizerTool { kMemcheck, kRacecheck, kInitcheck, kSynccheck };
/// "memcheck", "racecheck", "initcheck", "synccheck".
const char* sanitizer_tool_name(SanitizerTool tool);
/// Inverse of sanitizer_tool_name; throws std::invalid_argument listing the names.
SanitizerTool sanitizer_tool_from_name(const std::string& name);

/// How workers run under compute-sanitizer.
struct SanitizerOptions {
  SanitizerTool tool = SanitizerTool::kMemcheck;
  /// The compute-sanitizer executable ($GRADFUZZ_COMPUTE_SANITIZER, else on PATH).
  std::string executable = "compute-sanitizer";
  /// Where each worker's log goes: "%p" is replaced by the worker's process id.
  std::string log_pattern;
};

/// The command line that runs `worker_argv` under the sanitizer: the tool, its log file
/// (never stdout, which carries the worker's frames), padding after every allocation so
/// small overruns land outside any allocation, errors reported without stopping the
/// process, and the worker command itself.
std::vector<std::string> sanitizer_argv(const SanitizerOptions& options, const std::vector<std::string>& worker_argv);

/// Environment a sanitized worker needs: PyTorch's caching allocator off, so every tensor
/// is its own allocation and an access past its end is out of bounds for the tool.
std::vector<std::pair<std::string, std::string>> sanitizer_environment();

/// What a stretch of sanitizer log says.
struct SanitizerReport {
  /// Error blocks found ("Invalid __global__ write of size 4 bytes", "Race reported ...").
  int64_t errors = 0;
  /// The first error block, its lines without the "=========" prefix, for the finding.
  std::string first_error;
  /// The kernel the first error names ("bias_activation_forward_kernel<float>"), if any.
  std::string kernel;
};

/// Parses compute-sanitizer output (any tool): every line starting "========= " followed by
/// text at the first column opens an error block, except the tool's banner and its
/// summaries; indented lines belong to the open block.
SanitizerReport parse_sanitizer_log(const std::string& text);

}  // namespace gradfuzz::campaign
