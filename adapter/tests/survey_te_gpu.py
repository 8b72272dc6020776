"""Runs a battery of cases through the te backend on a GPU with TransformerEngine installed,
judges every path against the float64 reference and prints one line per case and path
(status, error kind, mismatches, caller tensors changed, fused groups), then runs a few
exported te scripts with pytest. A survey, not a test: TE's own defects show up here.

    PYTHONPATH=/tmp/te-site:adapter python3 adapter/tests/survey_te_gpu.py [OUT_DIR]
"""

import json
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
from helpers import harness_tolerance, judge, run, spec  # noqa: E402

from gradfuzz_adapter.__main__ import Server  # noqa: E402
from gradfuzz_adapter.backends import configure_torch  # noqa: E402
from gradfuzz_adapter.case import decode_case  # noqa: E402
from gradfuzz_adapter.client import make_request  # noqa: E402


def bound(channel, to_caller=False):
    return {"channel": channel, "output_to_caller": to_caller}


def cases():
    f32, bf16 = "float32", "bfloat16"
    residual = [
        {"name": "MakeExtraOutput", "output_bindings": [bound("r")]},
        {"name": "ConstantScale", "attrs": {"scale": 0.75}},
        {"name": "AddExtraInput", "input_channels": ["r"]},
    ]
    out = {}
    for dtype in (f32, bf16):
        out[f"mlp-{dtype}"] = spec(
            [
                {"name": "Linear", "attrs": {"out": 32}},
                {"name": "Bias"},
                {"name": "GELU"},
                {"name": "Linear", "attrs": {"out": 16}},
                {"name": "Bias"},
                {"name": "ReLU"},
                {"name": "SReLU"},
            ],
            shape=(16, 16),
            dtype=dtype,
            fusions=["ForwardLinearBiasActivation"],
        )
    out["residual-linear-add-f32"] = spec(
        [
            {"name": "MakeExtraOutput", "attrs": {"in_place": 1}, "output_bindings": [bound("r")]},
            {"name": "Linear", "attrs": {"out": 16}},
            {"name": "Bias"},
            {"name": "AddExtraInput", "attrs": {"in_place": 1}, "input_channels": ["r"]},
        ],
        shape=(16, 16),
        dtype=f32,
        fusions=["BackwardLinearAdd", "ForwardLinearBiasAdd"],
    )
    out["linear-scale-add-bf16"] = spec(
        [
            {"name": "AddExtraInput"},
            {"name": "Linear", "attrs": {"out": 16}},
            {"name": "ConstantScale", "attrs": {"scale": -0.5}},
            {"name": "AddExtraInput", "attrs": {"in_place": 1}},
        ],
        shape=(16, 16),
        dtype=bf16,
        fusions=["ForwardLinearScaleAdd", "BackwardLinearScale"],
    )
    out["add-rmsnorm-f32"] = spec(
        [
            {"name": "MakeExtraOutput", "output_bindings": [bound("h", True)]},
            {"name": "RMSNorm", "attrs": {"zero_centered_gamma": 1}},
            {"name": "LayerNorm", "attrs": {"zero_centered_gamma": 1, "sm_margin": 1}},
            {"name": "LayerNorm"},
        ],
        shape=(8, 32),
        dtype=f32,
        fusions=["BackwardAddRMSNorm"],
    )
    for k in (0, 2):
        out[f"swiglu-interleave{k}-f32"] = spec(
            [
                {"name": "SwiGLU", "attrs": {"interleave": k}},
                {"name": "Reshape", "attrs": {"features": 8}},
                {"name": "Identity"},
                {"name": "ScaledSwiGLU", "attrs": {"interleave": k}},
                {"name": "ScaledSReLU"},
            ],
            shape=(8, 16),
            dtype=f32,
        )
    for name, fusions in (
        ("joint", ["FusedResidual.joint"]),
        ("fwd", ["FusedResidual.forward"]),
        ("bwd", ["FusedResidual.backward"]),
    ):
        out[f"fused-residual-{name}-f32"] = spec(
            residual[:1] + [{"name": "Linear", "attrs": {"out": 16}}] + residual[2:],
            shape=(8, 16),
            dtype=f32,
            fusions=fusions,
        )
    out["moe-f32"] = spec(
        [
            {
                "name": "Dispatch",
                "attrs": {"groups": 3},
                "output_bindings": [bound("sizes"), bound("probs"), bound("map")],
            },
            {
                "name": "GroupedLinear",
                "attrs": {"groups": 3, "out": 32},
                "input_channels": ["sizes"],
            },
            {"name": "ScaledSwiGLU", "input_channels": ["probs"]},
            {
                "name": "GroupedLinear",
                "attrs": {"groups": 3, "out": 16, "scale_bias": 1},
                "input_channels": ["sizes", "probs"],
            },
            {"name": "Combine", "input_channels": ["map"]},
        ],
        shape=(24, 16),
        dtype=f32,
    )
    for dtype in (f32, bf16):
        out[f"grouped-options-{dtype}"] = spec(
            [
                {
                    "name": "GroupedLinear",
                    "attrs": {"groups": 2, "out": 16, "accumulate_into_main_grad": 1},
                },
                {
                    "name": "GroupedLinear",
                    "attrs": {"groups": 3, "out": 16, "delay_wgrad_compute": 1},
                },
                {"name": "GroupedLinear", "attrs": {"groups": 2, "out": 16, "bias": 0}},
                {"name": "Linear", "attrs": {"out": 16, "accumulate_into_main_grad": 1}},
            ],
            shape=(16, 16),
            dtype=dtype,
        )
    out["grouped-single-param-bf16"] = spec(
        [
            {
                "name": "GroupedLinear",
                "attrs": {"groups": 2, "out": 16, "single_grouped_weight": 1},
            },
            {
                "name": "GroupedLinear",
                "attrs": {
                    "groups": 2,
                    "out": 16,
                    "single_grouped_weight": 1,
                    "single_grouped_bias": 1,
                },
            },
            {
                "name": "GroupedLinear",
                "attrs": {
                    "groups": 2,
                    "out": 16,
                    "single_grouped_bias": 1,
                    "delay_wgrad_compute": 1,
                },
            },
        ],
        shape=(16, 16),
        dtype=bf16,
    )
    out["custom-ops-bf16"] = spec(
        [
            {"name": "RowStat", "output_bindings": [bound("s", True)]},
            {"name": "ScaledSReLU", "input_channels": ["s"]},
            {"name": "DualExtraOutput", "output_bindings": [bound("a"), {"channel": None}]},
            {"name": "AddExtraInput", "input_channels": ["a"]},
            {"name": "Boundary"},
            {"name": "GELU", "attrs": {"cache_quantized_input": 0}},
        ],
        shape=(8, 16),
        dtype=bf16,
    )
    out["cache-quantized-input-f32"] = spec(
        [
            {"name": "GELU", "attrs": {"cache_quantized_input": 1}},
            {"name": "SwiGLU", "attrs": {"cache_quantized_input": 1}},
        ],
        shape=(8, 16),
        dtype=f32,
    )
    out["zero-rows-group-f32"] = spec(
        [{"name": "GroupedLinear", "attrs": {"groups": 4, "out": 8}}],
        shape=(2, 8),
        dtype=f32,
        seed=5,
    )
    out["corrupt-split-sizes-f32"] = spec(
        [{"name": "GroupedLinear", "attrs": {"groups": 2, "out": 8}}],
        shape=(6, 8),
        dtype=f32,
        corrupt_split_sizes=True,
    )
    out["corrupt-split-sizes-bf16"] = spec(
        [{"name": "GroupedLinear", "attrs": {"groups": 2, "out": 8}}],
        shape=(6, 8),
        dtype=bf16,
        corrupt_split_sizes=True,
    )
    out["finding1-router-f32"] = spec(
        [
            {
                "name": "Dispatch",
                "attrs": {"groups": 2},
                "output_bindings": [{"channel": None}, bound("probs")],
            },
            {"name": "ScaledSwiGLU", "input_channels": ["probs"]},
        ],
        shape=(6, 8),
        dtype=f32,
    )
    out["finding2-generator-f32"] = dict(out["finding1-router-f32"])
    out["finding2-generator-f32"]["ops"] = [
        dict(out["finding1-router-f32"]["ops"][0], output_style="generator"),
        out["finding1-router-f32"]["ops"][1],
    ]
    out["finding3-call-then-bind-f32"] = dict(
        out["finding1-router-f32"], call_then_bind=[{"op": 1}]
    )
    out["float64-declined"] = spec([{"name": "Linear", "attrs": {"out": 8}}], dtype="float64")
    return out


FLOAT_FUSIONS = [
    "ForwardLinearBiasActivation",
    "ForwardLinearBiasAdd",
    "ForwardLinearScaleAdd",
    "BackwardLinearAdd",
    "BackwardLinearScale",
    "BackwardActivationBias",
    "BackwardAddRMSNorm",
    "FusedResidual.joint",
    "FusedResidual.forward",
    "FusedResidual.backward",
]


def random_spec(rng, seed):
    """A random valid chain: shapes follow the ops, every bound input has an earlier producer
    of the same kind and shape in its fuser."""
    rows = rng.choice([4, 8, 16])
    features = rng.choice([8, 16, 32])
    shape = [rows, features]
    ops, channels = [], []  # channels: (name, kind, shape)
    count = 0

    def channel(kind, shape_):
        nonlocal count
        count += 1
        name = f"c{count}"
        channels.append((name, kind, list(shape_)))
        return name

    def take(kind, shape_):
        matching = [c for c in channels if c[1] == kind and c[2] == list(shape_)]
        return rng.choice(matching)[0] if matching and rng.random() < 0.8 else None

    def out_binding(kind, shape_):
        r = rng.random()
        if r < 0.4:
            return {"channel": None}
        return {"channel": channel(kind, shape_), "output_to_caller": r < 0.6}

    for _ in range(rng.randint(2, 7)):
        f = shape[1]
        choice = rng.choice(
            [
                "Linear",
                "Linear",
                "Bias",
                "Bias",
                "ConstantScale",
                "ReLU",
                "GELU",
                "SReLU",
                "SwiGLU",
                "ScaledSwiGLU",
                "ScaledSReLU",
                "MakeExtraOutput",
                "MakeExtraOutput",
                "AddExtraInput",
                "AddExtraInput",
                "RowStat",
                "DualExtraOutput",
                "RMSNorm",
                "LayerNorm",
                "Identity",
                "Boundary",
                "GroupedLinear",
                "Dispatch",
            ]
        )
        op = {"name": choice}
        if choice == "Linear":
            op["attrs"] = {
                "out": rng.choice([8, 16, 32]),
                "accumulate_into_main_grad": int(rng.random() < 0.2),
            }
            shape = [rows, op["attrs"]["out"]]
        elif choice == "ConstantScale":
            op["attrs"] = {"scale": rng.choice([0.5, -1.25, 2.0])}
        elif choice in ("SwiGLU", "ScaledSwiGLU"):
            if f < 8:
                continue
            if choice == "ScaledSwiGLU":
                op["input_channels"] = [take("float", [rows])]
            shape = [rows, f // 2]
        elif choice == "ScaledSReLU":
            op["input_channels"] = [take("float", [rows])]
        elif choice == "MakeExtraOutput":
            op["attrs"] = {"in_place": int(rng.random() < 0.2)}
            op["output_bindings"] = [out_binding("float", shape)]
        elif choice == "AddExtraInput":
            op["attrs"] = {"in_place": int(rng.random() < 0.2)}
            op["input_channels"] = [take("float", shape)]
        elif choice == "RowStat":
            op["output_bindings"] = [out_binding("float", [rows])]
        elif choice == "DualExtraOutput":
            op["output_bindings"] = [out_binding("float", shape), out_binding("float", shape)]
        elif choice in ("RMSNorm", "LayerNorm"):
            op["attrs"] = {"zero_centered_gamma": int(rng.random() < 0.5)}
        elif choice == "Boundary":
            if not ops or ops[-1]["name"] == "Boundary":
                continue
            channels.clear()
        elif choice == "GroupedLinear":
            groups = rng.choice([1, 2, 3])
            scale_bias = int(rng.random() < 0.3)
            op["attrs"] = {
                "groups": groups,
                "out": rng.choice([8, 16]),
                "scale_bias": scale_bias,
                "accumulate_into_main_grad": int(rng.random() < 0.2),
                "delay_wgrad_compute": int(rng.random() < 0.2),
            }
            op["input_channels"] = [take("split_sizes", [groups])]
            if scale_bias:
                op["input_channels"].append(take("float", [rows]))
            shape = [rows, op["attrs"]["out"]]
        elif choice == "Dispatch":
            groups = rng.choice([2, 3])
            op["attrs"] = {"groups": groups}
            op["output_bindings"] = [
                out_binding("split_sizes", [groups]),
                out_binding("float", [rows]),
                {"channel": None},
            ]
        ops.append(op)
    while ops and ops[-1]["name"] == "Boundary":
        ops.pop()
    fusions = sorted(rng.sample(FLOAT_FUSIONS, rng.randint(0, 4)))
    dtype = rng.choice(["float32", "float32", "bfloat16", "float16"])
    return spec(ops, shape=(rows, features), dtype=dtype, seed=seed, fusions=fusions)


def random_survey(backend, count, seed):
    """Random cases: counts per verdict, and the cases that did not pass."""
    import random

    rng = random.Random(seed)
    tally = {}
    failures = []
    for k in range(count):
        case_spec = random_spec(rng, seed * 100000 + k)
        if not case_spec["ops"]:
            continue
        paths = [
            {"name": "fused", "fusions": case_spec["fusions"]},
            {"name": "unfused", "fusions": []},
        ]
        try:
            case, results = run(backend, case_spec, paths=paths)
        except Exception:  # noqa: BLE001
            failures.append({"spec": case_spec, "adapter_error": traceback.format_exc()})
            tally["adapter_error"] = tally.get("adapter_error", 0) + 1
            continue
        for r in results:
            if r["status"] == "ok":
                problems = judge(case, r, all_channels=False)
                verdict = "modified" if r["modified"] else ("mismatch" if problems else "pass")
                if verdict != "pass":
                    failures.append(
                        {
                            "spec": case_spec,
                            "path": r["name"],
                            "problems": problems,
                            "modified": r["modified"],
                        }
                    )
            elif r["status"] == "error":
                verdict = f"error:{r['error']['kind']}"
                failures.append({"spec": case_spec, "path": r["name"], "error": r["error"]})
            else:
                verdict = r["status"]
                if verdict == "unsupported":
                    failures.append({"spec": case_spec, "path": r["name"], "reason": r["reason"]})
            tally[verdict] = tally.get(verdict, 0) + 1
    return tally, failures


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    configure_torch()
    started = time.time()
    server = Server("te")
    hello = server.handle({"op": "hello"}, [])[0]
    print("hello:", json.dumps({k: hello[k] for k in ("versions", "device_name")}))
    print("fusions:", [(f["name"], f["pass"]) for f in hello["capabilities"]["fusions"]])
    print("GroupedLinear options:", hello["capabilities"]["ops"]["GroupedLinear"]["options"])
    print(f"TE started in {time.time() - started:.1f} s")
    backend = server.backend
    report = {}
    for name, case_spec in cases().items():
        paths = [
            {"name": "fused", "fusions": list(case_spec.get("fusions") or [])},
            {"name": "unfused", "fusions": []},
        ]
        t0 = time.time()
        try:
            case, results = run(backend, case_spec, paths=paths)
        except Exception:  # noqa: BLE001 - a survey goes on
            print(f"{name}: ADAPTER ERROR\n{traceback.format_exc()}")
            report[name] = {"adapter_error": traceback.format_exc()}
            continue
        entries = []
        for r in results:
            entry = {"path": r["name"], "status": r["status"], "modified": r.get("modified")}
            if r["status"] == "error":
                entry["error"] = r["error"]
                entry["left_locked"] = r.get("left_locked")
            if r["status"] == "unsupported":
                entry["reason"] = r["reason"]
            if r["status"] == "ok":
                try:
                    entry["mismatches"] = judge(case, r, all_channels=False)
                except Exception:  # noqa: BLE001
                    entry["mismatches"] = ["judge failed: " + traceback.format_exc()]
                entry["channels"] = [sorted(c) for c in r["channel_grads"]]
            entry["fused"] = sorted(
                {
                    g["name"]
                    for p in r["plans"]
                    for k in ("forward", "backward")
                    for g in p[k]
                    if g["fused"]
                }
            )
            entries.append(entry)
        report[name] = entries
        ms = (time.time() - t0) * 1000
        for e in entries:
            verdict = e["status"]
            if e["status"] == "ok":
                verdict = "PASS" if not e["mismatches"] and not e["modified"] else "MISMATCH"
            extra = ""
            if e.get("error"):
                err = e["error"]
                extra = f"{err['kind']} in {err['phase']}: {err['type']}: {err['message'][:300]}"
            if e.get("reason"):
                extra = e["reason"][:300]
            if e.get("mismatches"):
                extra = " | ".join(e["mismatches"])[:1500]
            print(
                f"{name:32s} {e['path']:8s} {verdict:12s} fused={e['fused']} "
                f"modified={e['modified']} {extra} ({ms:.0f} ms)"
            )

    started_random = time.time()
    tally, failures = random_survey(backend, int(os.environ.get("SURVEY_RANDOM_CASES", "300")), 7)
    print(
        f"random cases ({time.time() - started_random:.1f} s): {json.dumps(tally, sort_keys=True)}"
    )
    for failure in failures[:60]:
        what = (
            failure.get("problems")
            or failure.get("error")
            or failure.get("reason")
            or failure.get("modified")
        )
        ops = [op["name"] for op in failure["spec"]["ops"]]
        where = f"{failure['spec']['dtype']} {failure['spec']['fusions']} {failure.get('path')}"
        print(f"  {where} {ops}: {str(what)[:400]}")
    with open(os.path.join(out_dir, "random_failures.json"), "w") as f:
        json.dump(failures, f, indent=1, default=str)

    # Exported scripts, as a TE maintainer runs them.
    scripts = {
        "test_fused_residual.py": ("fused-residual-joint-f32", {"kind": "pass"}),
        "test_mlp.py": ("mlp-bfloat16", {"kind": "pass"}),
        "test_moe.py": ("moe-f32", {"kind": "pass"}),
        "test_finding3.py": ("finding3-call-then-bind-f32", {"kind": "pass"}),
    }
    all_cases = cases()
    for file_name, (case_name, expect) in scripts.items():
        case_spec = all_cases[case_name]
        header, tensors = make_request(case_spec, op="export", backend="te")
        tol = harness_tolerance(decode_case(header, tensors))
        tol.setdefault("baseline_factor", 0.0)
        tol.setdefault("baseline_cap", 0.0)
        header["expect"] = dict(expect, tolerance=tol)
        header["case_file"] = f"survey/{case_name}"
        reply, _ = server.handle(header, tensors)
        with open(os.path.join(out_dir, file_name), "w") as f:
            f.write(reply["script"])
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *sorted(scripts)],
        cwd=out_dir,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", "").split(":")[0]),
    )
    print("exported scripts:")
    print(
        "\n".join(
            line
            for line in result.stdout.splitlines()
            if line.split(" ")[0] in ("PASSED", "FAILED", "ERROR")
        )
    )
    with open(os.path.join(out_dir, "scripts.log"), "w") as f:
        f.write(result.stdout + result.stderr)
    with open(os.path.join(out_dir, "survey.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"survey done in {time.time() - started:.1f} s; torch {torch.__version__}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/te-survey")
