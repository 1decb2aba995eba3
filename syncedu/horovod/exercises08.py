"""Checkers for notebooks/08_horovod_vs_ddp's exercises."""

from __future__ import annotations

import inspect

from syncedu.comm.ledger import ring_allreduce_elements
from syncedu.horovod import launch as horovod_launch
from syncedu.ui.checkers import attempt, checker, verdict

# The job of the DDP script the learner converts: the digits, the MLP seeded by the rank
# (so only a broadcast of rank 0's weights makes the ranks agree), 16 samples per rank
# (global batch 32), lr 0.05 per rank scaled by the world size, two epochs (so a missing
# set_epoch shows: epoch 1 would repeat epoch 0's order), DistributedSampler(seed=0).
EPOCHS = 2
JOB = dict(steps=EPOCHS * (1797 // 32), global_batch=32, lr=0.1, seed=0)


def _shortcut(fn) -> str:
    """Why `fn`'s source is not a conversion (calls the page's recipe, sums), or ''."""
    code = getattr(fn, "__code__", None)
    names = set(getattr(code, "co_names", ())) | set(getattr(code, "co_freevars", ()))
    if "horovod_recipe" in names:
        return "it calls the page's horovod_recipe: write the conversion yourself"
    if "Sum" in names:
        return ("op=hvd.Sum with an unscaled lr is the same SGD step only while nothing "
                "non-linear touches the gradient (clipping, Adam); the exercise asks for "
                "op=hvd.Average and lr x hvd.size()")
    return ""


def _stub(fn) -> bool:
    try:
        return "NotImplementedError" in inspect.getsource(fn)
    except (OSError, TypeError):
        return False


@checker
def convert(my_horovod_train) -> bool:
    """Exercise 08.1: the DDP script, converted to Horovod, run on 2 Horovod ranks."""
    name = "Exercise 1 (convert DDP to Horovod)"
    if _stub(my_horovod_train):
        print(f"{name}: not attempted yet - write your answer and re-run this cell")
        return False
    why_not = _shortcut(my_horovod_train)
    if why_not:
        return verdict(name, False, why_not)
    ok, why = horovod_launch.available()
    if not ok:
        print(f"{name}: skipped: {why}")
        return False
    try:
        res = horovod_launch.run(my_horovod_train, 2, timeout=180, quiet=True)
    except horovod_launch.HorovodRunError as e:
        last = [line for line in e.output.splitlines() if "Error" in line][-1:]
        return verdict(name, False, f"a rank failed: {last[0] if last else e}")
    except TimeoutError:
        return verdict(name, False, "it hung: do all ranks submit the same tensor names?")
    from syncedu import train

    ref = train.run("single", 1, **JOB).params
    got = res[0]
    if not isinstance(got, dict) or set(got) != set(ref):
        return verdict(name, False, f"return rank 0's model.state_dict() (keys {sorted(ref)})")
    gap = max((res[1][k] - got[k]).abs().max().item() for k in ref) if len(res) > 1 else 0.0
    if gap > 1e-6:
        return verdict(name, False, f"the two ranks end {gap:.3g} apart: the ranks start from "
                        "different weights (seed=hvd.rank()); hvd.broadcast_parameters makes "
                        "them start from rank 0's, and DistributedOptimizer keeps them together")
    diff = max((got[k] - ref[k]).abs().max().item() for k in ref)
    good = diff < 1e-5
    return verdict(name, good, "" if good else f"the parameters differ by {diff:.3g} from one "
                    f"process on the global batch ({EPOCHS} epochs): sampler.set_epoch(epoch) "
                    "every epoch? lr scaled by hvd.size()? op=hvd.Average?")


@checker
def wire_bytes(answer) -> bool:
    """Exercise 08.2: bytes one rank sends per optimizer step under DistributedOptimizer."""
    name = "Exercise 2 (bytes on the wire)"
    cases = [(8970, 2, 1, False), (8970, 2, 4, False), (8970, 2, 1, True), (1000, 4, 2, True)]
    ok, got = attempt(name, lambda: [answer(p, n, k, f) for p, n, k, f in cases])
    if not ok:
        return False
    want = [ring_allreduce_elements(p, n, 0)[0] * (2 if f else 4) for p, n, _, f in cases]
    good = [round(g) for g in got] == want
    return verdict(name, good, "" if good else f"got {got}; a ring sends 2(N-1)/N of the "
                    "buffer, once per optimizer step, in the dtype on the wire")
