"""The backend a process serves, made by name, and torch set up for it: what the adapter's
entry point (__main__.py) and each rank process of a distributed case (ranks.py) share.
Importing it sets NVIDIA_TF32_OVERRIDE (unless set); both import it before torch runs."""

import os

# Before anything can create a cuBLAS/cuDNN handle: NVIDIA's libraries then compute fp32
# in full fp32, TF32 off, including TE's own cuBLASLt GEMMs that do not read PyTorch's
# allow_tf32 flags (documented by NVIDIA for cuBLAS and cuDNN).
os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")


def make_backend(name):
    """The backend object; the te one imports TransformerEngine here, not before."""
    if name == "torch":
        from .torch_backend.backend import TorchBackend

        return TorchBackend()
    if name == "te":
        from .te.backend import TEBackend

        # GRADFUZZ_TE_DEVICE: where te.ops run (default CUDA's current device); the tests
        # set "cpu" to run TE's Python code over a stubbed extension (tests/te_stub.py).
        return TEBackend(device=os.environ.get("GRADFUZZ_TE_DEVICE") or None)
    raise ValueError(f"unknown backend '{name}'; known backends: te, torch")


def configure_torch():
    """TF32 off (fp32 results must be fp32), and one intra-op CPU thread: cases are tiny and
    workers run in parallel processes; with a thread pool a [6, 2] softmax was seen to take
    12 ms on a busy 2-core machine instead of 3 us. GRADFUZZ_ADAPTER_THREADS overrides."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(int(os.environ.get("GRADFUZZ_ADAPTER_THREADS", "1")))
