"""gradfuzz case /root/out/work/export/te32_findings-known_9dfb7fa3283f1791.json (te, float32, input [1, 7]): MakeExtraOutput -> RMSNorm -> Boundary -> MakeExtraOutput -> Linear -> AddExtraInput.

Reproduce: gradfuzz replay /root/out/work/export/te32_findings-known_9dfb7fa3283f1791.json --backend te
Expected: outputs and gradients within gradfuzz's bounds of the float64 reference, no caller tensor changed.
"""
import os

os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")  # fp32 GEMMs in fp32

import contextlib  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformer_engine.pytorch as te  # noqa: E402
from transformer_engine.pytorch.ops.fuser import OperationFuser  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False


# The values gradfuzz drew, float64 on the CPU, rounded to the case dtype
DTYPE = torch.float32
DEVICE = torch.device("cuda")
X = torch.tensor([
    [0.27757677, -0.28830415, 0.9702559, -1.8138045, 0.25343874, 0.32362524, 0.5380528],
], dtype=torch.float32).double()
INPUT_REQUIRES_GRAD = True
GAMMA1 = torch.tensor([1.1189708, 0.9060469, 0.27251935, 1.4108152, -1.746777, -0.3127659, -1.394367], dtype=torch.float32).double()
W4 = torch.tensor([
    [0.6723982, 0.06520561, -0.14451812, 0.0640757, -0.27671075, 0.49316755, -0.17727444],
    [0.3301425, -0.5144039, 0.5268531, 0.5429173, 0.20814605, 0.15921994, -0.18761912],
    [0.54272413, -0.14468807, 0.0067497473, 0.014560499, 0.023416627, -0.25794497, 0.3417127],
    [0.7191483, -0.36637947, 0.28453678, 0.26794258, 0.5011279, -0.0052147834, 0.15420759],
    [-0.54342395, 0.0029190674, 0.12573813, -0.4296146, 0.26634568, -0.07588373, -0.5834503],
    [0.16644645, 0.34353533, -0.29307094, -0.078266874, 0.03901423, -0.55570155, 0.024588333],
    [-0.054060366, 0.8350116, 0.23345459, -0.46769792, -0.27953443, -0.15697569, -0.43337417],
], dtype=torch.float32).double()
DY = torch.tensor([
    [-0.5903815, 0.22532937, -0.41645548, 0.53004885, -1.9992726, 1.476394, -0.322393],
], dtype=torch.float32).double()
DY1 = torch.tensor([
    [-0.97166336, -0.70071614, 0.73234457, 1.1992204, 0.3199231, -0.22747752, -0.058378473],
], dtype=torch.float32).double()
DY2 = torch.tensor([
    [-0.006076468, 0.6979354, 0.94570065, 1.7816331, -0.8383209, 1.1259992, -1.3910376],
], dtype=torch.float32).double()
FALLBACK = (1e-05, 1.6250000000000001e-06)  # atol, rtol of the tensors BOUNDS does not name
BOUNDS = {  # tensor: atol, rtol, per-element allowance, norm bound
    'extra_output[0]': (1e-05, 1.6250000000000001e-06, torch.tensor([
    [0.0, 0.0, 4.76837158203125e-07, 9.5367431640625e-07, 0.0, 2.384185791015625e-07, 0.0],
], dtype=torch.float64), 3.058245927464889e-05),
    'extra_output[1]': (1e-05, 1.6250000000000001e-06, torch.tensor([
    [4.5173526430630773e-07, 2.1522999382739272e-07, 7.718317771576721e-07, 2.1774542702246436e-06, 2.426261245247474e-07, 2.0255302413119125e-07, 7.488981963454933e-07],
], dtype=torch.float64), 3.6743366023431416e-05),
    'grad_channel[c0@fuser1]': (1e-05, 1.6250000000000001e-06, torch.tensor([
    [5.811452865600586e-07, 7.152557373046875e-07, 2.384185791015625e-07, 1.9073486328125e-06, 1.430511474609375e-06, 9.5367431640625e-07, 1.430511474609375e-06],
], dtype=torch.float64), 3.606086312640308e-05),
    'grad_input': (1e-05, 1.6250000000000001e-06, torch.tensor([
    [1.934042717977036e-06, 1.6822805148919429e-06, 2.0598109529146313e-06, 8.96893919843933e-06, 3.65972993066066e-06, 2.4103955738041805e-06, 1.5796723182859296e-06],
], dtype=torch.float64), 4.509525216573628e-05),
    'grad_param[1].RMSNorm[0]': (1e-05, 1.6250000000000001e-06, torch.tensor([3.598506512769717e-07, 4.0417399604919524e-07, 7.601412137514529e-07, 1.8951605866845966e-06, 9.357574741741814e-07, 3.957275893640144e-07, 1.175971970024392e-06], dtype=torch.float64), 4.0054514559244504e-05),
    'grad_param[4].Linear[0]': (1e-05, 1.6250000000000001e-06, torch.tensor([
    [2.4119243491327325e-07, 5.514141609985757e-07, 9.704762637952058e-07, 4.3245361496246915e-06, 1.5598541880379457e-07, 2.471960109939886e-07, 5.8097813759872e-07],
    [1.3998399217562962e-07, 7.273487856451766e-08, 1.1441307457005223e-07, 1.0008432393959765e-06, 4.790869850834767e-08, 4.407303422215847e-08, 1.6888675985482493e-07],
    [2.729296784131918e-07, 1.324067455676925e-07, 2.0186770299801537e-07, 2.2833781514464135e-06, 8.242835047855834e-08, 1.030090475140355e-07, 2.8441134058976303e-07],
    [3.1074113859830277e-07, 4.248685732122226e-07, 1.188815622832351e-06, 1.0995852974815534e-06, 1.5798401442612686e-07, 2.648933909998874e-07, 3.4072970955811854e-07],
    [7.167575883926247e-07, 9.775268345890709e-07, 2.3964978161927775e-06, 4.634962394334252e-06, 4.3017865891670226e-07, 4.866406548842406e-07, 1.4760427848869995e-06],
    [1.0498691569438279e-06, 5.485256000525851e-07, 1.3047473395033649e-06, 2.439235153417485e-06, 6.261161655807257e-07, 3.8343543318219986e-07, 8.421961328330951e-07],
    [3.6197807595783615e-07, 2.6439897315988503e-07, 5.667198639258686e-07, 1.0958363247937086e-06, 1.2569476859347617e-07, 1.0823147555960588e-07, 2.081541050635849e-07],
], dtype=torch.float64), 9.842080502561607e-05),
    'output': (1e-05, 1.6250000000000001e-06, torch.tensor([
    [1.0787410236190453e-06, 2.7145161674013707e-06, 5.022389260034288e-07, 3.6818273869698714e-06, 2.406124064435744e-06, 6.976508193368147e-07, 5.512063658841271e-07],
], dtype=torch.float64), 4.0403556484902266e-05),
}


def reference(dtype=torch.float64, input_requires_grad=INPUT_REQUIRES_GRAD):
    """The case in plain PyTorch with gradfuzz's catalog functions, on the CPU."""
    x = X.to(dtype).requires_grad_(input_requires_grad)
    gamma1 = GAMMA1.to(dtype).requires_grad_(True)
    w4 = W4.to(dtype).requires_grad_(True)
    h = x
    o0_0 = h.view_as(h)  # MakeExtraOutput
    h = rms_norm(h, gamma1, 1e-05, True)  # RMSNorm
    # Boundary: a plain module ends the fuser (channels end with it)
    c_c0 = h.view_as(h)  # MakeExtraOutput
    h = h @ w4.T  # Linear
    h = h + c_c0  # AddExtraInput
    outputs = [h, o0_0, c_c0]
    cotangents = [DY.to(dtype), DY1.to(dtype), DY2.to(dtype)]
    leaves = [
        ("grad_input", x),
        ("grad_param[1].RMSNorm[0]", gamma1),
        ("grad_param[4].Linear[0]", w4),
    ]
    return results(outputs, cotangents, leaves)


def build(state):
    """The case with te.ops as a user writes it (its ops go into state["ops"])."""
    op0 = te.ops.MakeExtraOutput(in_place=True)
    op1 = te.ops.RMSNorm(7, eps=1e-05, device=DEVICE, dtype=DTYPE, zero_centered_gamma=True, sm_margin=1)
    with torch.no_grad():
        op1.weight.copy_(GAMMA1)
    op2 = Boundary()  # a plain module: ends the fuser
    op3 = te.ops.MakeExtraOutput(in_place=True)
    op4 = te.ops.BasicLinear(7, 7, device=DEVICE, dtype=DTYPE, accumulate_into_main_grad=True)
    copy_param_values(op4, "Linear", [v.to(DEVICE, DTYPE) for v in (W4,)])
    set_param_requires_grad(op4, "Linear", [True])
    attach_main_grads(op4, "Linear")
    op5 = te.ops.AddExtraInput(in_place=True)
    state["ops"] = ops = [op0, op1, op2, op3, op4, op5]
    op3.set_extra_output_channel(0, 'c0', output_to_caller=True)
    op5.set_extra_input_channel(0, 'c0')
    model = te.ops.Sequential(op0, op1, op2, op3, op4, op5)
    return model


def call(model, ops, input_requires_grad=INPUT_REQUIRES_GRAD, no_grad=False):
    """Forward, then one autograd.grad of sum <output_k, cotangent_k>: the tensors
    the oracle compares by name, and the caller tensors the call changed."""
    x = X.to(DEVICE, DTYPE, copy=True).requires_grad_(input_requires_grad)
    extras = []
    cotangents = [DY.to(DEVICE, DTYPE, copy=True), DY1.to(DEVICE, DTYPE, copy=True), DY2.to(DEVICE, DTYPE, copy=True)]
    caller = {"input": x, **{f"extra_input[{k}]": e for k, e in enumerate(extras)},
              **{f"cotangent[{k}]": c for k, c in enumerate(cotangents) if c is not None}}
    pristine = {n: t.detach().clone() for n, t in caller.items()}
    with torch.set_grad_enabled(not no_grad):
        out = model(x, *extras)
    outputs = list(out) if isinstance(out, tuple) else [out]
    leaves = []
    if not no_grad:
        leaves = [
            ("grad_input", x),
            ("grad_param[1].RMSNorm[0]", ops[1].weight),
            *[(f"op4.{k}", t) for k, t in enumerate(param_leaves(ops[4], "Linear"))],
        ]
    got = results(outputs, [] if no_grad else cotangents, leaves, zeros=False)
    if not no_grad:
        finish_weight_gradients(ops[4])
        by_id = {id(t): got.get(f"op4.{k}") for k, t in enumerate(param_leaves(ops[4], "Linear"))}
        for j, g in enumerate(model_param_got(ops[4], "Linear", by_id)):
            got[f"grad_param[4].Linear[{j}]"] = g
    return got, [n for n, t in caller.items() if not torch.equal(t, pristine[n])]


PATHS = [['FusedResidual.joint', 'UserbuffersBackwardLinear', 'BackwardLinearAdd', 'BackwardAddRMSNorm', 'FusedResidual.backward'], []]
PATH_NAMES = ['fused', 'unfused']


@pytest.mark.parametrize("fusions", PATHS, ids=PATH_NAMES)
def test_case(fusions):
    expected = reference()
    state = {}
    with only_fusions(fusions):
        model = build(state)
        got, modified = call(model, state["ops"])
    problems = check_all(got, expected)
    problems += [f"{name}: changed by the call (a caller tensor)" for name in modified]
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------
# What the test uses: the adapter's te.ops extensions, gradfuzz's catalog functions and comparison


class GradfuzzError(Exception):
    kind = "unrecognized"


class InvalidArgumentError(GradfuzzError, ValueError):
    kind = "invalid-argument"


def _shape(t):
    return "<undefined>" if t is None else str(list(t.shape))


def check_features(op, x, features):
    if x is None or x.dim() < 1 or x.shape[-1] != features:
        raise InvalidArgumentError(
            f"{op}: input must have {features} features (last dim), got shape {_shape(x)}"
        )


def rms_norm(x, gamma, eps, zero_centered_gamma=False):
    check_features("RMSNorm", x, gamma.shape[0])
    scale = 1 + gamma if zero_centered_gamma else gamma
    return F.rms_norm(x, (x.shape[-1],), scale, eps)


class Boundary(torch.nn.Module):
    def forward(self, x):
        self.last_input = x
        return x


def _per_group(op, name, k):
    if name != "GroupedLinear":
        return False
    return not (op.single_grouped_weight if k == 0 else op.single_grouped_bias)


def _storage(t):
    data = getattr(t, "rowwise_data", None)
    return t if data is None else data.view(tuple(t.shape))


def param_groups(op, name):
    if name in ("Linear", "RMSNorm"):
        return [[op.weight]]
    if name == "Bias":
        return [[op.bias]]
    if name == "LayerNorm":
        return [[op.weight], [op.bias]]
    if name == "GroupedLinear":
        if op.single_grouped_weight:
            groups = [[op.weight]]
        else:
            groups = [[getattr(op, f"weight{g}") for g in range(op.num_groups)]]
        if op.has_bias:
            if op.single_grouped_bias:
                groups.append([op.bias])
            else:
                groups.append([getattr(op, f"bias{g}") for g in range(op.num_groups)])
        return groups
    return []


def copy_param_values(op, name, values):
    with torch.no_grad():
        for k, (tensors, value) in enumerate(zip(param_groups(op, name), values)):
            if _per_group(op, name, k):
                for g, t in enumerate(tensors):
                    t.copy_(value[g])
            else:
                _storage(tensors[0]).copy_(value.reshape(tuple(tensors[0].shape)))


def set_param_requires_grad(op, name, flags):
    for tensors, flag in zip(param_groups(op, name), flags):
        for t in tensors:
            t.requires_grad_(bool(flag))


def attach_main_grads(op, name):
    if not getattr(op, "_accumulate_into_main_grad", False):
        return
    for t in param_groups(op, name)[0]:
        t.main_grad = torch.zeros(tuple(t.shape), dtype=torch.float32, device=t.device)


class FusedResidual(te.ops.FusedOperation):
    def __init__(self, producer, inner, consumer, *, fusion_name, returns_channel):
        super().__init__((producer, inner, consumer))
        self.fusion_name = fusion_name
        self.returns_channel = returns_channel

    def fuser_forward(
        self,
        basic_op_ctxs,
        input_,
        *,
        basic_op_extra_inputs,
        prev_op_grad_output_quantizer,
        next_op_input_quantizer,
        basic_op_kwargs,
    ):
        if self.fusion_name == "FusedResidual.backward":
            raise RuntimeError("FusedResidual.backward is backward-only; its forward ran")
        producer, inner, consumer = self.basic_ops
        # The inner op runs its own forward and fills its own context. Its neighbours'
        # quantizers are what the fuser would pass it (fuser.py: prev_op/next_op).
        y, inner_extra_outputs = inner.fuser_forward(
            [basic_op_ctxs[1]],
            input_,
            basic_op_extra_inputs=[basic_op_extra_inputs[1]],
            prev_op_grad_output_quantizer=producer.get_grad_output_quantizer(),
            next_op_input_quantizer=consumer.get_input_quantizer(),
            basic_op_kwargs=[basic_op_kwargs[1]],
        )
        if tuple(y.shape) != tuple(input_.shape):
            raise InvalidArgumentError(
                f"AddExtraInput slot 0: extra input must have the input's shape "
                f"{list(y.shape)}, got {list(input_.shape)}"
            )
        # y [rows, n] + x [rows, n], out of place: x is still C's value
        output = y + input_
        channel = input_ if self.returns_channel else None
        return output, [(channel,), inner_extra_outputs[0], ()]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        if self.fusion_name == "FusedResidual.forward":
            raise RuntimeError("FusedResidual.forward is forward-only; its backward ran")
        inner = self.basic_ops[1]
        grad_inner, inner_grad_params, inner_grad_extra_inputs = inner.fuser_backward(
            [basic_op_ctxs[1]],
            grad_output,
            basic_op_grad_extra_outputs=[basic_op_grad_extra_outputs[1]],
        )
        # AddExtraInput: d(inner output) = d(C) = grad_output [rows, n]; MakeExtraOutput:
        # dx = inner dx + d(C) from AddExtraInput + d(C) from everyone else.
        grad_input = grad_output if grad_inner is None else grad_inner + grad_output
        (grad_extra_output,) = basic_op_grad_extra_outputs[0]
        if grad_extra_output is not None:
            grad_input = grad_input + grad_extra_output
        return (
            grad_input,
            [(), inner_grad_params[0], ()],
            [(), inner_grad_extra_inputs[0], (grad_output,)],
        )


def residual_pattern(window):
    producer, inner, consumer = window
    if any(op.is_fused_op for op in window):
        return False
    if not isinstance(producer, te.ops.MakeExtraOutput):
        return False
    if not isinstance(consumer, te.ops.AddExtraInput):
        return False
    if inner.num_extra_inputs or inner.num_extra_outputs:
        return False
    channel = producer._extra_output_channels[0]
    return channel is not None and consumer._extra_input_channels[0] == channel


def fuse_residual(ops, fusion_name):
    out = []
    i = 0
    while i < len(ops):
        window = ops[i : i + 3]
        if len(window) == 3 and residual_pattern(window):
            producer, inner, consumer = window
            channel = producer._extra_output_channels[0]
            basic = [b for op in ops for b in (op.basic_ops if op.is_fused_op else [op])]
            consumed_elsewhere = any(
                b is not consumer and channel in b._extra_input_channels for b in basic
            )
            returns_channel = producer._extra_output_to_caller[0] or consumed_elsewhere
            out.append(
                FusedResidual(
                    producer,
                    inner,
                    consumer,
                    fusion_name=fusion_name,
                    returns_channel=returns_channel,
                )
            )
            i += 3
        else:
            out.append(ops[i])
            i += 1
    return out


def fuse_residual_backward(ops, *, recipe=None, **unused):
    return fuse_residual(ops, "FusedResidual.backward")
fuse_residual_backward.gradfuzz_fusion_name = "FusedResidual.backward"


def fuse_residual_forward(ops, *, recipe=None, **unused):
    return fuse_residual(ops, "FusedResidual.forward")
fuse_residual_forward.gradfuzz_fusion_name = "FusedResidual.forward"


def fuse_residual_joint(ops, *, recipe=None, **unused):
    return fuse_residual(ops, "FusedResidual.joint")
fuse_residual_joint.gradfuzz_fusion_name = "FusedResidual.joint"


def register_fusions():
    from transformer_engine.pytorch.ops.fuser import OperationFuser

    registered = OperationFuser.forward_backward_fusion_functions
    if fuse_residual_joint in registered:
        return
    te.ops.register_forward_fusion(fuse_residual_forward)
    te.ops.register_backward_fusion(fuse_residual_backward)
    te.ops.register_forward_backward_fusion(fuse_residual_joint)


def param_leaves(op, name):
    return [t for tensors in param_groups(op, name) for t in tensors if t.requires_grad]


def model_param_grads(op, name, autograd_grads):
    out = []
    for k, tensors in enumerate(param_groups(op, name)):
        grads = []
        for t in tensors:
            if not t.requires_grad:
                grads.append(None)
            elif k == 0 and getattr(op, "_accumulate_into_main_grad", False):
                grads.append(getattr(t, "main_grad", None))
            elif (
                k == 0
                and getattr(op, "need_backward_dw", None) is not None
                and op.need_backward_dw()
            ):
                grads.append(t.grad)
            else:
                grads.append(autograd_grads.get(id(t)))
        if any(g is None for g in grads):
            out.append(None)  # a group without its gradient: the whole tensor has none
        elif _per_group(op, name, k):
            out.append(torch.stack([g.reshape(tuple(t.shape)) for g, t in zip(grads, tensors)]))
        else:
            out.append(_storage(grads[0]).reshape(tuple(tensors[0].shape)))
    return out


def finish_weight_gradients(op):
    if getattr(op, "need_backward_dw", None) is not None and op.need_backward_dw():
        op.backward_dw()


@contextlib.contextmanager
def only_fusions(names):
    """Only the fusions called `names` in TE's registry (fuser.py: OperationFuser's lists)."""
    saved = {a: getattr(OperationFuser, a) for a in dir(OperationFuser) if a.endswith("_functions")}
    name = lambda f: getattr(f, "gradfuzz_fusion_name", None) or f.__qualname__.split(".")[0]
    try:
        for attr, funcs in saved.items():
            setattr(OperationFuser, attr, [f for f in funcs if name(f) in names])
        yield
    finally:
        for attr, funcs in saved.items():
            setattr(OperationFuser, attr, funcs)


def results(outputs, cotangents, leaves, zeros=True):
    """The outputs, and d sum_k <outputs[k], cotangents[k]> / d leaf for the named leaves
    requiring grad (where nothing reached one: zeros, the reference's, or None), by name."""
    got = {f"extra_output[{k - 1}]" if k else "output": o.detach() for k, o in enumerate(outputs)}
    pairs = [(o, c.to(o)) for o, c in zip(outputs, cotangents)
             if c is not None and o.is_floating_point() and o.requires_grad]
    leaves = [(n, t) for n, t in leaves if t is not None and t.requires_grad]
    if pairs and leaves:
        grads = torch.autograd.grad([o for o, _ in pairs], [t for _, t in leaves],
                                    [c for _, c in pairs], retain_graph=True, allow_unused=True)
        for (n, t), g in zip(leaves, grads):
            got[n] = (torch.zeros_like(t) if zeros else None) if g is None else g
    return got


def check(name, got, e, atol, rtol, allowance=None, norm_bound=None):
    """Why `got` is off gradfuzz's bound of `e` (oracle/oracle.h), or None: every element
    finite and |got - e| <= atol + rtol (rms(e) + |e|) + allowance (unjudged where that is
    infinite), and ||got - e|| <= norm_bound."""
    if got is None:
        fine = e is None or e.numel() == 0 or (name.startswith("grad") and not e.any())
        return None if fine else f"{name}: none returned"
    got = got.detach().to("cpu", torch.float64)
    e = torch.zeros_like(got) if e is None else e.detach().to(torch.float64)
    if got.shape != e.shape:
        return f"{name}: shape {list(got.shape)}, expected {list(e.shape)}"
    a = torch.zeros_like(e) if allowance is None else allowance.double()
    judged, finite, diff = ~a.isinf(), got.isfinite() & e.isfinite(), (got - e).abs()
    rms = torch.where(e.isfinite(), e, 0).square().mean().sqrt()
    bad = judged & (~finite | (diff > atol + rtol * (rms + e.abs()) + torch.where(judged, a, 0)))
    if bad.any():
        k = int(torch.where(bad, torch.nan_to_num(diff, nan=float("inf")), -1).argmax())
        return (f"{name}: {int(bad.sum())} of {e.numel()} off, worst at flat index {k}: got "
                f"{got.flatten()[k]:.9g}, expected {e.flatten()[k]:.9g}")
    error = torch.where(judged & finite, diff, 0).norm()
    if norm_bound is not None and error > norm_bound:
        return f"{name}: error norm {float(error):.3g} > {norm_bound:.3g}"


def check_all(got, expected, baseline=None):
    """Every tensor either side has (channels: those the reference has), under BOUNDS or
    else FALLBACK."""
    names = [n for n in dict.fromkeys([*expected, *got])
             if n in expected or not n.startswith("grad_channel")]
    problems = [check(n, got.get(n), expected.get(n), *BOUNDS.get(n, FALLBACK)) for n in names]
    return [p for p in problems if p]


register_fusions()  # the adapter's FusedResidual, in all three passes
