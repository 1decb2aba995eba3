"""Issue 45 item 6 on real ranks, with torch's FSDP2 + torch.distributed.checkpoint beside it:
AdamW, 2 steps on 2 real (Gloo) ranks, a sharded save; loaded on 3 real ranks, 2 steps more
on the same global batches; both equal to an unbroken 4-step run within 1e-6 (the optimizer
state too: resumed without it, the run is another one)."""

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from syncedu import launch
from syncedu.comm import sim
from syncedu.zero.fully_shard import FullyShard


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))  # odd rows at 2 and 3


def _rows(step, comm, size=6):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(size, 6, generator=g), torch.randint(0, 3, (size,), generator=g)
    return x.chunk(comm.world_size)[comm.rank], y.chunk(comm.world_size)[comm.rank]


def _train(comm, model, forward, opt, steps, finish=lambda: None):
    for step in steps:
        opt.zero_grad()
        x, y = _rows(step, comm)
        F.cross_entropy(forward(x), y).backward()
        finish()
        opt.step()


def _ours(comm, steps, folder, load=False, with_optimizer=True):
    fs = FullyShard(_net(), comm, shard=(nn.Linear,))
    opt = torch.optim.AdamW(fs.module.parameters(), lr=0.05, weight_decay=0.1)
    if load:
        saved = [torch.load(os.path.join(folder, f), mmap=True) for f in sorted(os.listdir(folder))]
        fs.load_sharded_state_dict(saved, opt if with_optimizer else None)
    _train(comm, fs.module, fs, opt, steps, fs.finish_gradient_synchronization)
    if folder is not None and not load:
        torch.save(fs.sharded_state_dict(opt), os.path.join(folder, f"rank{comm.rank}.pt"))
    return fs.full_parameters()


def _fsdp2(comm, steps, folder, load=False):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model, mesh = _net(), init_device_mesh("cpu", (comm.world_size,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    if load:  # DCP reads each rank's new rows out of the 2 ranks' shards
        model_sd, optim_sd = get_state_dict(model, opt)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=folder)
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    _train(comm, model, model, opt, steps)
    if not load:
        model_sd, optim_sd = get_state_dict(model, opt)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)
    return {k: p.full_tensor() for k, p in model.named_parameters()}


def _gap(got, want):
    assert got.keys() == want.keys()
    return max((got[k] - want[k]).abs().max().item() for k in want)


@pytest.mark.real
def test_saved_on_2_real_ranks_loaded_on_3_ours_and_fsdp2_with_dcp(pool2, tmp_path):
    unbroken = sim.run(_ours, 2, args=(range(4), None))[0]
    folders = {fn: str(tmp_path / fn.__name__) for fn in (_ours, _fsdp2)}
    for fn, folder in folders.items():
        os.makedirs(folder)
        pool2.run(fn, (range(2), folder))  # each of 2 real ranks writes its shards
    with launch.Pool(3, output="quiet", timeout=120) as pool3:
        for fn, folder in folders.items():
            for params in pool3.run(fn, (range(2, 4), folder, True)):
                assert _gap(params, unbroken) < 1e-6, fn.__name__
    fresh = sim.run(_ours, 3, args=(range(2, 4), folders[_ours], True, False))[0]
    assert _gap(fresh, unbroken) > 1e-3  # the witness: the optimizer's state mattered
