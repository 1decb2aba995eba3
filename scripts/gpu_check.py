"""`make gpu-check`: one short, prepared check of the GPU paths (no network, installs nothing).

On a machine without CUDA it says so and exits 0. With CUDA it:

1. prints the GPU, torch and NCCL versions;
2. runs the tests marked `gpu` (pytest -m gpu);
3. executes every notebook (no output comparison: a GPU changes device strings and
   timings) and reports pass or fail and the time of each;
4. measures the busbw of torch's built-in all_reduce beside our pipelined ring, with NCCL
   on as many GPUs as there are (2 to 4), or says why it cannot.

It must finish in under 5 minutes on one GPU and run with torch 2.11 as well as 2.13, so it
uses only long-standing APIs and skips (with the reason) whatever tool is missing.
Exit status: 0 when everything that ran passed (skips included), 1 otherwise.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET_S = 270  # leave a margin under the 5-minute promise
NOTEBOOK_TIMEOUT_S = 150


def has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def versions() -> list[str]:
    import torch

    nccl = ".".join(map(str, torch.cuda.nccl.version())) if has("torch.cuda.nccl") else "?"
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return [f"GPU: {len(gpus)} x {gpus[0]}" if gpus else "GPU: none",
            f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}",
            f"python {sys.version.split()[0]} ({sys.executable})"]


def gpu_tests() -> tuple[list[str], bool]:
    if not has("pytest"):
        return ["gpu tests: SKIPPED (pytest is not installed here)"], True
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p",
                           "no:cacheprovider", "tests"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    tail = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
    ok = proc.returncode in (0, 5)  # 5: no test collected
    verdict = "PASS" if ok else "FAIL"
    return [f"gpu tests: {verdict} in {time.perf_counter() - t0:.1f} s ({tail})"], ok


def notebooks(deadline: float) -> tuple[list[str], bool]:
    if not (has("nbformat") and has("nbclient") and has("ipykernel")):
        return ["notebooks: SKIPPED (nbformat/nbclient/ipykernel not installed here)"], True
    import nbformat
    from nbclient import NotebookClient

    lines, all_ok = [], True
    for path in sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb"))):
        name = os.path.basename(path)
        if time.perf_counter() > deadline:
            lines.append(f"  {name:40s} SKIPPED (time budget spent)")
            continue
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(nb, timeout=NOTEBOOK_TIMEOUT_S, kernel_name="python3",
                                resources={"metadata": {"path": os.path.dirname(path)}})
        t0 = time.perf_counter()
        try:
            client.execute()
            verdict = "PASS"
        except Exception as e:  # CellExecutionError, timeouts, a dead kernel
            last = (str(e).strip().splitlines() or [""])[-1][:100]
            verdict, all_ok = f"FAIL ({type(e).__name__}: {last})", False
        lines.append(f"  {name:40s} {verdict:6s} {time.perf_counter() - t0:6.1f} s")
    return ["notebooks (executed with the GPU visible; NCCL wherever each rank has a GPU):"] + \
        lines, all_ok


def _busbw_worker(comm, nbytes: int, rounds: int):
    import torch

    from syncedu import collectives

    t = torch.ones(nbytes // 4, device=comm.device)
    ring = "ring_pipelined" if "ring_pipelined" in collectives.ALGORITHMS else "ring"
    out = {}
    for name, call in (("built-in", lambda: comm.all_reduce(t)),
                       ("our ring", lambda: collectives.allreduce(comm, t, algorithm=ring))):
        call()  # warm-up
        torch.cuda.synchronize()
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(rounds):
            call()
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - t0) / rounds
        n = comm.world_size
        out[name] = nbytes / seconds * 2 * (n - 1) / n / 1e9  # nccl-tests busbw, GB/s
    return out


def busbw() -> tuple[list[str], bool]:
    import torch

    n = min(torch.cuda.device_count(), 4)
    if n < 2:
        return ["busbw: SKIPPED (NCCL needs one GPU per rank and this machine has "
                f"{torch.cuda.device_count()}; two ranks cannot share a GPU)"], True
    if not has("cloudpickle"):
        return ["busbw: SKIPPED (cloudpickle is not installed here)"], True
    from syncedu import launch

    lines = [f"busbw, {n} ranks, NCCL (GB/s, nccl-tests convention):"]
    for mib in (16, 256):
        res = launch.run(_busbw_worker, n, args=(mib << 20, 10), backend="nccl", timeout=120,
                         output="quiet")
        lines.append(f"  {mib:4d} MiB: built-in {res[0]['built-in']:7.1f}   "
                     f"our ring {res[0]['our ring']:7.1f}")
    return lines, True


def main() -> int:
    sys.path.insert(0, ROOT)
    os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])
    if not has("torch"):
        print(f"gpu-check: torch is not installed for {sys.executable}; nothing to check "
              "(run `make setup` first, or set PY=/path/to/python with torch)")
        return 1
    import torch

    if not torch.cuda.is_available():
        print(f"gpu-check: no CUDA device on this machine (torch {torch.__version__}); "
              "nothing to check. Run `make gpu-check` on a GPU machine.")
        return 0
    t0 = time.perf_counter()
    print("== syncedu gpu-check ==", *versions(), sep="\n", flush=True)
    ok = True
    steps = (("gpu tests", gpu_tests), ("notebooks", lambda: notebooks(t0 + BUDGET_S - 60)),
             ("busbw", busbw))
    for name, step in steps:
        try:
            lines, passed = step()
        except Exception as e:  # report and go on: one broken step must not hide the others
            lines, passed = [f"{name}: ERROR {type(e).__name__}: {e}"], False
        print(*lines, sep="\n", flush=True)
        ok &= passed
    print(f"total {time.perf_counter() - t0:.0f} s: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
