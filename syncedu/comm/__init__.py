"""The engine: the `Comm` interface, its implementations, the network, ledger and launcher.

- base.py `Comm` (what every algorithm is written against); local.py `LocalComm`
  (world size 1); torch_comm.py `TorchComm` (real processes);
- sim.py `SimComm`, simulated ranks on a logical clock (then, in the order a
  message meets them: sim_links.py, sim_delivery.py, sim_handles.py; built-ins
  in sim_collectives.py and sim_fast.py; where ranks run: sim_sched.py);
- network.py `Network` and alphabeta.py (the model), emulation.py (on real
  ranks), nccl_model.py (NCCL's tuning model);
- ledger.py, trace.py, wire.py (bytes per rank and op, every message, and what
  loopback really carried); runs.py (`RunResult`, argument checks);
- launch.py, procs.py, _worker.py: starting real ranks.
"""

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
