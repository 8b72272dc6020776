#pragma once

#include <iosfwd>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace gradfuzz::tools {

/// `gradfuzz known accept REPORT.json -o FILE [--known OLD.json]`: writes a known-issues file
/// (docs/KNOWN.md) with one entry per finding cluster of the report that no entry of OLD
/// matches (OLD's entries kept first), each matching exactly that cluster's signature on the
/// report's backend and version, status open-defect and a note saying where it came from:
/// the baseline a maintainer then edits (says what each is, links it, widens the match), the
/// way linters keep a baseline. Registered on the app by the constructor; the object must
/// outlive parsing.
class KnownCommand {
 public:
  explicit KnownCommand(CLI::App& app);
  KnownCommand(const KnownCommand&) = delete;
  KnownCommand& operator=(const KnownCommand&) = delete;

  bool parsed() const;
  /// Throws InputError for an unreadable report or known file, or an output that cannot be
  /// written. Returns 0.
  int run(std::ostream& out) const;

 private:
  CLI::App* known_ = nullptr;
  CLI::App* accept_ = nullptr;
  std::string report_;
  std::string output_;
  std::string previous_;
};

}  // namespace gradfuzz::tools
