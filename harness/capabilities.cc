#include "harness/capabilities.h"

#include <ATen/Context.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "ops/faults.h"

namespace gradfuzz::harness {

namespace {

using nlohmann::json;

const char* style_name(ops::OutputStyle style) {
  return style == ops::OutputStyle::kGenerator ? "generator" : "vector";
}

ops::OutputStyle style_from(const std::string& name) {
  if (name == "vector") return ops::OutputStyle::kVector;
  if (name == "generator") return ops::OutputStyle::kGenerator;
  throw std::invalid_argument("unknown output style '" + name + "'; known: vector, generator");
}

ops::FusionPass pass_from(const std::string& name) {
  for (ops::FusionPass pass : {ops::FusionPass::kJoint, ops::FusionPass::kForward, ops::FusionPass::kBackward}) {
    if (name == ops::fusion_pass_name(pass)) return pass;
  }
  throw std::invalid_argument("unknown fusion pass '" + name + "'; known: joint, forward, backward");
}

}  // namespace

const OpCapability* BackendCapabilities::op(const std::string& name) const {
  auto it = std::find_if(ops.begin(), ops.end(), [&](const OpCapability& o) { return o.name == name; });
  return it == ops.end() ? nullptr : &*it;
}

bool BackendCapabilities::has_deviation(const std::string& name) const {
  return std::find(deviations.begin(), deviations.end(), name) != deviations.end();
}

std::vector<std::string> BackendCapabilities::op_names() const {
  std::vector<std::string> out;
  for (const auto& o : ops) out.push_back(o.name);
  return out;
}

std::vector<std::string> BackendCapabilities::fusion_names() const {
  std::vector<std::string> out;
  for (const auto& f : fusions) out.push_back(f.name);
  return out;
}

const FaultCapability* BackendCapabilities::fault(const std::string& name) const {
  auto it = std::find_if(faults.begin(), faults.end(), [&](const FaultCapability& f) { return f.name == name; });
  return it == faults.end() ? nullptr : &*it;
}

std::vector<const RecipeCapability*> BackendCapabilities::available_recipes() const {
  std::vector<const RecipeCapability*> out;
  for (const auto& r : recipes) {
    if (r.available) out.push_back(&r);
  }
  return out;
}

namespace {

/// capabilities.fp8_gemm_accumulation, checked: std::invalid_argument naming the field.
Fp8GemmAccumulationCapability fp8_gemm_accumulation_from(const json& j) {
  const auto fail = [](const std::string& field, const std::string& what) {
    throw std::invalid_argument("capabilities.fp8_gemm_accumulation." + field + ": " + what);
  };
  if (!j.is_object()) fail("", "expected an object");
  Fp8GemmAccumulationCapability a;
  const auto integer = [&](const char* key, int64_t fallback, int64_t min, int64_t max) {
    if (!j.contains(key)) return fallback;
    if (!j[key].is_number_integer()) fail(key, "expected an integer");
    const auto v = j[key].get<int64_t>();
    if (v < min || v > max)
      fail(key, "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " + std::to_string(v));
    return v;
  };
  a.fraction_bits = integer("fraction_bits", a.fraction_bits, 1, 52);
  a.products_per_step = integer("products_per_step", a.products_per_step, 1, int64_t{1} << 20);
  a.promotion_products = integer("promotion_products", a.promotion_products, 1, int64_t{1} << 30);
  if (a.promotion_products % a.products_per_step != 0) {
    fail("promotion_products", "must be a multiple of products_per_step (" + std::to_string(a.products_per_step) +
                                   "), got " + std::to_string(a.promotion_products));
  }
  if (j.contains("fast_accumulation")) {
    if (!j["fast_accumulation"].is_object()) fail("fast_accumulation", "expected an object recipe -> GEMMs");
    for (const auto& [recipe, gemms] : j["fast_accumulation"].items()) {
      if (!gemms.is_array()) fail("fast_accumulation." + recipe, "expected a list of GEMMs");
      std::vector<std::string>& fast = a.fast_accumulation[recipe];  // a recipe with none is listed too
      for (const auto& g : gemms) {
        const std::string name = g.is_string() ? g.get<std::string>() : "";
        if (name != "fprop" && name != "dgrad" && name != "wgrad") {
          fail("fast_accumulation." + recipe, "expected \"fprop\", \"dgrad\" or \"wgrad\", got " + g.dump());
        }
        fast.push_back(name);
      }
    }
  }
  return a;
}

}  // namespace

void to_json(json& j, const BackendCapabilities& caps) {
  json ops_json = json::object();
  for (const auto& o : caps.ops) {
    json styles = json::array();
    for (auto s : o.output_styles) styles.push_back(style_name(s));
    ops_json[o.name] = {{"implementation", o.implementation}, {"options", o.options}, {"output_styles", styles}};
  }
  json fusions = json::array();
  for (const auto& f : caps.fusions) {
    fusions.push_back(
        {{"name", f.name}, {"pass", ops::fusion_pass_name(f.pass)}, {"implementation", f.implementation}});
  }
  j = json{{"backend", caps.backend},   {"devices", caps.devices},
           {"dtypes", caps.dtypes},     {"ops", ops_json},
           {"fusions", fusions},        {"deviations", caps.deviations},
           {"versions", caps.versions}, {"device_name", caps.device_name}};
  if (caps.repeat_calls) j["repeat_calls"] = true;
  if (!caps.usage.empty()) j["usage"] = caps.usage;
  j["exposes_all_channels"] = caps.exposes_all_channels;
  j["fp8_reference_exact"] = caps.fp8_reference_exact;
  if (caps.fp8_gemm_accumulation) {
    const Fp8GemmAccumulationCapability& a = *caps.fp8_gemm_accumulation;
    j["fp8_gemm_accumulation"] = {{"fraction_bits", a.fraction_bits},
                                  {"products_per_step", a.products_per_step},
                                  {"promotion_products", a.promotion_products},
                                  {"fast_accumulation", a.fast_accumulation}};
  }
  json faults = json::array();
  for (const auto& f : caps.faults) {
    json fault{{"name", f.name}, {"description", f.description}, {"target", f.target}};
    if (f.world_size > 0) fault["world_size"] = f.world_size;
    faults.push_back(std::move(fault));
  }
  j["faults"] = std::move(faults);
  if (caps.max_world_size != 1) j["max_world_size"] = caps.max_world_size;
  json recipes = json::array();
  for (const auto& r : caps.recipes) {
    recipes.push_back({{"name", r.name},
                       {"available", r.available},
                       {"reason", r.reason},
                       {"fp8_formats", r.fp8_formats},
                       {"options", r.options}});
  }
  j["recipes"] = std::move(recipes);
}

void from_json(const json& j, BackendCapabilities& caps) {
  caps = BackendCapabilities{};
  if (j.contains("backend")) caps.backend = j["backend"].get<std::string>();
  caps.devices = j.at("devices").get<std::vector<std::string>>();
  caps.dtypes = j.at("dtypes").get<std::vector<std::string>>();
  for (const auto& [name, o] : j.at("ops").items()) {
    OpCapability op;
    op.name = name;
    op.implementation = o.value("implementation", "");
    if (o.contains("options")) {
      for (const auto& [attr, values] : o["options"].items()) op.options[attr] = values.get<std::vector<double>>();
    }
    if (o.contains("output_styles")) {
      op.output_styles.clear();
      for (const auto& s : o["output_styles"]) op.output_styles.push_back(style_from(s.get<std::string>()));
    }
    caps.ops.push_back(std::move(op));
  }
  for (const auto& f : j.at("fusions")) {
    caps.fusions.push_back(
        {f.at("name").get<std::string>(), pass_from(f.at("pass").get<std::string>()), f.value("implementation", "")});
  }
  if (j.contains("deviations")) caps.deviations = j["deviations"].get<std::vector<std::string>>();
  if (j.contains("versions")) caps.versions = j["versions"].get<std::map<std::string, std::string>>();
  if (j.contains("device_name") && j["device_name"].is_string()) caps.device_name = j["device_name"].get<std::string>();
  caps.repeat_calls = j.value("repeat_calls", false);
  if (j.contains("usage")) caps.usage = j["usage"].get<std::vector<std::string>>();
  caps.exposes_all_channels = j.value("exposes_all_channels", true);
  caps.fp8_reference_exact = j.value("fp8_reference_exact", false);
  if (j.contains("fp8_gemm_accumulation") && !j["fp8_gemm_accumulation"].is_null()) {
    caps.fp8_gemm_accumulation = fp8_gemm_accumulation_from(j["fp8_gemm_accumulation"]);
  }
  caps.max_world_size = j.value("max_world_size", int64_t{1});
  if (caps.max_world_size < 1) {
    throw std::invalid_argument("max_world_size must be >= 1, got " + std::to_string(caps.max_world_size));
  }
  if (j.contains("faults")) {
    for (const auto& f : j["faults"]) {
      caps.faults.push_back({f.at("name").get<std::string>(), f.value("description", ""), f.value("target", ""),
                             f.value("world_size", int64_t{0})});
    }
  }
  if (j.contains("recipes")) {
    for (const auto& r : j["recipes"]) {
      RecipeCapability recipe;
      recipe.name = r.at("name").get<std::string>();
      recipe.available = r.value("available", false);
      recipe.reason = r.value("reason", "");
      if (r.contains("fp8_formats")) recipe.fp8_formats = r["fp8_formats"].get<std::vector<std::string>>();
      if (r.contains("options")) {
        recipe.options = r["options"].get<std::map<std::string, std::vector<std::string>>>();
      }
      caps.recipes.push_back(std::move(recipe));
    }
  }
}

bool BackendCapabilities::runs_usage(const std::string& element) const {
  return std::find(usage.begin(), usage.end(), element) != usage.end();
}

BackendCapabilities model_capabilities() {
  BackendCapabilities caps;
  caps.backend = "model";
  // cache_quantized_input: the model rounds as the reference does (CachedInput tests).
  caps.fp8_reference_exact = true;
  caps.devices = {"cpu"};
  if (at::hasCUDA()) caps.devices.push_back("cuda");
  caps.dtypes = {"float64", "float32", "bfloat16", "float16"};
  caps.repeat_calls = true;
  // An optimizer step between calls: the model's ops read their parameters at every call.
  caps.usage = {"update"};
  for (ops::Fault f : ops::all_faults()) caps.faults.push_back({ops::fault_name(f), ops::fault_description(f), "ops/"});
  const auto& registry = ops::OpRegistry::catalog();
  for (const auto& name : registry.names()) {
    OpCapability op;
    op.name = name;
    op.implementation = "gradfuzz::ops (" + registry.info(name).summary + ")";
    op.output_styles = {ops::OutputStyle::kVector, ops::OutputStyle::kGenerator};
    caps.ops.push_back(std::move(op));
  }
  for (const auto& entry : ops::FusionRegistry::catalog().entries()) {
    caps.fusions.push_back({entry.name, entry.pass, "gradfuzz::ops fused op"});
  }
  return caps;
}

const std::vector<std::string>& backend_names() {
  static const std::vector<std::string> names{"model", "te", "torch"};
  return names;
}

}  // namespace gradfuzz::harness
