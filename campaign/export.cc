#include "campaign/export.h"

#include <cmath>
#include <iterator>

#include "campaign/exit_codes.h"
#include "campaign/finding_recorder.h"
#include "harness/dtype.h"
#include "harness/sharding.h"
#include "oracle/tolerances.h"

namespace gradfuzz::campaign {

namespace {

/// The compact and full forms' expectation: what the script must check (docs/BACKENDS.md
/// "export"): the oracle's own bound of every tensor, computed here from the reference and its
/// evidence so that the script judges exactly as replay does; for a quantizing (or
/// distributed) case the reference's own values, which the catalog's high-precision math in
/// the script cannot recompute.
void add_expectation(const ExportJob& job, const runner::PreparedCase& prepared, backends::ExportRequest& request) {
  const harness::CaseSpec& spec = job.case_file.file.spec;
  const std::string& path = job.case_file.path.string();
  request.expect = {{"kind", "pass"}};
  if (const auto kind = runner::reference_error_kind(spec)) request.expect = {{"kind", "error"}, {"error_kind", *kind}};
  const bool distributed = harness::is_distributed(spec);
  if (distributed) {
    // A torchrun script of one process per rank, its values in a file beside it.
    if (request.data_file.empty()) {
      throw InputError("export: a distributed case's script keeps its values beside it: give -o FILE");
    }
    if (request.expect.at("kind") != "pass") {
      throw InputError("export: " + path + " is a distributed case that must raise " +
                       request.expect.at("error_kind").get<std::string>() +
                       "; its scripts check passing cases only (replay checks this one)");
    }
    try {
      request.expect["sharding"] = harness::sharding_json(harness::plan_sharding(spec, prepared.plan), prepared.plan);
    } catch (const harness::SpecError& e) {
      throw InputError(path + ": not a valid distributed case: " + e.what());
    }
  }
  const at::ScalarType dtype = harness::scalar_type_from_name(spec.dtype);
  const oracle::Tolerance tolerance =
      oracle::case_tolerance(dtype, {spec.num_ops(), prepared.plan.max_reduction_length});
  request.expect["tolerance"] = {{"atol", tolerance.atol}, {"rtol", tolerance.rtol}};
  if (request.expect.at("kind") != "pass") return;
  const runner::Expectation expectation =
      runner::judging_expectation(spec, {}, job.paths, job.fp8_target ? &*job.fp8_target : nullptr);
  auto bounds_json = [&](const oracle::CaseBounds& bounds) {
    nlohmann::json tensors = nlohmann::json::object();
    for (const auto& [name, b] : bounds.tensors) {
      nlohmann::json t{{"atol", b.atol}, {"rtol", b.rtol}};
      t["norm_bound"] = std::isfinite(b.norm_bound) ? nlohmann::json(b.norm_bound) : nlohmann::json(nullptr);
      if (b.allowance.defined()) {
        // Infinite where the dtype cannot hold the reference's value: a large finite stand-in.
        request.expect_tensors.push_back(b.allowance.nan_to_num(0, 1e300, 0));
        t["allowance"] = {{"expect_tensor", static_cast<int64_t>(request.expect_tensors.size()) - 1}};
      } else {
        t["allowance"] = nullptr;
      }
      tensors[name] = std::move(t);
    }
    return tensors;
  };
  auto ship = [&](const std::map<std::string, at::Tensor>& tensors) {
    nlohmann::json refs = nlohmann::json::object();
    for (const auto& [name, t] : tensors) {
      if (!t.defined()) continue;
      request.expect_tensors.push_back(t);
      refs[name] = {{"expect_tensor", static_cast<int64_t>(request.expect_tensors.size()) - 1}};
    }
    return refs;
  };
  auto ship_calls = [&](const std::vector<std::map<std::string, at::Tensor>>& calls) {
    nlohmann::json repeats = nlohmann::json::array();
    for (const auto& call : calls) repeats.push_back(ship(call));
    return repeats;
  };
  if (const auto& bounds = expectation.bounds) request.expect["tensors"] = bounds_json(*bounds);
  if (expectation.quantized || distributed) {
    request.expect["expected"] = ship(expectation.expected);
    request.expect["repeat_expected"] = ship_calls(expectation.repeat_expected);
  }
  if (!expectation.paths.empty()) {
    // A path whose fused ops quantize elsewhere (BackwardLinearScale under a recipe) is judged
    // against its own reference, in replay and in the script (docs/BACKENDS.md "Per-path
    // quantization points").
    nlohmann::json own = nlohmann::json::object();
    for (const auto& [name, e] : expectation.paths) {
      own[name] = {{"points", e.points},
                   {"tensors", bounds_json(*e.bounds)},
                   {"expected", ship(e.expected)},
                   {"repeat_expected", ship_calls(e.repeat_expected)}};
    }
    request.expect["paths"] = std::move(own);
  }
}

}  // namespace

corpus::SavedFinding finding_from_report(const nlohmann::json& cluster) {
  const auto details = cluster.find("details");
  if (details == cluster.end() || !details->is_array() || details->empty()) {
    throw InputError("report upstream: cluster " + cluster.value("signature", std::string("?")) +
                     " has no details to write a test for");
  }
  nlohmann::json detail = details->front();
  detail["signature"] = cluster.value("signature", std::string());
  // A report writes NaN and infinite errors as null; the finding's numbers are its own.
  for (auto it = detail.begin(); it != detail.end();) {
    it = it->is_null() ? detail.erase(it) : std::next(it);
  }
  corpus::SavedFinding saved;
  try {
    saved.finding = detail.get<harness::Finding>();
    if (const auto c = cluster.find("confirmation"); c != cluster.end() && c->is_object()) {
      saved.diagnosis = c->value("diagnosis", std::string());
      if (const auto d = c->find("first_divergence"); d != c->end() && d->is_object()) {
        saved.first_divergence = d->get<harness::Divergence>();
      }
    }
  } catch (const std::exception& e) {
    throw InputError("report upstream: cluster " + detail["signature"].get<std::string>() +
                     " is not a finding: " + e.what());
  }
  if (saved.finding.op.empty()) {
    const std::string& sig = saved.finding.signature;
    const size_t a = sig.find('|');
    const size_t b = a == std::string::npos ? a : sig.find('|', a + 1);
    if (b != std::string::npos) saved.finding.op = sig.substr(a + 1, b - a - 1);
  }
  return saved;
}

nlohmann::json saved_finding_json(const corpus::SavedFinding& saved) {
  nlohmann::json j = saved.finding;
  if (saved.first_divergence) j["first_divergence"] = *saved.first_divergence;
  if (!saved.diagnosis.empty()) j["diagnosis"] = saved.diagnosis;
  return j;
}

backends::ExportRequest export_request(const ExportJob& job, const runner::PreparedCase& prepared) {
  backends::ExportRequest request;
  request.backend = job.target;
  request.case_file = job.case_file.path.string();
  if (job.form != ExportForm::kUpstream) {
    request.full = job.form == ExportForm::kFull;
    // Values too large to inline go beside the script.
    if (!job.output.empty()) request.data_file = job.output + ".values.pt";
    add_expectation(job, prepared, request);
    return request;
  }
  const harness::CaseSpec& spec = job.case_file.file.spec;
  if (harness::is_distributed(spec)) {
    throw InputError("export --upstream: " + request.case_file +
                     " is a distributed case; its test is the torchrun script of `export --python`");
  }
  if (!job.finding) {
    throw InputError("export --upstream: " + request.case_file + " does not say which finding it stands for");
  }
  request.form = "upstream";
  request.finding = saved_finding_json(*job.finding);
  if (job.fault) request.fault = *job.fault;
  // Where seeded values do not reproduce the finding, gradfuzz's go beside the test.
  if (!job.output.empty()) request.data_file = job.output + ".values.pt";
  return request;
}

corpus::SavedFinding replayed_finding(const LoadedCase& c, CaseRunner& runner, const std::string& fault,
                                      const std::string& signature) {
  harness::CaseResult result = runner.run_now(c.file.spec, fault);
  if (wants_trace(result)) {
    harness::CaseResult traced = runner.run_traced(c.file.spec, fault);
    if (traced.failed()) result = std::move(traced);
  }
  const std::string& file = c.path.string();
  if (!result.failed()) {
    throw InputError("export --upstream: " + file + " passes on the " + runner.capabilities().backend + " backend" +
                     (fault.empty() ? std::string() : " with fault " + fault) +
                     ": there is no finding to write a test for");
  }
  const harness::Finding* f = signature.empty() ? &result.findings.front() : result.finding(signature);
  if (f == nullptr) {
    std::string found;
    for (const auto& s : result.signatures()) found += (found.empty() ? "" : ", ") + s;
    throw InputError("export --upstream: " + file + " has no finding '" + signature + "'; it has: " + found);
  }
  corpus::SavedFinding saved{*f, std::nullopt, ""};
  if (const harness::Divergence* d = result.divergence_of(f->path_pair)) saved.first_divergence = *d;
  return saved;
}

}  // namespace gradfuzz::campaign
