#pragma once

#include <optional>
#include <string>
#include <vector>

#include "harness/case_spec.h"

namespace gradfuzz::harness::testing {

/// A hand-written op of a test case: name, attrs, input channels (nullopt = public) and
/// output bindings.
inline OpSpec op(std::string name, ops::OpAttrs attrs = {}, std::vector<std::optional<std::string>> inputs = {},
                 std::vector<OutputBindingSpec> outputs = {}) {
  OpSpec o;
  o.name = std::move(name);
  o.attrs = std::move(attrs);
  o.input_channels = std::move(inputs);
  o.output_bindings = std::move(outputs);
  return o;
}

}  // namespace gradfuzz::harness::testing
