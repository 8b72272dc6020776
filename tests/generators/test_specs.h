#pragma once

#include <optional>
#include <string>
#include <vector>

#include "harness/case_spec.h"

namespace gradfuzz::generators::testing {

/// Hand-written case pieces for the generators/ tests.
inline harness::OpSpec op(std::string name, ops::OpAttrs attrs = {}) {
  harness::OpSpec o;
  o.name = std::move(name);
  o.attrs = std::move(attrs);
  return o;
}

inline harness::OpSpec with_inputs(harness::OpSpec o, std::vector<std::optional<std::string>> channels) {
  o.input_channels = std::move(channels);
  return o;
}

inline harness::OpSpec with_output(harness::OpSpec o, size_t slot, std::string channel, bool to_caller = true) {
  if (o.output_bindings.size() <= slot) o.output_bindings.resize(slot + 1);
  o.output_bindings[slot] = {std::move(channel), to_caller};
  return o;
}

inline harness::CaseSpec make_case(std::vector<harness::OpSpec> ops, std::vector<int64_t> shape = {4, 8},
                                   std::vector<std::string> fusions = {}) {
  harness::CaseSpec spec;
  spec.ops = std::move(ops);
  spec.input_shape = std::move(shape);
  spec.fusions = std::move(fusions);
  return spec;
}

}  // namespace gradfuzz::generators::testing
