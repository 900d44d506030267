"""Names of aten operators, one spelling in and out.

ort-lazy prints an overload as ``aten.mul.Tensor`` (metrics, explain, the expectations of the
op-database suite) and accepts ``aten.mul.Tensor``, ``aten.mul`` (every overload),
``aten::mul`` (TorchScript's spelling) and ``torch.ops.aten.mul.default`` from users.
"""

from __future__ import annotations

import difflib
import functools
from typing import Any

import torch

__all__ = ["op_name", "named_in", "normalize", "lookup", "suggest"]


def op_name(target: Any) -> str:
    """``aten.mul.Tensor`` for an OpOverload, a readable name for anything else."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def named_in(target: Any, names: frozenset[str]) -> bool:
    """Whether ``names`` (normalized: ``aten.relu`` or ``aten.relu.default``) names the overload
    ``target``, by itself or by its packet."""
    if not names:
        return False
    full = op_name(target)
    return full in names or full.rsplit(".", 1)[0] in names


def normalize(name: str) -> str:
    """``aten::relu`` / ``torch.ops.aten.relu.default`` / ``aten.relu`` -> ``aten.relu[.overload]``."""
    text = name.strip()
    if text.startswith("torch.ops."):
        text = text[len("torch.ops.") :]
    return text.replace("::", ".")


def lookup(name: str) -> Any:
    """The OpOverload (``aten.mul.Tensor``) or OpOverloadPacket (``aten.mul``) ``name`` names,
    or None when torch has no such operator."""
    parts = normalize(name).split(".")
    if len(parts) not in (2, 3) or not all(parts):
        return None
    try:
        packet = getattr(getattr(torch.ops, parts[0]), parts[1])
        if len(parts) == 2:
            return packet
        return getattr(packet, parts[2])
    except (AttributeError, RuntimeError):
        return None


@functools.lru_cache(maxsize=4)
def _known(namespace: str) -> tuple[str, ...]:
    names = set()
    for schema in torch._C._jit_get_all_schemas():
        ns, _, op = schema.name.partition("::")
        if ns == namespace:
            names.add(f"{ns}.{op}")
    return tuple(sorted(names))


def suggest(name: str) -> list[str]:
    """Operator names close to a misspelt ``name`` (for did-you-mean messages)."""
    text = normalize(name)
    namespace = text.split(".", 1)[0]
    packet = ".".join(text.split(".")[:2])
    return difflib.get_close_matches(packet, _known(namespace), n=3, cutoff=0.75)
