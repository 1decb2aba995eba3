"""Checkers for notebooks/08_horovod_vs_ddp's exercises."""

from __future__ import annotations

import functools
import inspect

from syncedu.comm.ledger import ring_allreduce_elements
from syncedu.horovod import launch as horovod_launch
from syncedu.ui.checkers import answered, checker, not_attempted, verdict

# The DDP script the learner converts: the MLP seeded by the rank (only a broadcast makes the
# ranks agree), 16 samples per rank, lr 0.05 x world size, two epochs (a missing set_epoch shows).
EPOCHS = 2
JOB = dict(steps=EPOCHS * (1797 // 32), global_batch=32, lr=0.1, seed=0)


def _shortcut(fn) -> str:
    """Why `fn` is not a conversion (it calls the page's recipe), or ''."""
    code = getattr(fn, "__code__", None)
    names = set(getattr(code, "co_names", ())) | set(getattr(code, "co_freevars", ()))
    return ("it calls the page's horovod_recipe: write the conversion yourself"
            if "horovod_recipe" in names else "")


def _recorded(fn):
    """`fn` to run in each rank, returning (its result, the `op` of every DistributedOptimizer):
    the run, not the source, says which reduction the learner chose. The checker seeds every
    `models.make` by the rank, whatever seed the learner passed, so that only the learner's
    `broadcast_parameters` can make the ranks start alike."""
    def ranked():
        import horovod.torch as hvd

        from syncedu.train import models

        make, real, ops = models.make, hvd.DistributedOptimizer, []
        models.make = lambda name, seed=0, **kw: (hvd.init(), make(name, seed=hvd.rank(), **kw))[1]
        names = {hvd.Average: "Average", hvd.Sum: "Sum", hvd.Adasum: "Adasum"}

        def recording(*args, **kwargs):
            op = inspect.signature(real).bind(*args, **kwargs).arguments.get("op", hvd.Average)
            ops.append(names.get(op, str(op)))
            return real(*args, **kwargs)

        hvd.DistributedOptimizer = recording
        try:
            return fn(), ops
        finally:
            hvd.DistributedOptimizer, models.make = real, make
    return ranked


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
        not_attempted(name)
    if why_not := _shortcut(my_horovod_train):
        return verdict(name, False, why_not)
    ok, why = horovod_launch.available()
    if not ok:
        print(f"{name}: skipped: {why}")
        return False
    try:
        res = horovod_launch.run(_recorded(my_horovod_train), 2, timeout=180, quiet=True)
    except horovod_launch.HorovodRunError as e:
        last = [line for line in e.output.splitlines() if "Error" in line][-1:]
        return verdict(name, False, f"a rank failed: {last[0] if last else e}")
    except TimeoutError:
        return verdict(name, False, "it hung: do all ranks submit the same tensor names?")
    return judge(res)


@functools.lru_cache(maxsize=1)
def _reference() -> dict:
    from syncedu import train

    return train.run("single", 1, **JOB).params


def judge(res: list) -> bool:
    """Exercise 08.1's verdict on one run: `res` = each rank's `(state_dict, ops)`."""
    name = "Exercise 1 (convert DDP to Horovod)"
    ref = _reference()
    (got, ops), other = res[0], res[-1][0]
    if not isinstance(got, dict) or set(got) != set(ref):
        return verdict(name, False, f"return rank 0's model.state_dict() (keys {sorted(ref)})")
    if not ops:
        return verdict(name, False, "hvd.DistributedOptimizer never ran: without it nothing "
                       "is averaged, each rank trains on its own shard")
    diff = max((got[k] - ref[k]).abs().max().item() for k in ref)
    wrong = [op for op in ops if op != "Average"]
    if wrong:
        why = ("plain SGD takes the same step: Sum with lr is Average with lr x N, but not "
               "with clipping, Adam or weight decay" if diff < 1e-5 else
               "the summed gradient is N times the average")
        return verdict(name, False, f"the run used op=hvd.{wrong[0]} and ends {diff:.3g} from one "
                       f"process on the global batch ({why}); use op=hvd.Average with lr x "
                       "hvd.size()")
    gap = max((other[k] - got[k]).abs().max().item() for k in ref)
    if gap > 1e-6:
        return verdict(name, False, f"the two ranks end {gap:.3g} apart: the ranks start from "
                        "different weights (seed=hvd.rank()); hvd.broadcast_parameters makes "
                        "them start from rank 0's, and DistributedOptimizer keeps them together")
    good = diff < 1e-5
    return verdict(name, good, "" if good else f"the parameters differ by {diff:.3g} from one "
                    f"process on the global batch ({EPOCHS} epochs): sampler.set_epoch(epoch) "
                    "every epoch? lr scaled by hvd.size()? op=hvd.Average?")


@checker
def wire_bytes(answer) -> bool:
    """Exercise 08.2: bytes one rank sends per optimizer step under DistributedOptimizer."""
    name = "Exercise 2 (bytes on the wire)"
    cases = [(8970, 2, 1, False), (8970, 2, 4, False), (8970, 2, 1, True), (1000, 4, 2, True)]
    got = answered(name, lambda: [answer(p, n, k, f) for p, n, k, f in cases])
    want = [ring_allreduce_elements(p, n, 0)[0] * (2 if f else 4) for p, n, _, f in cases]
    good = [round(g) for g in got] == want
    return verdict(name, good, "" if good else f"got {got}; a ring sends 2(N-1)/N of the "
                    "buffer, once per optimizer step, in the dtype on the wire")
