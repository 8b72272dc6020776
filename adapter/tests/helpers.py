"""Shared by the tests: run a CaseSpec through a backend and judge it against the reference."""

import math
import os

from gradfuzz_adapter.case import decode_case, run_reference
from gradfuzz_adapter.client import make_request, path_result
from gradfuzz_adapter.export.support import compare_results
from gradfuzz_adapter.protocol import TensorList

ADAPTER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Tolerances per dtype: torch.testing.assert_close's defaults, as the harness starts from.
TOLERANCE = {
    "float64": {"atol": 1e-7, "rtol": 1e-7},
    # fp32 too gets the rounding baseline here: a saturated GELU's derivative is exactly 0
    # in fp32 and -2e-7 in fp64 (seen on the H200), which no static tolerance covers.
    "float32": {"atol": 1.3e-6, "rtol": 1e-5, "baseline_factor": 16, "baseline_cap": 0.25},
    "bfloat16": {"atol": 1.6e-2, "rtol": 1e-5, "baseline_factor": 16, "baseline_cap": 0.25},
    "float16": {"atol": 1e-3, "rtol": 1e-5, "baseline_factor": 16, "baseline_cap": 0.25},
}


def spec(ops, *, shape=(4, 8), dtype="float64", seed=1, **extra):
    """A CaseSpec dict with defaults."""
    out = {
        "ops": ops,
        "fusions": [],
        "input_requires_grad": True,
        "input_shape": list(shape),
        "dtype": dtype,
        "device": "cpu",
        "seed": seed,
    }
    out.update(extra)
    return out


def run(backend, case_spec, paths=None):
    """(case, [path results with tensors resolved]) of `case_spec` on `backend`."""
    header, tensors = make_request(case_spec, paths=paths)
    case = decode_case(header, tensors)
    out = TensorList()
    results = backend.run(case, header["paths"], out)
    return case, [path_result(r, out.tensors) for r in results]


def harness_tolerance(case):
    """The dtype's tolerance scaled for depth and reduction length as harness/tolerances.cc
    scales it (sqrt(K/16) for sums of K terms; depth: linear for half types, n/4 for fp32)."""
    tolerance = dict(TOLERANCE[case.dtype_name])
    n = max(len(case.catalog_ops), 1)
    longest = 1
    for op in case.ops:
        longest = max([longest, *op.input_shape, *op.output_shape])
    depth = {"float16": n, "bfloat16": n, "float32": max(1.0, n / 4)}.get(case.dtype_name, 1.0)
    tolerance["rtol"] *= max(1.0, math.sqrt(longest / 16)) * depth
    return tolerance


def judge(case, result, *, all_channels=True):
    """Mismatches of one ok path against the float64 reference (and the rounding baseline)."""
    assert result["status"] == "ok", result
    expected = run_reference(case)
    tolerance = harness_tolerance(case)
    baseline = run_reference(case, dtype=case.dtype) if tolerance.get("baseline_factor") else None
    return compare_results(expected, result, tolerance, baseline, all_channels=all_channels)


def stubbed_te_backend():
    """A TEBackend on the CPU over TE's Python with the stubbed extension (te_stub.py), or the
    calling test skipped where TE's source is not found."""
    import pytest
    import te_stub

    from gradfuzz_adapter.te.backend import TEBackend

    reason = te_stub.available()
    if reason:
        pytest.skip(reason)
    te_stub.install()
    return TEBackend(device="cpu")


def run_one_path(backend, header, tensors, fault=None):
    """The first path of the request (header, tensors) on `backend`, under `fault`, with its
    tensors resolved."""
    case = decode_case(header, tensors)
    out = TensorList()
    result = backend.run(case, header["paths"][:1], out, fault=fault)[0]
    return path_result(result, out.tensors)
