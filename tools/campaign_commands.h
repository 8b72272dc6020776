#pragma once

// The subcommands that run cases: `gradfuzz fuzz`, `replay`, `selftest` and the internal
// `worker` (a campaign's worker process). Internal to gradfuzz_cli (tools/cli.cc).

#include <iosfwd>

namespace CLI {
class App;
}  // namespace CLI

namespace gradfuzz::tools::detail {

struct Flags;

/// `gradfuzz fuzz`: a seeded campaign; progress lines to `err` when `terminal`.
int cmd_fuzz(const Flags& f, const CLI::App& sub, std::ostream& out, std::ostream& err, bool terminal);
/// `gradfuzz replay PATH...`.
int cmd_replay(const Flags& f, const CLI::App& sub, std::ostream& out, std::ostream& err);
/// `gradfuzz selftest`: the default campaign against every known fault.
int cmd_selftest(const Flags& f, const CLI::App& sub, std::ostream& out, std::ostream& err, bool terminal);
/// `gradfuzz worker` (internal): a campaign's worker process (campaign::run_worker).
int cmd_worker(const Flags& f);

}  // namespace gradfuzz::tools::detail
