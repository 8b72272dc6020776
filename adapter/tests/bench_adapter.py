"""Where an adapter case's time goes (docs/BENCHMARKS.md, "The te worker's adapter").

    python adapter/tests/bench_adapter.py --backend te|torch [--cases N] [--profile FILE]
    python adapter/tests/bench_adapter.py --backend te --real   # on a GPU with TE installed

Runs a fixed mix of tiny float32 cases (the ops TE's Python runs over the stubbed
extension, tests/te_stub.py, for te; the same mix for torch; with --real, real TE on CUDA
and a mix that adds TE's kernel ops, Linear, activations and norms, with every fusion TE
registers on the fused path) and prints:
- start: spawning `python -m gradfuzz_adapter` to its hello reply (median of 3);
- the adapter's own time per case, by stage (decoding the request frame and the case,
  building ops per path, forward, backward, the reply's tensors, encoding the reply), from
  timers around those functions (in process, one backend object, as a worker runs it);
- cases/s through the pipes of a real adapter process (this script plays the C++ worker,
  whose own cost, building the request and the float64 reference, is not counted).
--profile writes a cProfile of the in-process loop (read it with pstats or snakeviz);
--syncs also counts the GPU synchronisations per case (torch.cuda.set_sync_debug_mode).

    python adapter/tests/bench_adapter.py --tracker [--device cuda]

times the writer tracker alone (driver.WriterTracker, modified_by): microseconds per check
of 8 tiny caller tensors (a fresh tracker per case of 16 checks), deferred (a GPU's mode,
forced on the CPU) and, on the CPU, immediate, and per leave() (with the deferred flags to
the host); with GRADFUZZ_BENCH_ADAPTER, an older tree's.
"""

import argparse
import cProfile
import io
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
# GRADFUZZ_BENCH_ADAPTER: another adapter tree to measure (an older commit's, for before and
# after figures); this file's tree by default.
ADAPTER = os.environ.get("GRADFUZZ_BENCH_ADAPTER") or os.path.dirname(HERE)
sys.path[:0] = [ADAPTER, HERE]

import torch  # noqa: E402

from gradfuzz_adapter import case as case_module  # noqa: E402
from gradfuzz_adapter import driver, protocol  # noqa: E402
from gradfuzz_adapter.client import make_request  # noqa: E402


def bound(channel, to_caller=False):
    return {"channel": channel, "output_to_caller": to_caller}


# Tiny float32 cases of 2-5 ops whose every op runs on TE's Python code over the stub
# (no kernel: channel ops, ConstantScale, Bias, Identity, the adapter's custom ops).
CASES = [
    (
        [
            {"name": "MakeExtraOutput", "output_bindings": [bound("r")]},
            {"name": "ConstantScale", "attrs": {"scale": 0.75}},
            {"name": "AddExtraInput", "input_channels": ["r"]},
        ],
        ["FusedResidual.joint"],
    ),
    ([{"name": "Bias"}, {"name": "RowStat", "output_bindings": [bound("s", True)]}], []),
    (
        [
            {"name": "ConstantScale", "attrs": {"scale": 2.0}},
            {"name": "Identity"},
            {"name": "Bias"},
            {"name": "AddExtraInput"},
        ],
        [],
    ),
    (
        [
            {"name": "DualExtraOutput", "output_bindings": [bound("a"), {"channel": None}]},
            {"name": "Bias"},
            {"name": "AddExtraInput", "input_channels": ["a"]},
        ],
        [],
    ),
    (
        [
            {
                "name": "Dispatch",
                "attrs": {"groups": 2},
                "output_bindings": [{"channel": None}, {"channel": None}, bound("map")],
            },
            {"name": "Bias"},
            {"name": "Combine", "input_channels": ["map"]},
        ],
        [],
    ),
    (
        [
            {"name": "MakeExtraOutput", "output_bindings": [bound("r")]},
            {"name": "Bias"},
            {"name": "AddExtraInput", "input_channels": ["r"]},
            {"name": "MakeExtraOutput", "output_bindings": [bound("q", True)]},
            {"name": "ConstantScale", "attrs": {"scale": 0.5}},
        ],
        ["FusedResidual.joint"],
    ),
]


# With --real: cases whose ops need TE's kernels, as a tiny float32 te campaign draws them.
KERNEL_CASES = [
    ([{"name": "Linear", "attrs": {"out": 16}}, {"name": "Bias"}, {"name": "GELU"}], True),
    (
        [
            {"name": "MakeExtraOutput", "output_bindings": [bound("r")]},
            {"name": "Linear", "attrs": {"out": 8}},
            {"name": "AddExtraInput", "input_channels": ["r"]},
            {"name": "RMSNorm"},
        ],
        True,
    ),
    ([{"name": "LayerNorm"}, {"name": "Linear", "attrs": {"out": 16}}, {"name": "SwiGLU"}], True),
    ([{"name": "Linear", "attrs": {"out": 8}}, {"name": "ReLU"}, {"name": "Bias"}], True),
]


def requests(n, real=False, fusions=()):
    """n run requests; with `real`, CUDA cases that also use TE's kernel ops, their fused
    path asking for every fusion in `fusions`."""
    mix = CASES + [(ops, list(fusions)) for ops, _ in KERNEL_CASES] if real else CASES
    out = []
    for k in range(n):
        ops, case_fusions = mix[k % len(mix)]
        spec = {
            "ops": ops,
            "fusions": case_fusions,
            "input_requires_grad": True,
            "input_shape": [4, 8] if not real else [16, 32],
            "dtype": "float32",
            "device": "cuda" if real else "cpu",
            "seed": k,
        }
        if real:
            spec["ops"] = [
                dict(op, attrs=dict(op.get("attrs", {}), out=32)) if op["name"] == "Linear" else op
                for op in ops
            ]
        out.append(make_request(spec))
    return out


def make_backend(name, real=False):
    if name == "torch":
        from gradfuzz_adapter.torch_backend.backend import TorchBackend

        return TorchBackend()
    if not real:
        import te_stub

        te_stub.install()
    from gradfuzz_adapter.te.backend import TEBackend

    return TEBackend(device=None if real else "cpu")


class Timers:
    """Seconds per stage, from wrappers around the functions each stage runs in."""

    def __init__(self):
        self.seconds = defaultdict(float)
        self.stack = []
        self.undo = []

    def wrap(self, owner, attr, stage):
        original = getattr(owner, attr, None)
        if original is None:
            return  # an older driver without this function
        timers = self

        def timed(*args, **kwargs):
            start = time.perf_counter()
            timers.stack.append(stage)
            try:
                return original(*args, **kwargs)
            finally:
                timers.stack.pop()
                elapsed = time.perf_counter() - start
                timers.seconds[stage] += elapsed
                if timers.stack:  # exclusive times: the enclosing stage loses this one
                    timers.seconds[timers.stack[-1]] -= elapsed

        setattr(owner, attr, timed)
        self.undo.append((owner, attr, original))

    def restore(self):
        for owner, attr, original in reversed(self.undo):
            setattr(owner, attr, original)


def count_syncs(backend, reqs):
    """GPU synchronisations per case (set_sync_debug_mode warns at each)."""
    import warnings

    from gradfuzz_adapter.__main__ import Server

    server = Server(backend.name)
    server.backend = backend
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for header, tensors in reqs:
                reply = server.handle(header, tensors)
                protocol.write_frame(io.BytesIO(), *reply)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    where = defaultdict(int)
    for w in caught:
        if "synchroniz" in str(w.message):
            where[f"{os.path.basename(w.filename)}:{w.lineno}"] += 1
    return sum(where.values()) / len(reqs), where


def in_process(backend, reqs, profile=None):
    """(seconds per case by stage, cases/s) of the adapter's work, frames included."""
    from gradfuzz_adapter.__main__ import Server

    server = Server(backend.name)
    server.backend = backend
    frames = []
    for header, tensors in reqs:
        buffer = io.BytesIO()
        protocol.write_frame(buffer, header, tensors)
        frames.append(buffer.getvalue())
    timers = Timers()
    builder = backend.builder
    timers.wrap(protocol, "read_frame", "read request frame")
    timers.wrap(case_module, "decode_case", "decode case")
    timers.wrap(driver, "_build", "build: calls, bindings, late binds")
    timers.wrap(builder, "create_op", "op construction")
    timers.wrap(builder, "make_sequential", "Sequential construction")
    timers.wrap(driver._CallerTensors, "add", "caller tensor copies")
    timers.wrap(driver._CallerTensors, "modified", "caller tensor comparison")
    timers.wrap(driver, "_run_call", "call: caller copies, cotangents, grads")
    timers.wrap(builder, "forward", "forward")
    timers.wrap(builder, "after_forward", "after_forward (observers)")
    timers.wrap(torch.autograd, "grad", "backward (autograd.grad)")
    timers.wrap(driver, "_emit", "reply tensors (TensorList)")
    timers.wrap(builder, "plans", "plans")
    timers.wrap(protocol, "write_frame", "write reply frame")
    for _ in range(2):  # warm: first-call costs (imports, TE's lazy state) are not per case
        server.handle(*protocol.read_frame(io.BytesIO(frames[0])))
    for stage in list(timers.seconds):
        timers.seconds[stage] = 0.0
    profiler = cProfile.Profile() if profile else None
    cpu_start = time.process_time()
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    for raw in frames:
        header, tensors = protocol.read_frame(io.BytesIO(raw))
        reply = server.handle(header, tensors)
        protocol.write_frame(io.BytesIO(), *reply)
    if profiler:
        profiler.disable()
        profiler.dump_stats(profile)
    total = time.perf_counter() - start
    in_process.cpu_per_case = (time.process_time() - cpu_start) / len(frames)
    timers.restore()
    per_case = {k: v / len(frames) for k, v in timers.seconds.items()}
    per_case["other (handle, driver glue)"] = total / len(frames) - sum(per_case.values())
    return per_case, len(frames) / total


def start_time(backend_name):
    env = dict(os.environ, PYTHONPATH=ADAPTER, PYTHONUNBUFFERED="1")
    if backend_name == "te":
        env["GRADFUZZ_TE_DEVICE"] = "cpu"
    times = []
    for _ in range(3):
        start = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, "-c", STUBBED_MAIN if backend_name == "te" else PLAIN_MAIN],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=ADAPTER,
        )
        protocol.write_frame(process.stdin, {"op": "hello"})
        header, _ = protocol.read_frame(process.stdout)
        times.append(time.perf_counter() - start)
        assert header["ok"], header
        protocol.write_frame(process.stdin, {"op": "quit"})
        process.wait(timeout=30)
    return statistics.median(times)


PLAIN_MAIN = (
    "import sys; from gradfuzz_adapter.__main__ import main; sys.exit(main(['--backend', 'torch']))"
)
STUBBED_MAIN = (
    f"import sys; sys.path.insert(0, {HERE!r}); import te_stub; te_stub.install(); "
    "from gradfuzz_adapter.__main__ import main; sys.exit(main(['--backend', 'te']))"
)


def through_pipes(backend_name, reqs):
    env = dict(os.environ, PYTHONPATH=ADAPTER, PYTHONUNBUFFERED="1")
    if backend_name == "te":
        env["GRADFUZZ_TE_DEVICE"] = "cpu"
    process = subprocess.Popen(
        [sys.executable, "-c", STUBBED_MAIN if backend_name == "te" else PLAIN_MAIN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        cwd=ADAPTER,
    )
    protocol.write_frame(process.stdin, {"op": "hello"})
    protocol.read_frame(process.stdout)
    for header, tensors in reqs[:2]:
        protocol.write_frame(process.stdin, header, tensors)
        protocol.read_frame(process.stdout)
    frames = []
    for header, tensors in reqs:
        buffer = io.BytesIO()
        protocol.write_frame(buffer, header, tensors)
        frames.append(buffer.getvalue())
    start = time.perf_counter()
    for raw in frames:
        process.stdin.write(raw)
        process.stdin.flush()
        reply, _ = protocol.read_frame(process.stdout)
        assert reply["ok"], reply
    rate = len(frames) / (time.perf_counter() - start)
    protocol.write_frame(process.stdin, {"op": "quit"})
    process.wait(timeout=30)
    return rate


def tracker_checks(device="cpu", deferred=True, cases=400, checks=16):
    """(microseconds per check, per leave) of a WriterTracker over 8 tiny caller tensors of
    a case: `checks` group changes (groups A and B in turn, B adding to one tensor at its
    third run), then leave()."""
    sizes = [(4, 8), (8,), (3, 5), (16,), (2, 2), (7,), (4, 4), (1,)]
    groups = [{"name": n, "begin": 0, "end": 1, "pass": "forward"} for n in "AB"]
    check_s = leave_s = 0.0
    for case in range(cases + 2):
        caller = driver._CallerTensors()
        tensors = [torch.rand(size, device=device) for size in sizes]
        for k, t in enumerate(tensors):
            caller.add(f"t{k}", t)
        tracker = driver.WriterTracker(caller, deferred=deferred)
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for k in range(checks):
            tracker.enter(groups[k % 2])
            if k == 5:
                tensors[5].add_(1)
        middle = time.perf_counter()
        tracker.leave()
        end = time.perf_counter()
        assert not tracker.failed and list(tracker.writers) == ["t5"], tracker.writers
        if case >= 2:  # warm
            check_s += middle - start
            leave_s += end - middle
    return 1e6 * check_s / (cases * checks), 1e6 * leave_s / cases


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("te", "torch"))
    parser.add_argument("--tracker", action="store_true", help="time the writer tracker alone")
    parser.add_argument("--device", default="cpu", help="the tracker's tensors' device")
    parser.add_argument("--cases", type=int, default=600)
    parser.add_argument("--profile")
    parser.add_argument("--real", action="store_true", help="real TE on CUDA (no stub)")
    parser.add_argument("--syncs", action="store_true", help="count GPU synchronisations")
    parser.add_argument("--no-pipes", action="store_true", help="skip the subprocess runs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.tracker:
        for deferred in (True, False) if args.device == "cpu" else (None,):
            check, leave = tracker_checks(args.device, deferred)
            mode = "immediate" if deferred is False else "deferred"
            print(
                f"tracker ({args.device}, {mode}): {check:.1f} us per check, "
                f"{leave:.1f} us per leave"
            )
        return
    if args.backend is None:
        parser.error("--backend is required (or --tracker)")
    torch.backends.cuda.matmul.allow_tf32 = False
    backend = make_backend(args.backend, args.real)
    fusions = []
    if args.real:
        fusions = [f["name"] for f in backend.hello()["capabilities"]["fusions"]]
    reqs = requests(args.cases, args.real, fusions)
    per_case, rate = in_process(backend, reqs, args.profile)
    where = "real TE on CUDA" if args.real else "CPU"
    print(f"backend {args.backend} ({where}): {args.cases} tiny float32 cases")
    print(
        f"in process: {rate:.0f} cases/s, {1e3 / rate:.2f} ms per case "
        f"({1e3 * in_process.cpu_per_case:.2f} ms of CPU time)"
    )
    for stage, seconds in sorted(per_case.items(), key=lambda kv: -kv[1]):
        print(f"  {stage:42s} {seconds * 1e3:7.3f} ms  {100 * seconds * rate:5.1f} %")
    if args.syncs and torch.cuda.is_available():
        per, where = count_syncs(backend, reqs[: min(len(reqs), 120)])
        print(f"GPU synchronisations: {per:.1f} per case")
        for place, n in sorted(where.items(), key=lambda kv: -kv[1])[:12]:
            print(f"  {place:40s} {n}")
    if not args.no_pipes and not args.real:
        print(f"adapter start to hello: {start_time(args.backend):.2f} s")
        print(f"through pipes: {through_pipes(args.backend, reqs):.0f} cases/s")


if __name__ == "__main__":
    main()
