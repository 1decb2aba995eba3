"""The engine: `Comm` (base.py) on one rank (local.py), real ranks (torch_comm.py, started by
launch.py) and simulated ones (sim*.py); the network model, the ledger and the trace."""

from .base import Comm, Work
from .errors import DeadlockError, TimeoutError, WorkerError
from .ledger import Ledger, RankLedger
from .local import LocalComm
from .network import PRESETS, Network
from .runs import RunResult
from .torch_comm import TorchComm
from .trace import Record, Trace

__all__ = ["Comm", "Work", "TorchComm", "LocalComm", "Network", "PRESETS", "Ledger", "RankLedger",
           "RunResult", "WorkerError", "TimeoutError", "DeadlockError", "Trace", "Record"]
