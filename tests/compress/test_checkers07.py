"""Lesson 07's checkers: a learner's right answer passes, plausible wrong ones are rejected
with a message that names the mistake (issue 23, checkers list)."""

import math

import pytest
import torch

from syncedu import compress
from syncedu.compress import exercises07 as ex


class LearnerTopK(compress.Compressor):
    """A right answer, written as the exercise asks (self.state per rank and bucket)."""
    ratio = 0.1
    write_back_all = True
    key_residual = True
    sum_duplicates = True

    def average_(self, comm, tensors, key="bucket"):
        flat = torch.cat([t.reshape(-1) for t in tensors])
        rkey = key if self.key_residual else "one"
        res = self.state(comm, rkey, lambda: torch.zeros_like(flat))
        acc = flat + res
        k = self.k(acc.numel())
        idx = acc.abs().topk(k).indices
        res.copy_(acc)
        res[idx] = 0
        vals = [torch.empty(k) for _ in range(comm.world_size)]
        idxs = [torch.empty(k, dtype=torch.int32) for _ in range(comm.world_size)]
        comm.all_gather(vals, acc[idx].contiguous())
        comm.all_gather(idxs, idx.to(torch.int32))
        out = torch.zeros_like(acc).index_add_(0, torch.cat(idxs).long(), torch.cat(vals))
        if not self.sum_duplicates:  # out[i] = v: an index two ranks chose keeps one value
            out = torch.zeros_like(acc)
            out[torch.cat(idxs).long()] = torch.cat(vals)
        out /= comm.world_size
        if self.write_back_all or comm.rank == 0:
            offset = 0
            for t in tensors:
                t.copy_(out[offset:offset + t.numel()].view_as(t))
                offset += t.numel()


    def k(self, d):
        return math.ceil(self.ratio * d)


class RoundedK(LearnerTopK):
    def k(self, d):
        return round(self.ratio * d)


class IntPlusOneK(LearnerTopK):
    def k(self, d):
        return int(self.ratio * d) + 1


class FixedK(LearnerTopK):
    def k(self, d):
        return 4  # ceil(0.1 x 37): right for the page's first buckets only


class OnlyRankZeroWrites(LearnerTopK):
    write_back_all = False


class ResidualPerRankOnly(LearnerTopK):
    key_residual = False


class DuplicatesOverwritten(LearnerTopK):
    sum_duplicates = False


def _grade(fn, capsys, *args):
    ok = fn.grade(*args)
    return ok, capsys.readouterr().out


def test_right_answer_passes(capsys):
    ok, out = _grade(ex.topk_compressor, capsys, LearnerTopK)
    assert ok, out


@pytest.mark.parametrize("wrong", [RoundedK, IntPlusOneK, FixedK], ids=lambda c: c.__name__)
def test_a_k_other_than_ceil_is_rejected(wrong, capsys):
    ok, out = _grade(ex.topk_compressor, capsys, wrong)
    assert not ok and "k = ceil(ratio * d)" in out, out


def test_only_rank_zero_writing_back_is_rejected(capsys):
    ok, out = _grade(ex.topk_compressor, capsys, OnlyRankZeroWrites)
    assert not ok and "every rank must write the average back" in out


def test_residual_per_rank_not_per_bucket_is_rejected(capsys):
    ok, out = _grade(ex.topk_compressor, capsys, ResidualPerRankOnly)
    assert not ok and "per bucket" in out


def test_no_error_feedback_is_rejected(capsys):
    ok, out = _grade(ex.topk_compressor, capsys, lambda: compress.TopK(0.1, error_feedback=False))
    assert not ok and "residual" in out


def test_powersgd_wrong_answers_are_rejected(capsys):
    def capped_always(s, r):  # caps r at min(n, m) and then compresses whatever it costs
        n, m = s[0], math.prod(s[1:])
        return min(r, n, m) * (n + m) if len(s) > 1 else n

    def no_condition(s, r):
        return r * (s[0] + math.prod(s[1:])) if len(s) > 1 else s[0]

    def right(s, r):
        n, m = s[0], math.prod(s[1:])
        return r * (n + m) if len(s) > 1 and 2 * r * (n + m) < n * m else n * m

    def at_most(s, r):  # compresses on the boundary too: <= where torch's test is <
        n, m = s[0], math.prod(s[1:])
        return r * (n + m) if len(s) > 1 and 2 * r * (n + m) <= n * m else n * m

    assert _grade(ex.powersgd_elements, capsys, right)[0]
    for wrong in (capped_always, no_condition, at_most):
        ok, out = _grade(ex.powersgd_elements, capsys, wrong)
        assert not ok and "compress only if" in out
    assert "<, not <=" in _grade(ex.powersgd_elements, capsys, at_most)[1]


def test_topk_bytes_wrong_answers_are_rejected(capsys):
    def right(n, d, r):
        return (n - 1) * math.ceil(r * d) * 8

    assert _grade(ex.topk_bytes, capsys, right)[0]
    for wrong in (lambda n, d, r: (n - 1) * math.ceil(r * d) * 4,     # values only
                  lambda n, d, r: n * math.ceil(r * d) * 8,           # counts its own payload
                  lambda n, d, r: 2 * (n - 1) / n * math.ceil(r * d) * 8):  # as if summable
        ok, out = _grade(ex.topk_bytes, capsys, wrong)
        assert not ok and "N-1" in out


def test_duplicates_overwritten_are_rejected_and_the_hint_says_sum(capsys):
    ok, out = _grade(ex.topk_compressor, capsys, DuplicatesOverwritten)
    assert not ok and "index_add_" in out
