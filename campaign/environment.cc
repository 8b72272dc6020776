#include "campaign/environment.h"

#include <ATen/Context.h>

#include "campaign/exit_codes.h"
#include "generators/coverage.h"
#include "reports/build_info.h"

#if defined(GRADFUZZ_WITH_CUDA) && __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define GRADFUZZ_HAVE_CUDART_HEADER 1
#endif

namespace gradfuzz::campaign {

bool cuda_available() { return at::hasCUDA(); }

std::string resolve_device(const std::string& requested) {
  if (requested == "cpu") return "cpu";
  if (requested == "cuda") {
    if (!cuda_available())
      throw InputError("--device cuda: this process has no CUDA device (try --device auto or cpu)");
    return "cuda";
  }
  if (requested == "auto") return cuda_available() ? "cuda" : "cpu";
  throw InputError("--device: expected cpu, cuda or auto, got '" + requested + "'");
}

reports::EnvironmentInfo environment_info(const std::string& device) {
  reports::EnvironmentInfo env;
  env.torch_version = reports::torch_version();
  env.device = device;
  env.device_name = device;
  if (device == "cuda") {
    env.device_name = "cuda:0";
#ifdef GRADFUZZ_HAVE_CUDART_HEADER
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) env.device_name = prop.name;
#endif
  }
  return env;
}

reports::ReportContext make_report_context(const reports::CampaignInfo& campaign, const std::string& device) {
  reports::ReportContext context;
  context.tool = reports::build_tool_info();
  context.environment = environment_info(device);
  context.campaign = campaign;
  context.coverage_names = reports::catalog_coverage_names(generators::coverage_feature_names());
  context.date = reports::utc_now_iso8601();
  return context;
}

}  // namespace gradfuzz::campaign
