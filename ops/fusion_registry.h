#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ops/fused_op.h"

namespace gradfuzz::ops {

/// Which plan a fusion contributes to (runtime.md section 5).
enum class FusionPass { kJoint, kForward, kBackward };
const char* fusion_pass_name(FusionPass pass);

/// What a fusion function may consult besides the ops themselves.
struct FusionContext {
  /// Index (in the fuser's basic ops) of the first op of the list handed to the function.
  int64_t first_op_requiring_backward = 0;
  /// The fuser's basic ops, for looking up bindings and producers by channel name.
  const std::vector<BasicOpPtr>* basic_ops = nullptr;
};

/// Maps an op list to an op list, replacing runs of groups with fused ops where its
/// pattern and preconditions hold and leaving everything else untouched.
using FusionFn = std::function<std::vector<FusedOpPtr>(const std::vector<FusedOpPtr>&, const FusionContext&)>;

/// A set of named fusions, each in one pass. An object handed to a fuser, not global
/// state, so each test or fuzz case chooses exactly which fusions are on.
class FusionRegistry {
 public:
  struct Entry {
    std::string name;
    FusionPass pass;
    FusionFn fn;
  };

  /// Adds a fusion; a name already present throws UnknownNameError-free logic_error.
  FusionRegistry& add(std::string name, FusionPass pass, FusionFn fn);
  /// Every catalog fusion of ops.md.
  static const FusionRegistry& catalog();
  /// The subset with exactly these names; an unknown name throws UnknownNameError that
  /// lists the known names.
  FusionRegistry only(const std::vector<std::string>& names) const;

  const std::vector<Entry>& entries() const { return entries_; }
  std::vector<std::string> names() const;
  bool empty() const { return entries_.empty(); }

  /// Applies the functions of one pass, in registration order.
  std::vector<FusedOpPtr> apply(FusionPass pass, std::vector<FusedOpPtr> groups, const FusionContext& context) const;

 private:
  std::vector<Entry> entries_;
};

/// Helper for pattern fusions: scans `groups` left to right; wherever `match` accepts the
/// run of *basic* groups starting at i (returning the fused op and how many groups it
/// covers, or nullptr), replaces them. Used by every catalog fusion.
using PatternMatcher =
    std::function<std::pair<FusedOpPtr, size_t>(const std::vector<FusedOpPtr>&, size_t, const FusionContext&)>;
std::vector<FusedOpPtr> apply_pattern(const std::vector<FusedOpPtr>& groups, const FusionContext& context,
                                      const PatternMatcher& match);

}  // namespace gradfuzz::ops
