"""The framed messages of docs/BACKENDS.md ("Frame format").

A message is an 8-byte little-endian header length H, H bytes of UTF-8 JSON (an object),
then the raw bytes of every tensor listed in header["tensors"] ({"dtype", "shape"}), back
to back, C-contiguous and little-endian. Elsewhere in the header a tensor is its index in
that list; null is "no tensor".
"""

import ctypes
import json
import struct

import torch

DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

# The C++ side's limits (wire.h: kMaxHeaderBytes, kMaxPayloadBytes): a header or payload
# beyond them is a broken peer there, so this side never writes one (write_frame raises
# before a byte goes out) and refuses to read one.
MAX_HEADER_BYTES = 64 << 20
MAX_PAYLOAD_BYTES = 16 << 30
# Frames up to this size go out in one write (one syscall, no partial frame in the pipe
# between two writes); larger payloads are written tensor by tensor, without a joined copy.
ONE_WRITE_BYTES = 1 << 20


class ProtocolError(Exception):
    """A malformed frame."""


def _read_exact(stream, n):
    """n bytes, or None at a clean end of stream before the first byte."""
    chunks = []
    got = 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            if got == 0:
                return None
            raise ProtocolError(f"stream ended after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_frame(stream):
    """(header, tensors) from `stream` (a binary file), or None at end of stream."""
    prefix = _read_exact(stream, 8)
    if prefix is None:
        return None
    (length,) = struct.unpack("<Q", prefix)
    if length == 0:
        raise ProtocolError("bad frame header length 0")
    if length > MAX_HEADER_BYTES:
        raise ProtocolError(
            f"bad frame header length: frame header of {length} bytes is over the limit of "
            f"{MAX_HEADER_BYTES} bytes"
        )
    text = _read_exact(stream, length)
    if text is None:
        raise ProtocolError("stream ended inside a frame header")
    try:
        header = json.loads(text.decode("utf-8"))
    except ValueError as e:
        raise ProtocolError(f"frame header is not JSON: {e}") from e
    if not isinstance(header, dict):
        raise ProtocolError("frame header is not a JSON object")
    descriptors = header.get("tensors") or []
    specs = []
    total = 0
    for d in descriptors:
        try:
            dtype = DTYPES[d["dtype"]]
            shape = [int(s) for s in d["shape"]]
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"bad tensor descriptor {d!r}") from e
        if any(s < 0 for s in shape):
            raise ProtocolError(f"bad tensor shape {d!r}")
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        total += nbytes
        if total > MAX_PAYLOAD_BYTES:
            raise ProtocolError("frame payload too large")
        specs.append((dtype, shape, nbytes))
    payload = bytearray(total)
    view = memoryview(payload)
    got = 0
    while got < total:
        n = stream.readinto(view[got:]) if hasattr(stream, "readinto") else None
        if n is None:
            chunk = stream.read(total - got)
            n = len(chunk)
            view[got : got + n] = chunk
        if not n:
            raise ProtocolError(f"stream ended after {got} of {total} payload bytes")
        got += n
    tensors = []
    offset = 0
    for dtype, shape, nbytes in specs:
        if nbytes == 0:
            tensors.append(torch.empty(shape, dtype=dtype))
        else:
            t = torch.frombuffer(payload, dtype=torch.uint8, count=nbytes, offset=offset)
            # A copy: its own aligned memory rather than a view into the payload.
            tensors.append(t.view(dtype).reshape(shape).clone())
        offset += nbytes
    return header, tensors


def tensor_bytes(t):
    """The raw little-endian bytes of a CPU tensor, C-contiguous."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return b""
    return ctypes.string_at(t.data_ptr(), nbytes)


def encode_frame(header, tensors=()):
    """The frame's pieces [prefix + header, tensor bytes...]; raises ProtocolError (before
    anything is written) for what the peer would refuse: a None or unsupported tensor, a
    header over MAX_HEADER_BYTES, a payload over MAX_PAYLOAD_BYTES."""
    header = dict(header)
    blobs = []
    if tensors:
        descriptors = []
        for t in tensors:
            if t is None:
                raise ProtocolError("cannot send None as a tensor (refer to it as null)")
            if t.dtype not in DTYPE_NAMES:
                raise ProtocolError(f"cannot send a tensor of dtype {t.dtype}")
            descriptors.append({"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape)})
            blobs.append(tensor_bytes(t))
        header["tensors"] = descriptors
    text = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("utf-8")
    if len(text) > MAX_HEADER_BYTES:
        raise ProtocolError(
            f"frame header of {len(text)} bytes is over the limit of {MAX_HEADER_BYTES} "
            "bytes (wire.h kMaxHeaderBytes); large data travels as tensors, not in the header"
        )
    payload = sum(len(b) for b in blobs)
    if payload > MAX_PAYLOAD_BYTES:
        raise ProtocolError(
            f"frame payload of {payload} bytes is over the limit of {MAX_PAYLOAD_BYTES} bytes"
        )
    return [struct.pack("<Q", len(text)) + text, *blobs]


def write_frame(stream, header, tensors=()):
    """Writes one frame; `tensors` are sent with their own dtype (one of DTYPES). Nothing is
    written when the frame cannot be encoded (encode_frame's ProtocolError)."""
    pieces = encode_frame(header, tensors)
    if sum(len(p) for p in pieces) <= ONE_WRITE_BYTES:
        stream.write(b"".join(pieces))
    else:
        for piece in pieces:
            stream.write(piece)
    stream.flush()


class TensorList:
    """Collects reply tensors and hands out their indices (null for None).

    Floating tensors travel as float64, integers as int64. A tensor on a GPU is copied (in
    the wire dtype, on its device, so later writes to it do not show) when added, and all
    of them reach the host in one transfer when the reply is encoded (`tensors`): one
    synchronising copy per reply instead of one per tensor."""

    def __init__(self):
        self._tensors = []
        self._on_device = False

    def add(self, t, *, widen=True):
        """Index of `t` in the reply."""
        if t is None:
            return None
        if not isinstance(t, torch.Tensor):
            raise ProtocolError(f"cannot send a {type(t).__name__} as a tensor")
        t = t.detach()
        if widen:
            if t.is_floating_point():
                t = t.to(dtype=torch.float64, copy=t.device.type != "cpu")
            elif t.dtype != torch.bool:
                t = t.to(dtype=torch.int64, copy=t.device.type != "cpu")
            elif t.device.type != "cpu":
                t = t.clone()
        if t.device.type != "cpu":
            self._on_device = True
        self._tensors.append(t)
        return len(self._tensors) - 1

    @property
    def tensors(self):
        """The reply's tensors, all on the host."""
        if self._on_device:
            self._tensors = _to_host(self._tensors)
            self._on_device = False
        return self._tensors

    def truncate(self, length):
        """Drops the tensors added after the first `length` (a result that cannot travel)."""
        del self._tensors[length:]

    def __len__(self):
        return len(self._tensors)


def _to_host(tensors):
    """`tensors` on the host: those on one device, per dtype, flattened into one buffer and
    copied in one transfer, then split back."""
    out = list(tensors)
    groups = {}
    for k, t in enumerate(tensors):
        if t.device.type != "cpu":
            groups.setdefault((t.device, t.dtype), []).append(k)
    for (_, _), members in groups.items():
        flat = torch.cat([tensors[k].reshape(-1) for k in members]).cpu()
        offset = 0
        for k in members:
            n = tensors[k].numel()
            out[k] = flat[offset : offset + n].reshape(tensors[k].shape)
            offset += n
    return out
