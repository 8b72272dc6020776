"""The torch backend through the driver: channel routing, runtime errors and locking,
judged against the plain reference (reference.py) on the same values."""

import time

import pytest
import torch
from helpers import judge, run, spec

from gradfuzz_adapter.errors import LockedError, MissingProducerError
from gradfuzz_adapter.torch_backend.backend import TorchBackend
from gradfuzz_adapter.torch_backend.runtime import BasicOp, Boundary, Sequential


@pytest.fixture(scope="module")
def backend():
    return TorchBackend()


def bound(channel, to_caller=False):
    return {"channel": channel, "output_to_caller": to_caller}


def only_path(backend, case_spec):
    case, results = run(backend, case_spec)
    assert results[1]["status"] == "skipped"  # no fusions: the unfused path would repeat it
    return case, results[0]


def test_fan_out_channel_sums_both_consumers(backend):
    case, result = only_path(
        backend,
        spec(
            [
                {"name": "MakeExtraOutput", "output_bindings": [bound("r")]},
                {"name": "Linear", "attrs": {"out": 8}},
                {"name": "AddExtraInput", "input_channels": ["r"]},
                {"name": "GELU"},
                {"name": "AddExtraInput", "input_channels": ["r"]},
            ]
        ),
    )
    assert judge(case, result) == []
    # The channel's gradient is its own: two consumers' plus nothing from the main path.
    assert set(result["channel_grads"][0]) == {"r"}
    g = result["channel_grads"][0]["r"]
    assert g.shape == (4, 8) and g.abs().sum() > 0


def test_hidden_public_and_public_bound_outputs(backend):
    case, result = only_path(
        backend,
        spec(
            [
                {"name": "DualExtraOutput", "output_bindings": [bound("a"), {"channel": None}]},
                {"name": "RowStat", "output_bindings": [bound("s", to_caller=True)]},
                {"name": "ScaledSReLU", "input_channels": ["s"]},
                {"name": "AddExtraInput", "input_channels": ["a"]},
            ]
        ),
    )
    # Main output, DualExtraOutput's public slot 1, RowStat's public-and-bound slot 0.
    assert [tuple(t.shape) for t in result["outputs"]] == [(4, 8), (4, 8), (4,)]
    assert judge(case, result) == []
    assert set(result["channel_grads"][0]) == {"a", "s"}


def test_mixed_bound_and_public_slots_in_one_op(backend):
    # GroupedLinear(scale_bias): slot 0 split sizes public, slot 1 scales bound (finding 4's
    # "modified two-input GroupedLinear"), then the reverse with Dispatch's split sizes.
    case, result = only_path(
        backend,
        spec(
            [
                {"name": "RowStat", "output_bindings": [bound("s")]},
                {
                    "name": "GroupedLinear",
                    "attrs": {"groups": 2, "out": 3, "scale_bias": 1},
                    "input_channels": [None, "s"],
                },
            ],
            shape=(6, 4),
        ),
    )
    assert judge(case, result) == []
    case, result = only_path(
        backend,
        spec(
            [
                {
                    "name": "Dispatch",
                    "attrs": {"groups": 2},
                    "output_bindings": [bound("sizes"), {"channel": None}, bound("map")],
                },
                {
                    "name": "GroupedLinear",
                    "attrs": {"groups": 2, "out": 4, "scale_bias": 1},
                    "input_channels": ["sizes", None],
                },
                {"name": "Combine", "input_channels": ["map"]},
            ],
            shape=(6, 4),
        ),
    )
    # Public extra inputs in (op, slot) order: Dispatch's logits, then GroupedLinear's scales.
    assert [tuple(t.shape) for t in result["grad_extra_inputs"]] == [(6, 2), (6,)]
    assert judge(case, result) == []


def test_fresh_producer_feeds_gradient_to_the_router(backend):
    # Review finding 1's scenario: Dispatch's probs are a fresh tensor; the logits must get
    # their gradient through ScaledSwiGLU's scales.
    case, result = only_path(
        backend,
        spec(
            [
                {
                    "name": "Dispatch",
                    "attrs": {"groups": 2},
                    "output_bindings": [{"channel": None}, bound("probs")],
                },
                {"name": "ScaledSwiGLU", "input_channels": ["probs"]},
            ],
            shape=(6, 8),
        ),
    )
    assert judge(case, result) == []
    assert result["grad_extra_inputs"][0].abs().sum() > 0


def test_generator_style_outputs_are_consumed_once(backend):
    case, result = only_path(
        backend,
        spec(
            [
                {
                    "name": "Dispatch",
                    "attrs": {"groups": 2},
                    "output_style": "generator",
                    "output_bindings": [{"channel": None}, bound("probs")],
                },
                {"name": "ScaledSwiGLU", "input_channels": ["probs"]},
                {"name": "DualExtraOutput", "output_style": "generator"},
            ],
            shape=(6, 8),
        ),
    )
    assert judge(case, result) == []


def test_call_then_bind_works_and_does_not_lock(backend):
    case, result = only_path(
        backend,
        spec(
            [
                {
                    "name": "Dispatch",
                    "attrs": {"groups": 2},
                    "output_bindings": [{"channel": None}, bound("probs")],
                },
                {"name": "ScaledSwiGLU", "input_channels": ["probs"]},
            ],
            shape=(6, 8),
            call_then_bind=[{"op": 1, "grad_mode": True}, {"op": 0, "grad_mode": False}],
        ),
    )
    assert judge(case, result) == []


def test_boundary_splits_fusers_and_their_extra_inputs(backend):
    case, result = only_path(
        backend,
        spec(
            [
                {"name": "AddExtraInput"},
                {"name": "RowStat"},
                {"name": "Boundary"},
                {"name": "ScaledSReLU"},
                {"name": "MakeExtraOutput"},
            ]
        ),
    )
    assert judge(case, result) == []
    assert len(result["grad_extra_inputs"]) == 2
    assert [tuple(t.shape) for t in result["outputs"]] == [(4, 8), (4,), (4, 8)]
    # Plans per fuser, in spec indices (the Boundary is op 2).
    assert [[(g["begin"], g["end"]) for g in p["forward"]] for p in result["plans"]] == [
        [(0, 1), (1, 2)],
        [(3, 4), (4, 5)],
    ]


def test_channels_never_cross_a_boundary(backend):
    _, results = run(
        backend,
        spec(
            [
                {"name": "MakeExtraOutput", "output_bindings": [bound("r")]},
                {"name": "Boundary"},
                {"name": "AddExtraInput", "input_channels": ["r"]},
            ]
        ),
    )
    error = results[0]["error"]
    assert (error["kind"], error["phase"]) == ("missing-producer", "Sequential construction")
    assert "no op in the same fuser produces it" in error["message"]
    assert results[0]["left_locked"] == []


@pytest.mark.parametrize(
    "ops, kind, phase, text",
    [
        (
            [
                {"name": "MakeExtraOutput", "output_bindings": [bound("c")]},
                {"name": "RowStat", "output_bindings": [bound("c")]},
            ],
            "duplicate-producer",
            "Sequential construction",
            "is produced twice",
        ),
        (
            [{"name": "AddExtraInput", "input_channels": ["nowhere"]}],
            "missing-producer",
            "Sequential construction",
            "channel 'nowhere'",
        ),
        (
            [
                {"name": "ScaledSReLU", "input_channels": ["s"]},
                {"name": "RowStat", "output_bindings": [bound("s")]},
            ],
            "producer-not-earlier",
            "Sequential construction",
            "expected the producer at an op index below 0",
        ),
        (
            [{"name": "Identity", "input_channels": ["x"]}],
            "slot-out-of-range",
            "binding",
            "out of range (the op has 0 extra input slots)",
        ),
    ],
)
def test_routing_errors_have_their_kind_and_message(backend, ops, kind, phase, text):
    _, results = run(backend, spec(ops))
    for result in results:  # the unfused path runs too: the fused one did not succeed
        assert result["status"] == "error"
        assert (result["error"]["kind"], result["error"]["phase"]) == (kind, phase)
        assert text in result["error"]["message"]


@pytest.mark.parametrize("delta, which", [(1, "surplus"), (-1, "shortfall")])
def test_extra_input_count_is_checked(backend, delta, which):
    _, results = run(backend, spec([{"name": "AddExtraInput"}], extra_input_count_delta=delta))
    error = results[0]["error"]
    assert (error["kind"], error["phase"]) == ("extra-input-count", "forward")
    assert which in error["message"]


def test_late_binds_raise_in_the_setters_order(backend):
    ops = [{"name": "MakeExtraOutput", "output_bindings": [bound("r")]}, {"name": "AddExtraInput"}]
    cases = [
        ({"op": 1, "slot": 0, "channel": "r"}, "locked"),
        ({"op": 1, "slot": 5, "channel": "r"}, "slot-out-of-range"),
        ({"op": 1, "slot": 0, "channel": ""}, "invalid-channel-name"),
    ]
    for late_bind, kind in cases:
        _, results = run(backend, spec(ops, late_binds=[late_bind]))
        assert (results[0]["error"]["kind"], results[0]["error"]["phase"]) == (kind, "late binding")


def test_corrupt_split_sizes_are_invalid_arguments(backend):
    _, results = run(
        backend,
        spec(
            [{"name": "GroupedLinear", "attrs": {"groups": 3, "out": 4}}], corrupt_split_sizes=True
        ),
    )
    error = results[0]["error"]
    assert (error["kind"], error["phase"]) == ("invalid-argument", "forward")
    assert "must sum to rows=4" in error["message"]


def test_requires_grad_patterns(backend):
    case, result = only_path(
        backend,
        spec(
            [
                {"name": "Linear", "attrs": {"out": 8}, "param_requires_grad": [False]},
                {"name": "RowStat", "output_bindings": [bound("s")]},
                {"name": "ScaledSReLU", "input_channels": ["s"]},
                {"name": "AddExtraInput", "extra_input_requires_grad": [True]},
                {"name": "Bias"},
            ],
            input_requires_grad=False,
        ),
    )
    assert result["grad_input"] is None
    assert result["grad_params"][0] == [None]
    assert result["grad_params"][4][0] is not None
    # Nothing before AddExtraInput requires grad: RowStat's value does not either, so no
    # channel gradient is due (the reference has none).
    assert result["channel_grads"] == [{}]
    assert judge(case, result) == []


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_low_precision_within_the_oracles_tolerance(backend, dtype):
    case, result = only_path(
        backend,
        spec(
            [
                {"name": "LayerNorm", "attrs": {"zero_centered_gamma": 1}},
                {"name": "Linear", "attrs": {"out": 8}},
                {"name": "SwiGLU", "attrs": {"interleave": 2}},
                {"name": "RMSNorm"},
            ],
            dtype=dtype,
            seed=7,
        ),
    )
    assert judge(case, result) == []


def test_a_tiny_two_path_case_costs_milliseconds(backend):
    case_spec = spec(
        [{"name": "Linear", "attrs": {"out": 6}}, {"name": "Bias"}, {"name": "ReLU"}],
        fusions=["ForwardLinearBiasActivation"],
    )
    run(backend, case_spec)
    start = time.perf_counter()
    for _ in range(10):
        run(backend, case_spec)
    assert (time.perf_counter() - start) / 10 < 0.05


def test_runtime_locking_rules():
    a = BasicOp("MakeExtraOutput", {"in_place": 0}, [2, 3])
    b = BasicOp("AddExtraInput", {"in_place": 0}, [2, 3])
    x = torch.ones(2, 3)
    a(x)  # a standalone call validates through a transient fuser and never locks
    a.set_extra_output_channel(0, "r", False)
    b.set_extra_input_channel(0, "r")
    with pytest.raises(MissingProducerError):
        Sequential(BasicOp("Identity", {}, [2, 3]), a, Boundary(), b)
    assert not a.locked and not b.locked  # a failed construction locks nothing
    model = Sequential(a, b)
    assert a.locked and b.locked
    with pytest.raises(LockedError):
        b.set_extra_input_channel(0, "r")  # even with the same value
    assert torch.equal(model(x), 2 * x)


DEFERRED_OPS = [
    {"name": "Linear", "attrs": {"out": 6}},
    {"name": "Bias"},
    {"name": "GELU"},
]


def _deferred_run(backend, fault=None, deferred=True):
    from gradfuzz_adapter.case import decode_case
    from gradfuzz_adapter.client import make_request, path_result
    from gradfuzz_adapter.protocol import TensorList

    header, tensors = make_request(spec(DEFERRED_OPS, deferred_init=deferred))
    case = decode_case(header, tensors)
    out = TensorList()
    result = backend.run(case, header["paths"][:1], out, fault=fault)[0]
    return case, path_result(result, out.tensors)


def test_deferred_init_runs_as_the_ops_built_directly_and_its_fault_shows(backend):
    case, deferred = _deferred_run(backend)
    assert case.deferred_init and deferred["status"] == "ok", deferred
    assert judge(case, deferred) == []
    _, direct = _deferred_run(backend, deferred=False)
    torch.testing.assert_close(deferred["outputs"][0], direct["outputs"][0], rtol=0, atol=0)
    torch.testing.assert_close(deferred["grad_input"], direct["grad_input"], rtol=0, atol=0)
    # Ops initialised again at their first call: the caller's values are gone.
    _, faulty = _deferred_run(backend, "torch-usage-deferred-init-reinitialised-at-first-forward")
    assert not torch.equal(faulty["outputs"][0], direct["outputs"][0])
    # Built directly, the fault has nothing to act on.
    _, plain = _deferred_run(
        backend, "torch-usage-deferred-init-reinitialised-at-first-forward", deferred=False
    )
    torch.testing.assert_close(plain["outputs"][0], direct["outputs"][0], rtol=0, atol=0)


def test_materialize_needs_parameters_on_meta():
    op = BasicOp("Bias", {}, [2, 3])
    with pytest.raises(Exception, match="needs parameters on 'meta'"):
        op.materialize("cpu")
    deferred = BasicOp("Bias", {}, [2, 3], device="meta")
    deferred.materialize("cpu")
    assert deferred.deferred and deferred.params[0].device.type == "cpu"
