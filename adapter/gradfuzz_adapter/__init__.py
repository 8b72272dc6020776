"""gradfuzz's Python adapter: the te (TransformerEngine te.ops) and torch (plain PyTorch)
backends behind the framed protocol of docs/BACKENDS.md. See adapter/README.md."""
