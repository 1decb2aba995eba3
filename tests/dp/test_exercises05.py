"""Lesson 05's checkers accept right answers and reject the wrong answers a learner writes.

The checker calls the learner's step twice on 2 and 3 simulated ranks (ranks
seeded differently, a frozen layer, a tied weight); each wrong answer below is
one plausible mistake, which it must reject with a message naming it.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from syncedu.dp import exercises05 as ex


def _accumulation(mode="right"):
    """A learner's train_step, right or with the one mistake `mode` names."""
    def train_step(model, optimizer, micro):
        k = len(micro)
        if mode not in ("no_zero", "zero_at_end"):
            optimizer.zero_grad()
        if mode == "lumped":  # review 03-06 #5a: one backward of the summed losses
            losses = [F.cross_entropy(model(x), y) / k for x, y in micro]
            sum(losses).backward()
            micro = []
        if mode == "one_pass":  # review r0306 #5: one forward/backward over all micro-batches
            x, y = (torch.cat(t) for t in zip(*micro))
            F.cross_entropy(model(x), y).backward()
            micro = []
        for j, (x, y) in enumerate(micro):
            if mode == "zero_inside":
                optimizer.zero_grad()
            scale = 1 if mode == "unscaled" else k
            quiet = (j > 0 if mode == "first_outside" else j < k - 1) and mode != "every"
            if mode == "partial":
                loss = F.cross_entropy(model(x), y) / scale
                with model.no_sync() if quiet else contextlib.nullcontext():
                    loss.backward()
            else:
                with model.no_sync() if quiet else contextlib.nullcontext():
                    (F.cross_entropy(model(x), y) / scale).backward()
            if mode == "step_each":
                model.finish_gradient_synchronization()
                optimizer.step()
        if mode != "no_finish":
            model.finish_gradient_synchronization()
        if mode != "step_each":
            optimizer.step()
        if mode == "zero_at_end":
            optimizer.zero_grad()
    return train_step


@pytest.mark.parametrize("mode", ["right", "zero_at_end"])
def test_right_answers_pass(mode, capsys):
    assert ex.accumulate.grade(_accumulation(mode)), capsys.readouterr().out


@pytest.mark.parametrize("mode, words", [
    ("every", "every micro-batch synchronizes"),
    ("partial", "wraps only backward()"),
    ("unscaled", "divide each micro-batch loss by"),
    ("step_each", "optimizer.step() ran 6 times"),
    ("zero_inside", "zero_grad() once"),
    ("no_zero", "first step's gradient was still in .grad"),
    ("no_finish", "ranks ended with different parameters"),
    ("lumped", "all K graphs and their activations stay alive"),
    ("one_pass", "is no accumulation"),
    ("first_outside", "the micro-batch outside no_sync() must be the last"),  # review r0306 #14
])
def test_wrong_answers_are_named(mode, words, capsys):
    assert not ex.accumulate.grade(_accumulation(mode)), mode
    out = capsys.readouterr().out
    assert words in out, out


def test_stubs_are_not_attempted(capsys):
    from syncedu.dp import exercises03 as ex3

    def stub(*args):
        raise NotImplementedError

    for check in (ex.accumulate, ex3.bucketed_overlap, ex3.flat_sync):
        assert not check.grade(stub)
        assert "not attempted yet" in capsys.readouterr().out
