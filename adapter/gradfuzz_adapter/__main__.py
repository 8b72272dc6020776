"""python3 -m gradfuzz_adapter --backend te|torch

Serves the framed requests of docs/BACKENDS.md (hello, run, export, quit) on stdin/stdout.
Frames go to a private duplicate of the original stdout; file descriptor 1 itself is
pointed at stderr, so a stray print in Python or C code (TE, CUDA) cannot corrupt them.
"""

import argparse
import gc
import json
import os
import sys
import time
import traceback

# backends sets NVIDIA_TF32_OVERRIDE at import. Server calls make_backend through this module
# (tests/te_stub_python.sh replaces it here).
from .backends import configure_torch, make_backend
from .errors import InvalidArgumentError
from .invariants import fp8_checks_on
from .protocol import ProtocolError, TensorList, read_frame, write_frame


class Server:
    """Answers requests one at a time; the backend starts at the first request needing it."""

    def __init__(self, backend_name):
        self.backend_name = backend_name
        self.backend = None
        self.coordinator = None

    def _coordinator(self):
        """The rank processes of distributed cases (ranks.py), made on first use."""
        if self.coordinator is None:
            from .ranks import Coordinator

            self.coordinator = Coordinator(self.backend_name)
        return self.coordinator

    def _backend(self):
        if self.backend is None:
            configure_torch()
            self.backend = make_backend(self.backend_name)
            # Everything imported so far (torch, TE: some 300,000 objects) lives as long as
            # the process: out of the collector's sight, a full collection no longer walks
            # it (one took 100 ms with torch alone, measured in tests/bench_adapter.py).
            gc.freeze()
        return self.backend

    def handle(self, header, tensors):
        """(reply header, reply tensors), or None for quit."""
        op = header.get("op")
        if op == "quit":
            return None
        if op == "hello":
            from .driver import protocol_hello

            return dict(protocol_hello(self._backend().hello()), ok=True), []
        if op == "start_ranks":
            # Before a distributed case, with the start's time limit: the ranks' start (a
            # forkserver importing torch, TE on CUDA) is not a case's time.
            world_size = int(header.get("world_size", 1))
            pool = self._coordinator().start(
                world_size, header.get("device", "cpu"), float(header.get("timeout_s") or 120.0)
            )
            return {"ok": True, "pids": pool.pids}, []
        if op == "run" and "ranks" in header:
            # A distributed case: each rank runs its part (ranks.py).
            out = TensorList()
            return dict(self._coordinator().run(header, tensors, out), ok=True), out.tensors
        if op == "run":
            from .case import decode_case

            case = decode_case(header, tensors)
            out = TensorList()
            # Protocol 2: a planted fault for this request only (the backend rejects an
            # unknown name: the request's error). Absent or null: the backend's run as is.
            fault = header.get("fault")
            extra = {} if fault is None else {"fault": fault}
            paths = self._backend().run(case, header.get("paths") or [], out, **extra)
            return {"ok": True, "paths": paths}, out.tensors
        if op == "export":
            from .case import decode_case
            from .export import export_reply

            case = decode_case(header, tensors)
            return export_reply(case, header, self.backend_name, tensors), []
        return {
            "ok": False,
            "error": f"unknown request op {op!r}; known: hello, run, start_ranks, export, quit",
        }, []


def serve(backend_name, instream, outstream):
    """Answers frames until quit or the end of the input; returns the exit status.

    With GRADFUZZ_ADAPTER_TIMING=FILE, appends one JSON line to FILE at exit: seconds spent
    waiting for requests (the caller's own time, the C++ worker's for a campaign), handling
    them and writing replies (and the process's CPU seconds handling them), the number of
    requests, and the driver's counts and seconds of the runs it makes (driver.COST: paths,
    repeat calls, fresh-plan Sequentials, writer runs): where a worker's time goes."""
    server = Server(backend_name)
    clock = {"requests": 0, "waiting_s": 0.0, "handling_s": 0.0, "writing_s": 0.0}
    clock["handling_cpu_s"] = 0.0
    clock["log"] = os.environ.get("GRADFUZZ_ADAPTER_TIMING") or None
    # GRADFUZZ_ADAPTER_PROFILE=PREFIX: a cProfile of this adapter's requests, written to
    # PREFIX.<pid>.prof at exit (read with pstats; docs/BENCHMARKS.md).
    profile_prefix = os.environ.get("GRADFUZZ_ADAPTER_PROFILE") or None
    if profile_prefix:
        import cProfile

        clock["profile"] = (cProfile.Profile(), f"{profile_prefix}.{os.getpid()}.prof")
        clock["profile"][0].enable()
    try:
        return _serve(server, instream, outstream, clock)
    finally:
        _log_clock(clock, backend_name)


def _log_clock(clock, backend_name):
    """One cumulative line (also every 100 requests: a worker may kill its adapter at the
    end instead of waiting for it to exit; take each pid's last line), and the profile so
    far."""
    if clock.get("profile"):
        profiler, path = clock["profile"]
        profiler.dump_stats(path)  # stops it
        profiler.enable()
    if clock["log"]:
        line = {k: v for k, v in clock.items() if k not in ("log", "profile")}
        driver = sys.modules.get(f"{__package__}.driver")
        if driver is not None:
            line.update(driver.COST)
        with open(clock["log"], "a", encoding="utf-8") as f:
            f.write(json.dumps(dict(line, backend=backend_name, pid=os.getpid())) + "\n")


def _serve(server, instream, outstream, clock):
    while True:
        start = time.perf_counter()
        try:
            frame = read_frame(instream)
        except ProtocolError as e:
            print(f"gradfuzz_adapter: {e}", file=sys.stderr)
            return 2
        received = time.perf_counter()
        clock["waiting_s"] += received - start
        if frame is None:
            if server.coordinator is not None:
                server.coordinator.stop()
            return 0
        header, tensors = frame
        clock["requests"] += 1
        cpu = time.process_time()
        try:
            reply = server.handle(header, tensors)
        except Exception as e:  # noqa: BLE001 - a failed request is answered, not fatal
            traceback.print_exc(file=sys.stderr)
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}, []
        handled = time.perf_counter()
        clock["handling_s"] += handled - received
        clock["handling_cpu_s"] += time.process_time() - cpu
        if reply is None:
            if server.coordinator is not None:
                server.coordinator.stop()
            return 0
        try:
            write_frame(outstream, *reply)
        except (ProtocolError, TypeError, ValueError) as e:
            # Nothing was written yet (write_frame encodes everything first): answer instead.
            traceback.print_exc(file=sys.stderr)
            write_frame(outstream, {"ok": False, "error": f"cannot encode the reply: {e}"})
        clock["writing_s"] += time.perf_counter() - handled
        if clock["requests"] % 100 == 0:
            _log_clock(clock, server.backend_name)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m gradfuzz_adapter")
    parser.add_argument("--backend", choices=("te", "torch"), required=True)
    args = parser.parse_args(argv)
    try:
        fp8_checks_on()  # a wrong GRADFUZZ_FP8_CHECKS stops the adapter before any case
    except InvalidArgumentError as exc:
        parser.error(str(exc))
    instream = os.fdopen(os.dup(0), "rb", buffering=0)
    outstream = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return serve(args.backend, instream, outstream)


if __name__ == "__main__":
    sys.exit(main())
