#include "ops/fusion_registry.h"

#include <algorithm>

#include "ops/errors.h"
#include "ops/op_registry.h"

namespace gradfuzz::ops {

const char* fusion_pass_name(FusionPass pass) {
  switch (pass) {
    case FusionPass::kJoint:
      return "joint";
    case FusionPass::kForward:
      return "forward";
    case FusionPass::kBackward:
      return "backward";
  }
  GRADFUZZ_INTERNAL_ASSERT(false, "unhandled fusion pass");
}

FusionRegistry& FusionRegistry::add(std::string name, FusionPass pass, FusionFn fn) {
  for (const Entry& entry : entries_) {
    GRADFUZZ_INTERNAL_ASSERT(entry.name != name, "fusion '" + name + "' registered twice");
  }
  entries_.push_back(Entry{std::move(name), pass, std::move(fn)});
  return *this;
}

const FusionRegistry& FusionRegistry::catalog() {
  static const FusionRegistry registry = [] {
    FusionRegistry r;
    register_catalog_fusions(r);
    return r;
  }();
  return registry;
}

std::vector<std::string> FusionRegistry::names() const {
  std::vector<std::string> out;
  for (const Entry& entry : entries_) out.push_back(entry.name);
  return out;
}

FusionRegistry FusionRegistry::only(const std::vector<std::string>& names) const {
  FusionRegistry subset;
  for (const std::string& name : names) {
    auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.name == name; });
    if (it == entries_.end()) {
      std::string known;
      for (const Entry& e : entries_) known += (known.empty() ? "" : ", ") + e.name;
      throw UnknownNameError("unknown fusion '" + name + "'; known fusions: " + known);
    }
  }
  // Keep registration order so plans do not depend on the order names were listed in.
  for (const Entry& entry : entries_) {
    if (std::find(names.begin(), names.end(), entry.name) != names.end()) subset.entries_.push_back(entry);
  }
  return subset;
}

std::vector<FusedOpPtr> FusionRegistry::apply(FusionPass pass, std::vector<FusedOpPtr> groups,
                                              const FusionContext& context) const {
  for (const Entry& entry : entries_) {
    if (entry.pass == pass) groups = entry.fn(groups, context);
  }
  return groups;
}

std::vector<FusedOpPtr> apply_pattern(const std::vector<FusedOpPtr>& groups, const FusionContext& context,
                                      const PatternMatcher& match) {
  std::vector<FusedOpPtr> out;
  out.reserve(groups.size());
  size_t i = 0;
  while (i < groups.size()) {
    if (groups[i]->is_basic()) {
      auto [fused, covered] = match(groups, i, context);
      if (fused) {
        GRADFUZZ_INTERNAL_ASSERT(covered > 0 && i + covered <= groups.size(), "pattern covers no groups");
        out.push_back(std::move(fused));
        i += covered;
        continue;
      }
    }
    out.push_back(groups[i]);
    ++i;
  }
  return out;
}

}  // namespace gradfuzz::ops
