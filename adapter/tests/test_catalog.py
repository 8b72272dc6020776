"""The catalog functions against torch.autograd.gradcheck (float64 finite differences) and
against forward formulas written out independently."""

import math

import pytest
import torch

from gradfuzz_adapter import catalog
from gradfuzz_adapter.errors import InvalidArgumentError


def away_from_zero(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(*shape, generator=g, dtype=torch.float64)
    return torch.sign(z) * (0.1 + z.abs())


def leaf(t):
    return t.clone().requires_grad_(True)


def check(fn, *inputs):
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


def test_gradcheck_linear_bias_scale():
    x, w, b = (
        leaf(away_from_zero(3, 4)),
        leaf(away_from_zero(5, 4, seed=1)),
        leaf(away_from_zero(4)),
    )
    check(catalog.linear, x, w)
    check(catalog.bias_add, x, b)
    check(lambda t: catalog.constant_scale(t, -0.75), x)


@pytest.mark.parametrize("fn", [catalog.relu, catalog.gelu, catalog.srelu])
def test_gradcheck_activations(fn):
    check(fn, leaf(away_from_zero(3, 4)))


@pytest.mark.parametrize("interleave", [0, 1, 2])
def test_gradcheck_glus(interleave):
    x, s = leaf(away_from_zero(3, 8)), leaf(away_from_zero(3, seed=2))
    check(lambda t: catalog.swiglu(t, interleave), x)
    check(lambda t, u: catalog.scaled_swiglu(t, u, interleave), x, s)
    check(catalog.scaled_srelu, x, s)


def test_gradcheck_channel_ops():
    x, e = leaf(away_from_zero(3, 4)), leaf(away_from_zero(3, 4, seed=3))
    check(lambda t: catalog.make_extra_output(t)[1][0], x)
    check(catalog.add_extra_input, x, e)
    check(lambda t: catalog.row_stat(t)[1][0], x)
    check(lambda t: catalog.dual_extra_output(t, 0.5, -1.5)[1][1], x)


@pytest.mark.parametrize("scale_bias", [False, True])
def test_gradcheck_grouped_linear(scale_bias):
    x = leaf(away_from_zero(6, 4))
    w, b = leaf(away_from_zero(3, 5, 4, seed=1)), leaf(away_from_zero(3, 5, seed=2))
    s = leaf(away_from_zero(6, seed=3))
    sizes = torch.tensor([2, 0, 4])
    if scale_bias:
        check(lambda *a: catalog.grouped_linear(a[0], sizes, a[1], a[2], a[3], 3), x, w, b, s)
    else:
        check(lambda *a: catalog.grouped_linear(a[0], sizes, a[1], a[2], None, 3), x, w, b)


@pytest.mark.parametrize("zero_centered", [False, True])
def test_gradcheck_norms(zero_centered):
    x, g, b = leaf(away_from_zero(3, 5)), leaf(away_from_zero(5, seed=1)), leaf(away_from_zero(5))
    check(lambda *a: catalog.rms_norm(a[0], a[1], 1e-5, zero_centered), x, g)
    check(lambda *a: catalog.layer_norm(a[0], a[1], a[2], 1e-5, zero_centered), x, g, b)


def test_gradcheck_dispatch_combine():
    x = leaf(away_from_zero(6, 4))
    logits = away_from_zero(6, 3, seed=4)
    logits.scatter_add_(1, logits.argmax(1, keepdim=True), torch.ones(6, 1, dtype=torch.float64))
    logits = leaf(logits)
    check(lambda a, b: catalog.dispatch(a, b, 3)[0], x, logits)
    check(lambda a, b: catalog.dispatch(a, b, 3)[1][1], x, logits)
    routing = catalog.dispatch(x, logits, 3)[1][2]
    check(lambda a: catalog.combine(a, routing), x)


# Forward formulas written out independently of the catalog's choice of torch calls.


def test_gelu_is_the_tanh_form():
    x = away_from_zero(3, 4)
    expected = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    torch.testing.assert_close(catalog.gelu(x), expected)


def test_interleaved_glu_takes_alternating_blocks():
    x = torch.arange(8, dtype=torch.float64).reshape(1, 8)
    a, b = catalog.glu_halves(x, 2)
    assert a.tolist() == [[0, 1, 4, 5]] and b.tolist() == [[2, 3, 6, 7]]
    a, b = catalog.glu_halves(x, 0)
    assert a.tolist() == [[0, 1, 2, 3]] and b.tolist() == [[4, 5, 6, 7]]
    a, b = x[:, [0, 1, 4, 5]], x[:, [2, 3, 6, 7]]
    torch.testing.assert_close(catalog.swiglu(x, 2), a * torch.sigmoid(a) * b)


def test_norms_match_their_definitions():
    x, g, b = away_from_zero(3, 5), away_from_zero(5, seed=1), away_from_zero(5, seed=2)
    rms = torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(catalog.rms_norm(x, g, 1e-5), x / rms * g)
    torch.testing.assert_close(catalog.rms_norm(x, g, 1e-5, True), x / rms * (1 + g))
    mean = x.mean(-1, keepdim=True)
    std = torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(
        catalog.layer_norm(x, g, b, 1e-5, True), (x - mean) / std * (1 + g) + b
    )


def test_grouped_linear_is_a_loop_over_groups():
    x, w, b, s = (
        away_from_zero(6, 4),
        away_from_zero(3, 5, 4, seed=1),
        away_from_zero(3, 5),
        away_from_zero(6),
    )
    sizes = [2, 0, 4]
    rows = []
    r = 0
    for g, n in enumerate(sizes):
        for _ in range(n):
            rows.append(x[r] @ w[g].t() + b[g] * s[r])
            r += 1
    got = catalog.grouped_linear(x, torch.tensor(sizes), w, b, s, 3)
    torch.testing.assert_close(got, torch.stack(rows))


def test_dispatch_routes_rows_stably_by_argmax_and_combine_undoes_it():
    x = torch.arange(12, dtype=torch.float64).reshape(6, 2)
    logits = torch.tensor([[0.0, 2], [3, 1], [0, 5], [4, 0], [1, 2], [9, 1]], dtype=torch.float64)
    y, (sizes, probs, routing) = catalog.dispatch(x, logits, 2)
    assert routing.tolist() == [1, 3, 5, 0, 2, 4]  # group 0 rows first, each group in order
    assert sizes.tolist() == [3, 3]
    assert torch.equal(y, x[routing])
    soft = torch.softmax(logits, 1)
    assert torch.allclose(probs, soft[routing, logits.argmax(1)[routing]])
    assert torch.equal(catalog.combine(y, routing), x)


def test_row_stat_and_dual_outputs():
    x = away_from_zero(3, 4)
    y, (stat,) = catalog.row_stat(x)
    torch.testing.assert_close(stat, (x**2).sum(1) / 4)
    y, (a, b) = catalog.dual_extra_output(x, 0.5, -1.5)
    torch.testing.assert_close(a, 0.5 * x)
    torch.testing.assert_close(b, -1.5 * x)


@pytest.mark.parametrize(
    "sizes, message",
    [
        (torch.tensor([1, 1]), "must sum to rows=3"),
        (torch.tensor([3, 0, 0]), "numel=G=2"),
        (torch.tensor([4, -1]), "non-negative"),
        (torch.tensor([1.0, 2.0]), "integer dtype"),
    ],
)
def test_bad_split_sizes_are_invalid_arguments(sizes, message):
    with pytest.raises(InvalidArgumentError, match=message):
        catalog.grouped_linear(away_from_zero(3, 4), sizes, away_from_zero(2, 5, 4), None, None, 2)


def test_validation_of_attrs_and_shapes():
    with pytest.raises(InvalidArgumentError, match="scale_bias=1 requires bias=1"):
        catalog.validate("GroupedLinear", {"bias": 0, "scale_bias": 1}, [4, 8])
    with pytest.raises(InvalidArgumentError, match="interleave=3"):
        catalog.validate("SwiGLU", {"interleave": 3}, [4, 8])
    with pytest.raises(InvalidArgumentError, match="must divide"):
        catalog.validate("Reshape", {"features": 5}, [4, 8])
    with pytest.raises(InvalidArgumentError, match="permutation"):
        catalog.combine(away_from_zero(3, 2), torch.tensor([0, 0, 1]))
    catalog.validate("RMSNorm", {"eps": 1e-5, "zero_centered_gamma": 1}, [4, 8])
