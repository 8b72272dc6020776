"""Parameters: the model's layout (../shared/spec/ops.md) <-> TE's parameters.

Duck-typed on the te.ops objects (no TE import), so the backend uses them and exported te
scripts embed this module whole (te/embed.py). GroupedLinear's weights are [G, out, in] and
its biases [G, out] in the model's layout; TE keeps one parameter per group, or one grouped
tensor with single_grouped_weight/bias.
"""

import torch


def param_groups(op, name):
    """TE's parameters per model parameter: [[tensors], ...]; one tensor, or one per group
    (GroupedLinear's weight0..weightG-1 and bias0..biasG-1, grouped_linear.py:
    GroupedLinear.__init__; with single_grouped_weight/bias one GroupedTensor "weight"/"bias"
    of shape [G, out, in] / [G, out], grouped_linear.py: make_grouped_weights,
    _make_grouped_biases_from_packed)."""
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


def _per_group(op, name, k):
    """Whether model parameter k is stored as one TE parameter per group (GroupedLinear's
    weight0.. / bias0..), so that values are split and gradients stacked along dim 0 (also
    for a single group)."""
    if name != "GroupedLinear":
        return False
    return not (op.single_grouped_weight if k == 0 else op.single_grouped_bias)


def _storage(t):
    """Where to write a parameter's values: a GroupedTensor's packed rowwise data viewed in
    its wrapper shape (as grouped_linear.py: _get_packed_bias_tensor and backward_dw read
    it), else the parameter itself."""
    data = getattr(t, "rowwise_data", None)
    return t if data is None else data.view(tuple(t.shape))


def copy_param_values(op, name, values):
    """Copies the model-layout `values` (on the op's device and dtype) into TE's parameters."""
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
    """accumulate_into_main_grad: what a Megatron-LM user does before backward, an fp32
    `main_grad` buffer on each weight (BasicLinear reads it in op_backward and
    GroupedLinear already in fuser_forward, through _common.py: get_main_grad_from_param;
    the wgrad GEMM accumulates into it, or overwrites with overwrite_main_grad)."""
    if not getattr(op, "_accumulate_into_main_grad", False):
        return
    for t in param_groups(op, name)[0]:
        t.main_grad = torch.zeros(tuple(t.shape), dtype=torch.float32, device=t.device)


def finish_weight_gradients(op):
    """delay_wgrad_compute: the user runs the delayed weight-gradient GEMMs after backward
    (grouped_linear.py: GroupedLinear.need_backward_dw / backward_dw, which set each
    weight's .grad, or accumulate into main_grad)."""
    if getattr(op, "need_backward_dw", None) is not None and op.need_backward_dw():
        op.backward_dw()


def param_leaves(op, name):
    """TE's parameters of the op that autograd should differentiate (those requiring grad)."""
    return [t for tensors in param_groups(op, name) for t in tensors if t.requires_grad]


def model_param_grads(op, name, autograd_grads):
    """Parameter gradients in the model's layout. `autograd_grads` maps id(parameter) to
    what torch.autograd.grad returned for it. A weight with accumulate_into_main_grad has
    its gradient in main_grad (the returned one is a dummy or None: _common.py:
    get_dummy_wgrads_for_params); with delay_wgrad_compute in .grad after backward_dw."""
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
