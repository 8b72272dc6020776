"""The torch backend: every case on gradfuzz's own model of te.ops in plain PyTorch
(docs/BACKENDS.md), one module per concern:

- runtime: the ops, bindings, locking, fusers and Sequential (BasicOp, Boundary, Sequential,
  FUSIONS; embedded in exported torch scripts);
- fp8: the FP8 recipes' emulation: quantize-dequantize, the quantizers, the quantized
  Linear, OpQuantization and the delayed-scaling updates (the recipe table is
  gradfuzz_adapter/recipes.py's);
- collectives: the ranks' collectives over torch.distributed and their autograd functions
  (nothing of the runtime: the distributed faults' targets);
- parallel: tensor and sequence parallelism, te.ops's communication ops and parallel Linear
  over the collectives (embedded in distributed scripts with them);
- faults: the planted faults, in fp8 and the collectives; importing the runtime plants
  $GRADFUZZ_FAULT's;
- backend: the driver hooks (TorchBuilder) and the hello/run answers (TorchBackend).

Nothing is imported here: gradfuzz_adapter/recipes.py re-exports fp8's names, and importing
the backend from here would make that a circle. gradfuzz_adapter/torch_runtime.py re-exports
the runtime's public names for exported upstream tests.
"""
