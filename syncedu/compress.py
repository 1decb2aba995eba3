"""Public face of `syncedu.strategies.compress`: gradient compressors (see that package)."""

from syncedu.strategies.compress import (  # noqa: F401
    BF16,
    FP16,
    REGISTRY,
    Cast,
    Compressor,
    PowerSGD,
    SignSGD,
    TopK,
    backend_refuses,
    resolve,
)
