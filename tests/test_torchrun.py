"""The same worker under torchrun: `launch.from_env()` joins the group torchrun set up."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.real


def test_worker_runs_under_torchrun(tmp_path):
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, "--standalone", "--nproc-per-node=2", "-m",
           "syncedu.examples.hello_allreduce"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith("rank "))
    assert lines == ["rank 0 of 2 (gloo): all_reduce gave 3",
                     "rank 1 of 2 (gloo): all_reduce gave 3"] or "nccl" in done.stdout


def test_from_env_without_torchrun_explains_itself(monkeypatch):
    from syncedu import launch

    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(RuntimeError, match="torchrun"):
        launch.from_env()


def test_torchcomm_wraps_a_script_default_group(tmp_path):
    script = tmp_path / "own_init.py"
    script.write_text(
        "import datetime, torch, torch.distributed as dist\n"
        "from syncedu.comm import TorchComm\n"
        "store = dist.FileStore(r'%s', 1)\n"
        "dist.init_process_group('gloo', store=store, rank=0, world_size=1,\n"
        "                        timeout=datetime.timedelta(seconds=30))\n"
        "comm = TorchComm()\n"
        "t = torch.ones(3); comm.all_reduce(t)\n"
        "print(comm.rank, comm.world_size, t.tolist(), comm.ledger.sent)\n"
        "dist.destroy_process_group()\n" % (tmp_path / "store"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "0 1 [1.0, 1.0, 1.0] 0"
