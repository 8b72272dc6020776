"""Issue 26 item 2 on the te backend's checks (invariants.py: TensorChecks), over the
stubbed TE (tests/te_stub.py): TE's quantizers, tensors and dequantize run for real; the
cast kernel (tex.quantize) is a torch stand-in written here, as the kernel is taken to
cast (fp32 product, saturated, round to nearest even; per-tensor scale from the amax,
power-of-two block scales). So these tests show the recording, the layouts read and the
planted faults, not TE's kernels."""

import pytest
import te_stub
import torch

pytestmark = pytest.mark.skipif(te_stub.available() is not None, reason=str(te_stub.available()))

E4M3_MAX = 448.0


@pytest.fixture(scope="module")
def te():
    return te_stub.install()


@pytest.fixture(autouse=True, params=["cloned", "buffered"])
def copies(request, monkeypatch):
    """Each test twice: the tensors' copies cloned on the host, and put in one byte buffer
    and unpacked from it, as a device's are (invariants.py: _Capture)."""
    from gradfuzz_adapter import invariants

    if request.param == "buffered":
        monkeypatch.setattr(invariants._Capture, "ON_HOST", ())
    return request.param


def _cast(x, scale):
    return (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def _quantize_stand_in(tensor, quantizer, out=None, noop_flag=None):
    """tex.quantize for per-tensor and block quantizers, E4M3 only."""
    from transformer_engine.pytorch.tensor.float8_blockwise_tensor import (
        Float8BlockQuantizer,
        Float8BlockwiseQTensor,
    )
    from transformer_engine.pytorch.tensor.float8_tensor import (
        Float8CurrentScalingQuantizer,
        Float8Tensor,
    )

    x2 = tensor.reshape(-1, tensor.shape[-1])
    m, n = x2.shape
    if isinstance(quantizer, Float8BlockQuantizer):
        b = quantizer.block_len
        two_d = quantizer.block_scaling_dim == 2

        def scales(rows, cols):
            pad = torch.nn.functional.pad(x2.float(), (0, (-n) % cols, 0, (-m) % rows))
            tiles = pad.reshape(pad.shape[0] // rows, rows, pad.shape[1] // cols, cols)
            amax = tiles.abs().amax(dim=(1, 3))
            _, e = torch.frexp(E4M3_MAX / torch.where(amax == 0, torch.ones_like(amax), amax))
            s = torch.ldexp(torch.full_like(amax, 0.5), e).float()
            return torch.where(amax == 0, torch.ones_like(s), s)  # [tiles_m, tiles_n]

        def expand(s, rows, cols):
            return s.repeat_interleave(rows, 0)[:m].repeat_interleave(cols, 1)[:, :n]

        def padded(s, width):
            return torch.nn.functional.pad(s, (0, (-s.shape[1]) % 4))[:, : max(width, 0) or None]

        if two_d:
            s = scales(b, b)
            rows = _cast(x2, expand(s, b, b))
            row_inv = torch.nn.functional.pad(1 / s, (0, (-s.shape[1]) % 4))
            col_inv = torch.nn.functional.pad((1 / s).t(), (0, (-s.shape[0]) % 4))
            cols = rows.t().contiguous()
        else:
            sr = scales(1, b)  # [m, tiles_n]
            sc = scales(b, 1)  # [tiles_m, n]
            rows = _cast(x2, expand(sr, 1, b))
            cols = _cast(x2, expand(sc, b, 1)).t().contiguous()
            row_inv = torch.nn.functional.pad((1 / sr).t(), (0, (-m) % 4))
            col_inv = torch.nn.functional.pad(1 / sc, (0, (-n) % 4))
        return Float8BlockwiseQTensor(
            shape=tensor.shape,
            dtype=tensor.dtype,
            rowwise_data=rows.reshape(tensor.shape),
            rowwise_scale_inv=row_inv.contiguous(),
            columnwise_data=cols,
            columnwise_scale_inv=col_inv.contiguous(),
            fp8_dtype=quantizer.dtype,
            quantizer=quantizer,
            is_2D_scaled=two_d,
            requires_grad=False,
            device=tensor.device,
        )
    if isinstance(quantizer, Float8CurrentScalingQuantizer):
        scale = torch.tensor(E4M3_MAX, dtype=torch.float32) / x2.abs().max().float()
    else:
        scale = quantizer.scale.reshape(()).float()
    data = _cast(x2, scale)
    return Float8Tensor(
        shape=tensor.shape,
        dtype=tensor.dtype,
        data=data.reshape(tensor.shape),
        fp8_scale_inv=torch.reciprocal(scale).reshape(1),
        fp8_dtype=quantizer.dtype,
        data_transpose=data.t().contiguous() if quantizer.columnwise_usage else None,
        quantizer=quantizer,
        requires_grad=False,
        device=tensor.device,
    )


def _quantizers():
    from transformer_engine.pytorch.constants import DType
    from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer
    from transformer_engine.pytorch.tensor.float8_tensor import (
        Float8CurrentScalingQuantizer,
        Float8Quantizer,
    )

    e4m3 = DType.kFloat8E4M3
    return {
        "delayed": Float8Quantizer(
            torch.tensor([37.3]), torch.zeros(1), e4m3, rowwise=True, columnwise=True
        ),
        "current": Float8CurrentScalingQuantizer(e4m3, "cpu", rowwise=True, columnwise=True),
        "block1d": Float8BlockQuantizer(e4m3, rowwise=True, columnwise=True, block_scaling_dim=1),
        "block2d": Float8BlockQuantizer(e4m3, rowwise=True, columnwise=True, block_scaling_dim=2),
    }


def _checks(te, kind, fault=None, dtype=torch.bfloat16):
    from unittest import mock

    from gradfuzz_adapter import faults
    from gradfuzz_adapter.invariants import TensorChecks, te_classes
    from gradfuzz_adapter.te.backend import transposed_copies
    from gradfuzz_adapter.te.faults import FAULTS

    tex = __import__("transformer_engine_torch")
    quantizer = _quantizers()[kind]
    checks = TensorChecks(te_classes(), lambda q, t: (7, "forward.0"), transposed_copies)
    torch.manual_seed(0)
    x = (torch.randn(130, 260) * torch.rand(130, 1) * 5).to(dtype)
    with mock.patch.object(tex, "quantize", _quantize_stand_in, create=True):
        with faults.planted(FAULTS, fault), checks.recording():
            q = quantizer(x)
    assert q is not None
    return checks.take()


@pytest.mark.parametrize("kind", ["delayed", "current", "block1d", "block2d"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_clean_tensors_pass_every_check(te, kind, dtype):
    verdict = _checks(te, kind, dtype=dtype)
    assert verdict == {"checked": 1, "violations": []}


@pytest.mark.parametrize(
    "fault, kind, what",
    [
        ("te-fp8-columnwise-copy-off-by-one-code", "current", "columnwise"),
        ("te-fp8-columnwise-copy-off-by-one-code", "delayed", "columnwise"),
        ("te-fp8-codes-rounded-toward-zero", "current", "codes"),
        ("te-fp8-codes-rounded-toward-zero", "delayed", "codes"),
        ("te-fp8-dequantize-scale-inv-bf16", "current", "dequantize"),
        ("te-fp8-dequantize-scale-inv-bf16", "delayed", "dequantize"),
        ("te-fp8-block-columnwise-one-code-off", "block1d", "columnwise"),
        # 2D: the column-wise codes are checked as the row-wise ones transposed and as their
        # own cast of x.
        ("te-fp8-block-columnwise-one-code-off", "block2d", "columnwise codes"),
    ],
)
def test_each_te_fault_is_seen_by_its_check(te, fault, kind, what):
    verdict = _checks(te, kind, fault=fault)
    assert verdict["checked"] == 1
    assert {v["what"] for v in verdict["violations"]} == set(what.split()), verdict
    v = verdict["violations"][0]
    assert v["op"] == 7 and v["quantizer"] == "quantized_tensor[forward.0]"


def test_recording_restores_the_entry_points_and_never_raises(te):
    from gradfuzz_adapter.invariants import TensorChecks, te_classes
    from gradfuzz_adapter.te.backend import transposed_copies

    classes = te_classes()
    before = classes["Quantizer"].__dict__["quantize"]
    checks = TensorChecks(classes, lambda q, t: (-1, "?"), transposed_copies)
    with checks.recording():
        assert classes["Quantizer"].__dict__["quantize"] is not before
        # The stub's kernel returns a mock: not a format checked here, nothing counted.
        _quantizers()["current"](torch.ones(4, 4))
    assert classes["Quantizer"].__dict__["quantize"] is before
    assert checks.take() == {"checked": 0, "violations": []}


def _handed_on(te, fault=None):
    """What TensorChecks sees of a per-tensor FP8 tensor an op hands on (a cast inside a
    fused kernel, made here by the stand-in outside the recording), the op's
    fuser_backward being `fault`'s wrapper of one that returns it."""
    from gradfuzz_adapter.invariants import TensorChecks, te_classes
    from gradfuzz_adapter.te.backend import transposed_copies
    from gradfuzz_adapter.te.faults import FAULTS

    torch.manual_seed(1)
    x = torch.randn(32, 48, dtype=torch.bfloat16) * 3
    q = _quantize_stand_in(x, _quantizers()["delayed"])
    checks = TensorChecks(
        te_classes(), lambda q, t: (-1, "?"), transposed_copies, lambda op, bw: (2, "grad_input")
    )

    def fuser_backward(self, *args, **kwargs):
        return q, [()], [()]

    if fault is not None:
        fuser_backward = FAULTS[fault].replace(fuser_backward)
    with checks.recording():
        checks._checking_handed_on(fuser_backward)(object())
    return checks.take()


def test_a_tensor_an_op_hands_on_is_checked_without_its_codes(te):
    assert _handed_on(te) == {"checked": 1, "violations": []}
    verdict = _handed_on(te, "te-backward-activation-bias-columnwise-one-code-off")
    assert verdict["checked"] == 1
    assert [v["what"] for v in verdict["violations"]] == ["columnwise"], verdict
    assert verdict["violations"][0]["quantizer"] == "quantized_tensor[grad_input]"
    assert verdict["violations"][0]["op"] == 2


def test_every_op_method_is_wrapped_while_recording_and_restored(te):
    from transformer_engine.pytorch.ops.fused import BackwardActivationBias

    from gradfuzz_adapter.invariants import TensorChecks, te_classes
    from gradfuzz_adapter.te.backend import transposed_copies

    before = BackwardActivationBias.__dict__["fuser_backward"]
    checks = TensorChecks(te_classes(), lambda q, t: (-1, "?"), transposed_copies)
    names = {(cls.__name__, name) for cls, name in checks._op_methods()}
    assert ("BackwardActivationBias", "fuser_backward") in names
    assert ("BasicOperation", "fuser_forward") in names
    with checks.recording():
        assert BackwardActivationBias.__dict__["fuser_backward"] is not before
    assert BackwardActivationBias.__dict__["fuser_backward"] is before


def test_a_tensor_checked_as_it_was_made_is_not_counted_again(te):
    from unittest import mock

    from gradfuzz_adapter.invariants import TensorChecks, te_classes
    from gradfuzz_adapter.te.backend import transposed_copies

    tex = __import__("transformer_engine_torch")
    checks = TensorChecks(te_classes(), lambda q, t: (0, "forward.0"), transposed_copies)
    with mock.patch.object(tex, "quantize", _quantize_stand_in, create=True):
        with checks.recording():
            q = _quantizers()["current"](torch.randn(16, 16))
            checks._checking_handed_on(lambda self: (q, []))(None)
    assert checks.take() == {"checked": 1, "violations": []}


def _made_then_overwritten(kind, fault):
    """take() of three tensors recorded by one TensorChecks, whose buffers (and x) are
    overwritten after they were made and before the take."""
    from unittest import mock

    from gradfuzz_adapter import faults
    from gradfuzz_adapter.invariants import TensorChecks, te_classes
    from gradfuzz_adapter.te.backend import transposed_copies
    from gradfuzz_adapter.te.faults import FAULTS

    tex = __import__("transformer_engine_torch")
    checks = TensorChecks(te_classes(), lambda q, t: (3, "forward.1"), transposed_copies)
    torch.manual_seed(2)
    made = []
    with mock.patch.object(tex, "quantize", _quantize_stand_in, create=True):
        with faults.planted(FAULTS, fault), checks.recording():
            for k in range(3):
                x = torch.randn(40, 136) * (k + 1)
                made.append(_quantizers()[kind](x))
                x.zero_()
    for q in made:
        for name in ("_data", "_transpose", "_rowwise_data", "_columnwise_data"):
            buffer = getattr(q, name, None)
            if buffer is not None:
                buffer.fill_(0x7F)
    verdict = checks.take()
    assert checks.take() == {"checked": 0, "violations": []}
    return verdict


@pytest.mark.parametrize("kind", ["delayed", "current", "block1d", "block2d"])
def test_tensors_are_checked_as_they_were_made_when_taken_later(te, kind):
    # The checks run at take(), on copies taken as each tensor was made: TE freeing or
    # overwriting a tensor's buffers afterwards (prepare_for_saving, a reused workspace)
    # changes nothing, and a faulty cast is seen in each tensor made with it.
    assert _made_then_overwritten(kind, None) == {"checked": 3, "violations": []}
    fault = {
        "delayed": "te-fp8-codes-rounded-toward-zero",
        "current": "te-fp8-codes-rounded-toward-zero",
        "block1d": "te-fp8-block-columnwise-one-code-off",
        "block2d": "te-fp8-block-columnwise-one-code-off",
    }[kind]
    verdict = _made_then_overwritten(kind, fault)
    assert verdict["checked"] == 3
    assert len(verdict["violations"]) >= 3, verdict
    assert {v["op"] for v in verdict["violations"]} == {3}
