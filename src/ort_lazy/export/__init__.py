"""Graph -> ONNX exporters (FX aten graphs; TorchScript subgraphs)."""
