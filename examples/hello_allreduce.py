"""The first worker of notebook 00, as a script for torchrun.

    torchrun --standalone --nproc-per-node=2 examples/hello_allreduce.py

`launch.from_env()` joins the group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) and hands back the `comm` that `launch.run` gives a notebook's worker; on
several machines, add `--nnodes`, `--node-rank` and `--rdzv-endpoint`.
"""

from __future__ import annotations

import sys

import torch

from syncedu.comm import launch


def hello(comm):
    """Every rank contributes rank + 1; after all_reduce each holds 1 + 2 + ... + N."""
    t = torch.full((4,), float(comm.rank + 1), device=comm.device)
    comm.all_reduce(t)
    return t.sum().item() / 4


def main() -> None:
    comm = launch.from_env()  # sync: join the group torchrun describes
    total = hello(comm)
    # One write per line: ranks share torchrun's stdout, and print() may write the
    # text and the newline separately, letting another rank's line slip in between.
    sys.stdout.write(f"rank {comm.rank} of {comm.world_size} ({comm.backend}): "
                     f"all_reduce gave {total:g}\n")
    sys.stdout.flush()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
