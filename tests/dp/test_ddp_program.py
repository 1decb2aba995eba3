"""The complete DDP program (examples/ddp_program.py), run for real.

Started the two ways a learner starts it (mp.spawn, torchrun), it must train to
the parameters of one process on the global batch with the same data order
(`train.run("single")`) and of `train.run("ddp", 2)`, save a checkpoint rank 0
wrote behind a barrier, resume from one, and show what forgetting
`sampler.set_epoch` changes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from syncedu import train
from syncedu.train import data, models, sampling
from syncedu.ui.show import program

ddp_program = program("ddp_program")
SCRIPT = ddp_program.__file__

pytestmark = pytest.mark.real

B = 64
PER_EPOCH = 1797 // B  # 28 steps: the sampler and the loader both drop the ragged tail


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _launch(args: list[str], cwd, torchrun: bool = False,
            ok: bool = True) -> subprocess.CompletedProcess:
    if torchrun:
        exe = os.path.join(os.path.dirname(sys.executable), "torchrun")
        cmd = [exe, "--standalone", "--nproc-per-node=2", SCRIPT]
    else:
        cmd = [sys.executable, SCRIPT, "--spawn", "2"]
    done = subprocess.run(cmd + args + ["--timeout", "60"], capture_output=True, text=True,
                          timeout=240, cwd=cwd)
    assert (done.returncode == 0) == ok, done.stderr[-3000:]
    return done


@pytest.mark.parametrize("torchrun", [False, True], ids=["mp.spawn", "torchrun"])
def test_a_failing_rank_still_fails_the_job(tmp_path, torchrun):
    # leave() exits 0 without teardown only after train() returned: a rank that raises
    # (here: an unreadable checkpoint to resume from) must still fail the job, with its error.
    ckpt = tmp_path / "ckpt.pt"
    ckpt.write_bytes(b"not a checkpoint")
    done = _launch(["--epochs", "1", "--checkpoint", str(ckpt)], tmp_path, torchrun, ok=False)
    assert "UnpicklingError" in done.stderr, done.stderr[-3000:]


def test_spawn_equals_one_process_and_train_run_ddp(tmp_path, pool):
    out, ckpt = tmp_path / "out.pt", tmp_path / "ckpt.pt"
    done = _launch(["--epochs", "2", "--out", str(out), "--checkpoint", str(ckpt)], tmp_path)
    assert "rank 0 of 2 (gloo): 56 steps" in done.stdout or "nccl" in done.stdout
    got = torch.load(out)
    single = train.run("single", 1, steps=2 * PER_EPOCH, global_batch=B, lr=0.1)
    assert _max_diff(got["params"], single.params) < 1e-5
    assert max(abs(a - b) for a, b in zip(got["loss"], single.loss)) < 1e-5
    ddp = train.run("ddp", 2, steps=2 * PER_EPOCH, global_batch=B, lr=0.1, pool=pool)
    assert _max_diff(got["params"], ddp.params) < 1e-5
    saved = torch.load(ckpt)  # rank 0's checkpoint after the last epoch
    assert saved["epoch"] == 2 and _max_diff(saved["model"], got["params"]) == 0.0


def _adam_checkpoint(path, epochs: int) -> None:
    """What the program saves after `epochs` epochs, computed here in one process."""
    model = models.make("mlp", seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for x, y in sampling.batches(data.digits(), epochs * PER_EPOCH, B, seed=0):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    torch.save({"epoch": epochs, "model": model.state_dict(), "optimizer": opt.state_dict()},
               path)


def test_torchrun_resumes_adam_and_forgetting_set_epoch_repeats_the_order(tmp_path):
    """One launch (they cost seconds each): torchrun, Adam, resume, no set_epoch."""
    out, ckpt = tmp_path / "out.pt", tmp_path / "ckpt.pt"
    _adam_checkpoint(ckpt, epochs=1)  # the ranks load it with map_location, then train epoch 2
    _launch(["--epochs", "2", "--optimizer", "adam", "--lr", "0.01", "--forget-set-epoch",
             "--out", str(out), "--checkpoint", str(ckpt)], tmp_path, torchrun=True)
    got = torch.load(out)
    assert len(got["loss"]) == PER_EPOCH  # only the second epoch ran
    assert torch.load(ckpt)["epoch"] == 2
    kw = dict(steps=2 * PER_EPOCH, global_batch=B, lr=0.01, optimizer="adam")
    # Without set_epoch the second epoch replays the first one's order (the first
    # epoch's order is the same either way, so the checkpoint fits both runs).
    forgot = train.run("single", 1, set_epoch=False, **kw)
    assert _max_diff(got["params"], forgot.params) < 1e-5
    right = train.run("single", 1, **kw)
    assert _max_diff(got["params"], right.params) > 1e-3  # a different run, not noise


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="optimizer"):
        ddp_program.Config(optimizer="lamb")
    with pytest.raises(ValueError, match="epochs"):
        ddp_program.Config(epochs=0)
    with pytest.raises(ValueError, match="world_size"):
        ddp_program.spawn(2, ddp_program.Config(global_batch=63))  # global_batch % 2
    with pytest.raises(ValueError, match="rank"):
        ddp_program.setup(2, 2)
