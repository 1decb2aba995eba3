"""The same worker under torchrun: `launch.from_env()` joins the group torchrun set up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real


def test_worker_runs_under_torchrun(tmp_path):
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    script = Path(__file__).resolve().parents[2] / "examples" / "hello_allreduce.py"
    # --redirects 1: each rank's stdout to its own file; two ranks sharing one pipe can
    # interleave within a line (print writes the text and the newline separately)
    cmd = [torchrun, "--standalone", "--nproc-per-node=2", f"--log-dir={tmp_path / 'logs'}",
           "--redirects=1", str(script)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    outs = "".join(p.read_text() for p in (tmp_path / "logs").rglob("stdout.log"))
    lines = sorted(line for line in outs.splitlines() if line.startswith("rank "))
    assert lines == ["rank 0 of 2 (gloo): all_reduce gave 3",
                     "rank 1 of 2 (gloo): all_reduce gave 3"] or "nccl" in outs


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


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_elastic_agent_restarts_the_group_and_the_job_resumes_from_its_checkpoint(tmp_path):
    import psutil

    from syncedu import train
    from syncedu.ui.show import program

    elastic_ddp = program("elastic_ddp")

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    res = elastic_ddp.launch_elastic(crash_rank=1, crash_epoch=1, epochs=2, timeout=150,
                                     workdir=str(tmp_path))
    assert res.returncode == 0 and res.attempt == 1 and res.resumed_at == 1, res.output[-2000:]
    ref = train.run("single", 1, steps=2 * (1797 // 64), global_batch=64, lr=0.1, seed=0)
    assert max((res.params[k] - ref.params[k]).abs().max().item() for k in ref.params) < 1e-5
    left = [p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE
            and "resource_tracker" not in " ".join(p.cmdline())]
    assert not left, f"processes left behind: {[p.cmdline() for p in left]}"


def test_launch_elastic_bad_arguments_name_the_parameter():
    from syncedu.ui.show import program

    elastic_ddp = program("elastic_ddp")

    for kwargs, name in [(dict(nproc=0), "nproc"), (dict(crash_rank=2), "crash_rank"),
                         (dict(crash_epoch=2), "crash_epoch"), (dict(timeout=0), "timeout"),
                         (dict(epochs=0), "epochs=0"), (dict(max_restarts=-1), "max_restarts"),
                         (dict(global_batch=0), "global_batch")]:
        with pytest.raises(ValueError, match=name):
            elastic_ddp.launch_elastic(**kwargs)


@pytest.mark.timeout(60)
def test_stop_reaches_workers_in_sessions_of_their_own():
    # torchrun starts its workers with start_new_session=True: a signal to torchrun's process
    # group misses them. A stand-in agent that ignores SIGTERM (so it gets SIGKILLed) with one
    # such worker: _stop must still leave nothing behind.
    import psutil

    from syncedu.ui.show import program

    elastic_ddp = program("elastic_ddp")

    agent = ("import signal, subprocess, sys, time\n"
             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
             " start_new_session=True)\n"
             "print('ready', flush=True)\n"
             "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", agent], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        (worker,) = psutil.Process(proc.pid).children()
        elastic_ddp._stop(proc)
        assert proc.poll() is not None
        assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
