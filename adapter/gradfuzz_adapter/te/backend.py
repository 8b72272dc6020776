"""The te backend's driver hooks (TEBuilder) and its hello/run answers (TEBackend).

TE is imported by TEBackend() and by nothing else in the adapter, so the rest of the te
package stays importable without TE (the exporter writes te scripts from it). Each path
builds fresh te.ops objects and a fresh te.ops.Sequential; citations are to TE 2.20.2's
source (transformer_engine/pytorch/...), as file:function.
"""

import contextlib
import os
import platform
import types

import torch

from .. import faults, recipes
from ..driver import USAGE, Builder, HeldWeight, run_paths, te_writer_scope
from ..fp8_state import FP8_MAX, state_entry
from ..invariants import TensorChecks, fp8_checks_on, te_classes
from . import recipes as te_recipes
from .classify import classify
from .faults import FAULTS
from .fusions import FUSION_PASSES, fusion_name, only_fusions
from .op_table import DEVICE, DTYPE, OPS, Symbol, op_recipe, te_options
from .params import (
    attach_main_grads,
    copy_param_values,
    finish_weight_gradients,
    model_param_grads,
    param_leaves,
    set_param_requires_grad,
)

# TE reads this opt-in before it unpickles an op's extra state (_extra_state.py).
_UNSAFE_PICKLE = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"


def _materialize(op, name):
    """The second half of deferred initialisation, as TE's users do it: each module holding
    parameters on "meta" reset (reset_parameters allocates them on the current device and
    initialises them; basic_linear.py, bias.py, the norms); the caller's values are copied in
    after. An op that cannot leave "meta" so raises (the path's error, phase create)."""
    for module in op.modules():
        if any(p.is_meta for p in module.parameters(recurse=False)):
            reset = getattr(module, "reset_parameters", None)
            if reset is None:
                raise NotImplementedError(
                    f"{name}: {type(module).__name__} holds parameters on 'meta' and has no "
                    "reset_parameters"
                )
            reset()
    left = [n for n, p in op.named_parameters() if p.is_meta]
    if left:
        raise RuntimeError(f"{name}: parameters still on 'meta' after reset_parameters: {left}")


def _block_count(n, block):
    return (n + block - 1) // block


def transposed_copies(weight):
    """A quantized weight's row-wise data and its column-wise data laid out as the row-wise
    one (HeldWeight.copies: [rowwise, columnwise transposed back, ...], raw), where TE's
    layout makes the column-wise copy exactly the row-wise one's transpose; None where it
    does not or where the tensor holds no valid column-wise copy (a 2D weight only).

    - Per-tensor scaling (Float8Tensor: DelayedScaling, Float8CurrentScaling): one scale
      for both copies (float8_tensor_storage.py: _scale_inv), and the column-wise copy is
      the FP8 codes transposed (_transpose, [in, out]; _create_transpose makes it by
      fp8_transpose of _data). Valid unless _transpose_invalid.
    - 2D (128x128) block scaling (Float8BlockwiseQTensor with _is_2D_scaled, the weights of
      Float8BlockScaling): one scale per block for both directions, so the column-wise
      codes ([in, out]) are the row-wise ones transposed and the column-wise scales
      ([ceil(in/128), ceil(out/128) padded to 4]) the row-wise ones ([ceil(out/128),
      ceil(in/128) padded to 4]) transposed, on the unpadded blocks only
      (float8_blockwise_tensor.py: Float8BlockQuantizer.get_scale_shape; the storage's
      _create_columnwise derives the column-wise pair from the row-wise one so).
    - 1D blocks, MXFP8, NVFP4: each direction is scaled along its own rows; None."""
    from transformer_engine.pytorch.tensor.storage.float8_blockwise_tensor_storage import (
        Float8BlockwiseQTensorStorage,
    )
    from transformer_engine.pytorch.tensor.storage.float8_tensor_storage import (
        Float8TensorStorage,
    )

    if isinstance(weight, Float8TensorStorage):
        data, transpose = weight._data, weight._transpose
        if data is None or transpose is None or weight._transpose_invalid or data.dim() != 2:
            return None
        return [data, transpose.t()]
    if isinstance(weight, Float8BlockwiseQTensorStorage) and weight._is_2D_scaled:
        rows, cols = weight._rowwise_data, weight._columnwise_data
        row_scales, col_scales = weight._rowwise_scale_inv, weight._columnwise_scale_inv
        if any(t is None for t in (rows, cols, row_scales, col_scales)) or rows.dim() != 2:
            return None
        block = getattr(weight._quantizer, "block_len", 128)
        out_blocks, in_blocks = (_block_count(n, block) for n in rows.shape)
        return [
            rows,
            cols.t(),
            row_scales[:out_blocks, :in_blocks],
            col_scales[:in_blocks, :out_blocks].t(),
        ]
    return None


class TEBuilder(Builder):
    """Driver hooks for te.ops. Each path builds fresh ops and a fresh Sequential (TE ops
    and fusers keep state); per-path state lives in self.path.

    Under a case's recipe (self.recipe, a recipes.Recipe set by TEBackend.run) every call
    of a Sequential runs inside te.autocast(enabled=True, recipe=TE's recipe object), as a
    user writes it; the call-then-bind calls run outside it (they leave the delayed-scaling
    histories alone). TE keeps the histories of every op quantized under one recipe in a
    process-global state that each update walks: a path starts with a fresh one, and a
    second Sequential of the path (the driver's fresh-plan runs) runs its forward in one of
    its own, so it does not roll the path's Sequential's histories.

    The usage script's recipe changes act on the path (self.path): a call under
    recipe_off_scope runs outside the autocast, and set_amax_history_len replaces the
    path's recipe object, whose new length TE's fuser notices at the next forward. With
    case.quantized_params every Linear is built under quantized_model_init, so that its
    weight parameter is a quantized tensor of the path's recipe; the case's values and each
    optimizer step are written into it in place (te/params.py: copy_param_values; TE
    quantizes a high-precision tensor copied into a quantized one, both copies)."""

    name = "te"

    def __init__(self, te, ext, operation_fuser, device=None):
        self.te = te
        self.ext = ext
        self.operation_fuser = operation_fuser
        self.fixed_device = device
        self.path = None
        self.recipe = None
        self.recipe_availability = {}

    def device(self, case):
        if self.recipe is not None:
            name = self.recipe.name
            if name not in self.recipe_availability:
                self.recipe_availability[name] = te_recipes.availability(self.te, name)
            available, reason = self.recipe_availability[name]
            if not available:
                raise NotImplementedError(f"{name} is not available here: {reason}")
        if self.fixed_device is not None:
            return torch.device(self.fixed_device)
        return torch.device("cuda", torch.cuda.current_device())

    @contextlib.contextmanager
    def fusion_scope(self, fusions):
        self.path = types.SimpleNamespace(
            names={},
            channel_grads=None,
            dtype=None,
            te_recipe=None,
            scratch_state=None,
            recipe_off=False,
            ops=[],
        )
        with contextlib.ExitStack() as stack:
            # Every quantized tensor TE's quantizers make while the path runs is checked as
            # it is made (invariants.py; take_tensor_checks hands the checks over).
            if fp8_checks_on():
                self.path.tensor_checks = TensorChecks(
                    te_classes(), self._op_of, transposed_copies, self._handed_by
                )
                stack.enter_context(self.path.tensor_checks.recording())
            if self.recipe is not None:
                self.path.te_recipe = te_recipes.make_recipe(self.recipe)
                self.path.fp8_state = te_recipes.fresh_fp8_state()
                stack.enter_context(te_recipes.fp8_state(self.path.fp8_state))
            stack.enter_context(only_fusions(self.operation_fuser, fusions))
            yield

    @contextlib.contextmanager
    def scratch_scope(self):
        # A fresh quantization state, so that the scratch run's autocast exits roll no
        # history of the path's ops (quantization.py: reduce_and_update_fp8_tensors walks
        # every op registered in the state) and the path's exits none of the scratch ops'.
        saved = self.path.scratch_state
        if self.path.te_recipe is not None:
            self.path.scratch_state = te_recipes.fresh_fp8_state()
        try:
            yield
        finally:
            self.path.scratch_state = saved

    @contextlib.contextmanager
    def recipe_off_scope(self):
        # forward reads the flag: the Sequential is called outside te.autocast, still in the
        # path's quantization state (its ops' histories are registered there).
        saved = self.path.recipe_off
        self.path.recipe_off = True
        try:
            yield
        finally:
            self.path.recipe_off = saved

    def set_amax_history_len(self, ops, case, length):
        # A recipe of the same class with another length: the fuser compares it with the one
        # of its last forward and has every basic op resize its histories (fuser.py:
        # OperationFuser.maybe_fuse_ops; op.py: BasicOperation.reset_recipe_state keeps the
        # first `length` rows or pads with zeros). Nothing is resized here.
        self.path.te_recipe = te_recipes.with_amax_history_len(self.path.te_recipe, length)

    def take_tensor_checks(self):
        # None where the call quantized nothing through TE's Python entry points, so that a
        # case without quantization keeps its verdict as it was.
        checks = getattr(self.path, "tensor_checks", None)
        if checks is None:
            return None
        verdict = checks.take()
        return verdict if verdict["checked"] or verdict["violations"] else None

    def _op_of(self, quantizer, tensor):
        """(spec op index, label) of the op whose quantizer made `tensor`: a quantizer of the
        op's recipe state (op.py: BasicOperation._quantizers[mode][k], label "mode.k"), or the
        op's weight itself (a quantized parameter written in place, label "weight");
        (-1, "?") where no op of the path owns either."""
        for index, op in self.path.ops:
            for mode, quantizers in (getattr(op, "_quantizers", None) or {}).items():
                for k, q in enumerate(quantizers):
                    if q is quantizer:
                        return index, f"{mode}.{k}"
            if tensor is not None and getattr(op, "weight", None) is tensor:
                return index, "weight"
        return -1, "?"

    def _handed_by(self, op, backward):
        """(spec op index, label) of the te.ops op that handed a tensor on: a basic op of
        the path itself, or of a fused op the basic op whose side the tensor leaves by (its
        first in backward: the input gradient; its last in forward: the output); label
        "grad_input" or "output". (-1, "?") where the path has no such op."""
        basics = list(getattr(op, "basic_ops", None) or [op])
        side = basics[0] if backward else basics[-1]
        for index, path_op in self.path.ops:
            # A spec op may be a te.ops composite (te.ops.Linear: BasicLinear and Bias).
            members = list(getattr(path_op, "basic_ops", None) or [])
            if path_op is side or any(member is side for member in members):
                return index, "grad_input" if backward else "output"
        return -1, "?"

    def held_weights(self, ops, case):
        # The weight parameter itself, as the caller holds it; copies where exact.
        out = []
        for op_case in case.catalog_ops:
            if op_case.name != "Linear":
                continue
            weight = getattr(ops[op_case.index], "weight", None)
            if weight is None or not _is_quantized(weight):
                continue
            out.append(
                HeldWeight(op=op_case.index, tensor=weight, copies=transposed_copies(weight))
            )
        return out

    def _resolve(self, callee):
        if callee.startswith("te."):
            target = self.te
            for part in callee.split(".")[1:]:
                target = getattr(target, part)
            return target
        return getattr(self.ext, callee)

    def create_op(self, op_case, case, device):
        callee, args, kwargs = op_recipe(
            op_case.name,
            op_case.attrs,
            op_case.input_shape,
            op_case.output_style,
            op_case.global_input_shape,
        )
        # Deferred initialisation: the op built on "meta", then materialised (_materialize).
        values = {DEVICE: torch.device("meta") if case.deferred_init else device, DTYPE: case.dtype}
        kwargs = {k: values.get(v, v) if isinstance(v, Symbol) else v for k, v in kwargs.items()}
        with self._param_scope(op_case, case):
            op = self._resolve(callee)(*args, **kwargs)
            if case.deferred_init:
                _materialize(op, op_case.name)
        params = [p.to(device=device, dtype=case.dtype) for p in op_case.params]
        copy_param_values(op, op_case.name, params)
        set_param_requires_grad(op, op_case.name, op_case.param_requires_grad)
        attach_main_grads(op, op_case.name)
        self.path.names[id(op)] = op_case.name
        self.path.ops.append((op_case.index, op))
        return op

    def _param_scope(self, op_case, case):
        """Where an op of the case is built: with case.quantized_params a Linear inside
        quantized_model_init with the path's recipe (its weight a quantized tensor: a
        QuantizedTensor of the recipe's quantizer, basic_linear.py: reset_parameters), every
        other op as it is."""
        if not getattr(case, "quantized_params", False) or op_case.name != "Linear":
            return contextlib.nullcontext()
        if self.path.te_recipe is None:
            raise NotImplementedError("quantized_params: the case has no recipe to quantize with")
        return te_recipes.quantized_model_init(self.te, self.path.te_recipe)

    def make_boundary(self):
        return self.ext.Boundary()

    def call_standalone(self, op, x, extras):
        op(x, *extras)  # op.py: BasicOperation.forward builds a transient OperationFuser

    def bind_input(self, op, slot, channel):
        op.set_extra_input_channel(slot, channel)  # op.py: BasicOperation.set_extra_input_channel

    def bind_output(self, op, slot, channel, output_to_caller):
        op.set_extra_output_channel(slot, channel, output_to_caller=output_to_caller)

    def is_locked(self, op):
        return bool(getattr(op, "_extra_tensor_channels_locked", False))  # op.py: __init__

    def make_sequential(self, modules):
        return self.te.ops.Sequential(*modules)

    @contextlib.contextmanager
    def _call_scope(self):
        """Where a Sequential of the path is called: every Sequential of the path (a second
        one over the same ops, the fresh ops of a checkpoint round trip) in the path's
        quantization state, as in one process; a scratch run's in its own (scratch_scope).
        A call under recipe_off_scope runs outside the autocast, as a user's call with FP8
        disabled (TE's fuser then runs without a recipe), in the same state."""
        if self.path is None or self.path.te_recipe is None:
            yield
            return
        state = self.path.scratch_state or self.path.fp8_state
        with te_recipes.fp8_state(state):
            if self.path.recipe_off:
                yield
            else:
                with self.te.autocast(enabled=True, recipe=self.path.te_recipe):
                    yield

    def forward(self, seq, x, extras):
        with self._call_scope():
            out = seq(x, *extras)
        return list(out) if isinstance(out, tuple) else [out]

    def plan_without_forward(self, seq, x, extras):
        """A te.ops.Sequential of fusible ops alone plans as its first forward does, up to
        the plans: Sequential.forward makes its module groups (_make_module_groups: here one
        OperationFuser), whose __call__ checks the extra inputs' count, places them in
        their basic ops' slots, reads the autocast's recipe and grad mode and calls
        maybe_fuse_ops, which makes both passes' plans (sequential.py: Sequential.forward;
        fuser.py: OperationFuser.__call__, maybe_fuse_ops) before any op runs. The same
        steps are taken here, in the call's scope, and nothing after them. A chain of
        Sequentials or a Sequential holding another module (several groups: a later
        group's input and its requires-grad come from running the earlier ones) is not
        planned so."""
        fusible = self.te.ops.FusibleOperation
        if not isinstance(seq, self.te.ops.Sequential):
            return False
        modules = list(seq)
        if not modules or not all(isinstance(m, fusible) for m in modules):
            return False
        from transformer_engine.pytorch.quantization import FP8GlobalStateManager

        with self._call_scope():
            if seq._module_groups is None:
                seq._module_groups = seq._make_module_groups(modules)
            (fuser,) = seq._module_groups
            if len(extras) != fuser.num_extra_inputs:
                raise ValueError(
                    f"Expected {fuser.num_extra_inputs} extra inputs but got {len(extras)}"
                )
            slots = [[None] * op.num_extra_inputs for op in fuser._basic_ops]
            for tensor, (op_idx, input_idx) in zip(extras, fuser._external_extra_input_slots):
                slots[op_idx][input_idx] = tensor
            recipe = (
                FP8GlobalStateManager.get_fp8_recipe()
                if FP8GlobalStateManager.is_fp8_enabled()
                else None
            )
            fuser.maybe_fuse_ops(torch.is_grad_enabled(), recipe, x, slots)
        return True

    def _fusers(self, seq):
        """The OperationFusers te.ops.Sequential built at its first forward
        (sequential.py: Sequential._module_groups)."""
        groups = getattr(seq, "_module_groups", None) or []
        return [g for g in groups if isinstance(g, self.operation_fuser)]

    def _returned_twice(self, seq, outputs):
        """Per fuser, the (op, slot) public extra outputs whose tensor the fuser returned more
        than once (as its main output too, or as another public extra output): TE returns
        the very tensor again (fuser.py: _OperationFuserAutogradFunction.forward, `return
        x, *extra_outputs_flat`; MakeExtraOutput hands back its input), and PyTorch then
        delivers the cotangents of all those outputs to the last of them, so no such slot
        receives its own gradient."""
        groups = getattr(seq, "_module_groups", None) or []
        extras = iter(outputs[1:])
        out = []
        for k, group in enumerate(groups):
            if not isinstance(group, self.operation_fuser):
                continue
            after = groups[k + 1] if k + 1 < len(groups) else None
            main = getattr(after, "last_input", None) if after is not None else outputs[0]
            slots = list(group._public_extra_output_slots)  # fuser.py: OperationFuser.__init__
            public = [next(extras, None) for _ in slots]
            returned = [main] + public
            twice = {
                slot
                for slot, t in zip(slots, public)
                if t is not None and sum(r is t for r in returned) > 1
            }
            out.append(twice)
        return out

    def after_forward(self, seq, case, ops, outputs):
        """Observes the gradient each channel producer's slot receives: the fuser sums the
        caller's gradient and every consumer's into basic_op_grad_extra_outputs before the
        producer's backward group runs (fuser.py: _OperationFuserAutogradFunction.backward).
        That total is visible only where the producer's group contains none of the
        channel's consumers (a fused op owning both ends applies it internally), and where
        the slot's tensor was not returned twice (see _returned_twice)."""
        recorded = [dict() for _ in case.fusers]
        self.path.channel_grads = recorded
        returned_twice = self._returned_twice(seq, outputs)
        for f, (fuser, members) in enumerate(zip(self._fusers(seq), case.fusers)):
            twice = returned_twice[f] if f < len(returned_twice) else set()
            for op, idxs in fuser._backward_ops:
                records = []
                for p in idxs:
                    kinds = case.ops[members[p]].extra_output_kinds
                    for s, channel in enumerate(fuser._basic_op_extra_output_channels[p]):
                        if channel is None or kinds[s] != "float" or (p, s) in twice:
                            continue
                        if any(c in idxs for c in fuser._basic_op_extra_output_consumers[p][s]):
                            continue
                        records.append((idxs.index(p), s, channel))
                if records:
                    self._observe(op, records, recorded[f])

    @staticmethod
    def _observe(op, records, store):
        original = op.fuser_backward

        def observed(basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
            for k, s, channel in records:
                grad = basic_op_grad_extra_outputs[k][s]
                if grad is not None:
                    # A copy: MakeExtraOutput(in_place) adds into this tensor afterwards.
                    store[channel] = grad.detach().clone()
            return original(
                basic_op_ctxs, grad_output, basic_op_grad_extra_outputs=basic_op_grad_extra_outputs
            )

        op.fuser_backward = observed

    def param_leaves(self, op, op_case):
        return param_leaves(op, op_case.name)

    def set_params(self, op, op_case, values):
        # An optimizer step writes TE's parameters in place (their layout: te/params.py). A
        # quantized weight (quantized_params) takes the high-precision values through its
        # copy_ (quantized_tensor.py: QuantizedTensor.__torch_dispatch__ -> quantize_), which
        # quantizes them again into its row-wise and column-wise data.
        copy_param_values(op, op_case.name, values)

    def delayed_states(self, ops, case):
        # op.py: BasicOperation._fp8_metas[mode]["scaling_fwd" | "scaling_bwd"], a
        # DelayedScalingRecipeState: scale [n], amax_history [len, n]; BasicLinear's forward
        # quantizers are (input, weight), GroupedLinear's (input, weight) per group, the
        # backward ones grad_output (per group).
        recipe = recipes.parse_recipe(case.spec.get("recipe"))
        if recipe is None or recipe.name != "DelayedScaling":
            return {}
        options = recipe.options
        out = {}
        for op_case in case.catalog_ops:
            metas = getattr(ops[op_case.index], "_fp8_metas", None) or {}
            for pass_, key in (("forward", "scaling_fwd"), ("backward", "scaling_bwd")):
                meta = metas.get(pass_) or {}
                state = meta.get(key)
                if state is None or not hasattr(state, "amax_history"):
                    continue
                roles = ("input", "weight") if pass_ == "forward" else ("grad_output",)
                for k in range(state.scale.numel()):
                    role, group = roles[k % len(roles)], k // len(roles)
                    out[(op_case.index, pass_, role, group)] = state_entry(
                        op_case.index,
                        pass_,
                        role,
                        group,
                        state.amax_history[:, k],
                        state.scale[k],
                        fp8_max=FP8_MAX[recipe.format_for(pass_ == "backward")],
                        margin=options["margin"],
                        algo=options["amax_compute_algo"],
                    )
        return out

    def load_state(self, op, state):
        # The checkpoint is the one this process saved a moment before: loading it opts in to
        # unpickling a DelayedScaling op's extra state (TE's _extra_state.py), as its user does.
        saved = os.environ.get(_UNSAFE_PICKLE)
        os.environ[_UNSAFE_PICKLE] = "1"
        try:
            op.load_state_dict(state)
        finally:
            if saved is None:
                del os.environ[_UNSAFE_PICKLE]
            else:
                os.environ[_UNSAFE_PICKLE] = saved

    def param_grads(self, op, op_case, leaf_grads):
        leaves = param_leaves(op, op_case.name)
        return model_param_grads(op, op_case.name, {id(t): g for t, g in zip(leaves, leaf_grads)})

    def after_backward(self, ops):
        for op in ops:
            if op is not None and hasattr(op, "need_backward_dw"):
                finish_weight_gradients(op)

    def recorded_channel_grads(self, case):
        return self.path.channel_grads

    def writer_scope(self, seq, case, ops, watch):
        # driver.py: te_writer_scope wraps each group of TE's fusers' plans (op.py:
        # BasicOperation tells a basic op computing in op_forward/op_backward).
        return te_writer_scope(
            self.operation_fuser, case, ops, watch, basic_operation=self.te.ops.BasicOperation
        )

    def plans(self, seq, case, ops):
        out = []
        for fuser, members in zip(self._fusers(seq), case.fusers):
            entry = {}
            for key, attr in (("forward", "_forward_ops"), ("backward", "_backward_ops")):
                groups = []
                for op, idxs in getattr(fuser, attr, None) or []:
                    fused = bool(op.is_fused_op)
                    name = (
                        getattr(op, "fusion_name", type(op).__name__)
                        if fused
                        else case.ops[members[idxs[0]]].name
                    )
                    groups.append(
                        {
                            "name": name,
                            "begin": members[idxs[0]],
                            "end": members[idxs[-1]] + 1,
                            "fused": fused,
                        }
                    )
                entry[key] = groups
            out.append(entry)
        return out

    def classify(self, exc):
        return classify(exc)

    def left_locked(self, seq, ops, locked_before, phase):
        # te.ops.Sequential builds its fusers at the first forward (lazy_fuser_construction);
        # _make_module_groups constructs them in order and each OperationFuser.__init__ locks
        # its ops once it validated, so a later fuser's routing error leaves the earlier
        # fusers' ops locked. _module_groups stays None when that happened.
        if phase != "forward" or seq is None or getattr(seq, "_module_groups", None) is not None:
            return []
        # A chain of Sequentials (driver.Chain, case.several_sequentials): those before the
        # failed one built their fusers and ran, so their ops are locked as they should be;
        # only the ops of a Sequential without its groups count.
        parts = getattr(seq, "sequentials", None)
        failed = None
        if parts is not None:
            failed = {
                id(module)
                for part in parts
                if getattr(part, "_module_groups", None) is None
                for module in part.modules()
            }
        return [
            i
            for i, op in enumerate(ops)
            if op is not None
            and self.is_locked(op)
            and not locked_before[i]
            and isinstance(op, self.te.ops.BasicOperation)
            and (failed is None or id(op) in failed)
        ]


def _is_quantized(t):
    """Whether `t` is a quantized tensor object (TE's QuantizedTensor: a dequantize() of its
    class's own; torch.Tensor's is for torch's quantized dtypes)."""
    method = getattr(type(t), "dequantize", None)
    return callable(method) and method is not torch.Tensor.dequantize


class TEBackend:
    name = "te"

    def __init__(self, device=None):
        """`device`: where te.ops run, CUDA's current device unless given (the tests run TE's
        Python code on the CPU over a stubbed extension; see tests/te_stub.py)."""
        # grouped_linear.py: GroupedLinear.__init__ honours single_grouped_weight/bias only
        # when this variable is set (utils.py: resolve_grouped_linear_single_param_flags);
        # the option is a dimension of the case, so it is set for the whole process.
        os.environ.setdefault("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "1")
        import transformer_engine
        import transformer_engine.pytorch as te
        from transformer_engine.pytorch.ops.fuser import OperationFuser

        from . import extensions  # imports TE: only here

        self.te = te
        self.te_version = getattr(transformer_engine, "__version__", "unknown")
        self.ext = extensions
        extensions.register_fusions()
        self.operation_fuser = OperationFuser
        self.builder = TEBuilder(te, self.ext, OperationFuser, device)

    def fusions(self):
        out = []
        for attr, pass_name in FUSION_PASSES:
            for func in getattr(self.operation_fuser, attr):
                name = fusion_name(func)
                if getattr(func, "gradfuzz_fusion_name", None):
                    implementation = "gradfuzz_adapter.te.extensions.FusedResidual"
                else:
                    implementation = f"te.ops.fused.{name}"
                out.append({"name": name, "pass": pass_name, "implementation": implementation})
        return out

    def single_grouped_params(self):
        """Whether GroupedLinear's single grouped parameters run here: they need the
        grouped-tensor path (grouped_linear.py: GroupedLinear.fuser_forward raises
        otherwise), which grouped_linear.py: is_op_fuser_grouped_tensor_path_supported
        allows for bf16/fp16 on sm90+ with a recent enough cuBLASLt (not the H200 image of
        2026-11, whose cuBLASLt is older than 13.4)."""
        check = getattr(self.te.ops, "is_op_fuser_grouped_tensor_path_supported", None)
        if check is None or not torch.cuda.is_available():
            return False
        try:
            return any(check(None, dtype) for dtype in (torch.bfloat16, torch.float16))
        except Exception:  # noqa: BLE001 - it queries the device; no answer means no
            return False

    def max_world_size(self):
        """Ranks a distributed case may have: one per visible GPU (a CPU-bound backend, the
        stubbed one of the tests: as many as the torch backend's gloo ranks)."""
        if self.builder.fixed_device == "cpu":
            return int(os.environ.get("GRADFUZZ_MAX_WORLD_SIZE", "8"))
        return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1

    def hello(self):
        options = te_options(self.single_grouped_params())
        capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
        accumulation = te_recipes.gemm_accumulation(capability)
        ops = {}
        for name, op in OPS.items():
            if op.custom:
                implementation = f"gradfuzz_adapter.te.extensions.{name} (a te.ops.BasicOperation)"
            else:
                implementation = op.implementation
            ops[name] = {
                "implementation": implementation,
                "options": options.get(name, {}),
                "output_styles": ["vector", "generator"] if op.custom else ["vector"],
            }
        return {
            "backend": "te",
            "protocol": 1,
            "versions": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "transformer_engine": self.te_version,
            },
            "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "capabilities": {
                "devices": ["cuda"],
                "dtypes": ["float32", "bfloat16", "float16"],
                "ops": ops,
                "fusions": self.fusions(),
                "deviations": ["surplus_extra_inputs_ignored", "lazy_fuser_construction"],
                # A channel's total gradient is seen only where the producer's backward group
                # holds none of its consumers (TEBuilder.after_forward): the oracle judges te
                # on the channels it reports.
                "exposes_all_channels": False,
                # TE's quantizers are the reference's (with the option values TE honours,
                # te/recipes.py); its FP8 GEMMs accumulate as Hopper's MMA does, which the
                # oracle takes as evidence where the device is one whose accumulation is
                # pinned (docs/TE.md): there the tight FP8 rule holds TE.
                "fp8_reference_exact": accumulation is not None,
                "fp8_gemm_accumulation": accumulation,
                "recipes": te_recipes.capabilities(self.te),
                "faults": faults.capabilities(FAULTS),
                # Distributed cases: one rank per visible GPU, NCCL (ranks.py); on the CPU
                # (TE's Python over a stubbed extension, tests/te_stub.py) gloo ranks.
                "max_world_size": self.max_world_size(),
                # The usage script's steps (driver.py runs them through the builder).
                "usage": list(USAGE),
            },
        }

    def run(self, case, paths, tensors, fault=None):
        """The paths' results; `fault`: one of capabilities.faults (te/faults.py), planted
        for this request only. A recipe hello could not have offered, or an unknown fault,
        is the request's error (ValueError)."""
        self.builder.recipe = recipes.parse_recipe(case.spec.get("recipe"))
        with faults.planted(FAULTS, fault):
            return run_paths(self.builder, case, paths, tensors)
