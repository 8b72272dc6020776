#include "harness/case_spec.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>

#include "ops/errors.h"
#include "ops/fusion_registry.h"

namespace gradfuzz::harness {

bool OpSpec::operator==(const OpSpec& o) const {
  return name == o.name && attrs == o.attrs && input_channels == o.input_channels &&
         output_bindings == o.output_bindings && output_style == o.output_style &&
         param_requires_grad == o.param_requires_grad && extra_input_requires_grad == o.extra_input_requires_grad;
}

bool CaseSpec::operator==(const CaseSpec& o) const {
  return ops == o.ops && fusions == o.fusions && call_then_bind == o.call_then_bind &&
         input_requires_grad == o.input_requires_grad && input_shape == o.input_shape && dtype == o.dtype &&
         device == o.device && seed == o.seed && extra_input_count_delta == o.extra_input_count_delta &&
         corrupt_split_sizes == o.corrupt_split_sizes && late_binds == o.late_binds && repeat_calls == o.repeat_calls &&
         recipe == o.recipe && world_size == o.world_size && input_layout == o.input_layout &&
         read_after_backward == o.read_after_backward && deferred_init == o.deferred_init &&
         several_sequentials == o.several_sequentials && quantized_params == o.quantized_params &&
         held_quantized_tensor == o.held_quantized_tensor;
}

namespace {

/// The usage script's elements in the report's order: whether a repeat call uses it (or,
/// for an element of the whole case, whether the case does), its capability name (empty: not
/// a step of its own, the no_grad call every backend runs) and its coverage.usage name.
struct UsageElement {
  bool (*call_uses)(const RepeatCall&);
  bool (*case_uses)(const CaseSpec&);
  const char* element;
  const char* coverage;
};
constexpr UsageElement kUsage[] = {
    {[](const RepeatCall& c) { return c.update; }, nullptr, "update", "training_steps"},
    {[](const RepeatCall& c) { return c.no_grad; }, nullptr, "", "eval_pass"},
    {[](const RepeatCall& c) { return c.inference_mode; }, nullptr, "inference_mode", "inference_mode"},
    {[](const RepeatCall& c) { return c.checkpoint; }, nullptr, "checkpoint", "checkpoint_roundtrip"},
    {[](const RepeatCall& c) { return c.recompute; }, nullptr, "recompute", "recompute"},
    {nullptr, [](const CaseSpec& s) { return s.read_after_backward; }, "read_after_backward", "read_after_backward"},
    {[](const RepeatCall& c) { return c.second_sequential; }, nullptr, "second_sequential", "op_in_two_fusers"},
    {nullptr, [](const CaseSpec& s) { return s.deferred_init; }, "deferred_init", "deferred_init"},
    {[](const RepeatCall& c) { return c.changes_recipe(); }, nullptr, "recipe_change", "recipe_change"},
    {nullptr, [](const CaseSpec& s) { return s.several_sequentials; }, "several_sequentials", "several_sequentials"},
    {nullptr, [](const CaseSpec& s) { return s.quantized_params; }, "quantized_params", "quantized_params"},
    {nullptr, [](const CaseSpec& s) { return s.held_quantized_tensor; }, "held_quantized_tensor",
     "held_quantized_tensor"},
};

/// Whether `spec` uses element `e`.
bool uses(const CaseSpec& spec, const UsageElement& e) {
  if (e.call_uses == nullptr) return e.case_uses(spec);
  return std::any_of(spec.repeat_calls.begin(), spec.repeat_calls.end(), e.call_uses);
}

}  // namespace

std::vector<std::string> CaseSpec::usage_elements() const {
  std::vector<std::string> out;
  for (const auto& e : kUsage) {
    if (*e.element != '\0' && uses(*this, e)) out.emplace_back(e.element);
  }
  return out;
}

const std::vector<std::string>& usage_coverage_names() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> names;
    for (const auto& e : kUsage) names.emplace_back(e.coverage);
    return names;
  }();
  return kNames;
}

void CaseSpec::clear_usage() {
  for (auto& call : repeat_calls) {
    call.update = call.inference_mode = call.checkpoint = call.recompute = call.second_sequential = false;
    call.recipe_off = false;
    call.amax_history_len = 0;
  }
  read_after_backward = deferred_init = several_sequentials = quantized_params = held_quantized_tensor = false;
}

namespace {

/// Whether the case's recipe keeps the backward in high precision (backward_override
/// high_precision): a backward that reads the weights' high-precision values.
bool high_precision_backward(const CaseSpec& spec) {
  if (!spec.recipe) return false;
  const auto it = spec.recipe->options.find("backward_override");
  return it != spec.recipe->options.end() && it->second == "high_precision";
}

}  // namespace

void CaseSpec::drop_unmet_usage() {
  const std::string name = recipe ? recipe->name : "";
  const auto has = [&](const char* op_name) {
    return std::any_of(ops.begin(), ops.end(), [&](const OpSpec& op) { return op.name == op_name; });
  };
  if (!has(kBoundaryOp)) several_sequentials = false;
  if (name.empty() || name == "DelayedScaling" || !has("Linear") || high_precision_backward(*this)) {
    quantized_params = false;
  }
  if (!quantized_params) held_quantized_tensor = false;
  for (auto& call : repeat_calls) {
    if (name.empty() || quantized_params) call.recipe_off = false;
    if (name != "DelayedScaling") call.amax_history_len = 0;
  }
}

std::vector<std::string> CaseSpec::usage_coverage() const {
  std::vector<std::string> out;
  for (const auto& e : kUsage) {
    if (uses(*this, e)) out.emplace_back(e.coverage);
  }
  return out;
}

bool is_known_input_layout(const std::string& layout) {
  return layout == "replicated" || layout == "rows" || layout == "features";
}

bool is_distributed(const CaseSpec& spec) {
  if (spec.world_size > 1) return true;
  return std::any_of(spec.ops.begin(), spec.ops.end(), [](const OpSpec& op) {
    if (op.name == "AllGather" || op.name == "ReduceScatter" || op.name == "AllReduce") return true;
    for (const char* attr : {"tensor_parallel_mode", "sequence_parallel", "tensor_parallel"}) {
      auto it = op.attrs.find(attr);
      if (it != op.attrs.end() && it->second != 0) return true;
    }
    return false;
  });
}

int64_t CaseSpec::num_ops() const {
  return static_cast<int64_t>(
      std::count_if(ops.begin(), ops.end(), [](const OpSpec& op) { return op.name != kBoundaryOp; }));
}

bool is_known_dtype(const std::string& dtype) {
  return dtype == "float64" || dtype == "float32" || dtype == "bfloat16" || dtype == "float16";
}

bool is_known_device(const std::string& device) { return device == "cpu" || device == "cuda"; }

// ---------------------------------------------------------------------------------------------
// Writing

namespace {

nlohmann::json op_to_json(const OpSpec& op) {
  nlohmann::json j = nlohmann::json::object();
  j["name"] = op.name;
  if (!op.attrs.empty()) {
    nlohmann::json attrs = nlohmann::json::object();
    for (const auto& [key, value] : op.attrs) attrs[key] = value;
    j["attrs"] = std::move(attrs);
  }
  if (!op.input_channels.empty()) {
    nlohmann::json channels = nlohmann::json::array();
    for (const auto& channel : op.input_channels) {
      channels.push_back(channel ? nlohmann::json(*channel) : nlohmann::json(nullptr));
    }
    j["input_channels"] = std::move(channels);
  }
  if (!op.output_bindings.empty()) {
    nlohmann::json bindings = nlohmann::json::array();
    for (const auto& binding : op.output_bindings) {
      bindings.push_back({{"channel", binding.channel ? nlohmann::json(*binding.channel) : nlohmann::json(nullptr)},
                          {"output_to_caller", binding.output_to_caller}});
    }
    j["output_bindings"] = std::move(bindings);
  }
  if (op.output_style != ops::OutputStyle::kVector) j["output_style"] = ops::output_style_name(op.output_style);
  if (!op.param_requires_grad.empty()) j["param_requires_grad"] = op.param_requires_grad;
  if (!op.extra_input_requires_grad.empty()) j["extra_input_requires_grad"] = op.extra_input_requires_grad;
  return j;
}

}  // namespace

void to_json(nlohmann::json& j, const CaseSpec& spec) {
  j = nlohmann::json::object();
  nlohmann::json op_list = nlohmann::json::array();
  for (const auto& op : spec.ops) op_list.push_back(op_to_json(op));
  j["ops"] = std::move(op_list);
  j["fusions"] = spec.fusions;
  if (!spec.call_then_bind.empty()) {
    nlohmann::json steps = nlohmann::json::array();
    for (const auto& step : spec.call_then_bind) steps.push_back({{"op", step.op}, {"grad_mode", step.grad_mode}});
    j["call_then_bind"] = std::move(steps);
  }
  j["input_requires_grad"] = spec.input_requires_grad;
  j["input_shape"] = spec.input_shape;
  j["dtype"] = spec.dtype;
  j["device"] = spec.device;
  j["seed"] = spec.seed;
  if (!spec.repeat_calls.empty()) {
    nlohmann::json calls = nlohmann::json::array();
    for (const auto& call : spec.repeat_calls) {
      nlohmann::json c = {{"no_grad", call.no_grad}, {"input_requires_grad", call.input_requires_grad}};
      // The steps' flags only where set: older case files and their hashes stay as they were.
      if (call.update) c["update"] = true;
      if (call.inference_mode) c["inference_mode"] = true;
      if (call.checkpoint) c["checkpoint"] = true;
      if (call.recompute) c["recompute"] = true;
      if (call.second_sequential) c["second_sequential"] = true;
      if (call.recipe_off) c["recipe_off"] = true;
      if (call.amax_history_len > 0) c["amax_history_len"] = call.amax_history_len;
      calls.push_back(std::move(c));
    }
    j["repeat_calls"] = std::move(calls);
  }
  if (spec.recipe) {
    j["recipe"] = {
        {"name", spec.recipe->name}, {"fp8_format", spec.recipe->fp8_format}, {"options", spec.recipe->options}};
  }
  // Written only where they say something: the case files of one-process cases (and their
  // hashes) stay as they were.
  if (spec.world_size != 1) j["world_size"] = spec.world_size;
  if (spec.input_layout != "replicated") j["input_layout"] = spec.input_layout;
  if (spec.read_after_backward) j["read_after_backward"] = true;
  if (spec.deferred_init) j["deferred_init"] = true;
  if (spec.several_sequentials) j["several_sequentials"] = true;
  if (spec.quantized_params) j["quantized_params"] = true;
  if (spec.held_quantized_tensor) j["held_quantized_tensor"] = true;
  if (spec.extra_input_count_delta != 0) j["extra_input_count_delta"] = spec.extra_input_count_delta;
  if (spec.corrupt_split_sizes) j["corrupt_split_sizes"] = true;
  if (!spec.late_binds.empty()) {
    nlohmann::json steps = nlohmann::json::array();
    for (const auto& step : spec.late_binds) {
      steps.push_back({{"op", step.op}, {"slot", step.slot}, {"channel", step.channel}});
    }
    j["late_binds"] = std::move(steps);
  }
}

std::ostream& operator<<(std::ostream& os, const CaseSpec& spec) {
  nlohmann::json j;
  to_json(j, spec);
  return os << j.dump();
}

// ---------------------------------------------------------------------------------------------
// Reading: every accessor knows its JSON path so the first problem is reported precisely.

namespace {

std::string type_name(const nlohmann::json& j) { return j.type_name(); }

/// A JSON value together with its JSON-pointer path.
class Reader {
 public:
  Reader(const nlohmann::json& j, std::string path) : j_(j), path_(std::move(path)) {}

  const nlohmann::json& json() const { return j_; }
  const std::string& path() const { return path_; }
  std::string at_path() const { return path_.empty() ? "/" : path_; }

  [[noreturn]] void fail(const std::string& message) const { throw SpecError(at_path(), message); }

  void expect_object(const std::set<std::string>& allowed) const {
    if (!j_.is_object()) fail("expected an object, got " + type_name(j_));
    for (const auto& item : j_.items()) {
      if (allowed.count(item.key()) == 0) {
        std::string known;
        for (const auto& key : allowed) known += (known.empty() ? "" : ", ") + key;
        child(item.key()).fail("unknown key '" + item.key() + "'; known keys: " + known);
      }
    }
  }
  bool has(const std::string& key) const { return j_.contains(key); }
  Reader child(const std::string& key) const { return Reader(j_.at(key), path_ + "/" + escape(key)); }
  Reader required(const std::string& key) const {
    if (!j_.contains(key)) fail("missing required key '" + key + "'");
    return child(key);
  }
  std::vector<Reader> elements() const {
    if (!j_.is_array()) fail("expected an array, got " + type_name(j_));
    std::vector<Reader> out;
    out.reserve(j_.size());
    for (size_t i = 0; i < j_.size(); ++i) out.emplace_back(j_[i], path_ + "/" + std::to_string(i));
    return out;
  }

  std::string string() const {
    if (!j_.is_string()) fail("expected a string, got " + type_name(j_));
    return j_.get<std::string>();
  }
  bool boolean() const {
    if (!j_.is_boolean()) fail("expected a boolean, got " + type_name(j_));
    return j_.get<bool>();
  }
  double number() const {
    if (!j_.is_number()) fail("expected a number, got " + type_name(j_));
    return j_.get<double>();
  }
  int64_t integer() const {
    if (j_.is_number_unsigned()) {
      if (j_.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) fail("integer out of range");
      return static_cast<int64_t>(j_.get<uint64_t>());
    }
    if (!j_.is_number_integer()) fail("expected an integer, got " + type_name(j_));
    return j_.get<int64_t>();
  }
  uint64_t unsigned_integer() const {
    if (j_.is_number_unsigned()) return j_.get<uint64_t>();
    if (j_.is_number_integer()) fail("expected a non-negative integer, got " + std::to_string(j_.get<int64_t>()));
    fail("expected a non-negative integer, got " + type_name(j_));
  }

 private:
  // RFC 6901 escaping of a key inside a JSON pointer.
  static std::string escape(const std::string& key) {
    std::string out;
    for (char c : key) {
      if (c == '~') {
        out += "~0";
      } else if (c == '/') {
        out += "~1";
      } else {
        out += c;
      }
    }
    return out;
  }

  const nlohmann::json& j_;
  std::string path_;
};

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

OpSpec op_from_json(const Reader& r) {
  r.expect_object({"name", "attrs", "input_channels", "output_bindings", "output_style", "param_requires_grad",
                   "extra_input_requires_grad"});
  OpSpec op;
  Reader name = r.required("name");
  op.name = name.string();
  const auto& registry = ops::OpRegistry::catalog();
  const bool boundary = op.name == kBoundaryOp;
  const ops::OpInfo* info = nullptr;
  if (!boundary) {
    auto names = registry.names();
    if (std::find(names.begin(), names.end(), op.name) == names.end()) {
      name.fail("unknown op '" + op.name + "'; known ops: " + join(names) + ", " + kBoundaryOp);
    }
    info = &registry.info(op.name);
  }
  if (r.has("attrs")) {
    Reader attrs = r.child("attrs");
    if (!attrs.json().is_object()) attrs.fail("expected an object, got " + type_name(attrs.json()));
    for (const auto& item : attrs.json().items()) {
      Reader value = attrs.child(item.key());
      if (boundary || info->defaults.count(item.key()) == 0) {
        std::vector<std::string> known;
        if (!boundary) {
          for (const auto& entry : info->defaults) known.push_back(entry.first);
        }
        value.fail("unknown attr '" + item.key() + "' of " + op.name +
                   "; known attrs: " + (known.empty() ? std::string("(none)") : join(known)));
      }
      op.attrs[item.key()] = value.number();
    }
  }
  if (r.has("input_channels")) {
    for (const Reader& entry : r.child("input_channels").elements()) {
      if (entry.json().is_null()) {
        op.input_channels.emplace_back(std::nullopt);
      } else {
        std::string channel = entry.string();
        if (channel.empty()) entry.fail("empty channel name (use null for a public slot)");
        op.input_channels.emplace_back(std::move(channel));
      }
    }
  }
  if (r.has("output_bindings")) {
    for (const Reader& entry : r.child("output_bindings").elements()) {
      entry.expect_object({"channel", "output_to_caller"});
      OutputBindingSpec binding;
      if (entry.has("channel")) {
        Reader channel = entry.child("channel");
        if (!channel.json().is_null()) {
          binding.channel = channel.string();
          if (binding.channel->empty()) channel.fail("empty channel name (use null for an unbound slot)");
        }
      }
      if (entry.has("output_to_caller")) binding.output_to_caller = entry.child("output_to_caller").boolean();
      op.output_bindings.push_back(std::move(binding));
    }
  }
  if (r.has("output_style")) {
    Reader style = r.child("output_style");
    std::string text = style.string();
    if (text == "vector") {
      op.output_style = ops::OutputStyle::kVector;
    } else if (text == "generator") {
      op.output_style = ops::OutputStyle::kGenerator;
    } else {
      style.fail("unknown output style '" + text + "'; known styles: vector, generator");
    }
  }
  if (r.has("param_requires_grad")) {
    for (const Reader& entry : r.child("param_requires_grad").elements())
      op.param_requires_grad.push_back(entry.boolean());
  }
  if (r.has("extra_input_requires_grad")) {
    for (const Reader& entry : r.child("extra_input_requires_grad").elements()) {
      op.extra_input_requires_grad.push_back(entry.boolean());
    }
  }
  if (boundary && (!op.input_channels.empty() || !op.output_bindings.empty() || !op.param_requires_grad.empty() ||
                   !op.extra_input_requires_grad.empty() || op.output_style != ops::OutputStyle::kVector)) {
    r.fail("the Boundary module takes no bindings, parameters or output style");
  }
  return op;
}

int64_t op_index(const Reader& r, const CaseSpec& spec) {
  int64_t op = r.integer();
  if (op < 0 || op >= static_cast<int64_t>(spec.ops.size())) {
    r.fail("op index " + std::to_string(op) + " out of range [0, " + std::to_string(spec.ops.size()) + ")");
  }
  if (spec.ops[static_cast<size_t>(op)].name == kBoundaryOp) {
    r.fail("op index " + std::to_string(op) + " is the Boundary module, not a catalog op");
  }
  return op;
}

}  // namespace

namespace {

/// The usage elements' flags of the whole case and what each element needs of the case, with
/// the JSON path of the offending key (read after everything else).
void check_usage_needs(const Reader& r, CaseSpec& out) {
  for (auto [key, flag] : {std::pair{"several_sequentials", &CaseSpec::several_sequentials},
                           std::pair{"quantized_params", &CaseSpec::quantized_params},
                           std::pair{"held_quantized_tensor", &CaseSpec::held_quantized_tensor}}) {
    if (r.has(key)) out.*flag = r.child(key).boolean();
  }
  const std::string recipe = out.recipe ? out.recipe->name : "";
  const bool has_boundary =
      std::any_of(out.ops.begin(), out.ops.end(), [](const OpSpec& op) { return op.name == kBoundaryOp; });
  if (out.several_sequentials && !has_boundary) {
    r.child("several_sequentials")
        .fail("several Sequentials are the runs of ops between Boundary modules; this case has no Boundary");
  }
  const bool has_linear =
      std::any_of(out.ops.begin(), out.ops.end(), [](const OpSpec& op) { return op.name == "Linear"; });
  if (out.quantized_params && (recipe.empty() || recipe == "DelayedScaling" || !has_linear)) {
    r.child("quantized_params")
        .fail(
            "quantized parameters are Linear weights quantized by the case's recipe: they need a Linear and a "
            "recipe other than DelayedScaling, got " +
            (recipe.empty() ? std::string("no recipe") : recipe) + (has_linear ? "" : " and no Linear"));
  }
  if (out.quantized_params && high_precision_backward(out)) {
    r.child("quantized_params")
        .fail("quantized weights keep no high-precision values for a backward_override of high_precision");
  }
  if (out.held_quantized_tensor && !out.quantized_params) {
    r.child("held_quantized_tensor")
        .fail("the held quantized tensors are the quantized weights: it needs quantized_params");
  }
  for (size_t k = 0; k < out.repeat_calls.size(); ++k) {
    const RepeatCall& call = out.repeat_calls[k];
    const Reader entry(r.child("repeat_calls").json().at(k), "/repeat_calls/" + std::to_string(k));
    if (call.recipe_off && recipe.empty()) entry.child("recipe_off").fail("the case has no recipe to turn off");
    if (call.recipe_off && out.quantized_params) {
      entry.child("recipe_off").fail("quantized weights keep no high-precision values for a call with the recipe off");
    }
    if (call.amax_history_len > 0 && recipe != "DelayedScaling") {
      entry.child("amax_history_len")
          .fail("amax_history_len is an option of DelayedScaling; the case's recipe is " +
                (recipe.empty() ? std::string("none") : recipe));
    }
  }
}

}  // namespace

void from_json(const nlohmann::json& j, CaseSpec& spec) {
  Reader r(j, "");
  r.expect_object({"ops",
                   "fusions",
                   "call_then_bind",
                   "input_requires_grad",
                   "input_shape",
                   "dtype",
                   "device",
                   "seed",
                   "extra_input_count_delta",
                   "corrupt_split_sizes",
                   "late_binds",
                   "repeat_calls",
                   "recipe",
                   "world_size",
                   "input_layout",
                   "read_after_backward",
                   "deferred_init",
                   "several_sequentials",
                   "quantized_params",
                   "held_quantized_tensor"});
  CaseSpec out;
  for (const Reader& op : r.required("ops").elements()) out.ops.push_back(op_from_json(op));
  if (r.has("fusions")) {
    // Fusion names belong to a backend (the model's catalog, TE's registrations): here
    // only their form is checked; corpus::load_case_file and the backends check the names.
    std::set<std::string> seen;  // a case file may list many names: no quadratic scan
    for (const Reader& entry : r.child("fusions").elements()) {
      std::string name = entry.string();
      const bool well_formed = !name.empty() && name.size() <= 200 && std::all_of(name.begin(), name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
      });
      if (!well_formed) {
        entry.fail("expected a fusion name (letters, digits, '_' and '.'), got '" + name + "'");
      }
      if (!seen.insert(name).second) entry.fail("fusion '" + name + "' listed twice");
      out.fusions.push_back(std::move(name));
    }
  }
  if (r.has("call_then_bind")) {
    for (const Reader& entry : r.child("call_then_bind").elements()) {
      entry.expect_object({"op", "grad_mode"});
      CallThenBindStep step;
      step.op = op_index(entry.required("op"), out);
      if (entry.has("grad_mode")) step.grad_mode = entry.child("grad_mode").boolean();
      out.call_then_bind.push_back(step);
    }
  }
  if (r.has("input_requires_grad")) out.input_requires_grad = r.child("input_requires_grad").boolean();
  {
    Reader shape = r.required("input_shape");
    out.input_shape.clear();
    for (const Reader& dim : shape.elements()) {
      int64_t size = dim.integer();
      if (size <= 0) dim.fail("dimension must be positive, got " + std::to_string(size));
      out.input_shape.push_back(size);
    }
    if (out.input_shape.size() != 2) {
      shape.fail("expected a shape [rows, features], got " + std::to_string(out.input_shape.size()) + " dimensions");
    }
  }
  {
    Reader dtype = r.required("dtype");
    out.dtype = dtype.string();
    if (!is_known_dtype(out.dtype)) {
      dtype.fail("unknown dtype '" + out.dtype + "'; known dtypes: float64, float32, bfloat16, float16");
    }
  }
  if (r.has("device")) {
    Reader device = r.child("device");
    out.device = device.string();
    if (!is_known_device(out.device)) device.fail("unknown device '" + out.device + "'; known devices: cpu, cuda");
  }
  out.seed = r.required("seed").unsigned_integer();
  if (r.has("repeat_calls")) {
    for (const Reader& entry : r.child("repeat_calls").elements()) {
      entry.expect_object({"no_grad", "input_requires_grad", "update", "inference_mode", "checkpoint", "recompute",
                           "second_sequential", "recipe_off", "amax_history_len"});
      RepeatCall call;
      if (entry.has("no_grad")) call.no_grad = entry.child("no_grad").boolean();
      if (entry.has("input_requires_grad")) call.input_requires_grad = entry.child("input_requires_grad").boolean();
      if (entry.has("update")) call.update = entry.child("update").boolean();
      if (entry.has("inference_mode")) call.inference_mode = entry.child("inference_mode").boolean();
      if (entry.has("checkpoint")) call.checkpoint = entry.child("checkpoint").boolean();
      if (entry.has("recompute")) call.recompute = entry.child("recompute").boolean();
      if (entry.has("second_sequential")) call.second_sequential = entry.child("second_sequential").boolean();
      if (entry.has("recipe_off")) call.recipe_off = entry.child("recipe_off").boolean();
      if (entry.has("amax_history_len")) {
        const Reader len = entry.child("amax_history_len");
        call.amax_history_len = len.integer();
        if (call.amax_history_len < 1 || call.amax_history_len > (int64_t{1} << 20)) {
          len.fail("expected an amax history length in [1, 1048576], got " + std::to_string(call.amax_history_len));
        }
        if (call.recipe_off) len.fail("a call with the recipe off changes no option of it: drop one of the two");
      }
      if (call.inference_mode && !call.no_grad) {
        entry.child("inference_mode").fail("inference_mode is an evaluation pass: it needs no_grad true");
      }
      if (call.recompute && call.no_grad) {
        entry.child("recompute").fail("recompute recomputes for a backward: it needs no_grad false");
      }
      out.repeat_calls.push_back(call);
    }
  }
  if (r.has("recipe") && !r.child("recipe").json().is_null()) {
    // The names and values belong to a backend (its capabilities.recipes): only the form is
    // checked here; the backend refuses what it does not know.
    const Reader recipe = r.child("recipe");
    recipe.expect_object({"name", "fp8_format", "options"});
    RecipeSpec spec_recipe;
    spec_recipe.name = recipe.required("name").string();
    if (spec_recipe.name.empty() || spec_recipe.name.size() > 64) recipe.child("name").fail("expected a recipe name");
    if (recipe.has("fp8_format")) spec_recipe.fp8_format = recipe.child("fp8_format").string();
    if (spec_recipe.fp8_format != "E4M3" && spec_recipe.fp8_format != "HYBRID") {
      recipe.child("fp8_format").fail("expected E4M3 or HYBRID, got '" + spec_recipe.fp8_format + "'");
    }
    if (recipe.has("options")) {
      const Reader options = recipe.child("options");
      if (!options.json().is_object()) options.fail("expected an object of option -> value strings");
      for (const auto& item : options.json().items()) {
        spec_recipe.options[item.key()] = options.child(item.key()).string();
      }
    }
    out.recipe = std::move(spec_recipe);
  }
  if (r.has("world_size")) {
    const Reader world = r.child("world_size");
    out.world_size = world.integer();
    if (out.world_size < 1 || out.world_size > kMaxWorldSize) {
      world.fail("expected a number of ranks in [1, " + std::to_string(kMaxWorldSize) + "], got " +
                 std::to_string(out.world_size));
    }
  }
  if (r.has("read_after_backward")) out.read_after_backward = r.child("read_after_backward").boolean();
  if (r.has("deferred_init")) {
    const Reader deferred = r.child("deferred_init");
    out.deferred_init = deferred.boolean();
    if (out.deferred_init && out.world_size != 1) {
      deferred.fail("deferred initialisation builds one process's ops; this case runs on " +
                    std::to_string(out.world_size) + " ranks (world_size must be 1)");
    }
  }
  if (r.has("input_layout")) {
    const Reader layout = r.child("input_layout");
    out.input_layout = layout.string();
    if (!is_known_input_layout(out.input_layout)) {
      layout.fail("unknown input layout '" + out.input_layout + "'; known layouts: replicated, rows, features");
    }
  }
  if (r.has("extra_input_count_delta")) out.extra_input_count_delta = r.child("extra_input_count_delta").integer();
  if (r.has("corrupt_split_sizes")) out.corrupt_split_sizes = r.child("corrupt_split_sizes").boolean();
  if (r.has("late_binds")) {
    for (const Reader& entry : r.child("late_binds").elements()) {
      entry.expect_object({"op", "slot", "channel"});
      LateBindStep step;
      step.op = op_index(entry.required("op"), out);
      step.slot = entry.required("slot").integer();
      step.channel = entry.required("channel").string();
      out.late_binds.push_back(std::move(step));
    }
  }
  check_usage_needs(r, out);
  spec = std::move(out);
}

// ---------------------------------------------------------------------------------------------
// Static wiring check

std::optional<SpecProblem> check_static_wiring(const CaseSpec& spec) {
  // Fusers are the maximal runs of catalog ops between Boundary modules (runtime.md section 9).
  size_t begin = 0;
  while (begin < spec.ops.size()) {
    if (spec.ops[begin].name == kBoundaryOp) {
      ++begin;
      continue;
    }
    size_t end = begin;
    while (end < spec.ops.size() && spec.ops[end].name != kBoundaryOp) ++end;
    std::map<std::string, size_t> producer_of;
    for (size_t i = begin; i < end; ++i) {
      const auto& bindings = spec.ops[i].output_bindings;
      for (size_t slot = 0; slot < bindings.size(); ++slot) {
        if (!bindings[slot].channel) continue;
        auto [it, inserted] = producer_of.emplace(*bindings[slot].channel, i);
        if (!inserted) {
          return SpecProblem{"/ops/" + std::to_string(i) + "/output_bindings/" + std::to_string(slot) + "/channel",
                             ops::DuplicateProducerError::kKind,
                             "channel '" + *bindings[slot].channel + "' is produced by op " +
                                 std::to_string(it->second) + " and again by op " + std::to_string(i) + " (" +
                                 spec.ops[i].name + ")"};
        }
      }
    }
    for (size_t i = begin; i < end; ++i) {
      const auto& channels = spec.ops[i].input_channels;
      for (size_t slot = 0; slot < channels.size(); ++slot) {
        if (!channels[slot]) continue;
        std::string path = "/ops/" + std::to_string(i) + "/input_channels/" + std::to_string(slot);
        auto it = producer_of.find(*channels[slot]);
        if (it == producer_of.end()) {
          return SpecProblem{path, ops::MissingProducerError::kKind,
                             "channel '" + *channels[slot] + "' bound to " + spec.ops[i].name + " (op " +
                                 std::to_string(i) + ") input slot " + std::to_string(slot) +
                                 " has no producer in the same fuser (ops " + std::to_string(begin) + ".." +
                                 std::to_string(end - 1) + ")"};
        }
        if (it->second >= i) {
          return SpecProblem{path, ops::ProducerNotEarlierError::kKind,
                             "channel '" + *channels[slot] + "' bound to " + spec.ops[i].name + " (op " +
                                 std::to_string(i) + ") input slot " + std::to_string(slot) + " is produced by op " +
                                 std::to_string(it->second) + ", not an earlier op"};
        }
      }
    }
    begin = end;
  }
  return std::nullopt;
}

}  // namespace gradfuzz::harness
