#include "harness/sharding.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
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
  throw SpecError(op_path(i), op.name + " (op " + std::to_string(i) + ") on " + layout_name(in) + " input: it takes " +
                                  layouts_text(allowed) + " (" + why + ")");
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
  if (!spec.call_then_bind.empty())
    throw SpecError("/call_then_bind", "distributed cases take no call-then-bind steps");
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

namespace {

/// The gradients of replicated tensors: one variable per group of replicated tensors whose
/// gradients lie alike (an op that passes its gradient on as it comes joins its input's and
/// output's), each whole, summands, or not yet decided (then whole).
class GradientSolver {
 public:
  enum Value { kFree = -1, kWhole = 0, kSummands = 1 };

  int make() {
    parent_.push_back(static_cast<int>(parent_.size()));
    value_.push_back(kFree);
    why_.emplace_back();
    return static_cast<int>(parent_.size()) - 1;
  }
  int find(int v) {
    while (parent_[static_cast<size_t>(v)] != v)
      v = parent_[static_cast<size_t>(v)] = parent_[static_cast<size_t>(parent_[static_cast<size_t>(v)])];
    return v;
  }
  /// Decides `v`'s group; SpecError at `path` when it was decided otherwise.
  void fix(int v, Value value, const std::string& why, const std::string& path) {
    if (v < 0) return;
    const int r = find(v);
    if (value_[static_cast<size_t>(r)] == kFree) {
      value_[static_cast<size_t>(r)] = value;
      why_[static_cast<size_t>(r)] = why;
    } else if (value_[static_cast<size_t>(r)] != value) {
      conflict(why_[static_cast<size_t>(r)], why, path);
    }
  }
  /// One group for `a` and `b`.
  void join(int a, int b, const std::string& path) {
    if (a < 0 || b < 0) return;
    const int ra = find(a);
    const int rb = find(b);
    if (ra == rb) return;
    const Value va = value_[static_cast<size_t>(ra)];
    const Value vb = value_[static_cast<size_t>(rb)];
    if (va != kFree && vb != kFree && va != vb)
      conflict(why_[static_cast<size_t>(ra)], why_[static_cast<size_t>(rb)], path);
    parent_[static_cast<size_t>(rb)] = ra;
    if (va == kFree) {
      value_[static_cast<size_t>(ra)] = vb;
      why_[static_cast<size_t>(ra)] = why_[static_cast<size_t>(rb)];
    }
  }
  /// Where the gradient of a tensor of `layout` (variable `v` when replicated) lies.
  Placement gradient(Layout layout, int v) {
    if (layout == Layout::kPartial) return replicated();
    if (layout != Layout::kReplicated) return value_placement(layout);
    return v >= 0 && value_[static_cast<size_t>(find(v))] == kSummands ? partial() : replicated();
  }
  bool summands(int v) { return v >= 0 && value_[static_cast<size_t>(find(v))] == kSummands; }

 private:
  [[noreturn]] static void conflict(const std::string& one, const std::string& other, const std::string& path) {
    throw SpecError(path, "a replicated tensor's gradient would have to lie two ways: " + one + ", but " + other);
  }
  std::vector<int> parent_;
  std::vector<Value> value_;
  std::vector<std::string> why_;
};

/// Whether op `name` passes the gradient of a replicated output on to its replicated input
/// as it comes (linear in the output's gradient, with factors every rank holds alike).
bool passes_gradient(const std::string& name, const OpSpec& op) {
  if (name == "Linear") return attr_of(op, "tensor_parallel_mode") == 0;
  if (name == "Bias") return attr_of(op, "tensor_parallel") == 0;
  return name == "ConstantScale" || name == "Identity" || name == "ReLU" || name == "GELU" || name == "SReLU" ||
         name == "SwiGLU" || name == "RMSNorm" || name == "LayerNorm" || name == "MakeExtraOutput" ||
         name == "AddExtraInput";
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
  GradientSolver grads;
  auto var_of = [&](Layout l) { return l == Layout::kReplicated ? grads.make() : -1; };
  const int input_var = var_of(out.input);
  // Per op: the gradient variables of its main input and output, and of its extra slots.
  std::vector<int> in_vars(spec.ops.size(), -1);
  std::vector<int> out_vars(spec.ops.size(), -1);
  std::vector<std::vector<int>> extra_in_vars(spec.ops.size());
  std::vector<std::vector<int>> extra_out_vars(spec.ops.size());
  std::map<std::pair<int64_t, std::string>, std::pair<Layout, int>> channel_of;
  Layout x = out.input;
  int x_var = input_var;
  for (size_t i = 0; i < spec.ops.size() && i < plan.ops.size(); ++i) {
    const OpPlan& op_plan = plan.ops[i];
    const OpSpec& op = spec.ops[i];
    const std::string path = op_path(i);
    const std::string at = op.name + " (op " + std::to_string(i) + ")";
    OpSharding rule;
    bool refused_here = false;
    if (op_plan.boundary) {
      rule.input = rule.output = x;
    } else if (!many) {
      rule.extra_inputs.assign(op_plan.signature.extra_inputs.size(), Layout::kReplicated);
      rule.extra_outputs.assign(op_plan.signature.extra_outputs.size(), Layout::kReplicated);
      rule.params.assign(op_plan.signature.parameter_shapes.size(), replicated());
      rule.param_grads = rule.params;
    } else {
      refused_here =
          refused && refused->at_construction && refused->op == static_cast<int64_t>(i) && !is_collective(op.name);
      rule = op_rule(op, op_plan, i, x, refused_here);
    }
    in_vars[i] = x_var;
    // The output's gradient variable: the input's where the op passes its gradient on.
    const bool through = many && !op_plan.boundary && rule.input == Layout::kReplicated &&
                         rule.output == Layout::kReplicated && passes_gradient(op.name, op);
    int y_var = -1;
    if (rule.output == Layout::kReplicated) {
      y_var = (through || op_plan.boundary || !many) && x_var >= 0 ? x_var : grads.make();
    }
    out_vars[i] = y_var;
    if (many && !refused_here && !op_plan.boundary) {
      const int64_t mode = op.name == "Linear" ? static_cast<int64_t>(attr_of(op, "tensor_parallel_mode")) : 0;
      if (op.name == "AllGather") {
        grads.fix(y_var, GradientSolver::kSummands,
                  at + "'s backward sums the ranks' gradients of its output (a reduce-scatter)", path);
      } else if (op.name == "AllReduce") {
        grads.fix(y_var, GradientSolver::kWhole, at + "'s backward hands each rank's gradient on as it is", path);
      } else if (mode == 2 && rule.output == Layout::kReplicated) {
        grads.fix(y_var, GradientSolver::kWhole,
                  at + ", row-parallel, takes the whole gradient of its output on every rank", path);
      } else if (mode == 1 && rule.input == Layout::kReplicated) {
        grads.fix(x_var, GradientSolver::kWhole,
                  at + ", column-parallel, hands every rank the whole input gradient (an all-reduce)", path);
      }
    }
    // Extra slots of ops that pass gradients on lie as the main tensor does.
    for (size_t s = 0; s < rule.extra_outputs.size(); ++s) {
      extra_out_vars[i].push_back(rule.extra_outputs[s] == Layout::kReplicated ? (y_var >= 0 ? y_var : grads.make())
                                                                               : -1);
    }
    for (size_t s = 0; s < rule.extra_inputs.size(); ++s) {
      extra_in_vars[i].push_back(rule.extra_inputs[s] == Layout::kReplicated ? (y_var >= 0 ? y_var : grads.make())
                                                                             : -1);
    }
    // Channels carry a producer's layout to its consumers, which must take it as it is.
    for (size_t s = 0; s < op.output_bindings.size() && s < rule.extra_outputs.size(); ++s) {
      if (!op.output_bindings[s].channel) continue;
      channel_of[{op_plan.fuser, *op.output_bindings[s].channel}] = {rule.extra_outputs[s], extra_out_vars[i][s]};
    }
    for (size_t s = 0; s < op.input_channels.size() && s < rule.extra_inputs.size(); ++s) {
      if (!op.input_channels[s]) continue;
      auto it = channel_of.find({op_plan.fuser, *op.input_channels[s]});
      if (it == channel_of.end()) continue;
      const std::string slot_path = path + "/input_channels/" + std::to_string(s);
      if (it->second.first != rule.extra_inputs[s]) {
        throw SpecError(slot_path, at + " extra input slot " + std::to_string(s) + " takes a " +
                                       layout_name(rule.extra_inputs[s]) + " tensor; channel '" +
                                       *op.input_channels[s] + "' carries a " + layout_name(it->second.first) + " one");
      }
      grads.join(it->second.second, extra_in_vars[i][s], slot_path);
    }
    x = rule.output;
    x_var = y_var;
    out.ops.push_back(std::move(rule));
  }
  // Every gradient decided: placements.
  out.input_grad = grads.gradient(out.input, input_var);
  for (size_t i = 0; i < out.ops.size(); ++i) {
    OpSharding& rule = out.ops[i];
    rule.input_grad = grads.gradient(rule.input, in_vars[i]);
    rule.output_grad = grads.gradient(rule.output, out_vars[i]);
    // A copied parameter of an op on replicated tensors: its gradient is a summand where
    // the output's gradient is.
    if (many && rule.output == Layout::kReplicated && grads.summands(out_vars[i])) {
      for (size_t p = 0; p < rule.params.size(); ++p) {
        if (rule.params[p].kind == Placement::Kind::kReplicated) rule.param_grads[p] = partial();
      }
    }
  }
  out.outputs.push_back(x);
  out.output_grads.push_back(grads.gradient(x, x_var));
  for (const auto& slot : plan.public_outputs) {
    const auto i = static_cast<size_t>(slot.op);
    const auto s = static_cast<size_t>(slot.slot);
    const auto& rule = out.ops.at(i);
    const Layout l = s < rule.extra_outputs.size() ? rule.extra_outputs[s] : Layout::kReplicated;
    out.outputs.push_back(l);
    out.output_grads.push_back(grads.gradient(l, s < extra_out_vars[i].size() ? extra_out_vars[i][s] : -1));
  }
  for (const auto& slot : plan.public_inputs) {
    const auto i = static_cast<size_t>(slot.op);
    const auto s = static_cast<size_t>(slot.slot);
    const auto& rule = out.ops.at(i);
    const Layout l = s < rule.extra_inputs.size() ? rule.extra_inputs[s] : Layout::kReplicated;
    out.extra_inputs.push_back(l);
    out.extra_input_grads.push_back(grads.gradient(l, s < extra_in_vars[i].size() ? extra_in_vars[i][s] : -1));
  }
  out.channel_grads.assign(static_cast<size_t>(plan.num_fusers), {});
  for (const auto& [key, layout_var] : channel_of) {
    if (key.first >= 0 && key.first < plan.num_fusers) {
      out.channel_grads[static_cast<size_t>(key.first)][key.second] =
          grads.gradient(layout_var.first, layout_var.second);
    }
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
        forward = refuse(false,
                         "First dimension of the tensor should be divisible by tensor parallel size, but got "
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
  if (!t.defined() || world_size <= 1 || t.dim() == 0 || p.kind == Placement::Kind::kReplicated) return t;
  if (p.kind == Placement::Kind::kPartial) {
    // Rank r's summand: its own rows, zeros elsewhere (the summands add up exactly).
    at::Tensor summand = at::zeros_like(t);
    at::Tensor rows = at::tensor_split(t, world_size, 0)[static_cast<size_t>(rank)];
    const int64_t begin = rank * (t.size(0) / world_size) + std::min<int64_t>(rank, t.size(0) % world_size);
    summand.narrow(0, begin, rows.size(0)).copy_(rows);
    return summand;
  }
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
  for (size_t k = 0; k < out.cotangents.size() && k < sharding.output_grads.size(); ++k) {
    out.cotangents[k] = shard(tensors.cotangents[k], sharding.output_grads[k], n, rank);
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

Placement channel_grad_placement(const ShardingPlan& sharding, size_t fuser, const std::string& channel) {
  if (fuser >= sharding.channel_grads.size()) return replicated();
  auto it = sharding.channel_grads[fuser].find(channel);
  return it == sharding.channel_grads[fuser].end() ? replicated() : it->second;
}

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
    out.grad_input = combine(collect(ranks, [](const PathRun& r) { return r.grad_input; }), sharding.input_grad);
    out.grad_params.resize(lead.grad_params.size());
    for (size_t i = 0; i < lead.grad_params.size(); ++i) {
      for (size_t p = 0; p < lead.grad_params[i].size(); ++p) {
        const Placement where = i < sharding.ops.size() && p < sharding.ops[i].param_grads.size()
                                    ? sharding.ops[i].param_grads[p]
                                    : replicated();
        out.grad_params[i].push_back(combine(collect(ranks,
                                                     [i, p](const PathRun& r) {
                                                       return i < r.grad_params.size() ? tensor_at(r.grad_params[i], p)
                                                                                       : at::Tensor();
                                                     }),
                                             where));
      }
    }
    for (size_t k = 0; k < lead.grad_extra_inputs.size(); ++k) {
      const Placement where = k < sharding.extra_input_grads.size() ? sharding.extra_input_grads[k] : replicated();
      out.grad_extra_inputs.push_back(
          combine(collect(ranks, [k](const PathRun& r) { return tensor_at(r.grad_extra_inputs, k); }), where));
    }
    out.channel_grads.resize(lead.channel_grads.size());
    for (size_t f = 0; f < lead.channel_grads.size(); ++f) {
      for (const auto& [channel, ignored] : lead.channel_grads[f]) {
        const Placement where = channel_grad_placement(sharding, f, channel);
        out.channel_grads[f][channel] =
            combine(collect(ranks,
                            [f, &channel](const PathRun& r) {
                              if (f >= r.channel_grads.size()) return at::Tensor();
                              auto it = r.channel_grads[f].find(channel);
                              return it == r.channel_grads[f].end() ? at::Tensor() : it->second;
                            }),
                    where);
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

nlohmann::json sharding_json(const ShardingPlan& sharding, const CasePlan& plan) {
  auto names = [](const std::vector<Placement>& places) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& p : places) out.push_back(placement_name(p));
    return out;
  };
  std::vector<Placement> outputs;
  for (Layout l : sharding.outputs) outputs.push_back(value_placement(l));
  std::vector<Placement> extra_inputs;
  for (Layout l : sharding.extra_inputs) extra_inputs.push_back(value_placement(l));
  nlohmann::json ops = nlohmann::json::array();
  for (size_t i = 0; i < sharding.ops.size() && i < plan.ops.size(); ++i) {
    ops.push_back({{"input_layout", layout_name(sharding.ops[i].input)},
                   {"global_input_shape", plan.ops[i].input_shape},
                   {"params", names(sharding.ops[i].params)},
                   {"param_grads", names(sharding.ops[i].param_grads)}});
  }
  return {{"world_size", sharding.world_size},
          {"input", placement_name(value_placement(sharding.input))},
          {"input_grad", placement_name(sharding.input_grad)},
          {"outputs", names(outputs)},
          {"output_grads", names(sharding.output_grads)},
          {"extra_inputs", names(extra_inputs)},
          {"extra_input_grads", names(sharding.extra_input_grads)},
          {"ops", std::move(ops)}};
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
  out.grad_input = keep(rank_run.grad_input, sharding.input_grad);
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
    const Placement where = k < sharding.extra_input_grads.size() ? sharding.extra_input_grads[k] : replicated();
    out.grad_extra_inputs.push_back(keep(rank_run.grad_extra_inputs[k], where));
  }
  out.channel_grads.resize(rank_run.channel_grads.size());
  for (size_t f = 0; f < rank_run.channel_grads.size(); ++f) {
    for (const auto& [channel, t] : rank_run.channel_grads[f]) {
      const at::Tensor kept = keep(t, channel_grad_placement(sharding, f, channel));
      if (kept.defined()) out.channel_grads[f][channel] = kept;
    }
  }
  return out;
}

}  // namespace gradfuzz::harness
