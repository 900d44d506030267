"""``ort_lazy.fx.compile(graph_module, example_inputs)``."""

from .frontends.fx import compile

__all__ = ["compile"]
