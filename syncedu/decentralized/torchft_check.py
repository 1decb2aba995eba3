"""Streaming DiLoCo (streaming.py) against torchft 0.2.0's `DiLoCo` with fragments, on real ranks.

The same seeded job twice: once with our `StreamingDiLoCo` (2 real ranks over `TorchComm`
and Gloo, or 2 simulated ones: the same arithmetic), once as 2 torchft replica groups of one
rank each (a `Manager` per replica, a lighthouse in the caller), then every rank's final
parameters compared bit for bit.
Getting the same bits took the details torchft's local_sgd.py fixes (streaming.py, Steps 2-4):
the fragment schedule (`_step_post_hook`), the pseudo-gradient taken when the delayed allreduce
starts (`prepare_sync`), pseudo-gradients averaged, not parameters, and the global copy
saved before the `fragment_update_alpha` mix (`perform_sync`). Two more choices here:

- `Manager(init_sync=False)`: with the default True, the first quorum heals replica 1 from
  replica 0's state of that moment. That quorum comes at the first fragment's prepare step
  (H/F - tau, step 1 of `JOB`: local_sgd.py:759-767 calls `start_quorum()` there), and with
  the `use_async_quorum=False` that `DiLoCo` requires, `start_quorum` waits for it and applies
  the healed state at once (manager.py:606-615), before the pseudo-gradient is taken. Both
  replicas here start from the same seeded weights instead, as our broadcast makes them;
- one outer optimizer per fragment, as torchft's own tests build them. One optimizer over the
  whole model is accepted and silently wrong: `torch.optim.SGD` skips a parameter whose
  `.grad` is None, but here every `.grad` still holds the last inner backward's gradient
  (`_train` zeroes before `backward()`, not after the step), so each fragment's outer step
  also applies the other fragments' leftover inner gradients, with outer lr 0.7 and momentum
  (2.2 off in the outside review's run; harmless only if `.grad` is None at each sync).

The negative control is ours with one detail wrong, the pseudo-gradient taken at the sync step
instead of when the delayed allreduce starts (our delay 0 against torchft's delay >= 1): a
near miss that must not match.

Every torchft server binds 127.0.0.1 (lesson 11's `faults.torchft_run` patches, reused).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import tempfile

import torch
from torch import nn

from syncedu.comm import launch, sim
from syncedu.decentralized.streaming import StreamingConfig, StreamingDiLoCo, layers, split


# The job both sides run (a plain dict: it travels to the ranks); `compare(spec=)` overrides it.
JOB = dict(inner_steps=4, fragments=2, delay=1, alpha=0.5, steps=24)


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    """The seeded model and its inner optimizer, the same on both sides."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                          nn.Linear(16, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)


def _train(model, inner, replica: int, steps: int, after_step) -> dict:
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * replica + step)  # each replica its own data
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
        inner.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        inner.step()
        after_step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def ours(comm, spec: dict) -> dict:
    """One rank of our streaming DiLoCo on `spec` (like `JOB`); its final parameters."""
    model, inner = _model()
    algo = StreamingDiLoCo(model, comm, inner, inner_steps=spec["inner_steps"],
                           fragments=spec["fragments"],
                           config=StreamingConfig(delay=spec["delay"], alpha=spec["alpha"]))
    return _train(model, inner, comm.rank, spec["steps"], algo.after_step)


def theirs(comm, spec: dict, lighthouse: str, folder: str, hook=None) -> dict:
    """One torchft replica group (this rank alone) on the same job; its final parameters.
    `hook(manager)`, if given, returns what runs after each inner step (torchft_kill.py)."""
    replica = comm.rank
    log = os.path.join(folder, f"rank_{comm.rank}.log")
    os.dup2(os.open(log, os.O_WRONLY | os.O_CREAT), 2)  # torchft's own logs there, not the notebook
    from torchft import Manager, ProcessGroupGloo
    from torchft.checkpointing.http_transport import HTTPTransport
    from torchft.local_sgd import DiLoCo

    from syncedu.faults.torchft_run import loopback_patches, loopback_store

    loopback_patches()
    store, _sock = loopback_store()
    (model, inner), wait = _model(), datetime.timedelta(seconds=30)
    frags = [nn.ModuleList(g) for g in split(layers(model), spec["fragments"])]  # our cut
    outers = [torch.optim.SGD(m.parameters(), lr=0.7, momentum=0.9, nesterov=True) for m in frags]

    manager = Manager(
        pg=ProcessGroupGloo(timeout=wait), min_replica_size=2, use_async_quorum=False,
        init_sync=False, load_state_dict=model.load_state_dict, state_dict=model.state_dict,
        replica_id=f"replica_{replica}", store_addr="127.0.0.1", store_port=store.port,
        rank=0, world_size=1, lighthouse_addr=lighthouse, hostname="127.0.0.1", timeout=wait,
        quorum_timeout=wait, connect_timeout=wait,
        checkpoint_transport=HTTPTransport(timeout=wait, num_chunks=0))
    try:
        with DiLoCo(manager, frags, inner, outers, sync_every=spec["inner_steps"],
                    fragment_sync_delay=spec["delay"], fragment_update_alpha=spec["alpha"]):
            return _train(model, inner, replica, spec["steps"],
                          hook(manager) if hook else lambda: None)
    finally:
        manager.shutdown(wait=False)


@contextlib.contextmanager
def lighthouse(folder, **options):
    """A torchft `LighthouseServer` on 127.0.0.1 for the block, its log in `folder`; yields
    its address. `options`: the server's (min_replicas, heartbeat_timeout_ms, ...)."""
    from torchft._torchft import LighthouseServer

    from syncedu.faults.tft_procs import _stderr_to

    with _stderr_to(os.path.join(folder, "lighthouse.log")):
        house = LighthouseServer(bind="127.0.0.1:0", **options)
        try:
            yield "http://127.0.0.1:" + house.address().rsplit(":", 1)[1]
        finally:
            house.shutdown()


def compare(spec: dict | None = None, *, simulate: bool = False, timeout: float = 120.0) -> dict:
    """Ours on 2 real ranks (`simulate=True`: 2 simulated ranks, the same arithmetic without
    process start-up) and torchft on 2 real ones;
    {"equal" / "control_equal": every tensor bit for bit on both replicas, "max_diff" /
    "control_max_diff", "ours", "control", "theirs": per replica, name -> tensor}."""
    spec = {**JOB, **(spec or {})}
    if spec["delay"] < 1:
        raise ValueError(f"spec['delay']={spec['delay']} must be >= 1: the negative control "
                         f"takes the pseudo-gradient that many steps late")

    run_ours = (lambda s: sim.run(ours, 2, args=(s,))) if simulate else (
        lambda s: launch.run(ours, 2, args=(s,), timeout=timeout, output="quiet"))
    out = {"ours": list(run_ours(spec)), "control": list(run_ours({**spec, "delay": 0}))}
    folder = tempfile.mkdtemp(prefix="torchft_diloco_")
    with lighthouse(folder, min_replicas=2) as address:
        out["theirs"] = list(launch.run(theirs, 2, args=(spec, address, folder),
                                        timeout=timeout, output="quiet"))
    for name, mine in (("", out["ours"]), ("control_", out["control"])):
        pairs = [(x[k], y[k]) for x, y in zip(mine, out["theirs"]) for k in x]
        out[name + "equal"] = all(torch.equal(x, y) for x, y in pairs)
        out[name + "max_diff"] = max(float((x - y).abs().max()) for x, y in pairs)
    return out
