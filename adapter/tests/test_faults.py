"""Planted faults (docs/BACKENDS.md Protocol 2 `fault`): the switch plants one replacement
for one request and restores the original even on error; each torch fault changes a
result of a small recipe case and leaves it unchanged when off; each te fault patches and
restores its target in TE's Python code, and those that need no kernel show on the
stubbed TE as the wrong value or missing gradient they are meant to be."""

import types

import pytest
import torch
from helpers import judge, spec

from gradfuzz_adapter import faults
from gradfuzz_adapter.te import faults as te_faults
from gradfuzz_adapter.torch_backend import faults as torch_faults
from gradfuzz_adapter.torch_backend import fp8
from gradfuzz_adapter.torch_backend.backend import TorchBackend

# ----------------------------------------------------------------------------------------
# The switch


def test_planted_swaps_the_target_for_the_body_and_restores_it_on_error():
    original = fp8.dequantize
    seen = []

    def replace(orig):
        assert orig is original
        return lambda q, scale: 2 * orig(q, scale)

    fault = faults.Fault(
        "f", "doubles dequantize", "gradfuzz_adapter.torch_backend.fp8.dequantize", replace
    )
    with pytest.raises(KeyError):
        with faults.planted({"f": fault}, "f"):
            seen.append(fp8.dequantize)
            raise KeyError("a failing request")
    assert seen[0] is not original and fp8.dequantize is original
    with faults.planted({"f": fault}, None):
        assert fp8.dequantize is original
    with pytest.raises(ValueError, match=r"unknown fault 'g'; this backend's faults: f"):
        with faults.planted({"f": fault}, "g"):
            pass


def test_wrap_keeps_static_and_class_methods_what_they_are():
    class Owner:
        @staticmethod
        def s(x):
            return x

        @classmethod
        def c(cls, x):
            return (cls, x)

    doubled = faults.wrap(vars(Owner)["s"], lambda f: lambda x: 2 * f(x))
    assert isinstance(doubled, staticmethod) and doubled.__func__(3) == 6
    tagged = faults.wrap(vars(Owner)["c"], lambda f: lambda cls, x: f(cls, x + 1))
    assert isinstance(tagged, classmethod) and tagged.__func__(Owner, 1) == (Owner, 2)


def test_every_faults_capability_names_an_existing_target():
    for catalog in (torch_faults.FAULTS, te_faults.FAULTS):
        for name, fault in catalog.items():
            entry = fault.capability()
            expected = {"name": name, "description": fault.description, "target": fault.target}
            if fault.world_size:
                # A fault of the ranks' communication: the selftest draws cases of its world.
                expected["world_size"] = fault.world_size
            assert entry == expected
            assert len(entry["description"]) > 40, name
    assert all(n.startswith("torch-") for n in torch_faults.FAULTS)
    for fault in torch_faults.FAULTS.values():
        owner, attr = faults.resolve(fault.target)
        assert attr in vars(owner)


# ----------------------------------------------------------------------------------------
# The torch backend's faults, on its recipe emulation


@pytest.fixture(scope="module")
def backend():
    return TorchBackend()


LINEAR = [{"name": "Linear", "attrs": {"out": 6}}]
HYBRID = {"name": "Float8CurrentScaling", "fp8_format": "HYBRID"}


def run_with(backend, case_spec, fault=None):
    """The first path of `case_spec` on the torch backend with `fault` planted."""
    from gradfuzz_adapter.case import decode_case
    from gradfuzz_adapter.client import make_request, path_result
    from gradfuzz_adapter.protocol import TensorList

    header, tensors = make_request(case_spec)
    case = decode_case(header, tensors)
    out = TensorList()
    results = backend.run(case, header["paths"], out, fault=fault)
    return path_result(results[0], out.tensors)


def relative_error(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def torch_case(recipe, **extra):
    return spec(LINEAR, shape=(4, 8), dtype="float32", seed=7, recipe=recipe, **extra)


@pytest.mark.parametrize(
    "fault, recipe, forward_changes, backward_changes",
    [
        ("torch-fp8-e5m2-grad-read-as-e4m3", HYBRID, False, True),
        ("torch-fp8-scale-inv-applied-twice", HYBRID, True, True),
        ("torch-fp8-transposed-copy-read-rowwise", HYBRID, True, True),
        ("torch-fp8-dgrad-scaled-down", HYBRID, False, True),
    ],
)
def test_a_torch_fault_changes_a_small_case_by_far_more_than_fp8_noise(
    backend, fault, recipe, forward_changes, backward_changes
):
    clean = run_with(backend, torch_case(recipe))
    faulty = run_with(backend, torch_case(recipe), fault)
    again = run_with(backend, torch_case(recipe))
    for key in ("outputs", "grad_input"):
        want = clean[key][0] if key == "outputs" else clean[key]
        got = faulty[key][0] if key == "outputs" else faulty[key]
        after = again[key][0] if key == "outputs" else again[key]
        assert torch.equal(after, want), f"{key} changed after the fault was switched off"
        changes = forward_changes if key == "outputs" else backward_changes
        if changes:
            # FP8 E4M3 rounding is at most 2^-4 relative per element; these are gross.
            assert relative_error(got, want) > 0.25, (fault, key)
        else:
            assert torch.equal(got, want), (fault, key)


def test_e5m2_read_as_e4m3_needs_hybrid(backend):
    e4m3 = {"name": "Float8CurrentScaling", "fp8_format": "E4M3"}
    clean = run_with(backend, torch_case(e4m3))
    faulty = run_with(backend, torch_case(e4m3), "torch-fp8-e5m2-grad-read-as-e4m3")
    assert torch.equal(clean["grad_input"], faulty["grad_input"])


def test_delayed_forward_scale_with_e5m2_max_shows_from_the_second_call(backend):
    delayed = {"name": "DelayedScaling", "fp8_format": "E4M3", "options": {"amax_history_len": "1"}}
    case_spec = torch_case(delayed, repeat_calls=[{}])
    clean = run_with(backend, case_spec)
    faulty = run_with(backend, case_spec, "torch-delayed-forward-scale-e5m2-max")
    assert torch.equal(clean["outputs"][0], faulty["outputs"][0])  # call 1: scale 1 either way
    got, want = faulty["repeats"][0]["outputs"][0], clean["repeats"][0]["outputs"][0]
    assert relative_error(got, want) > 0.5  # call 2: everything past 448/57344 amax saturates
    assert torch.equal(run_with(backend, case_spec)["repeats"][0]["outputs"][0], want)


def test_the_torch_backend_lists_its_faults_and_refuses_an_unknown_one(backend):
    caps = backend.hello()["capabilities"]
    assert [f["name"] for f in caps["faults"]] == list(torch_faults.FAULTS)
    assert caps["faults"][0]["target"] == "gradfuzz_adapter.torch_backend.fp8.cast_to_fp8"
    with pytest.raises(ValueError, match="unknown fault 'te-fuser-drops-consumer-grads'"):
        run_with(backend, torch_case(HYBRID), "te-fuser-drops-consumer-grads")


# ----------------------------------------------------------------------------------------
# TE's faults, on TE's Python code (stubbed extension)


@pytest.fixture(scope="module")
def te_backend():
    import te_stub

    reason = te_stub.available()
    if reason:
        pytest.skip(reason)
    te_stub.install()
    from gradfuzz_adapter.te.backend import TEBackend

    return TEBackend(device="cpu")


def test_te_faults_are_at_least_six_routing_and_four_quantization_faults():
    names = list(te_faults.FAULTS)
    quantization = [n for n in names if n.startswith(("te-fp8-", "te-delayed-"))]
    assert len(names) - len(quantization) >= 6 and len(quantization) >= 4
    targets = {te_faults.FAULTS[n].target.rsplit(".", 1)[0] for n in names if n not in quantization}
    ops = {t for t in targets if ".fused." in t or ".basic." in t}
    assert len(ops) >= 4 and any(t.endswith("fuser.OperationFuser") for t in targets)
    in_place_fusions = {"BackwardLinearAdd", "ForwardLinearScaleAdd", "ForwardLinearBiasAdd"}
    assert len({t.rsplit(".", 1)[1] for t in targets} & in_place_fusions) >= 2


@pytest.mark.parametrize("name", list(te_faults.FAULTS))
def test_each_te_fault_patches_and_restores_its_target(te_backend, name):
    fault = te_faults.FAULTS[name]
    owner, attr = faults.resolve(fault.target)
    original = vars(owner)[attr]
    with pytest.raises(RuntimeError, match="the request failed"):
        with faults.planted(te_faults.FAULTS, name):
            replaced = vars(owner)[attr]
            assert replaced is not original
            assert type(replaced) is type(original)  # a classmethod stays one
            raise RuntimeError("the request failed")
    assert vars(owner)[attr] is original


def bound(channel, to_caller=False):
    return {"channel": channel, "output_to_caller": to_caller}


RESIDUAL = [
    {"name": "MakeExtraOutput", "output_bindings": [bound("r")]},
    {"name": "ConstantScale", "attrs": {"scale": 0.75}},
    {"name": "AddExtraInput", "input_channels": ["r"]},
]
UNFUSED = [{"name": "unfused", "fusions": []}]


def run_te(backend, case_spec, fault=None, paths=UNFUSED):
    from gradfuzz_adapter.case import decode_case
    from gradfuzz_adapter.client import make_request, path_result
    from gradfuzz_adapter.protocol import TensorList

    header, tensors = make_request(case_spec, paths=paths)
    case = decode_case(header, tensors)
    out = TensorList()
    results = backend.run(case, header["paths"], out, fault=fault)
    return case, path_result(results[0], out.tensors)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("te-fuser-drops-consumer-grads", "grad_input"),
        ("te-make-extra-output-grad-summed-twice", "grad_input"),
        ("te-add-extra-input-grad-to-main-input", "grad_input"),
        ("te-fuser-backward-boundary-off-by-one", "grad_input"),
    ],
)
def test_a_te_fault_in_python_code_shows_on_the_stub_and_not_without_it(te_backend, name, expected):
    case_spec = spec(RESIDUAL, dtype="float32", seed=4)
    case, clean = run_te(te_backend, case_spec)
    assert judge(case, clean, all_channels=False) == []
    case, faulty = run_te(te_backend, case_spec, name)
    problems = judge(case, faulty, all_channels=False)
    assert problems and any(p.startswith(expected) for p in problems), problems
    case, after = run_te(te_backend, case_spec)
    assert judge(case, after, all_channels=False) == []


def test_the_off_by_one_boundary_is_a_missing_gradient_not_a_crash(te_backend):
    case, faulty = run_te(
        te_backend, spec(RESIDUAL, dtype="float32"), "te-fuser-backward-boundary-off-by-one"
    )
    assert faulty["status"] == "ok" and faulty["grad_input"] is None


def quantizer_returning(storage):
    """A TE Quantizer whose kernel is replaced by handing back `storage`."""
    from transformer_engine.pytorch.quantized_tensor import Quantizer

    class Fixed(Quantizer):
        def quantize_impl(self, tensor):
            return storage

        def _get_compatible_recipe(self):
            return None

    quantizer = Fixed(rowwise=True, columnwise=True)
    quantizer.internal = True
    return quantizer


def float8_storage(fp8_dtype):
    from transformer_engine.pytorch.constants import DType
    from transformer_engine.pytorch.tensor.storage.float8_tensor_storage import (
        Float8TensorStorage,
    )

    data = torch.arange(6, dtype=torch.uint8).reshape(2, 3)
    return Float8TensorStorage(
        data=data,
        fp8_scale_inv=torch.tensor([0.25]),
        fp8_dtype=getattr(DType, fp8_dtype),
        data_transpose=data.t().contiguous(),
    )


def test_the_fp8_faults_rewrite_what_tes_quantize_returns(te_backend):
    from transformer_engine.pytorch.constants import DType

    x = torch.zeros(2, 3)
    with faults.planted(te_faults.FAULTS, "te-fp8-e5m2-grad-read-as-e4m3"):
        assert quantizer_returning(float8_storage("kFloat8E5M2"))(x)._fp8_dtype == DType.kFloat8E4M3
        kept = quantizer_returning(float8_storage("kFloat8E4M3"))(x)
        assert kept._fp8_dtype == DType.kFloat8E4M3
    with faults.planted(te_faults.FAULTS, "te-fp8-scale-inv-applied-twice"):
        assert quantizer_returning(float8_storage("kFloat8E4M3"))(x)._scale_inv.item() == 0.0625
    with faults.planted(te_faults.FAULTS, "te-fp8-transposed-copy-read-rowwise"):
        got = quantizer_returning(float8_storage("kFloat8E4M3"))(x)
        assert got._data.tolist() == [[0, 3, 1], [4, 2, 5]] and tuple(got._data.shape) == (2, 3)
    clean = quantizer_returning(float8_storage("kFloat8E5M2"))(x)
    assert clean._fp8_dtype == DType.kFloat8E5M2 and clean._scale_inv.item() == 0.25


def test_the_delayed_scale_fault_scales_only_the_forward_scales_an_update_changed(te_backend):
    from transformer_engine.pytorch.quantization import FP8GlobalStateManager

    forward_key = "forward_recipe=r,group=None"
    backward_key = "backward_recipe=r,group=None"
    changed, unchanged, backward = torch.tensor([2.0]), torch.tensor([3.0]), torch.tensor([5.0])
    state = types.SimpleNamespace(
        global_scale_buffer={forward_key: [changed, unchanged], backward_key: [backward]}
    )

    def fake_update(cls, forward=True):
        # What TE's update does to these scales: the first one and the backward one move.
        if forward:
            changed.fill_(4.0)
        else:
            backward.fill_(6.0)

    saved_state = FP8GlobalStateManager.quantization_state
    fault = te_faults.FAULTS["te-delayed-forward-scale-e5m2-max"]
    faulty = fault.replace(classmethod(fake_update)).__get__(None, FP8GlobalStateManager)
    FP8GlobalStateManager.quantization_state = state
    try:
        faulty(forward=True)
        faulty(forward=False)
    finally:
        FP8GlobalStateManager.quantization_state = saved_state
    assert changed.item() == 4.0 * 57344 / 448 and unchanged.item() == 3.0
    assert backward.item() == 6.0


def test_the_te_backend_lists_its_faults(te_backend):
    caps = te_backend.hello()["capabilities"]
    assert [f["name"] for f in caps["faults"]] == list(te_faults.FAULTS)
    by_name = {f["name"]: f for f in caps["faults"]}
    assert by_name["te-fuser-drops-consumer-grads"]["target"] == (
        "transformer_engine.pytorch.ops.fuser.OperationFuser.__init__"
    )
