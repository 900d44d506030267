"""OpInfo parity suite: PyTorch's operator database through ``torch.compile(backend="ort")``."""
