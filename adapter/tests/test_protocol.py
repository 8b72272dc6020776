import io
import os
import re
import struct

import pytest
import torch

from gradfuzz_adapter.protocol import (
    MAX_HEADER_BYTES,
    MAX_PAYLOAD_BYTES,
    ProtocolError,
    TensorList,
    read_frame,
    write_frame,
)


def round_trip(header, tensors):
    buffer = io.BytesIO()
    write_frame(buffer, header, tensors)
    buffer.seek(0)
    frame = read_frame(buffer)
    assert read_frame(buffer) is None  # clean end of stream after one frame
    return frame


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool]
)
def test_tensors_of_every_dtype_survive_a_round_trip(dtype):
    values = torch.tensor([[1.5, -2.25, 3.0], [0.0, 7.0, -0.5]])
    t = values > 0 if dtype == torch.bool else values.to(dtype)
    header, tensors = round_trip({"op": "x"}, [t])
    assert header["tensors"] == [{"dtype": str(dtype).replace("torch.", ""), "shape": [2, 3]}]
    assert tensors[0].dtype == dtype
    assert torch.equal(tensors[0], t)


def test_bfloat16_bytes_are_the_bit_pattern():
    t = torch.tensor([1.0, -2.0, 0.1], dtype=torch.bfloat16)
    buffer = io.BytesIO()
    write_frame(buffer, {"op": "x"}, [t])
    raw = buffer.getvalue()
    length = struct.unpack("<Q", raw[:8])[0]
    payload = raw[8 + length :]
    assert len(payload) == 6  # two bytes per element, nothing widened
    back = torch.frombuffer(bytearray(payload), dtype=torch.int16)
    assert torch.equal(back, t.view(torch.int16))


def test_empty_and_scalar_tensors_and_nulls():
    tensors = [
        torch.zeros(0, dtype=torch.float64),
        torch.zeros(3, 0, dtype=torch.int64),
        torch.tensor(2.5, dtype=torch.float32),
        torch.ones(2, dtype=torch.float16),
    ]
    header, back = round_trip({"op": "run", "values": {"input": 3, "missing": None}}, tensors)
    assert header["values"] == {"input": 3, "missing": None}
    assert [tuple(t.shape) for t in back] == [(0,), (3, 0), (), (2,)]
    assert back[2].item() == 2.5
    assert torch.equal(back[3], tensors[3])


def test_non_contiguous_and_strided_tensors_are_sent_in_c_order():
    t = torch.arange(12, dtype=torch.float64).reshape(3, 4).t()
    _, back = round_trip({"op": "x"}, [t])
    assert torch.equal(back[0], t)


def test_frame_without_tensors_has_no_tensor_list():
    buffer = io.BytesIO()
    write_frame(buffer, {"op": "hello"})
    buffer.seek(0)
    header, tensors = read_frame(buffer)
    assert header == {"op": "hello"} and tensors == []


def test_tensor_list_widens_floats_and_keeps_integers():
    out = TensorList()
    assert out.add(None) is None
    assert out.add(torch.ones(2, dtype=torch.bfloat16)) == 0
    assert out.add(torch.ones(2, dtype=torch.int32)) == 1
    assert out.tensors[0].dtype == torch.float64
    assert out.tensors[1].dtype == torch.int64


def test_truncated_and_malformed_frames_are_protocol_errors():
    buffer = io.BytesIO()
    write_frame(buffer, {"op": "x"}, [torch.ones(4)])
    raw = buffer.getvalue()
    with pytest.raises(ProtocolError):
        read_frame(io.BytesIO(raw[:-3]))
    with pytest.raises(ProtocolError):
        read_frame(io.BytesIO(struct.pack("<Q", 0)))
    with pytest.raises(ProtocolError):
        read_frame(io.BytesIO(struct.pack("<Q", 3) + b"[1]"))
    bad = b'{"tensors":[{"dtype":"int8","shape":[1]}]}'
    with pytest.raises(ProtocolError):
        read_frame(io.BytesIO(struct.pack("<Q", len(bad)) + bad + b"\0"))


def test_a_header_over_the_peers_limit_is_refused_before_a_byte_is_written():
    buffer = io.BytesIO()
    with pytest.raises(ProtocolError, match="over the limit of 67108864 bytes"):
        write_frame(buffer, {"ok": True, "script": "x" * MAX_HEADER_BYTES})
    assert buffer.getvalue() == b""  # the stream stays in step: the server answers instead
    with pytest.raises(ProtocolError, match="frame header of 67108865 bytes"):
        read_frame(io.BytesIO(struct.pack("<Q", MAX_HEADER_BYTES + 1)))


def test_the_limits_are_the_cpp_sides(repo):
    # wire.h (harness/ before the C++ side's move to backends/) states the reader's limits.
    found = [
        os.path.join(repo, folder, "wire.h")
        for folder in ("backends", "harness")
        if os.path.isfile(os.path.join(repo, folder, "wire.h"))
    ]
    assert found, "wire.h not found"
    text = open(found[0]).read()
    header = re.search(r"kMaxHeaderBytes = (\d+)ull << (\d+);", text)
    payload = re.search(r"kMaxPayloadBytes = (\d+)ull << (\d+);", text)
    assert int(header[1]) << int(header[2]) == MAX_HEADER_BYTES
    assert int(payload[1]) << int(payload[2]) == MAX_PAYLOAD_BYTES


def test_a_small_frame_goes_out_in_one_write():
    class Recorder(io.BytesIO):
        writes = 0

        def write(self, data):
            self.writes += 1
            return super().write(data)

    stream = Recorder()
    write_frame(stream, {"op": "x"}, [torch.ones(3), torch.zeros(2, dtype=torch.int64)])
    assert stream.writes == 1
    stream.seek(0)
    header, tensors = read_frame(stream)
    assert torch.equal(tensors[0], torch.ones(3))


def test_reply_tensors_are_snapshots_taken_when_added():
    out = TensorList()
    t = torch.ones(3, dtype=torch.float32)
    out.add(t)
    t += 1  # a later call writes the buffer (a main_grad zeroed before a repeat call)
    assert torch.equal(out.tensors[0], torch.ones(3, dtype=torch.float64))
    out.truncate(0)
    assert len(out) == 0 and out.tensors == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_reply_tensors_reach_the_host_in_one_transfer_each_as_added():
    out = TensorList()
    a = torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3)
    b = torch.tensor([1, 2], dtype=torch.int32, device="cuda")
    c = torch.ones(2, dtype=torch.bfloat16, device="cuda")
    assert [out.add(a), out.add(b), out.add(torch.ones(1)), out.add(c)] == [0, 1, 2, 3]
    a.zero_()
    host = out.tensors
    assert all(t.device.type == "cpu" for t in host)
    assert torch.equal(host[0], torch.arange(6, dtype=torch.float64).reshape(2, 3))
    assert host[1].dtype == torch.int64 and host[1].tolist() == [1, 2]
    assert host[3].dtype == torch.float64 and host[3].tolist() == [1.0, 1.0]
