"""Public face of `syncedu.comm.launch`: start real ranks (see that module)."""

from syncedu.comm.launch import (  # noqa: F401
    DEFAULT_TIMEOUT,
    MAX_WORLD_SIZE,
    Pool,
    RunResult,
    TimeoutError,
    WorkerError,
    from_env,
    resolve_backend,
    run,
)
