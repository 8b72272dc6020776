"""Distributed cases: the adapter's rank processes (docs/BACKENDS.md "Distributed cases").

A case with world_size N (or with a collective or a tensor-parallel option on one rank:
te.ops needs a process group for those) runs as N rank processes, one per rank (one per
GPU on CUDA), which form one process group (gloo on the CPU, NCCL on CUDA). The adapter
process coordinates: it starts the ranks once per world size (RankPool), hands each its
part of a `run` request (its plan and values, cut by the harness: harness/sharding.h) and
gathers their replies into one. Every rank runs the backend's ordinary driver on its slice.

A rank that dies while a case runs, or one that does not answer before the request's
deadline (also: within `grace_s` of the others' answers, as a rank stuck in a collective
whose peer raised), makes the case's reply a failure: {"kind": "crash"|"timeout",
"message"} (the worker turns it into that case's finding), and every rank is killed and
joined, so none is left behind; the next distributed case starts a new pool.

The ranks are forked from a forkserver that imported torch once (preloaded), so a pool
starts in well under a second after the first; a rank is a child of the forkserver, which
exits with the adapter, and asks the kernel to kill it when its parent goes (Linux
PR_SET_PDEATHSIG), and exits when its pipe to the adapter closes.
"""

import ctypes
import datetime
import importlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time
import traceback

# Seconds a rank may still take once another rank answered (a rank stuck in a collective
# whose peer raised before it: gloo would wait for its own timeout); overridable for tests.
DEFAULT_GRACE_S = 20.0


def _die_with_parent():
    """Linux: SIGKILL this process when its parent exits (no-op elsewhere)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _rank_main(backend_name, rank, world_size, port, conn, device_type, timeout_s):
    """One rank: its process group, its backend, then requests until None or EOF."""
    _die_with_parent()
    try:
        import torch
        import torch.distributed as dist

        from .backends import configure_torch, make_backend
        from .torch_backend import collectives

        configure_torch()
        dist_backend = "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(rank)
            dist_backend = "nccl"
        store = dist.TCPStore("127.0.0.1", port, is_master=False)
        dist.init_process_group(
            dist_backend,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        collectives.init(rank, world_size)
        # GRADFUZZ_RANK_BACKEND="module:function" makes each rank's backend instead (the te
        # backend over the stubbed extension of tests/te_stub.py, on the CPU).
        factory = os.environ.get("GRADFUZZ_RANK_BACKEND")
        if factory:
            module, _, function = factory.partition(":")
            backend = getattr(importlib.import_module(module), function)(backend_name)
        else:
            backend = make_backend(backend_name)
        conn.send(("ready", os.getpid()))
    except Exception as e:  # noqa: BLE001 - a rank that cannot start says why and exits
        traceback.print_exc(file=sys.stderr)
        conn.send(("failed", f"{type(e).__name__}: {e}"))
        return
    from .case import decode_case
    from .protocol import TensorList

    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            break
        header, tensors = message
        try:
            case = decode_case(header, tensors)
            out = TensorList()
            fault = header.get("fault")
            extra = {} if fault is None else {"fault": fault}
            paths = backend.run(case, header.get("paths") or [], out, **extra)
            conn.send(("ok", paths, out.tensors))
        except Exception as e:  # noqa: BLE001 - a failed request is answered, not fatal
            traceback.print_exc(file=sys.stderr)
            conn.send(("error", f"{type(e).__name__}: {e}", []))
    try:
        import torch.distributed as dist

        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - exiting either way
        pass


class RankFailure(Exception):
    """A rank died or did not answer: kind "crash" or "timeout", and what happened."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def _context():
    ctx = multiprocessing.get_context("forkserver")
    # The forkserver imports these once; each rank is then a fork of it.
    ctx.set_forkserver_preload(["torch", "gradfuzz_adapter.ranks"])
    return ctx


def _describe_exit(process):
    code = process.exitcode
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


class RankPool:
    """`world_size` rank processes of backend `backend_name` on `device_type` ("cpu": gloo,
    "cuda": NCCL, rank r on GPU r of the visible ones)."""

    def __init__(self, backend_name, world_size, device_type="cpu", start_timeout_s=120.0):
        import torch.distributed as dist

        self.backend_name = backend_name
        self.world_size = int(world_size)
        self.device_type = device_type
        self.processes = []
        self.conns = []
        self.pids = []
        ctx = _context()
        # The rendezvous: a store served by this process on a free port.
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        collective_timeout = float(os.environ.get("GRADFUZZ_RANK_COLLECTIVE_TIMEOUT_S", "300"))
        try:
            for rank in range(self.world_size):
                parent, child = ctx.Pipe()
                p = ctx.Process(
                    target=_rank_main,
                    args=(
                        backend_name,
                        rank,
                        self.world_size,
                        self.store.port,
                        child,
                        device_type,
                        collective_timeout,
                    ),
                    daemon=True,
                )
                p.start()
                child.close()
                self.processes.append(p)
                self.conns.append(parent)
            deadline = time.monotonic() + start_timeout_s
            for rank, conn in enumerate(self.conns):
                left = deadline - time.monotonic()
                if left <= 0 or not conn.poll(left):
                    raise RuntimeError(f"rank {rank} did not start within {start_timeout_s:g} s")
                status, detail = conn.recv()
                if status != "ready":
                    raise RuntimeError(f"rank {rank} did not start: {detail}")
                self.pids.append(detail)
        except (Exception, EOFError):
            self.close()
            raise

    def alive(self):
        return bool(self.processes) and all(p.is_alive() for p in self.processes)

    def run(self, requests, timeout_s, grace_s=None):
        """Each rank's (header, tensors) request; returns each rank's (paths, tensors) in rank
        order. Raises RankFailure (every rank killed and joined) for a rank that died or did
        not answer, ValueError for a rank's own request error (the pool stays up)."""
        grace_s = (
            float(os.environ.get("GRADFUZZ_RANK_GRACE_S", DEFAULT_GRACE_S))
            if grace_s is None
            else grace_s
        )
        for rank, (conn, request) in enumerate(zip(self.conns, requests)):
            try:
                conn.send(request)
            except (BrokenPipeError, ConnectionError, EOFError):
                self._fail(
                    "crash",
                    f"rank {rank} {_describe_exit(self.processes[rank])} before it read the case",
                )
        replies = [None] * self.world_size
        start = time.monotonic()
        deadline = start + timeout_s
        first_answer = None
        waiting = {conn: rank for rank, conn in enumerate(self.conns)}
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.processes)}
        while waiting:
            now = time.monotonic()
            limit = deadline
            if first_answer is not None:
                limit = min(limit, first_answer + grace_s)
            if now >= limit:
                pending = sorted(waiting.values())
                answered = [r for r in range(self.world_size) if replies[r] is not None]
                what = (
                    f"did not answer within {timeout_s:g} s"
                    if first_answer is None or deadline <= first_answer + grace_s
                    else f"did not answer within {grace_s:g} s of rank(s) "
                    f"{', '.join(map(str, answered))} answering (stuck in a collective?)"
                )
                done = "; ".join(_reply_summary(r, replies[r]) for r in answered)
                self._fail(
                    "timeout",
                    f"rank(s) {', '.join(map(str, pending))} {what}"
                    + (f"; {done}" if done else ""),
                )
            ready = multiprocessing.connection.wait(
                list(waiting) + list(sentinels), timeout=max(0.0, limit - now)
            )
            for obj in ready:
                if obj in waiting:
                    rank = waiting[obj]
                    try:
                        replies[rank] = obj.recv()
                    except (EOFError, ConnectionError):
                        continue  # its sentinel says how it ended
                    del waiting[obj]
                    if first_answer is None:
                        first_answer = time.monotonic()
            for obj in ready:
                rank = sentinels.get(obj)
                if rank is not None and replies[rank] is None:
                    others = [r for r in range(self.world_size) if r != rank]
                    self._fail(
                        "crash",
                        f"rank {rank} {_describe_exit(self.processes[rank])} while running the "
                        f"case; rank(s) {', '.join(map(str, others))} killed",
                    )
        errors = [(r, reply[1]) for r, reply in enumerate(replies) if reply[0] != "ok"]
        if errors:
            raise ValueError("; ".join(f"rank {r}: {message}" for r, message in errors))
        return [(reply[1], reply[2]) for reply in replies]

    def _fail(self, kind, message):
        self.close()
        raise RankFailure(kind, message)

    def close(self):
        """Kills and joins every rank (a clean quit first when they are idle and alive)."""
        for conn in self.conns:
            try:
                conn.close()
            except OSError:
                pass
        for p in self.processes:
            if p.is_alive():
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.processes:
            p.join(timeout=10)
        self.processes, self.conns = [], []


def _reply_summary(rank, reply):
    if reply is None:
        return f"rank {rank} did not answer"
    if reply[0] != "ok":
        return f"rank {rank} failed: {reply[1]}"
    statuses = ", ".join(
        f"{p.get('name')}: {p.get('status')}"
        + (f" ({p['error'].get('kind')})" if p.get("status") == "error" else "")
        for p in reply[1]
    )
    return f"rank {rank} answered ({statuses})"


# ----------------------------------------------------------------------------------------
# Requests: cutting the adapter's request into the ranks', joining their replies


def _remap(value, index_of):
    """`value` (a values structure) with every tensor index i replaced by index_of(i);
    booleans (requires-grad flags) are left alone."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return index_of(value)
    if isinstance(value, list):
        return [_remap(v, index_of) for v in value]
    if isinstance(value, dict):
        return {
            k: (v if k == "extra_input_requires_grad" else _remap(v, index_of))
            for k, v in value.items()
        }
    return value


def _renumbered(values, tensors):
    """(values with tensor indices renumbered from 0, the tensors they now refer to)."""
    used = []
    position = {}

    def index_of(i):
        if i not in position:
            position[i] = len(used)
            used.append(tensors[i])
        return position[i]

    return _remap(values, index_of), used


def rank_requests(header, tensors):
    """Per rank: (request header, its tensors) from a distributed `run` request, whose
    "ranks" list holds each rank's plan and values (indices into the frame's tensors)."""
    out = []
    for entry in header["ranks"]:
        values, used = _renumbered(entry["values"], tensors)
        request = {
            "op": "run",
            "spec": header["spec"],
            "plan": entry["plan"],
            "values": values,
            # No trace on ranks (docs/BACKENDS.md "run": the first divergence is looked for
            # in cases of one process): a path's "trace" is dropped.
            "paths": [
                {k: v for k, v in path.items() if k != "trace"}
                for path in header.get("paths") or []
            ],
            # A second run of a path to find who wrote a caller tensor would be a second
            # round of collectives on only the ranks that saw the write: not done.
            "modified_by": False,
        }
        if header.get("fault") is not None:
            request["fault"] = header["fault"]
        out.append((request, used))
    return out


_PATH_TENSOR_KEYS = ("outputs", "grad_input", "grad_params", "grad_extra_inputs")


def _shift_path(entry, offset):
    """A path reply entry with its tensor indices moved by `offset` (repeats included)."""
    entry = dict(entry)
    for key in _PATH_TENSOR_KEYS:
        if key in entry:
            entry[key] = _remap(entry[key], lambda i: i + offset)
    if "channel_grads" in entry:
        entry["channel_grads"] = [
            {name: (None if i is None else i + offset) for name, i in chans.items()}
            for chans in entry["channel_grads"]
        ]
    if "repeats" in entry:
        entry["repeats"] = [_shift_path(r, offset) for r in entry["repeats"]]
    return entry


def join_replies(replies, out):
    """[{"paths": [...]}, ...] per rank, their tensors appended to TensorList `out`."""
    joined = []
    for paths, tensors in replies:
        offset = len(out.tensors)
        for t in tensors:
            out.tensors.append(t)
        joined.append({"paths": [_shift_path(p, offset) for p in paths]})
    return joined


class Coordinator:
    """The adapter's side: one pool at a time (started for a world size on first use, or by
    a `start_ranks` request), replaced after a failure."""

    def __init__(self, backend_name):
        self.backend_name = backend_name
        self.pool = None

    def start(self, world_size, device_type="cpu", timeout_s=120.0):
        """A pool of `world_size` ranks, started unless one is up."""
        pool = self.pool
        if (
            pool is not None
            and pool.world_size == world_size
            and pool.device_type == device_type
            and pool.alive()
        ):
            return pool
        self.stop()
        self.pool = RankPool(self.backend_name, world_size, device_type, timeout_s)
        return self.pool

    def stop(self):
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def run(self, header, tensors, out):
        """The reply of a distributed run request: {"ranks": [...]} or {"failure": {...}}."""
        world_size = int(header["spec"].get("world_size", 1))
        if len(header["ranks"]) != world_size:
            raise ValueError(f"{len(header['ranks'])} rank entries for world_size {world_size}")
        device_type = header["spec"].get("device", "cpu")
        if device_type == "cuda":
            import torch

            visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if visible < world_size:
                return {
                    "unsupported": f"{world_size} ranks need {world_size} GPUs; {visible} visible"
                }
        timeout_s = float(header.get("timeout_s") or 120.0)
        pool = self.start(world_size, device_type)
        try:
            replies = pool.run(rank_requests(header, tensors), timeout_s)
        except RankFailure as failure:
            self.pool = None
            return {"failure": {"kind": failure.kind, "message": str(failure)}}
        return {"ranks": join_replies(replies, out), "pids": pool.pids}
