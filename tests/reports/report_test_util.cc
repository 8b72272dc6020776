#include "tests/reports/report_test_util.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "reports/report_document.h"

namespace gradfuzz::reports::test_util {

namespace {

std::string source_dir() {
  const char* root = std::getenv("GRADFUZZ_SOURCE_DIR");
  return root ? root : ".";
}

}  // namespace

std::string data_path(const std::string& name) { return source_dir() + "/tests/reports/data/" + name; }
std::string golden_path(const std::string& name) { return source_dir() + "/tests/reports/golden/" + name; }

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    return "";
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

nlohmann::ordered_json data_report(const std::string& name) { return load_report(data_path(name)); }

void expect_golden(const std::string& name, const std::string& text) {
  const std::string path = golden_path(name);
  const char* update = std::getenv("GRADFUZZ_UPDATE_GOLDEN");
  if (update && std::string(update) == "1") {
    std::ofstream(path, std::ios::binary) << text;
    GTEST_SKIP() << "rewrote " << path;
  }
  EXPECT_EQ(text, read_text(path)) << "output differs from " << path;
}

std::string make_temp_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/gradfuzz-reports-test-XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (!::mkdtemp(buffer.data())) {
    ADD_FAILURE() << "cannot create " << pattern;
    return "";
  }
  return buffer.data();
}

void remove_dir(const std::string& dir) {
  if (dir.empty() || dir.find("gradfuzz-reports-test-") == std::string::npos) return;
  std::string out;
  run_command("rm -rf '" + dir + "'", out);
}

int run_command(const std::string& command, std::string& out) {
  out.clear();
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return -1;
  std::array<char, 4096> buffer{};
  size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) out.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace gradfuzz::reports::test_util
