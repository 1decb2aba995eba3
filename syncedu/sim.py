"""Public face of `syncedu.comm.sim`: simulated ranks with a logical clock (see that module)."""

from syncedu.comm.errors import DeadlockError, TimeoutError, WorkerError  # noqa: F401
from syncedu.comm.sim import DEFAULT_TIMEOUT, MAX_WORLD_SIZE, SimComm, run  # noqa: F401
