#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

namespace gradfuzz::tools::detail {

/// The JSON report, valid at every moment: each write goes to a temporary file beside it and
/// is renamed over it, so a reader (or a run killed mid-write) never sees half a document.
class ReportFile {
 public:
  /// Checks up front that the directory takes a file, so a bad path is a usage error
  /// before any case runs.
  explicit ReportFile(std::string path);
  void write(const nlohmann::ordered_json& document);
  void write_raw(const std::string& text);

 private:
  void write_text(const std::string& text);
  std::string path_;
};

}  // namespace gradfuzz::tools::detail
