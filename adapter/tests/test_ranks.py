"""The rank processes of distributed cases (ranks.py): requests cut per rank, replies joined,
the torch backend's collectives on two gloo ranks, a dying rank turned into the case's
failure with every rank reaped."""

import os

import pytest
import torch

from gradfuzz_adapter import ranks
from gradfuzz_adapter.protocol import TensorList


def test_rank_requests_keep_only_each_ranks_tensors_and_leave_flags_alone():
    header = {
        "spec": {"world_size": 2},
        "paths": [{"name": "fused"}],
        "fault": "f",
        "ranks": [
            {
                "plan": {"ops": []},
                "values": {"input": 3, "extra_input_requires_grad": [True, False]},
            },
            {"plan": {"ops": []}, "values": {"input": 1, "params": [[0, None]], "cotangents": [1]}},
        ],
    }
    tensors = [torch.full((1,), float(k)) for k in range(4)]
    (first, first_tensors), (second, second_tensors) = ranks.rank_requests(header, tensors)
    assert first["values"] == {"input": 0, "extra_input_requires_grad": [True, False]}
    assert [t.item() for t in first_tensors] == [3.0]
    assert second["values"] == {"input": 0, "params": [[1, None]], "cotangents": [0]}
    assert [t.item() for t in second_tensors] == [1.0, 0.0]
    assert first["modified_by"] is False and first["fault"] == "f"


def test_joined_replies_move_every_tensor_index_by_the_ranks_offset():
    path = {
        "name": "fused",
        "outputs": [0],
        "grad_input": 1,
        "grad_params": [[None, 0]],
        "grad_extra_inputs": [],
        "channel_grads": [{"c0": 1}],
        "repeats": [{"name": "fused.call[1]", "outputs": [1], "grad_input": None}],
    }
    out = TensorList()
    joined = ranks.join_replies([([path], [torch.zeros(1), torch.ones(1)])] * 2, out)
    assert len(out.tensors) == 4
    second = joined[1]["paths"][0]
    assert second["outputs"] == [2] and second["grad_input"] == 3
    assert second["grad_params"] == [[None, 2]] and second["channel_grads"] == [{"c0": 3}]
    assert second["repeats"][0]["outputs"] == [3] and second["repeats"][0]["grad_input"] is None


def _op_entry(shape, attrs=None):
    return {
        "fuser": 0,
        "input_shape": shape,
        "output_shape": shape,
        "extra_inputs": [],
        "extra_outputs": [],
        "param_shapes": [],
        "attrs": attrs or {},
    }


def _request(name, local_shapes, output_shapes, values_per_rank, fault=None):
    """A distributed run request of one op on two ranks: rank r's input and cotangent."""
    tensors, entries = [], []
    for shape, out_shape, (x, dy) in zip(local_shapes, output_shapes, values_per_rank):
        tensors += [x, dy]
        entry = _op_entry(shape)
        entry["output_shape"] = out_shape
        entries.append(
            {
                "plan": {"ops": [entry], "public_inputs": [], "public_outputs": []},
                "values": {
                    "input": len(tensors) - 2,
                    "params": [[]],
                    "extra_inputs": [],
                    "extra_input_requires_grad": [],
                    "cotangents": [len(tensors) - 1],
                    "call_inputs": [],
                },
            }
        )
    spec = {
        "ops": [{"name": name}],
        "fusions": [],
        "input_shape": local_shapes[0],
        "dtype": "float64",
        "device": "cpu",
        "seed": 0,
        "world_size": 2,
    }
    header = {"op": "run", "spec": spec, "ranks": entries, "paths": [{"name": "fused"}]}
    if fault:
        header["fault"] = fault
    header["timeout_s"] = 60
    return header, tensors


@pytest.fixture(scope="module")
def coordinator():
    c = ranks.Coordinator("torch")
    yield c
    c.stop()


def _tensor(out, ref):
    return out.tensors[ref]


def test_all_reduce_on_two_gloo_ranks_sums_the_summands_and_passes_the_gradient_on(coordinator):
    x = [torch.arange(6, dtype=torch.float64).reshape(2, 3), torch.ones(2, 3, dtype=torch.float64)]
    dy = torch.full((2, 3), 0.5, dtype=torch.float64)
    header, tensors = _request("AllReduce", [[2, 3]] * 2, [[2, 3]] * 2, [(x[0], dy), (x[1], dy)])
    out = TensorList()
    reply = coordinator.run(header, tensors, out)
    assert len(reply["pids"]) == 2
    for rank in reply["ranks"]:
        path = rank["paths"][0]
        assert path["status"] == "ok", path
        assert torch.equal(_tensor(out, path["outputs"][0]), x[0] + x[1])
        assert torch.equal(_tensor(out, path["grad_input"]), dy)


def test_all_gather_concatenates_the_rows_and_reduce_scatters_the_gradient(coordinator):
    x = [torch.zeros(1, 2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64)]
    dy = [torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)] * 2
    header, tensors = _request("AllGather", [[1, 2]] * 2, [[2, 2]] * 2, list(zip(x, dy)))
    out = TensorList()
    reply = coordinator.run(header, tensors, out)
    for r, rank in enumerate(reply["ranks"]):
        path = rank["paths"][0]
        assert torch.equal(_tensor(out, path["outputs"][0]), torch.cat(x))
        # Rank r's rows of the sum of the ranks' gradients.
        assert torch.equal(_tensor(out, path["grad_input"]), 2 * dy[0][r : r + 1])


def test_a_rank_that_dies_is_the_cases_crash_and_every_rank_is_reaped(coordinator):
    coordinator.start(2)
    pids = list(coordinator.pool.pids)
    x = torch.zeros(1, 2, dtype=torch.float64)
    dy = torch.zeros(2, 2, dtype=torch.float64)
    header, tensors = _request(
        "AllGather", [[1, 2]] * 2, [[2, 2]] * 2, [(x, dy), (x, dy)], fault="torch-rank-killed"
    )
    reply = coordinator.run(header, tensors, TensorList())
    assert reply["failure"]["kind"] == "crash"
    assert "rank 1 killed by SIGKILL while running the case" in reply["failure"]["message"]
    assert coordinator.pool is None
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    # The next case starts new ranks.
    header, tensors = _request("AllGather", [[1, 2]] * 2, [[2, 2]] * 2, [(x, dy), (x, dy)])
    assert "ranks" in coordinator.run(header, tensors, TensorList())


def test_a_rank_that_hangs_is_the_cases_timeout(coordinator, monkeypatch):
    x = torch.zeros(1, 2, dtype=torch.float64)
    dy = torch.zeros(2, 2, dtype=torch.float64)
    header, tensors = _request(
        "AllGather", [[1, 2]] * 2, [[2, 2]] * 2, [(x, dy), (x, dy)], fault="torch-rank-hangs"
    )
    header["timeout_s"] = 2
    coordinator.start(2)
    pids = list(coordinator.pool.pids)
    reply = coordinator.run(header, tensors, TensorList())
    assert reply["failure"]["kind"] == "timeout"
    assert "did not answer within 2 s" in reply["failure"]["message"]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
