#include "generators/invalid_gen.h"

#include <ostream>

#include "generators/draw.h"
#include "generators/parallel_gen.h"
#include "generators/validate.h"
#include "ops/errors.h"

namespace gradfuzz::generators {
namespace {

using harness::CaseSpec;
using harness::OpSpec;

using detail::pick;

OpSpec make_op(const std::string& name, ops::OpAttrs attrs = {}) {
  OpSpec op;
  op.name = name;
  op.attrs = std::move(attrs);
  return op;
}

OpSpec bound_output(OpSpec op, int64_t slot, const std::string& channel, bool to_caller) {
  op.output_bindings.resize(static_cast<size_t>(slot) + 1);
  op.output_bindings[slot] = {channel, to_caller};
  return op;
}

OpSpec bound_input(OpSpec op, int64_t slot, const std::string& channel) {
  op.input_channels.resize(static_cast<size_t>(slot) + 1);
  op.input_channels[slot] = channel;
  return op;
}

/// Inserts `ops` before module `pos`, shifting call-then-bind indices that follow.
void insert_ops(CaseSpec& spec, int64_t pos, const std::vector<OpSpec>& ops) {
  spec.ops.insert(spec.ops.begin() + pos, ops.begin(), ops.end());
  for (auto& step : spec.call_then_bind) {
    if (step.op >= pos) step.op += static_cast<int64_t>(ops.size());
  }
}

/// Positions where a Boundary splits no channel of `spec` (0 and the end always qualify).
std::vector<int64_t> boundary_safe_positions(const CaseSpec& spec, const CaseLayout& layout) {
  const auto channels = case_channels(spec, layout);
  std::vector<int64_t> safe;
  for (int64_t k = 0; k <= static_cast<int64_t>(spec.ops.size()); ++k) {
    bool splits = false;
    for (const auto& ch : channels) {
      for (const auto& c : ch.consumers) splits = splits || (ch.producer.op < k && k <= c.op);
    }
    if (!splits) safe.push_back(k);
  }
  return safe;
}

/// Shape reaching position `pos` (before module pos; the output shape at the end).
std::vector<int64_t> shape_at(const CaseSpec& spec, const CaseLayout& layout, int64_t pos) {
  if (pos < static_cast<int64_t>(layout.modules.size())) return layout.modules[pos].input_shape;
  if (layout.modules.empty()) return spec.input_shape;
  const auto& last = layout.modules.back();
  return last.boundary ? last.input_shape : last.signature.output_shape;
}

/// Index of an op with at least one extra input, inserting a public AddExtraInput if none.
int64_t op_with_inputs(CaseSpec& spec) {
  auto layout = compute_layout(spec);
  std::vector<int64_t> found;
  for (size_t i = 0; i < layout->modules.size(); ++i) {
    if (!layout->modules[i].signature.extra_inputs.empty()) found.push_back(static_cast<int64_t>(i));
  }
  if (!found.empty()) return found[static_cast<size_t>(pick(0, static_cast<int64_t>(found.size()) - 1))];
  const int64_t pos = pick(0, static_cast<int64_t>(spec.ops.size()));
  insert_ops(spec, pos, {make_op("AddExtraInput", {{"in_place", 0}})});
  return pos;
}

InvalidCase mutate(CaseSpec spec, int64_t which, bool surplus_ignored, int64_t max_tensor_elements) {
  // One Sequential: its construction checks every fuser before it locks any (several
  // Sequentials would lock the ones built before the invalid one).
  spec.several_sequentials = false;
  const auto layout = *compute_layout(spec);
  const int64_t n = static_cast<int64_t>(spec.ops.size());
  int64_t pos = pick(0, n);
  const std::string x = "invalid_x";
  const bool to_caller = pick(0, 1) == 1;
  InvalidCase out;
  switch (which) {
    case 0: {  // consumer before producer, adjacent in one fuser
      const int64_t variant = pick(0, 2);
      std::vector<OpSpec> pair;
      if (variant == 0) {
        pair = {bound_input(make_op("AddExtraInput"), 0, x), bound_output(make_op("MakeExtraOutput"), 0, x, to_caller)};
      } else if (variant == 1) {
        const int64_t slot = pick(0, 1);
        pair = {bound_input(make_op("AddExtraInput"), 0, x),
                bound_output(make_op("DualExtraOutput", {{"s0", 0.5}, {"s1", -2.0}}), slot, x, to_caller)};
      } else {
        pair = {bound_input(make_op("ScaledSReLU"), 0, x), bound_output(make_op("RowStat"), 0, x, to_caller)};
      }
      insert_ops(spec, pos, pair);
      out.expected_kind = ops::ProducerNotEarlierError::kKind;
      out.description = pair[0].name + " at op " + std::to_string(pos) + " consumes '" + x + "' produced by " +
                        pair[1].name + " after it";
      break;
    }
    case 1: {  // two producers of one channel in one fuser
      if (pick(0, 1) == 0) {
        insert_ops(
            spec, pos,
            {bound_output(make_op("MakeExtraOutput"), 0, x, to_caller), bound_output(make_op("RowStat"), 0, x, true)});
        out.description = "MakeExtraOutput and RowStat at ops " + std::to_string(pos) + "," + std::to_string(pos + 1) +
                          " both produce '" + x + "'";
      } else {
        OpSpec dual = make_op("DualExtraOutput", {{"s0", 1.5}, {"s1", -0.5}});
        dual.output_bindings = {{x, to_caller}, {x, true}};
        insert_ops(spec, pos, {dual});
        out.description = "DualExtraOutput at op " + std::to_string(pos) + " produces '" + x + "' from both slots";
      }
      out.expected_kind = ops::DuplicateProducerError::kKind;
      break;
    }
    case 2: {  // channel across a Boundary, or with no producer anywhere
      if (pick(0, 1) == 0) {
        const auto safe = boundary_safe_positions(spec, layout);
        const int64_t at = safe[static_cast<size_t>(pick(0, static_cast<int64_t>(safe.size()) - 1))];
        insert_ops(spec, at,
                   {bound_output(make_op("MakeExtraOutput"), 0, x, to_caller), make_op(harness::kBoundaryOp),
                    bound_input(make_op("AddExtraInput"), 0, x)});
        out.description = "channel '" + x + "' crosses the Boundary at op " + std::to_string(at + 1);
      } else {
        insert_ops(spec, pos, {bound_input(make_op("AddExtraInput"), 0, x)});
        out.description = "AddExtraInput at op " + std::to_string(pos) + " consumes '" + x + "' that nobody produces";
      }
      out.expected_kind = ops::MissingProducerError::kKind;
      break;
    }
    case 3: {  // surplus or shortfall of public extra inputs
      const int64_t publics = count_public_inputs(spec, layout);
      // A backend that documents ignoring a surplus (TE's Sequential) is only given a shortfall.
      if (surplus_ignored && publics == 0) {
        return mutate(std::move(spec), 2, surplus_ignored, max_tensor_elements);  // nothing to withhold
      }
      std::vector<int64_t> deltas;
      if (!surplus_ignored) deltas = {1, 2};
      if (publics > 0) deltas.push_back(-1);
      spec.extra_input_count_delta = deltas[static_cast<size_t>(pick(0, static_cast<int64_t>(deltas.size()) - 1))];
      out.expected_kind = ops::ExtraInputCountError::kKind;
      out.description = "passes " + std::to_string(publics + spec.extra_input_count_delta) + " public extra inputs, " +
                        std::to_string(publics) + " expected";
      break;
    }
    case 4: {  // split sizes that do not sum to the rows
      bool has_public_split = false;
      for (size_t i = 0; i < layout.modules.size(); ++i) {
        const auto& ins = layout.modules[i].signature.extra_inputs;
        for (size_t s = 0; s < ins.size(); ++s) {
          const auto& ch = spec.ops[i].input_channels;
          if (ins[s].kind == ops::TensorKind::kSplitSizes && (s >= ch.size() || !ch[s])) has_public_split = true;
        }
      }
      if (!has_public_split) {
        // A shape-preserving GroupedLinear (out = features here) with public split sizes,
        // where its weights ([features, features] per group) fit the tensor budget as valid
        // cases' do; a case with no such place gets another kind of invalid configuration.
        const int64_t groups = pick(1, 4);
        std::vector<int64_t> places;
        for (int64_t p = 0; p <= n; ++p) {
          const int64_t f = shape_at(spec, layout, p)[1];
          if (f * f <= max_tensor_elements) places.push_back(p);
        }
        if (places.empty()) return mutate(std::move(spec), 3, surplus_ignored, max_tensor_elements);
        pos = places[static_cast<size_t>(pick(0, static_cast<int64_t>(places.size()) - 1))];
        const auto shape = shape_at(spec, layout, pos);
        const bool scale_bias = pick(0, 1) == 1;
        insert_ops(spec, pos,
                   {make_op("GroupedLinear", {{"groups", static_cast<double>(groups)},
                                              {"out", static_cast<double>(shape[1])},
                                              {"bias", scale_bias ? 1.0 : static_cast<double>(pick(0, 1))},
                                              {"scale_bias", scale_bias ? 1.0 : 0.0}})});
      }
      spec.corrupt_split_sizes = true;
      out.expected_kind = ops::InvalidArgumentError::kKind;
      out.description = "public split sizes drawn so that they do not sum to the rows";
      break;
    }
    default: {  // late binds: locked, slot-out-of-range, invalid-channel-name
      const int64_t op = op_with_inputs(spec);
      const auto new_layout = *compute_layout(spec);
      const int64_t n_in = static_cast<int64_t>(new_layout.modules[op].signature.extra_inputs.size());
      harness::LateBindStep step;
      step.op = op;
      if (which == 5) {
        step.slot = pick(0, n_in - 1);
        const auto& ch = spec.ops[op].input_channels;
        // Re-binding the same channel must raise too; otherwise a new name.
        const bool same = step.slot < static_cast<int64_t>(ch.size()) && ch[step.slot] && pick(0, 1) == 1;
        step.channel = same ? *ch[step.slot] : "late";
        out.expected_kind = ops::LockedError::kKind;
        out.description = spec.ops[op].name + " input slot " + std::to_string(step.slot) + " bound to '" +
                          step.channel + "' after construction";
      } else if (which == 6) {
        step.slot = pick(0, 1) == 0 ? -1 : n_in + pick(0, 2);
        step.channel = "late";
        out.expected_kind = ops::SlotOutOfRangeError::kKind;
        out.description =
            spec.ops[op].name + " late bind of input slot " + std::to_string(step.slot) + " of " + std::to_string(n_in);
      } else {
        step.slot = pick(0, n_in - 1);
        step.channel = "";
        out.expected_kind = ops::InvalidChannelNameError::kKind;
        out.description =
            spec.ops[op].name + " late bind of input slot " + std::to_string(step.slot) + " with an empty channel name";
      }
      spec.late_binds.push_back(step);
      break;
    }
  }
  canonicalize(spec);
  out.spec = std::move(spec);
  return out;
}

}  // namespace

const std::vector<std::string>& invalid_case_kinds() {
  static const std::vector<std::string> kKinds{
      ops::ProducerNotEarlierError::kKind, ops::DuplicateProducerError::kKind, ops::MissingProducerError::kKind,
      ops::ExtraInputCountError::kKind,    ops::InvalidArgumentError::kKind,   ops::LockedError::kKind,
      ops::SlotOutOfRangeError::kKind,     ops::InvalidChannelNameError::kKind};
  return kKinds;
}

std::ostream& operator<<(std::ostream& os, const InvalidCase& c) {
  return os << "InvalidCase{" << c.expected_kind << ": " << c.description << ", spec=" << c.spec << "}";
}

rc::Gen<InvalidCase> gen_invalid_case(const GenOptions& options) {
  // Distributed cases: a split te.ops refuses (parallel_gen.h); on one rank there is none,
  // so the one-process mutations below on one-process cases.
  if (options.world_size && *options.world_size > 1) return gen_parallel_invalid_case(options);
  if (options.world_size) {
    GenOptions one = options;
    one.world_size.reset();
    return gen_invalid_case(one);
  }
  const auto base = gen_case(options);
  // Invalid configurations that a backend's documented deviation makes valid are not drawn
  // for it: TE ignores surplus extra inputs, and builds (and locks) its fusers at the first
  // forward, so a binding set after its Sequential was constructed is legal there.
  const auto* caps = options.capabilities.get();
  const bool surplus_ignored = caps && caps->has_deviation("surplus_extra_inputs_ignored");
  const bool lazy = caps && caps->has_deviation("lazy_fuser_construction");
  std::vector<int64_t> kinds;
  for (int64_t k = 0; k < static_cast<int64_t>(invalid_case_kinds().size()); ++k) {
    if (lazy && invalid_case_kinds()[static_cast<size_t>(k)] == std::string(ops::LockedError::kKind)) continue;
    kinds.push_back(k);
  }
  const int64_t max_tensor_elements = options.max_tensor_elements;
  return rc::gen::exec([base, kinds, surplus_ignored, max_tensor_elements] {
    const CaseSpec spec = *base;
    const int64_t which = kinds[static_cast<size_t>(pick(0, static_cast<int64_t>(kinds.size()) - 1))];
    return mutate(spec, which, surplus_ignored, max_tensor_elements);
  });
}

InvalidCase generate_invalid_case(uint64_t seed, int size, const GenOptions& options) {
  return gen_invalid_case(options)(rc::Random(seed), size).value();
}

}  // namespace gradfuzz::generators
