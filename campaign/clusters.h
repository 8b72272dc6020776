#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include "harness/case_result.h"

namespace gradfuzz::campaign {

/// A campaign's finding clusters: one per key, the root-cause signature of a finding
/// (oracle/signature.h), with "|persists-without-fault" appended for a selftest finding its
/// fault is not responsible for, and "|known:<id>" for a finding a known issue with
/// case-level conditions matched (its recipe or dtype, docs/KNOWN.md): such an entry covers
/// some of a signature's cases, and the others must stay a new cluster of their own. A case
/// whose findings carry several signatures is counted in each of their clusters.
class ClusterTable {
 public:
  struct Cluster {
    std::string key;
    std::string signature;
    harness::VerdictKind kind = harness::VerdictKind::kMismatch;
    bool attributable = true;
    /// The known issue its findings match (empty: new).
    std::string known;
    /// Failing cases counted in it, and unshrunk example files saved for it.
    int64_t cases = 0;
    int64_t examples = 0;
  };

  /// The key of `signature` for a finding that is (or is not) the campaign fault's, and that
  /// the case-level known issue `case_known` matched (empty: none did).
  static std::string key(const std::string& signature, bool attributable, const std::string& case_known = "");
  /// The cluster with `key`, or nullptr.
  Cluster* find(const std::string& key);
  /// Adds a cluster (its key must be new) and returns it; addresses stay valid.
  Cluster& add(Cluster cluster);
  const std::deque<Cluster>& clusters() const { return clusters_; }

 private:
  std::deque<Cluster> clusters_;
};

}  // namespace gradfuzz::campaign
