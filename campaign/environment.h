#pragma once

#include <string>

#include "reports/reporter.h"

namespace gradfuzz::campaign {

/// Whether this process can run CUDA cases (LibTorch built with CUDA and a device present).
bool cuda_available();

/// "cpu" -> "cpu"; "cuda" -> "cuda" (InputError when CUDA is not available); "auto" -> cuda
/// when available, else cpu. Anything else throws InputError.
std::string resolve_device(const std::string& requested);

/// Environment block of a report for the resolved `device` ("cpu" or "cuda").
reports::EnvironmentInfo environment_info(const std::string& device);

/// Context block with this build's tool info, the environment of `device`, the catalog and
/// feature coverage names, the current UTC date and `campaign`.
reports::ReportContext make_report_context(const reports::CampaignInfo& campaign, const std::string& device);

}  // namespace gradfuzz::campaign
