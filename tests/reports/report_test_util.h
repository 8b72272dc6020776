#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace gradfuzz::reports::test_util {

/// tests/reports/data/<name> and tests/reports/golden/<name> in the source tree
/// ($GRADFUZZ_SOURCE_DIR, set by ctest; "." otherwise).
std::string data_path(const std::string& name);
std::string golden_path(const std::string& name);

/// The whole file; fails the current test (and returns "") when it cannot be read.
std::string read_text(const std::string& path);

/// load_report() of tests/reports/data/<name>.
nlohmann::ordered_json data_report(const std::string& name);

/// Compares `text` with golden file `name`, or rewrites it when GRADFUZZ_UPDATE_GOLDEN=1
/// (then review the diff).
void expect_golden(const std::string& name, const std::string& text);

/// A fresh directory under $TMPDIR for one test; removed by the caller with remove_dir.
std::string make_temp_dir();
void remove_dir(const std::string& dir);

/// Runs `command` with /bin/sh; returns its exit status (-1 when it did not exit) and
/// stores its standard output in `out`.
int run_command(const std::string& command, std::string& out);

}  // namespace gradfuzz::reports::test_util
