"""What `compression=` accepts (None, a name `syncedu.compress` registers, or an object with
`average_(comm, tensors, key)` and `check(comm)`), resolved without importing that topic.
`TrainConfig` also reads two optional members: `strategies`, the names it runs under (default
every compressible one), and `check_config(cfg)`, which raises on a job it cannot run."""

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
