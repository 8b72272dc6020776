#include "harness/sharding.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <stdexcept>

namespace gradfuzz::harness {

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::kReplicated:
      return "replicated";
    case Layout::kRows:
      return "rows";
    case Layout::kFeatures:
      return "features";
    case Layout::kPartial:
      return "partial";
  }
  return "replicated";
}

Layout input_layout_of(const CaseSpec& spec) {
  if (spec.input_layout == "rows") return Layout::kRows;
  if (spec.input_layout == "features") return Layout::kFeatures;
  return Layout::kReplicated;
}

Placement replicated() { return {Placement::Kind::kReplicated, 0}; }
Placement sharded(int64_t dim) { return {Placement::Kind::kSharded, dim}; }
Placement partial() { return {Placement::Kind::kPartial, 0}; }

std::string placement_name(const Placement& p) {
  switch (p.kind) {
    case Placement::Kind::kReplicated:
      return "replicated";
    case Placement::Kind::kPartial:
      return "partial";
    case Placement::Kind::kSharded:
      return p.dim == 0 ? "rows" : "features";
  }
  return "replicated";
}

Placement value_placement(Layout layout) {
  switch (layout) {
    case Layout::kRows:
      return sharded(0);
    case Layout::kFeatures:
      return sharded(1);
    case Layout::kPartial:
      return partial();
    case Layout::kReplicated:
      break;
  }
  return replicated();
}

Placement gradient_placement(Layout layout) {
  return layout == Layout::kPartial ? replicated() : value_placement(layout);
}

namespace {

bool is_collective(const std::string& name) {
  return name == "AllGather" || name == "ReduceScatter" || name == "AllReduce";
}

/// The op's attr, or its catalog default.
double attr_of(const OpSpec& op, const std::string& name) {
  auto it = op.attrs.find(name);
  if (it != op.attrs.end()) return it->second;
  const auto& defaults = ops::OpRegistry::catalog().info(op.name).defaults;
  auto d = defaults.find(name);
  return d == defaults.end() ? 0.0 : d->second;
}

std::string op_path(size_t i) { return "/ops/" + std::to_string(i); }

std::string layouts_text(std::initializer_list<Layout> layouts) {
  std::string out;
  for (Layout l : layouts) out += std::string(out.empty() ? "" : " or ") + layout_name(l);
  return out;
}

/// Throws unless `in` is one of `allowed`.
void require_input(const OpSpec& op, size_t i, Layout in, std::initializer_list<Layout> allowed,
                   const std::string& why) {
  if (std::find(allowed.begin(), allowed.end(), in) != allowed.end()) return;
  throw SpecError(op_path(i), op.name + " (op " + std::to_string(i) + ") on " + layout_name(in) +
                                  " input: it takes " + layouts_text(allowed) + " (" + why + ")");
}

/// The rule of op `i` on input layout `in` (N > 1). `constructs_not` : TE refuses the op at
/// construction, so its input's layout is not checked.
OpSharding op_rule(const OpSpec& op, const OpPlan& op_plan, size_t i, Layout in, bool constructs_not) {
  const Layout kR = Layout::kReplicated;
  const Layout kS = Layout::kRows;
  const Layout kF = Layout::kFeatures;
  const Layout kP = Layout::kPartial;
  OpSharding r;
  r.input = in;
  r.output = in;
  const std::string& name = op.name;
  const size_t n_params = op_plan.signature.parameter_shapes.size();
  auto params = [&](Placement values, Placement grads) {
    r.params.assign(n_params, values);
    r.param_grads.assign(n_params, grads);
  };
  if (name == "AllGather") {
    require_input(op, i, in, {kS}, "it gathers the ranks' row slices");
    r.output = kR;
  } else if (name == "ReduceScatter") {
    require_input(op, i, in, {kP}, "it sums the ranks' summands");
    r.output = kS;
  } else if (name == "AllReduce") {
    require_input(op, i, in, {kP}, "it sums the ranks' summands");
    r.output = kR;
  } else if (name == "Linear") {
    const int64_t mode = static_cast<int64_t>(attr_of(op, "tensor_parallel_mode"));
    const bool sp = attr_of(op, "sequence_parallel") != 0;
    if (mode == 1) {
      // Column: y_r = x W_r^T with W_r the r-th block of W's rows; the input whole on every
      // rank (with sequence_parallel gathered from row slices first).
      if (!constructs_not) {
        require_input(op, i, in, {sp ? kS : kR},
                      sp ? "column-parallel with sequence_parallel gathers row slices"
                         : "column-parallel needs the whole input on every rank");
      }
      r.output = kF;
      params(sharded(0), sharded(0));
    } else if (mode == 2) {
      // Row: y = sum_r x_r W_r^T, W_r the r-th block of W's columns, summed over the ranks
      // (with sequence_parallel reduce-scattered into row slices).
      if (!constructs_not) require_input(op, i, in, {kF}, "row-parallel takes the ranks' feature slices");
      r.output = sp ? kS : kR;
      params(sharded(1), sharded(1));
    } else if (in == kF) {
      // A plain Linear on feature slices: the row split written by hand, summands out.
      r.output = kP;
      params(sharded(1), sharded(1));
    } else {
      // The weight copied; on slices of the rows or summands each rank's gradient is a summand.
      params(replicated(), in == kR ? replicated() : partial());
    }
  } else if (name == "Bias") {
    if (attr_of(op, "tensor_parallel") != 0) {
      if (!constructs_not) require_input(op, i, in, {kF}, "tensor_parallel splits the bias over feature slices");
      params(sharded(0), sharded(0));
    } else {
      require_input(op, i, in, {kR, kS}, "a whole bias adds to whole rows; set tensor_parallel for feature slices");
      params(replicated(), in == kR ? replicated() : partial());
    }
  } else if (name == "ConstantScale" || name == "Identity") {
    // Linear and shape-preserving: any layout.
  } else if (name == "ReLU" || name == "GELU" || name == "SReLU") {
    require_input(op, i, in, {kR, kS, kF}, "elementwise, not linear: summands would not sum");
  } else if (name == "SwiGLU") {
    require_input(op, i, in, {kR, kS}, "it splits the whole feature dimension into halves");
  } else if (name == "RMSNorm" || name == "LayerNorm") {
    require_input(op, i, in, {kR, kS}, "it normalises over every feature");
    params(replicated(), in == kR ? replicated() : partial());
  } else if (name == "MakeExtraOutput") {
    r.extra_outputs = {in};
  } else if (name == "AddExtraInput") {
    require_input(op, i, in, {kR, kS, kF}, "each rank would add the whole extra input to its summand");
    r.extra_inputs = {in};
  } else {
    throw SpecError(op_path(i), op.name + " (op " + std::to_string(i) +
                                    ") has no rule for distributed cases; they take AllGather, ReduceScatter, "
                                    "AllReduce, Linear, Bias, ConstantScale, Identity, ReLU, GELU, SReLU, SwiGLU, "
                                    "RMSNorm, LayerNorm, MakeExtraOutput, AddExtraInput");
  }
  if (r.params.size() != n_params) params(replicated(), replicated());
  auto cached = op.attrs.find("cache_quantized_input");
  if (cached != op.attrs.end() && cached->second != 0) {
    throw SpecError(op_path(i) + "/attrs/cache_quantized_input",
                    op.name + " (op " + std::to_string(i) +
                        "): cache_quantized_input=1 on several ranks scales by each rank's slice, which the "
                        "reference (the unsharded tensors) does not model");
  }
  return r;
}

/// The spec-level knobs distributed cases do not take.
void check_case_knobs(const CaseSpec& spec) {
  const std::string n = std::to_string(spec.world_size);
  if (spec.recipe) {
    throw SpecError("/recipe", "a recipe on " + n +
                                   " ranks: each rank's quantizers scale by its own slice, which the reference "
                                   "(the unsharded tensors) does not model");
  }
  if (!spec.call_then_bind.empty()) throw SpecError("/call_then_bind", "distributed cases take no call-then-bind steps");
  if (!spec.late_binds.empty()) throw SpecError("/late_binds", "distributed cases take no late binds");
  if (spec.extra_input_count_delta != 0 || spec.corrupt_split_sizes) {
    throw SpecError(spec.extra_input_count_delta != 0 ? "/extra_input_count_delta" : "/corrupt_split_sizes",
                    "distributed cases take no invalid-configuration knobs but their own splits");
  }
  const Layout in = input_layout_of(spec);
  if (in != Layout::kReplicated && spec.input_shape.size() == 2) {
    const int64_t dim = spec.input_shape[in == Layout::kRows ? 0 : 1];
    if (dim % spec.world_size != 0) {
      throw SpecError("/input_layout", std::string("input layout ") + layout_name(in) + " splits " +
                                           std::to_string(dim) + " " + layout_name(in) + " over " + n +
                                           " ranks: not divisible");
    }
  }
}

int64_t split_size(int64_t size, int64_t world_size, int64_t rank) {
  return size / world_size + (rank < size % world_size ? 1 : 0);
}

}  // namespace

ShardingPlan plan_sharding(const CaseSpec& spec, const CasePlan& plan) {
  ShardingPlan out;
  out.world_size = spec.world_size;
  const bool many = spec.world_size > 1;
  if (many) check_case_knobs(spec);
  std::optional<ParallelConfigError> refused;
  if (many) refused = parallel_config_error(spec, plan);
  out.input = many ? input_layout_of(spec) : Layout::kReplicated;
  out.channels.assign(static_cast<size_t>(plan.num_fusers), {});
  std::map<std::pair<int64_t, std::string>, Layout> channel_layouts;
  Layout x = out.input;
  for (size_t i = 0; i < spec.ops.size() && i < plan.ops.size(); ++i) {
    const OpPlan& op_plan = plan.ops[i];
    const OpSpec& op = spec.ops[i];
    OpSharding rule;
    if (op_plan.boundary) {
      rule.input = rule.output = x;
    } else if (!many) {
      rule.extra_inputs.assign(op_plan.signature.extra_inputs.size(), Layout::kReplicated);
      rule.extra_outputs.assign(op_plan.signature.extra_outputs.size(), Layout::kReplicated);
      rule.params.assign(op_plan.signature.parameter_shapes.size(), replicated());
      rule.param_grads = rule.params;
    } else {
      const bool constructs_not =
          refused && refused->at_construction && refused->op == static_cast<int64_t>(i) && !is_collective(op.name);
      rule = op_rule(op, op_plan, i, x, constructs_not);
    }
    // Channels carry a producer's layout to its consumers, which must take it as it is.
    for (size_t s = 0; s < op.output_bindings.size() && s < rule.extra_outputs.size(); ++s) {
      if (op.output_bindings[s].channel) {
        channel_layouts[{op_plan.fuser, *op.output_bindings[s].channel}] = rule.extra_outputs[s];
        if (op_plan.fuser >= 0 && op_plan.fuser < plan.num_fusers) {
          out.channels[static_cast<size_t>(op_plan.fuser)][*op.output_bindings[s].channel] = rule.extra_outputs[s];
        }
      }
    }
    for (size_t s = 0; s < op.input_channels.size() && s < rule.extra_inputs.size(); ++s) {
      if (!op.input_channels[s]) continue;
      auto it = channel_layouts.find({op_plan.fuser, *op.input_channels[s]});
      if (it != channel_layouts.end() && it->second != rule.extra_inputs[s]) {
        throw SpecError(op_path(i) + "/input_channels/" + std::to_string(s),
                        op.name + " (op " + std::to_string(i) + ") extra input slot " + std::to_string(s) +
                            " takes a " + layout_name(rule.extra_inputs[s]) + " tensor; channel '" +
                            *op.input_channels[s] + "' carries a " + layout_name(it->second) + " one");
      }
    }
    x = rule.output;
    out.ops.push_back(std::move(rule));
  }
  out.outputs.push_back(x);
  for (const auto& slot : plan.public_outputs) {
    const auto& rule = out.ops.at(static_cast<size_t>(slot.op));
    out.outputs.push_back(static_cast<size_t>(slot.slot) < rule.extra_outputs.size()
                              ? rule.extra_outputs[static_cast<size_t>(slot.slot)]
                              : Layout::kReplicated);
  }
  for (const auto& slot : plan.public_inputs) {
    const auto& rule = out.ops.at(static_cast<size_t>(slot.op));
    out.extra_inputs.push_back(static_cast<size_t>(slot.slot) < rule.extra_inputs.size()
                                   ? rule.extra_inputs[static_cast<size_t>(slot.slot)]
                                   : Layout::kReplicated);
  }
  return out;
}

std::optional<ParallelConfigError> parallel_config_error(const CaseSpec& spec, const CasePlan& plan) {
  const int64_t n = spec.world_size;
  if (n <= 1) return std::nullopt;
  std::optional<ParallelConfigError> forward;
  for (size_t i = 0; i < spec.ops.size() && i < plan.ops.size(); ++i) {
    const OpSpec& op = spec.ops[i];
    const OpPlan& op_plan = plan.ops[i];
    if (op_plan.boundary || op_plan.input_shape.size() != 2) continue;
    const int64_t rows = op_plan.input_shape[0];
    const int64_t features = op_plan.input_shape[1];
    const std::string at = op.name + " (op " + std::to_string(i) + "): ";
    auto refuse = [&](bool construction, const std::string& message) -> std::optional<ParallelConfigError> {
      return ParallelConfigError{static_cast<int64_t>(i), construction, at + message};
    };
    if (op.name == "Linear") {
      const int64_t mode = static_cast<int64_t>(attr_of(op, "tensor_parallel_mode"));
      const int64_t out = static_cast<int64_t>(attr_of(op, "out"));
      // basic_linear.py: BasicLinear._canonicalize_tensor_parallelism
      if (mode == 1 && out % n != 0) {
        return refuse(true, "Invalid configuration for tensor parallelism (mode='column', out_features=" +
                                std::to_string(out) + ", group_size=" + std::to_string(n) + ")");
      }
      if (mode == 2 && features % n != 0) {
        return refuse(true, "Invalid configuration for tensor parallelism (mode='row', in_features=" +
                                std::to_string(features) + ", group_size=" + std::to_string(n) + ")");
      }
      // distributed.py: reduce_scatter_along_first_dim, in BasicLinear._functional_forward
      if (mode == 2 && attr_of(op, "sequence_parallel") != 0 && rows % n != 0 && !forward) {
        forward = refuse(false, "First dimension of the tensor should be divisible by tensor parallel size, but got "
                                "dim_size[0]=" +
                                    std::to_string(rows) + " and world_size=" + std::to_string(n));
      }
    } else if (op.name == "Bias" && attr_of(op, "tensor_parallel") != 0 && features % n != 0) {
      // bias.py: Bias.__init__
      return refuse(true, "Invalid configuration for tensor parallelism (size=" + std::to_string(features) +
                              ", tensor_parallel_size=" + std::to_string(n) + ")");
    } else if (op.name == "ReduceScatter" && rows % n != 0 && !forward) {
      // reduce_scatter.py: ReduceScatter.op_forward
      forward = refuse(false, "Attempted to reduce-scatter a tensor with shape=[" + std::to_string(rows) + ", " +
                                  std::to_string(features) + "] over " + std::to_string(n) + " processes");
    }
  }
  return forward;
}

std::vector<int64_t> shard_shape(const std::vector<int64_t>& shape, const Placement& p, int64_t world_size,
                                 int64_t rank) {
  std::vector<int64_t> out = shape;
  if (p.kind != Placement::Kind::kSharded || world_size <= 1 || shape.empty()) return out;
  const size_t dim = std::min(static_cast<size_t>(p.dim), shape.size() - 1);
  out[dim] = split_size(shape[dim], world_size, rank);
  return out;
}

at::Tensor shard(const at::Tensor& t, const Placement& p, int64_t world_size, int64_t rank) {
  if (!t.defined() || p.kind != Placement::Kind::kSharded || world_size <= 1 || t.dim() == 0) return t;
  const int64_t dim = std::min<int64_t>(p.dim, t.dim() - 1);
  return at::tensor_split(t, world_size, dim)[static_cast<size_t>(rank)].contiguous();
}

CasePlan rank_plan(const CasePlan& plan, const ShardingPlan& sharding, int64_t rank) {
  CasePlan out = plan;
  const int64_t n = sharding.world_size;
  for (size_t i = 0; i < out.ops.size() && i < sharding.ops.size(); ++i) {
    OpPlan& op = out.ops[i];
    const OpSharding& rule = sharding.ops[i];
    op.input_shape = shard_shape(op.input_shape, value_placement(rule.input), n, rank);
    op.signature.output_shape = shard_shape(op.signature.output_shape, value_placement(rule.output), n, rank);
    for (size_t s = 0; s < op.signature.extra_inputs.size() && s < rule.extra_inputs.size(); ++s) {
      auto& slot = op.signature.extra_inputs[s];
      slot.shape = shard_shape(slot.shape, value_placement(rule.extra_inputs[s]), n, rank);
    }
    for (size_t s = 0; s < op.signature.extra_outputs.size() && s < rule.extra_outputs.size(); ++s) {
      auto& slot = op.signature.extra_outputs[s];
      slot.shape = shard_shape(slot.shape, value_placement(rule.extra_outputs[s]), n, rank);
    }
    for (size_t p = 0; p < op.signature.parameter_shapes.size() && p < rule.params.size(); ++p) {
      op.signature.parameter_shapes[p] = shard_shape(op.signature.parameter_shapes[p], rule.params[p], n, rank);
    }
  }
  if (!sharding.outputs.empty()) {
    out.output_shape = shard_shape(out.output_shape, value_placement(sharding.outputs.front()), n, rank);
  }
  for (size_t k = 0; k < out.public_inputs.size() && k < sharding.extra_inputs.size(); ++k) {
    auto& slot = out.public_inputs[k].slot_spec;
    slot.shape = shard_shape(slot.shape, value_placement(sharding.extra_inputs[k]), n, rank);
  }
  for (size_t k = 0; k < out.public_outputs.size() && k + 1 < sharding.outputs.size(); ++k) {
    auto& slot = out.public_outputs[k].slot_spec;
    slot.shape = shard_shape(slot.shape, value_placement(sharding.outputs[k + 1]), n, rank);
  }
  return out;
}

CaseTensors rank_tensors(const CaseTensors& tensors, const ShardingPlan& sharding, int64_t rank) {
  const int64_t n = sharding.world_size;
  CaseTensors out = tensors;
  out.input = shard(tensors.input, value_placement(sharding.input), n, rank);
  for (size_t i = 0; i < out.params.size() && i < sharding.ops.size(); ++i) {
    for (size_t p = 0; p < out.params[i].size() && p < sharding.ops[i].params.size(); ++p) {
      out.params[i][p] = shard(tensors.params[i][p], sharding.ops[i].params[p], n, rank);
    }
  }
  for (size_t k = 0; k < out.extra_inputs.size() && k < sharding.extra_inputs.size(); ++k) {
    out.extra_inputs[k] = shard(tensors.extra_inputs[k], value_placement(sharding.extra_inputs[k]), n, rank);
  }
  for (size_t k = 0; k < out.cotangents.size() && k < sharding.outputs.size(); ++k) {
    out.cotangents[k] = shard(tensors.cotangents[k], gradient_placement(sharding.outputs[k]), n, rank);
  }
  return out;
}

namespace {

/// The ranks' parts of one tensor put together as `p` says.
at::Tensor combine(const std::vector<at::Tensor>& parts, const Placement& p) {
  const auto first = std::find_if(parts.begin(), parts.end(), [](const at::Tensor& t) { return t.defined(); });
  if (first == parts.end()) return at::Tensor();
  if (p.kind == Placement::Kind::kReplicated) return parts.front();
  if (p.kind == Placement::Kind::kPartial) {
    at::Tensor sum = at::zeros_like(*first, at::TensorOptions().dtype(at::kDouble).device(at::kCPU));
    for (const auto& t : parts) {
      if (t.defined() && t.sizes() == sum.sizes()) sum += t.to(at::kCPU, at::kDouble);
    }
    return sum;
  }
  std::vector<at::Tensor> pieces;
  const int64_t dim = std::min<int64_t>(p.dim, first->dim() - 1);
  for (const auto& t : parts) {
    // A rank without this gradient contributes zeros of its neighbour's slice shape.
    pieces.push_back(t.defined() ? t.to(at::kCPU) : at::zeros_like(*first, at::TensorOptions().device(at::kCPU)));
  }
  try {
    return at::cat(pieces, dim);
  } catch (const std::exception&) {
    return parts.front();  // slices that do not fit together: rank 0's, the comparison reports the shape
  }
}

std::vector<at::Tensor> collect(const std::vector<PathRun>& ranks, const std::function<at::Tensor(const PathRun&)>& f) {
  std::vector<at::Tensor> out;
  out.reserve(ranks.size());
  for (const auto& r : ranks) out.push_back(f(r));
  return out;
}

at::Tensor tensor_at(const std::vector<at::Tensor>& v, size_t i) { return i < v.size() ? v[i] : at::Tensor(); }

std::string rank_error_text(const PathRun& run, size_t rank) {
  return "rank " + std::to_string(rank) + " " +
         (run.ok() ? std::string("ran") : run.error_kind + " during " + run.error_stage + ": " + run.error_message);
}

}  // namespace

PathRun assemble_ranks(std::vector<PathRun> ranks, const ShardingPlan& sharding) {
  if (ranks.empty()) throw std::invalid_argument("assemble_ranks: no rank runs");
  PathRun out;
  const PathRun& lead = ranks.front();
  out.name = lead.name;
  // The status: the ranks' when they agree; otherwise the first rank that did not run is
  // the path's error, its message naming what every rank did.
  const bool same_status = std::all_of(ranks.begin(), ranks.end(), [&](const PathRun& r) {
    return r.status == lead.status && r.error_kind == lead.error_kind;
  });
  const PathRun* failed = nullptr;
  for (const auto& r : ranks) {
    if (!r.ok() && r.status != PathStatus::kSkipped) {
      failed = &r;
      break;
    }
  }
  if (same_status || !failed) {
    out.status = lead.status;
    out.error_kind = lead.error_kind;
    out.error_message = lead.error_message;
    out.error_stage = lead.error_stage;
    out.error_type = lead.error_type;
    out.error_origin = lead.error_origin;
  } else {
    out.status = failed->status;
    out.error_kind = failed->error_kind;
    out.error_stage = failed->error_stage;
    out.error_type = failed->error_type;
    out.error_origin = failed->error_origin;
    std::string text;
    for (size_t r = 0; r < ranks.size(); ++r) text += (r ? "; " : "") + rank_error_text(ranks[r], r);
    out.error_message = "the ranks disagree: " + text;
  }
  for (const auto& r : ranks) {
    for (int64_t op : r.left_locked) {
      if (std::find(out.left_locked.begin(), out.left_locked.end(), op) == out.left_locked.end()) {
        out.left_locked.push_back(op);
      }
    }
    for (const auto& name : r.modified) {
      if (std::find(out.modified.begin(), out.modified.end(), name) == out.modified.end()) out.modified.push_back(name);
    }
  }
  out.plans = lead.plans;
  out.expected_plans = lead.expected_plans;
  out.modified_by = lead.modified_by;
  if (out.ok()) {
    const size_t n_outputs = lead.outputs.size();
    for (size_t k = 0; k < n_outputs; ++k) {
      const Layout layout = k < sharding.outputs.size() ? sharding.outputs[k] : Layout::kReplicated;
      out.outputs.push_back(
          combine(collect(ranks, [k](const PathRun& r) { return tensor_at(r.outputs, k); }), value_placement(layout)));
    }
    out.grad_input = combine(collect(ranks, [](const PathRun& r) { return r.grad_input; }),
                             gradient_placement(sharding.input));
    out.grad_params.resize(lead.grad_params.size());
    for (size_t i = 0; i < lead.grad_params.size(); ++i) {
      for (size_t p = 0; p < lead.grad_params[i].size(); ++p) {
        const Placement where = i < sharding.ops.size() && p < sharding.ops[i].param_grads.size()
                                    ? sharding.ops[i].param_grads[p]
                                    : replicated();
        out.grad_params[i].push_back(combine(collect(ranks,
                                                     [i, p](const PathRun& r) {
                                                       return i < r.grad_params.size()
                                                                  ? tensor_at(r.grad_params[i], p)
                                                                  : at::Tensor();
                                                     }),
                                             where));
      }
    }
    for (size_t k = 0; k < lead.grad_extra_inputs.size(); ++k) {
      const Layout layout = k < sharding.extra_inputs.size() ? sharding.extra_inputs[k] : Layout::kReplicated;
      out.grad_extra_inputs.push_back(combine(
          collect(ranks, [k](const PathRun& r) { return tensor_at(r.grad_extra_inputs, k); }),
          gradient_placement(layout)));
    }
    out.channel_grads.resize(lead.channel_grads.size());
    for (size_t f = 0; f < lead.channel_grads.size(); ++f) {
      for (const auto& [channel, ignored] : lead.channel_grads[f]) {
        Layout layout = Layout::kReplicated;
        if (f < sharding.channels.size()) {
          auto it = sharding.channels[f].find(channel);
          if (it != sharding.channels[f].end()) layout = it->second;
        }
        out.channel_grads[f][channel] = combine(collect(ranks,
                                                        [f, &channel](const PathRun& r) {
                                                          if (f >= r.channel_grads.size()) return at::Tensor();
                                                          auto it = r.channel_grads[f].find(channel);
                                                          return it == r.channel_grads[f].end() ? at::Tensor()
                                                                                                : it->second;
                                                        }),
                                                gradient_placement(layout));
      }
    }
  }
  size_t n_repeats = lead.repeats.size();
  for (const auto& r : ranks) n_repeats = std::min(n_repeats, r.repeats.size());
  for (size_t k = 0; k < n_repeats; ++k) {
    std::vector<PathRun> calls;
    for (const auto& r : ranks) calls.push_back(r.repeats[k]);
    out.repeats.push_back(assemble_ranks(std::move(calls), sharding));
  }
  out.ranks = std::move(ranks);
  return out;
}

PathRun replica_view(const PathRun& rank_run, const ShardingPlan& sharding) {
  PathRun out;
  out.name = rank_run.name;
  out.status = rank_run.status;
  auto keep = [](const at::Tensor& t, const Placement& p) {
    return p.kind == Placement::Kind::kReplicated ? t : at::Tensor();
  };
  for (size_t k = 0; k < rank_run.outputs.size(); ++k) {
    const Layout layout = k < sharding.outputs.size() ? sharding.outputs[k] : Layout::kReplicated;
    out.outputs.push_back(keep(rank_run.outputs[k], value_placement(layout)));
  }
  out.grad_input = keep(rank_run.grad_input, gradient_placement(sharding.input));
  out.grad_params.resize(rank_run.grad_params.size());
  for (size_t i = 0; i < rank_run.grad_params.size(); ++i) {
    for (size_t p = 0; p < rank_run.grad_params[i].size(); ++p) {
      const Placement where = i < sharding.ops.size() && p < sharding.ops[i].param_grads.size()
                                  ? sharding.ops[i].param_grads[p]
                                  : replicated();
      out.grad_params[i].push_back(keep(rank_run.grad_params[i][p], where));
    }
  }
  for (size_t k = 0; k < rank_run.grad_extra_inputs.size(); ++k) {
    const Layout layout = k < sharding.extra_inputs.size() ? sharding.extra_inputs[k] : Layout::kReplicated;
    out.grad_extra_inputs.push_back(keep(rank_run.grad_extra_inputs[k], gradient_placement(layout)));
  }
  out.channel_grads.resize(rank_run.channel_grads.size());
  for (size_t f = 0; f < rank_run.channel_grads.size(); ++f) {
    for (const auto& [channel, t] : rank_run.channel_grads[f]) {
      Layout layout = Layout::kReplicated;
      if (f < sharding.channels.size()) {
        auto it = sharding.channels[f].find(channel);
        if (it != sharding.channels[f].end()) layout = it->second;
      }
      const at::Tensor kept = keep(t, gradient_placement(layout));
      if (kept.defined()) out.channel_grads[f][channel] = kept;
    }
  }
  return out;
}

}  // namespace gradfuzz::harness
