"""Which te.ops calls make the host wait for the GPU (docs/BENCHMARKS.md).

    python adapter/tests/probe_te_sync.py     # on a GPU with TE installed

For each op on a tiny float32 [16, 32] input: the host time of its forward and backward
call when the GPU is idle, and when about 20 ms of work are queued before it. A call that
returns in microseconds either way is asynchronous; one whose host time grows by the queued
work waits for the GPU (a synchronisation inside TE, or an allocation that needs one), and
every such wait in a case costs the GPU's whole queue.
"""

import time

import torch


def queue_work(ms=20.0):
    """About `ms` milliseconds of GPU work queued (a chain of matmuls), returned at once."""
    a = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    b = a @ a
    torch.cuda.synchronize()
    one = max(time.perf_counter() - start, 1e-5)
    for _ in range(max(1, int(ms / 1e3 / one))):
        b = a @ b
    return b


def host_time(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main():
    import transformer_engine.pytorch as te

    torch.backends.cuda.matmul.allow_tf32 = False
    ops = {
        "BasicLinear": lambda: te.ops.BasicLinear(32, 32, device="cuda", dtype=torch.float32),
        "Bias": lambda: te.ops.Bias(32, device="cuda", dtype=torch.float32),
        "GELU": lambda: te.ops.GELU(),
        "ReLU": lambda: te.ops.ReLU(),
        "SwiGLU": lambda: te.ops.SwiGLU(),
        "RMSNorm": lambda: te.ops.RMSNorm(32, device="cuda", dtype=torch.float32),
        "LayerNorm": lambda: te.ops.LayerNorm(32, device="cuda", dtype=torch.float32),
        "ConstantScale": lambda: te.ops.ConstantScale(0.5),
        "MakeExtraOutput": lambda: te.ops.MakeExtraOutput(),
    }
    print(
        f"{'op':16s} {'construct':>10s} {'fwd idle':>10s} {'fwd queued':>11s} "
        f"{'bwd idle':>10s} {'bwd queued':>11s}  (ms, host time)"
    )
    for name, make in ops.items():
        rows = []
        for _ in range(3):  # the first rounds load kernels and plans
            torch.cuda.synchronize()
            construct = host_time(make)
            times = []
            for queued in (False, True):
                op = make()
                seq = te.ops.Sequential(op)
                x = torch.randn(16, 32, device="cuda", requires_grad=True)
                torch.cuda.synchronize()
                if queued:
                    queue_work()
                start = time.perf_counter()
                y = seq(x)
                times.append(time.perf_counter() - start)
                y = y[0] if isinstance(y, tuple) else y
                dy = torch.ones_like(y)
                torch.cuda.synchronize()
                if queued:
                    queue_work()
                start = time.perf_counter()
                torch.autograd.grad(y, [x], dy)
                times.append(time.perf_counter() - start)
                torch.cuda.synchronize()
            rows.append([construct, times[0], times[2], times[1], times[3]])
        c, fi, fq, bi, bq = (1e3 * v for v in rows[-1])
        print(f"{name:16s} {c:10.3f} {fi:10.3f} {fq:11.3f} {bi:10.3f} {bq:11.3f}")


if __name__ == "__main__":
    main()
