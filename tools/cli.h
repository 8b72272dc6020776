#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace gradfuzz::tools {

/// The whole `gradfuzz` command line (fuzzer.md "Command line"), in-process:
///   gradfuzz fuzz   [--cases N | --time SECONDS] [--seed S] [--device cpu|cuda|auto]
///                   [--dtypes LIST] [--max-ops K] [--fault NAME] [--corpus DIR]
///                   [--report FILE] [--quiet]
///   gradfuzz replay PATH... [--fault NAME] [--report FILE]
///   gradfuzz selftest [--faults LIST|all] [--cases N] [--report FILE]
///                     (extras: [--seed S] [--device D] [--dtypes LIST] [--max-ops K] [--corpus DIR])
///   gradfuzz list ops|fusions|faults [--json]
///   gradfuzz bench [--cases N] [--seed S] [--device D] [--dtypes LIST] [--max-ops K]
///   gradfuzz report merge OUT IN... | report diff LAST NEW [--json FILE]  (tools/report_tool.h)
/// fuzz, replay, selftest and report merge also take --junit FILE and --html FILE.
/// `args` excludes the program name. Human output goes to `out`, errors to `err`; progress
/// lines go to `err` only when `terminal` is true (main passes isatty(stderr)). Returns the
/// exit status: 0 no finding, 1 findings, 2 usage or input error, 3 internal error. Never
/// throws.
int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err, bool terminal);

}  // namespace gradfuzz::tools
