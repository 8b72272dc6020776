#include "campaign/sanitizer.h"

#include <sstream>
#include <stdexcept>

namespace gradfuzz::campaign {

namespace {

constexpr const char* kPrefix = "=========";

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

/// Lines the tool prints that are not errors.
bool is_banner(const std::string& body) {
  for (const char* b : {"COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY", "Target application",
                        "Program hit cudaErrorNotReady", "This tool", "Warning:"}) {
    if (starts_with(body, b)) return true;
  }
  return false;
}

}  // namespace

const char* sanitizer_tool_name(SanitizerTool tool) {
  switch (tool) {
    case SanitizerTool::kMemcheck:
      return "memcheck";
    case SanitizerTool::kRacecheck:
      return "racecheck";
    case SanitizerTool::kInitcheck:
      return "initcheck";
    case SanitizerTool::kSynccheck:
      return "synccheck";
  }
  return "memcheck";
}

SanitizerTool sanitizer_tool_from_name(const std::string& name) {
  for (SanitizerTool t :
       {SanitizerTool::kMemcheck, SanitizerTool::kRacecheck, SanitizerTool::kInitcheck, SanitizerTool::kSynccheck}) {
    if (name == sanitizer_tool_name(t)) return t;
  }
  throw std::invalid_argument("unknown sanitizer tool '" + name +
                              "'; known: memcheck, racecheck, initcheck, synccheck");
}

std::vector<std::string> sanitizer_argv(const SanitizerOptions& options, const std::vector<std::string>& worker_argv) {
  std::vector<std::string> argv{options.executable, "--tool", sanitizer_tool_name(options.tool), "--log-file",
                                options.log_pattern,
                                // Keep running after an error: the worker reports it as the case's finding.
                                "--error-exitcode", "0"};
  if (options.tool == SanitizerTool::kMemcheck) {
    // A padding buffer after every allocation: a write just past a tensor hits it rather
    // than a neighbouring allocation, where it would be invisible.
    argv.insert(argv.end(), {"--padding", "512", "--leak-check", "no"});
  }
  if (options.tool == SanitizerTool::kRacecheck) argv.insert(argv.end(), {"--racecheck-report", "all"});
  argv.insert(argv.end(), worker_argv.begin(), worker_argv.end());
  return argv;
}

std::vector<std::pair<std::string, std::string>> sanitizer_environment() {
  return {{"PYTORCH_NO_CUDA_MEMORY_CACHING", "1"}};
}

SanitizerReport parse_sanitizer_log(const std::string& text) {
  SanitizerReport report;
  std::istringstream in(text);
  std::string line;
  bool in_first = false;
  while (std::getline(in, line)) {
    if (!starts_with(line, kPrefix)) {
      in_first = false;
      continue;
    }
    std::string body = line.substr(std::string(kPrefix).size());
    if (body.empty() || body.find_first_not_of(' ') == std::string::npos) {
      in_first = false;
      continue;
    }
    const size_t indent = body.find_first_not_of(' ');
    const std::string content = body.substr(indent);
    if (indent <= 1) {
      // A header at the first column: a new error, unless it is the banner or a summary.
      in_first = false;
      if (is_banner(content)) continue;
      if (++report.errors == 1) {
        report.first_error = content;
        in_first = true;
      }
      continue;
    }
    if (in_first) {
      report.first_error += "\n  " + content;
      if (report.kernel.empty() && starts_with(content, "at ")) {
        // "at 0x90 in void kernel<float>(...)" or "at kernel<float>(...)+0x90"
        std::string k = content.substr(3);
        const size_t in_pos = k.find(" in ");
        if (in_pos != std::string::npos) k = k.substr(in_pos + 4);
        if (starts_with(k, "void ")) k = k.substr(5);
        const size_t paren = k.find('(');
        report.kernel = paren == std::string::npos ? k : k.substr(0, paren);
      }
    }
  }
  return report;
}

}  // namespace gradfuzz::campaign
