"""Layer 1, comm: the `Comm` interface, its two implementations, the ledger, the launcher.

- base.py: `Comm`, the interface every algorithm is written against;
- local.py: `LocalComm`, world size 1 in this process (the one-process reference);
- torch_comm.py: `TorchComm`, real processes over torch.distributed;
- sim.py: `SimComm`, simulated ranks with a logical clock (its files, in the order a
  message meets them: sim.py, sim_links.py, sim_delivery.py, sim_handles.py; built-ins
  in sim_collectives.py and sim_fast.py; where ranks run: sim_sched.py);
- trace.py: `Trace`, every message of a run (`res.trace`);
- nccl_model.py: NCCL's own tuning model (predicted all-reduce times);
- wire.py: the bytes the loopback interface really carried (a witness for the ledger);
- network.py: `Network`, the alpha-beta model with stragglers, jitter, loss;
- emulation.py: that model applied to real processes;
- ledger.py: bytes and messages per rank and per op;
- launch.py / procs.py / _worker.py: starting real ranks.
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
