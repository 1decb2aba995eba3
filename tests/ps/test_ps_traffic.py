"""Lesson 04's traffic claims, counted from the trace of simulated runs: with S = W servers
a worker moves P each way; a co-located machine (worker w + server w) moves the ring's
2(W-1)/W P, the same as the simulated ring all-reduce's counted ledger."""

import pytest

from syncedu import ps, train


@pytest.mark.parametrize("workers", [3, 4])
def test_sharded_worker_and_colocated_machine(workers):
    p4, steps = ps.numel() * 4, 3
    h = ps.run("sync", workers, servers=workers, steps=steps, global_batch=4 * workers,
               simulate=True, compute_seconds=0)
    t = [r for r in h.trace if r.tag in (ps.PUSH_TAG, ps.PULL_TAG)]
    assert sum(r.nbytes for r in t if r.dst == 0) / (steps - 1) == p4
    assert sum(r.nbytes for r in t if r.src == 0) / steps == p4 + 4 * workers
    machine = {0, workers}
    machine_in = (sum(r.nbytes for r in t if r.dst == workers and r.src not in machine) / steps
                  + sum(r.nbytes for r in t if r.dst == 0 and r.src not in machine) / (steps - 1))
    flat = train.run("flat", workers, steps=2, global_batch=4 * workers, simulate=True)
    ring = flat.ledger.ops["all_reduce"].received[0] / 2
    assert abs(machine_in - ring) <= 8 * workers
    assert machine_in < 2 * p4
