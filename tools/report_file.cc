#include "tools/report_file.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "campaign/exit_codes.h"

namespace gradfuzz::tools::detail {

using campaign::InputError;

ReportFile::ReportFile(std::string path) : path_(std::move(path)) {
  if (path_.empty()) throw InputError("--report: expected a file name, got an empty one");
  write_text("{}\n");
}

void ReportFile::write(const nlohmann::ordered_json& document) { write_text(document.dump(2) + "\n"); }

void ReportFile::write_raw(const std::string& text) { write_text(text); }

void ReportFile::write_text(const std::string& text) {
  const std::string tmp = path_ + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream file(tmp, std::ios::binary | std::ios::trunc);
    if (!file) throw InputError("--report: cannot write '" + path_ + "' (cannot create " + tmp + ")");
    file << text;
    file.flush();
    if (!file) throw InputError("--report: cannot write '" + path_ + "'");
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw InputError("--report: cannot write '" + path_ + "' (rename failed)");
  }
}

}  // namespace gradfuzz::tools::detail
