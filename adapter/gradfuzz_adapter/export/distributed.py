"""The distributed form (docs/BACKENDS.md "Distributed cases"): a pytest file launched as
`torchrun --nproc-per-node N -m pytest -q FILE`, one process per rank (NCCL on CUDA, gloo
on the CPU).

Every rank loads the case's whole values from the data file beside the script, cuts its
own slices as the harness does (`SHARDING`: harness/sharding.h's placements, sent with the
request as expect.sharding), builds the case's Sequential on its slices with the dialect's
ops (te: te.ops with tensor_parallel_mode, sequence_parallel and tensor_parallel given the
unsharded sizes; torch: the embedded emulation), runs one forward and one autograd.grad,
and gathers every rank's results: the tensors are put together as they lie (slices
concatenated, summands summed, rank 0's copy of a replicated one) and judged against the
float64 reference's values (shipped, as expect.expected) under the oracle's own bounds
(expect.tensors); each other rank's copy of a replicated tensor must agree with rank 0's.
What the script leaves to replay: the unfused path, repeat calls and channel gradients.
"""

import os
import string

import torch

from .templates import TEMPLATES
from .text import adapter_module_body

# Helpers every distributed script embeds.
HELPERS = '''
def shard(t, where, world, rank):
    """Rank `rank`'s part of whole tensor `t`: all of it ("replicated"), its slice of rows or
    features (torch.tensor_split's cut), or its summand ("partial": its rows, zeros elsewhere)."""
    if t is None or world == 1 or where == "replicated" or t.dim() == 0:
        return t
    if where == "partial":
        pieces = torch.tensor_split(t, world, 0)
        begin = sum(p.shape[0] for p in pieces[:rank])
        out = torch.zeros_like(t)
        out[begin : begin + pieces[rank].shape[0]] = pieces[rank]
        return out
    return torch.tensor_split(t, world, 0 if where == "rows" else t.dim() - 1)[rank].contiguous()


def combine(parts, where):
    """The whole tensor from the ranks' parts of it (None: that rank has none)."""
    defined = [p for p in parts if p is not None]
    if not defined:
        return None
    if where == "replicated":
        return parts[0]
    if where == "partial":
        return sum(p.double() for p in defined)
    dim = 0 if where == "rows" else defined[0].dim() - 1
    return torch.cat([torch.zeros_like(defined[0]) if p is None else p for p in parts], dim)


def rank_and_world():
    """This process's rank and the world's size (torchrun's environment)."""
    if not dist.is_initialized():
        dist.init_process_group("nccl" if DEVICE_TYPE == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size()
'''

# The test: every rank runs its slice; the ranks' results, gathered, are judged whole.
TEST = """

def test_case():
    rank, world = rank_and_world()
    assert world == WORLD_SIZE, f"run with torchrun --nproc-per-node {WORLD_SIZE}"
    if DEVICE_TYPE == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    data = torch.load(DATA, weights_only=True)
$init    ops = build(rank, world, device, data["params"])
    model = $sequential(*ops)
    x = shard(data["input"], SHARDING["input"], world, rank).to(device, DTYPE)
    x.requires_grad_(INPUT_REQUIRES_GRAD)
    extras = []
    for e, w, rg in zip(data["extra_inputs"], SHARDING["extra_inputs"], EXTRA_INPUT_REQUIRES_GRAD):
        e = shard(e, w, world, rank).to(device)
        extras.append(e.to(DTYPE).requires_grad_(rg) if e.is_floating_point() else e)
    names = $names
    scope = only_fusions(FUSIONS) if "only_fusions" in globals() else contextlib.nullcontext()
    with scope:
        out = model(x, *extras)
        outputs = list(out) if isinstance(out, tuple) else [out]
        cotangents = []
        for c, w, o in zip(data["cotangents"], SHARDING["output_grads"], outputs):
            cotangents.append(None if c is None else shard(c, w, world, rank).to(device, o.dtype))
        leaves = [("grad_input", x)]
        leaves += [(f"grad_extra_input[{k}]", e) for k, e in enumerate(extras)]
        for i, (op, name) in enumerate(zip(ops, names)):
            if name == "Boundary":
                continue
            for j, t in enumerate($leaves):
                leaves.append((f"grad_param[{i}].{name}[{j}]", t))
        pairs = [(o, c) for o, c in zip(outputs, cotangents)
                 if c is not None and o.is_floating_point() and o.requires_grad]
        wanted = [(n, t) for n, t in leaves if t is not None and t.requires_grad]
        grads = [None] * len(wanted)
        if pairs and wanted:
            grads = torch.autograd.grad([o for o, _ in pairs], [t for _, t in wanted],
                                        [c for _, c in pairs], allow_unused=True)
$finish    got = {(f"extra_output[{k - 1}]" if k else "output"): o.detach().cpu()
           for k, o in enumerate(outputs)}
    for (n, t), g in zip(wanted, grads):
        got[n] = None if g is None else g.detach().cpu()
    every = [None] * world
    dist.all_gather_object(every, got)
    where = {"output": SHARDING["outputs"][0], "grad_input": SHARDING["input_grad"]}
    for k, w in enumerate(SHARDING["outputs"][1:]):
        where[f"extra_output[{k}]"] = w
    for k, w in enumerate(SHARDING["extra_input_grads"]):
        where[f"grad_extra_input[{k}]"] = w
    for i, op in enumerate(SHARDING["ops"]):
        for j, w in enumerate(op["param_grads"]):
            where[f"grad_param[{i}].{names[i]}[{j}]"] = w
    problems = []
    for name in dict.fromkeys([*data["expected"], *got]):
        if name.startswith("grad_channel"):
            continue
        placement = where.get(name, "replicated")
        whole = combine([g.get(name) for g in every], placement)
        b = data["bounds"].get(name, {})
        problems.append(check(name, whole, data["expected"].get(name), b.get("atol", 0.0),
                              b.get("rtol", 0.0), b.get("allowance"), b.get("norm_bound")))
        if placement == "replicated" and whole is not None:
            for r in range(1, world):
                copy = every[r].get(name)
                problems.append(check(f"{name} on rank {r}", copy, whole, $pair_tolerance))
    problems = [p for p in problems if p]
    assert not problems, "; ".join(problems)
"""

DTYPES = {
    "float64": "torch.float64",
    "float32": "torch.float32",
    "bfloat16": "torch.bfloat16",
    "float16": "torch.float16",
}


def _params(op):
    return list(op.params)


def distributed_export(case, request, dialect):
    """The reply to an `export` request of a distributed case: {"ok", "script", "notes",
    "data_file"}. Needs request.data_file (the values and the expected tensors go there)
    and expect.sharding and expect.expected (what the C++ side sends for such a case)."""
    data_file = request.data_file
    if not data_file:
        raise ValueError(
            "a distributed case's script keeps its values in a file beside it: export it "
            "with -o FILE"
        )
    expect = request.expect or {}
    sharding = expect.get("sharding")
    if not sharding:
        raise ValueError("expect.sharding missing: the harness sends the case's placements")
    bounds = {}
    for name, b in (expect.get("tensors") or {}).items():
        bounds[name] = {
            "atol": float(b.get("atol", 0.0)),
            "rtol": float(b.get("rtol", 0.0)),
            "norm_bound": b.get("norm_bound"),
            "allowance": request.allowances.get(name),
        }
    data = {
        "input": case.input,
        "params": [_params(op) for op in case.ops],
        "extra_inputs": list(case.extra_inputs),
        "cotangents": list(case.cotangents),
        "expected": request.expected[0],
        "bounds": bounds,
    }
    torch.save(data, data_file)
    writer = DistributedWriter(case, dialect, sharding, expect, request.case_file, data_file)
    notes = [
        "a distributed case: run with torchrun --nproc-per-node "
        f"{sharding['world_size']} -m pytest -q FILE; "
        f"its values are in {os.path.basename(data_file)}",
        "the script checks the fused path's outputs, input, parameter and extra-input "
        "gradients; repeat calls and channel gradients are replay's",
    ]
    return {"ok": True, "script": writer.script(), "notes": notes, "data_file": data_file}


class DistributedWriter:
    def __init__(self, case, dialect, sharding, expect, case_file, data_file):
        self.case = case
        self.dialect = dialect
        self.sharding = sharding
        self.expect = expect
        self.case_file = case_file
        self.data_file = data_file

    def script(self):
        case = self.case
        world = int(self.sharding["world_size"])
        lines = [
            f'"""gradfuzz case {os.path.basename(self.case_file) or "(unsaved)"} '
            f"on {self.dialect.name}: a distributed case of {world} rank(s).",
            "",
            f"Run: torchrun --nproc-per-node {world} -m pytest -q THIS_FILE (NCCL on CUDA,",
            "gloo on the CPU). Each rank builds the case's Sequential on its slice of the",
            "values, and the ranks' results are judged together against gradfuzz's float64",
            'reference under its own bounds (see gradfuzz_adapter/export/distributed.py)."""',
            "",
            "import contextlib",
            "import math",
            "import os",
            "",
            "import pytest",
            "import torch",
            "import torch.distributed as dist",
            "import torch.nn.functional as F",
        ]
        lines += self.dialect.imports()
        lines += [
            "",
            f"WORLD_SIZE = {world}",
            f'DEVICE_TYPE = "{case.device}"',
            f"DTYPE = {DTYPES[case.dtype_name]}",
            f"DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "
            f"{os.path.basename(self.data_file)!r})",
            f"SHARDING = {self.sharding!r}",
            f"FUSIONS = {list(case.spec.get('fusions') or [])!r}",
            f"INPUT_REQUIRES_GRAD = {bool(case.input_requires_grad)!r}",
            f"EXTRA_INPUT_REQUIRES_GRAD = {list(case.extra_input_requires_grad)!r}",
            f"PARAM_REQUIRES_GRAD = {[list(op.param_requires_grad) for op in case.ops]!r}",
            "",
            "# " + "-" * 88,
            "# Errors and the op catalog (gradfuzz_adapter/errors.py, catalog.py)",
            adapter_module_body("errors"),
            adapter_module_body("catalog"),
        ]
        lines += self.dialect.distributed_sections()
        lines += [
            "# " + "-" * 88,
            "# Ranks, slices and the oracle's check",
            HELPERS + TEMPLATES["check"],
        ]
        lines += self._build()
        lines += self._test()
        return "\n".join(lines) + "\n"

    def _build(self):
        """build(rank, world, device): the case's modules on this rank, parameters copied."""
        case = self.case
        out = [
            "",
            "def build(rank, world, device, params):",
            '    """The case\'s modules on this rank (its slices of `params`), bound."""',
            "    ops = []",
        ]
        keyword = self.dialect.output_to_caller_keyword
        for i, op in enumerate(case.ops):
            if op.boundary:
                out.append("    ops.append(Boundary())")
                continue
            placements = self.sharding["ops"][i]
            local = (
                f"[shard(p, w, world, rank) for p, w in zip(params[{i}], {placements['params']!r})]"
            )
            out.append(f"    mine = {local}")
            out += self.dialect.distributed_build_op(self, op, i)
            for slot, channel in op.bound_inputs:
                out.append(f"    op.set_extra_input_channel({slot}, {channel!r})")
            for slot, channel, to_caller in op.bound_outputs:
                out.append(
                    f"    op.set_extra_output_channel({slot}, {channel!r}, {keyword}{to_caller!r})"
                )
            out.append("    ops.append(op)")
        out.append("    return ops")
        return out

    def global_input_shape(self, i):
        """Op i's input shape on the unsharded tensors."""
        return self.sharding["ops"][i]["global_input_shape"]

    def local_shape(self, i):
        """Op i's input shape on a rank (tensor_split's slice; equal splits in valid cases)."""
        op = self.sharding["ops"][i]
        shape = list(op["global_input_shape"])
        world = int(self.sharding["world_size"])
        layout = op["input_layout"]
        if world > 1 and layout in ("rows", "features"):
            dim = 0 if layout == "rows" else len(shape) - 1
            shape[dim] = -(-shape[dim] // world)
        return shape

    def _test(self):
        fields = self.dialect.distributed_test_fields()
        return [
            string.Template(TEST).substitute(
                names=repr([op.name for op in self.case.ops]),
                pair_tolerance=self._pair_tolerance(),
                **fields,
            )
        ]

    def _pair_tolerance(self):
        t = self.expect.get("tolerance") or {}
        return f"{float(t.get('atol', 0.0))!r}, {float(t.get('rtol', 0.0))!r}"
