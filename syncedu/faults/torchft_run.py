"""torchft for real: a lighthouse, two replica groups on Gloo, one SIGKILLed mid-step.

torchft (meta-pytorch/torchft, 0.2.0 here) makes every step a transaction
(`start_quorum()`, `manager.allreduce`, `should_commit()`). The run:

1. the parent serves a `LighthouseServer` (heartbeat timeout 2 s; its log to a
   file) and starts two replicas (`replica_main`, forked after one import of torch);
2. in its `kill_after + 1`-th step with both in the quorum, replica 1 SIGKILLs
   itself after `backward()`: replica 0's allreduce fails, `should_commit()` is
   False and its parameters stay as they were (the step is discarded);
3. after the heartbeat timeout the quorum shrinks to replica 0, which trains on;
4. a standby replica 1 (forked with the others) joins when the parent writes
   the `go` file; its first quorum heals it from replica 0 (model and optimizer);
5. both stop at the same step (a stop file) and save their weights: equal bits.

Every server listens on 127.0.0.1 only (torchft's default is every interface): the
lighthouse by its `bind`, the TCPStore by a socket we bind (`master_listen_fd`), and,
as a WORKAROUND (0.2.0 has no option), the manager and checkpoint servers by patches.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import tempfile
import time
from dataclasses import asdict, dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path

import torch

from syncedu.comm.ledger import Ledger, RankLedger, ring_allreduce_charge
from syncedu.train.harness import Result

# _stderr_to keeps its name while decentralized/torchft_check.py imports it so (for the lead).
from .tft_procs import _stderr_to, listening, start_replicas, wait_until, write_json


@dataclass(frozen=True)
class TorchftConfig:
    """The torchft drill of lesson 11: when replica 1 is killed, how long both train after,
    and every wait's limit (`heartbeat_ms` in ms, `pace`, `timeout`, `deadline` in seconds).
    """
    kill_after: int = 3  # replica 1 dies in its 4th step with both replicas in the quorum
    extra_steps: int = 5  # steps both train after the restarted replica healed
    heartbeat_ms: int = 2000
    pace: float = 0.05  # seconds slept per step (so the run is watchable)
    timeout: float = 10.0  # every torchft wait
    deadline: float = 90.0  # the whole run

    def __post_init__(self):
        if self.kill_after < 0 or self.extra_steps < 1 or min(
                self.heartbeat_ms, self.timeout, self.deadline) <= 0:
            raise ValueError(f"{self}: kill_after must be >= 0, extra_steps >= 1, "
                             "heartbeat_ms, timeout and deadline > 0")


def available() -> str | None:
    """None if torchft imports, else why not (its cells and tests then skip)."""
    try:
        import torchft  # noqa: F401
    except Exception as e:  # ImportError, or numpy missing (torchft 0.2.0 needs it undeclared)
        return f"torchft is not installed or does not import here: {e}"
    return None


def loopback_patches() -> None:
    """WORKAROUND (torchft 0.2.0): its manager and checkpoint servers on 127.0.0.1."""
    import torchft.checkpointing.http_transport as http_transport
    import torchft.manager as manager
    from torchft._torchft import ManagerServer

    def manager_server(**kwargs):
        return ManagerServer(**{**kwargs, "bind": "127.0.0.1:0"})

    class LoopbackHTTPServer(ThreadingHTTPServer):
        def __init__(self, address, handler):
            super().__init__(("127.0.0.1", address[1]), handler)

    def address(self) -> str:
        return f"http://127.0.0.1:{self._server.socket.getsockname()[1]}/checkpoint/"

    manager.ManagerServer = manager_server
    http_transport._IPv6HTTPServer = LoopbackHTTPServer
    http_transport.HTTPTransport.address = address


def loopback_store():
    """A TCPStore master listening on 127.0.0.1 only."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    store = torch.distributed.TCPStore("127.0.0.1", sock.getsockname()[1], is_master=True,
                                       wait_for_workers=False, master_listen_fd=sock.fileno())
    return store, sock


def _batch(replica: int, step: int):
    g = torch.Generator().manual_seed(7919 * replica + step)
    return torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)


def _setup(index: int, lighthouse: str, cfg: TorchftConfig):
    from torchft import Manager, ProcessGroupGloo
    from torchft.checkpointing.http_transport import HTTPTransport
    from torchft.optim import OptimizerWrapper

    loopback_patches()
    store, sock = loopback_store()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    wait = datetime.timedelta(seconds=cfg.timeout)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=wait), min_replica_size=1, use_async_quorum=False,
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]),
                                    opt.load_state_dict(sd["opt"])),
        state_dict=lambda: {"model": model.state_dict(), "opt": opt.state_dict()},
        replica_id=f"replica_{index}", store_addr="127.0.0.1", store_port=store.port, rank=0,
        world_size=1, lighthouse_addr=lighthouse, hostname="127.0.0.1", timeout=wait,
        quorum_timeout=wait, connect_timeout=wait,
        checkpoint_transport=HTTPTransport(timeout=wait, num_chunks=0))
    return manager, model, OptimizerWrapper(manager, opt), (store, sock)


def replica_step(manager, model, opt, index: int, kill) -> dict:
    """One step; a killed replica dies after backward, before its allreduce. `opt` is torchft's
    OptimizerWrapper: zero_grad() starts the quorum, step() steps only if should_commit()."""
    t0 = time.time()
    opt.zero_grad(set_to_none=True)
    t_quorum, step = time.time(), manager.current_step()
    x, y = _batch(index, step)
    torch.nn.functional.mse_loss(model(x), y).backward()
    if kill(step, manager.num_participants()):
        os.kill(os.getpid(), signal.SIGKILL)
    before = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad for p in model.parameters()]
    for w in [manager.allreduce(g) for g in grads]:
        w.wait()
    t_reduce = time.time()
    opt.step()
    committed = manager.current_step() == step + 1  # should_commit() counts a commit
    unchanged = all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    return dict(step=step, t0=t0, t_quorum=t_quorum, t_reduce=t_reduce, committed=committed,
                unchanged=unchanged, participants=manager.num_participants(),
                numel=sum(g.numel() for g in grads), itemsize=grads[0].element_size())


def replica_main(index: int, lighthouse: str, folder: str, cfg: TorchftConfig, kill: bool,
                 standby: bool = False) -> None:
    """One replica group (one rank): train until the stop file's step, log, save.

    A `standby` replica imports torchft, then waits for the `go` file: a replacement
    ready without the seconds an import takes (a scheduler would start it on failure).
    """
    out, cfg = Path(folder), (TorchftConfig(**cfg) if isinstance(cfg, dict) else cfg)
    log_fd = os.open(out / f"replica_{index}_{os.getpid()}.log", os.O_WRONLY | os.O_CREAT)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)  # torchft's own logs go to a file, not the notebook
    import torchft  # noqa: F401  (the slow part of a start, done before the wait)
    if standby:
        wait_until(lambda: (out / "go").exists(), time.time() + cfg.deadline, "the go file")
    manager, model, opt, _keep = _setup(index, lighthouse, cfg)
    log, start = [], time.time()

    def dies_now(step: int, participants: int) -> bool:
        together = sum(e["participants"] == 2 for e in log)
        if kill and participants == 2 and together >= cfg.kill_after:
            write_json(out / "killed", {"time": time.time(), "step": step})
            return True
        return False

    while time.time() - start < cfg.deadline:
        stop = json.loads((out / "stop").read_text()) if (out / "stop").exists() else None
        if stop is not None and manager.current_step() >= stop:
            break
        log.append(replica_step(manager, model, opt, index, dies_now))
        write_json(out / f"progress_{index}_{os.getpid()}", log)  # the whole log: a kill loses none
        time.sleep(cfg.pace)
    torch.save({"log": log, "params": model.state_dict(), "step": manager.current_step()},
               out / f"final_{index}_{os.getpid()}.pt")
    manager.shutdown(wait=False)
    os._exit(0)  # skip the interpreter's teardown of torchft's threads (seconds, nothing to save)


def _progress(folder: Path, index: int, pid: int, whole: bool = False):
    """A replica's last step (`whole`: every step it logged), or None before its first."""
    path = folder / f"progress_{index}_{pid}"
    log = json.loads(path.read_text()) if path.exists() else [None]
    return log if whole else log[-1]


def _ledger(logs: list[tuple[int, list[dict]]]) -> Ledger:
    """Each replica's steps, charged by formula ("modeled": torchft's Gloo hides its messages)
    as one ring allreduce of its gradients among that step's participants: a quorum of one
    sends nothing; the survivor's failed step is charged whole, as if it had completed."""
    ranks = [RankLedger(r, kind="modeled") for r in range(2)]
    for index, log in logs:
        for e in log:  # alone in its quorum, a replica is rank 0 of a ring of 1
            ranks[index].record("all_reduce", **ring_allreduce_charge(
                e["numel"], e["itemsize"], e["participants"], min(index, e["participants"] - 1)))
    return Ledger(ranks)


@dataclass
class TorchftResult(Result):
    """What listened, the kill ({"time", "step", "log"}) and its exit code, the survivor's and the
    restarted replica's {"log", "params", "step"}, the ledger (`_ledger`), wall-clock seconds."""

    folder: str
    listening: list[str]
    exitcode: int
    killed: dict
    survivor: dict
    restarted: dict


def run(world_size: int = 2, *, network=None, simulate: bool = False, folder: str | None = None,
        **options) -> TorchftResult:
    """Steps 1-5 (the parent), on real processes only; `options` are `TorchftConfig`'s fields.
    `faults.ft.run` simulates the same kind of protocol, from scratch, at any size."""
    if world_size != 2 or network is not None or simulate is not False:
        raise ValueError(f"world_size={world_size!r}, network={network!r}, simulate={simulate!r}:"
                         " this drill runs 2 torchft replica groups (one killed, one surviving) "
                         "as real processes over Gloo: world_size=2, network=None, simulate=False")
    cfg = TorchftConfig(**options)
    from torchft._torchft import LighthouseServer

    out = Path(folder or tempfile.mkdtemp(prefix="torchft_"))
    start, result, forker = time.time(), {"folder": str(out)}, None
    deadline = start + cfg.deadline
    ours = set(listening([os.getpid()]))  # this process's own listeners, before the lighthouse
    with _stderr_to(out / "lighthouse.log"):
        lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1,  # Step 1
                                      heartbeat_timeout_ms=cfg.heartbeat_ms)
        try:
            port = lighthouse.address().rsplit(":", 1)[1]
            spec = [f"http://127.0.0.1:{port}", str(out), asdict(cfg)]
            forker, (first, doomed, reborn) = start_replicas(
                [[0, *spec, False, False], [1, *spec, True, False], [1, *spec, False, True]], out)
            wait_until(lambda: _progress(out, 0, first) and _progress(out, 1, doomed), deadline,
                  "both replicas training")
            result["listening"] = sorted(
                set(listening([os.getpid(), first, doomed, reborn])) - ours)
            wait_until(lambda: (out / f"exit_{doomed}").exists(), deadline, "the kill")  # Step 2
            result["exitcode"] = json.loads((out / f"exit_{doomed}").read_text())
            wait_until(lambda: (e := _progress(out, 0, first)) and e["participants"] == 1
                  and e["committed"], deadline, "a step without the dead one")  # Step 3
            write_json(out / "go", True)  # Step 4: the standby replaces the killed replica
            wait_until(lambda: _progress(out, 1, reborn), deadline, "the restarted replica's step")
            write_json(out / "stop", _progress(out, 1, reborn)["step"] + cfg.extra_steps)  # Step 5
            forker.wait(max(0.0, deadline - time.time()))
            result["survivor"] = torch.load(out / f"final_0_{first}.pt")
            result["restarted"] = torch.load(out / f"final_1_{reborn}.pt")
            result["killed"] = {**json.loads((out / "killed").read_text()),
                                "log": _progress(out, 1, doomed, whole=True)}
            result["ledger"] = _ledger([(0, result["survivor"]["log"]),
                                        (1, result["killed"]["log"] + result["restarted"]["log"])])
        finally:
            if forker is not None:
                if forker.poll() is None:
                    os.killpg(forker.pid, signal.SIGKILL)  # the forker and its replicas
                forker.wait(5)
                forker.stdout.close()
            lighthouse.shutdown()
    return TorchftResult(**result, seconds=time.time() - start)


def verdicts(result: TorchftResult) -> dict:
    """What the run showed: discard, continue, recover, equal weights; and the timings (s)."""
    killed, log = result.killed["time"], result.survivor["log"]
    failed = [e for e in log if e["step"] == result.killed["step"] and not e["committed"]]
    alone = [e for e in log if e["t0"] > killed and e["participants"] == 1 and e["committed"]]
    first = result.restarted["log"][0]
    a, b = result.survivor["params"], result.restarted["params"]
    return {
        "discarded, parameters unchanged": bool(failed) and all(e["unchanged"] for e in failed),
        "quorum shrank, survivor trained on": bool(alone),
        "restarted replica healed from its peer": first["step"] > 0 and first["participants"] == 2,
        "final weights bit-identical": result.survivor["step"] == result.restarted["step"]
        and all(torch.equal(a[k], b[k]) for k in a),
        "SIGKILLed (exit code -9)": result.exitcode == -signal.SIGKILL,
        "only 127.0.0.1 listening": bool(result.listening)
        and all(x.startswith("127.0.0.1:") for x in result.listening),
        "detect_s": failed[0]["t_reduce"] - killed if failed else None,
        "shrink_s": alone[0]["t_quorum"] - killed if alone else None,
        "recover_s": first["t_quorum"] - first["t0"],
    }


if __name__ == "__main__":  # the replicas' forker, started by tft_procs.start_replicas
    import sys

    from .tft_procs import fork_main

    fork_main(replica_main, json.loads(sys.argv[2]))
