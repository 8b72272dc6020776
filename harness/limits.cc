#include "harness/limits.h"

#include <limits>
#include <sstream>

#include "harness/builder.h"
#include "ops/op_registry.h"

namespace gradfuzz::harness {

namespace {

/// Product of `shape`, saturating at int64 max (shapes come from untrusted files).
int64_t elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::numeric_limits<int64_t>::max();
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return std::numeric_limits<int64_t>::max();
    n *= d;
  }
  return n;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

void check_case_limits(const CaseSpec& spec, const CaseLimits& limits) {
  auto over = [](const std::string& path, const std::string& what, const std::string& got, int64_t limit) {
    throw SpecError(path, what + " " + got + " is past gradfuzz's limit of " + std::to_string(limit));
  };
  if (static_cast<int64_t>(spec.ops.size()) > limits.max_ops) {
    over("/ops", "a case of", std::to_string(spec.ops.size()) + " modules", limits.max_ops);
  }
  for (size_t d = 0; d < spec.input_shape.size(); ++d) {
    if (spec.input_shape[d] > limits.max_dim) {
      over("/input_shape/" + std::to_string(d), "dimension", std::to_string(spec.input_shape[d]), limits.max_dim);
    }
  }
  if (spec.extra_input_count_delta > limits.max_extra_input_count_delta ||
      spec.extra_input_count_delta < -limits.max_extra_input_count_delta) {
    over("/extra_input_count_delta", "a delta of", std::to_string(spec.extra_input_count_delta),
         limits.max_extra_input_count_delta);
  }
  if (static_cast<int64_t>(spec.call_then_bind.size()) > limits.max_steps) {
    over("/call_then_bind", "", std::to_string(spec.call_then_bind.size()) + " steps", limits.max_steps);
  }
  if (static_cast<int64_t>(spec.late_binds.size()) > limits.max_steps) {
    over("/late_binds", "", std::to_string(spec.late_binds.size()) + " steps", limits.max_steps);
  }
  if (static_cast<int64_t>(spec.repeat_calls.size()) > limits.max_repeat_calls) {
    over("/repeat_calls", "", std::to_string(spec.repeat_calls.size()) + " calls", limits.max_repeat_calls);
  }
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    for (const auto& [name, value] : spec.ops[i].attrs) {
      const bool is_count = name == "groups";
      const bool is_dim = name == "out" || name == "features" || name == "interleave" || is_count;
      if (!is_dim) continue;
      const int64_t limit = is_count ? limits.max_groups : limits.max_dim;
      if (value > static_cast<double>(limit)) {
        std::ostringstream text;
        text << value;
        over("/ops/" + std::to_string(i) + "/attrs/" + name, "attr '" + name + "' =", text.str(), limit);
      }
    }
  }
  // Shapes through the ops' signatures: nothing allocated yet. An op whose attrs do not
  // fit raises in every path later; the sizes before it are still checked.
  const auto& registry = ops::OpRegistry::catalog();
  std::vector<int64_t> shape = spec.input_shape;
  int64_t total = elements(shape);
  auto check_tensor = [&](const std::string& path, const std::string& what, const std::vector<int64_t>& s) {
    const int64_t n = elements(s);
    if (n > limits.max_tensor_elements) {
      throw SpecError(path,
                      what + " " + shape_text(s) + " has " +
                          (n == std::numeric_limits<int64_t>::max() ? std::string("too many") : std::to_string(n)) +
                          " elements, past gradfuzz's limit of " + std::to_string(limits.max_tensor_elements));
    }
    total = n > limits.max_case_elements - total ? limits.max_case_elements + 1 : total + n;
  };
  check_tensor("/input_shape", "the input", shape);
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    const OpSpec& op = spec.ops[i];
    if (op.name == kBoundaryOp) continue;
    ops::OpSignature sig;
    try {
      sig = registry.signature(op.name, op.attrs, shape);
    } catch (const std::exception&) {
      return;  // every path's error, reported by the run
    }
    const std::string path = "/ops/" + std::to_string(i);
    check_tensor(path, op.name + " output", sig.output_shape);
    for (const auto& slot : sig.extra_inputs) check_tensor(path, op.name + " extra input", slot.shape);
    for (const auto& slot : sig.extra_outputs) check_tensor(path, op.name + " extra output", slot.shape);
    for (const auto& p : sig.parameter_shapes) check_tensor(path, op.name + " parameter", p);
    if (total > limits.max_case_elements) {
      throw SpecError(path, "the case's tensors up to " + op.name + " have more than gradfuzz's limit of " +
                                std::to_string(limits.max_case_elements) + " elements");
    }
    shape = sig.output_shape;
  }
}

int64_t json_nesting_depth(const std::string& text) {
  int64_t depth = 0;
  int64_t deepest = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace gradfuzz::harness
