"""The adapter as the C++ worker runs it: python3 -m gradfuzz_adapter --backend torch, framed
requests on its stdin, replies on its stdout."""

import json
import os
import struct
import subprocess
import sys

import pytest
import torch
from helpers import ADAPTER_DIR, spec

from gradfuzz_adapter.client import make_request
from gradfuzz_adapter.protocol import read_frame, write_frame


@pytest.fixture
def adapter():
    env = dict(os.environ, PYTHONPATH=ADAPTER_DIR, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        [sys.executable, "-m", "gradfuzz_adapter", "--backend", "torch"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    yield process
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)
    for stream in (process.stdin, process.stdout, process.stderr):
        stream.close()


def ask(process, header, tensors=()):
    write_frame(process.stdin, header, list(tensors))
    return read_frame(process.stdout)


def test_hello_run_quit_through_pipes(adapter):
    header, _ = ask(adapter, {"op": "hello"})
    assert header["ok"] and header["backend"] == "torch" and header["protocol"] == 2
    caps = header["capabilities"]
    assert caps["repeat_calls"] is True  # driver.protocol_hello
    assert "cpu" in caps["devices"]
    # The one fusion the torch backend emulates: TE's BackwardLinearScale under a recipe.
    assert [(f["name"], f["pass"]) for f in caps["fusions"]] == [
        ("BackwardLinearScale", "backward")
    ]
    assert set(caps["ops"]) >= {"Linear", "Dispatch", "GroupedLinear", "SwiGLU"}
    assert caps["ops"]["RowStat"]["output_styles"] == ["vector", "generator"]

    request, tensors = make_request(
        spec(
            [
                {
                    "name": "RowStat",
                    "output_bindings": [{"channel": "s", "output_to_caller": True}],
                },
                {"name": "ScaledSReLU", "input_channels": ["s"]},
            ],
            dtype="bfloat16",
        )
    )
    reply, reply_tensors = ask(adapter, request, tensors)
    assert reply["ok"], reply
    fused, unfused = reply["paths"]
    assert fused["status"] == "ok" and unfused["status"] == "skipped"
    outputs = [reply_tensors[i] for i in fused["outputs"]]
    assert [tuple(t.shape) for t in outputs] == [(4, 8), (4,)]
    assert all(t.dtype == torch.float64 for t in outputs)  # results travel widened
    assert reply_tensors[fused["grad_input"]].shape == (4, 8)
    assert set(fused["channel_grads"][0]) == {"s"}

    write_frame(adapter.stdin, {"op": "quit"})
    adapter.stdin.flush()
    assert adapter.wait(timeout=30) == 0
    assert adapter.stdout.read() == b""  # nothing after the last reply


def test_a_bad_request_is_answered_and_the_adapter_goes_on(adapter):
    header, _ = ask(adapter, {"op": "dance"})
    assert not header["ok"] and "unknown request op" in header["error"]
    header, _ = ask(adapter, {"op": "run", "spec": {"ops": []}})
    assert not header["ok"]
    header, _ = ask(adapter, {"op": "hello"})
    assert header["ok"]


def test_end_of_input_exits_cleanly(adapter):
    adapter.stdin.close()
    assert adapter.wait(timeout=30) == 0


def test_a_large_case_exports_within_the_frame_limit(adapter, tmp_path):
    # Issue 15: exports of large cases ended in "bad frame header length 375092705": the
    # script inlined every value, and the reply header went past the C++ reader's 64 MiB.
    case_spec = spec(
        [
            {
                "name": "MakeExtraOutput",
                "output_bindings": [{"channel": "r", "output_to_caller": False}],
            },
            {"name": "Boundary"},
            {"name": "AddExtraInput", "input_channels": ["r"]},
        ],
        shape=(2048, 2048),
        dtype="float32",
    )
    data_file = str(tmp_path / "test_large.values.pt")
    for extra in ({}, {"data_file": data_file}):
        request, tensors = make_request(
            case_spec, op="export", backend="te", expect={"kind": "error"}, **extra
        )
        write_frame(adapter.stdin, request, tensors)
        prefix = adapter.stdout.read(8)
        length = struct.unpack("<Q", prefix)[0]
        assert length <= 64 << 20  # wire.h: kMaxHeaderBytes, the C++ reader's limit
        reply = json.loads(adapter.stdout.read(length))
        assert reply["ok"] and len(reply["script"]) < 1 << 20
        if extra:
            assert reply["notes"] == [] and reply["data_file"] == data_file
            values = torch.load(data_file, weights_only=True)
            assert set(values) == {"input", "cotangent[0]"}
            assert values["input"].shape == (2048, 2048)
        else:
            assert "draws them from a seed" in reply["notes"][0]
    header, _ = ask(adapter, {"op": "hello"})  # the stream is still in step
    assert header["ok"]


def test_the_adapter_reports_where_its_time_went(tmp_path):
    timing = tmp_path / "timing.jsonl"
    env = dict(os.environ, PYTHONPATH=ADAPTER_DIR, PYTHONUNBUFFERED="1")
    env["GRADFUZZ_ADAPTER_TIMING"] = str(timing)
    process = subprocess.Popen(
        [sys.executable, "-m", "gradfuzz_adapter", "--backend", "torch"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    ask(process, {"op": "hello"})
    request, tensors = make_request(spec([{"name": "GELU"}]))
    assert ask(process, request, tensors)[0]["ok"]
    write_frame(process.stdin, {"op": "quit"})
    assert process.wait(timeout=30) == 0
    process.stdin.close()
    process.stdout.close()
    (line,) = timing.read_text().splitlines()
    clock = json.loads(line)
    assert clock["requests"] == 3 and clock["backend"] == "torch"  # hello, run, quit
    assert clock["handling_s"] > 0 and clock["waiting_s"] >= 0 and clock["writing_s"] > 0
