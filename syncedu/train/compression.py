"""What `compression=` accepts, resolved without importing the compression topic.

None, a name registered by `syncedu/compress/__init__.py` (`COMPRESSORS[name] =
cls`: "fp16", "bf16", "topk", ...) or an object with `average_(comm, tensors,
key)` and `check(comm)`; so the harness and `dp.DataParallel` never import lesson 07.
"""

from __future__ import annotations

COMPRESSORS: dict[str, type] = {}  # name -> class, filled by syncedu.compress


def resolve(spec):
    """None or "none" -> None; a registered name -> a fresh compressor; a compressor -> itself."""
    if spec is None or spec == "none":
        return None
    if hasattr(spec, "average_") and hasattr(spec, "check"):
        return spec
    if isinstance(spec, str) and spec in COMPRESSORS:
        return COMPRESSORS[spec]()
    raise ValueError(f"compression={spec!r} is not supported; use None, one of "
                     f"{sorted(COMPRESSORS)}, or a Compressor from syncedu.compress")
