"""Lesson 11, when a rank fails: uneven inputs, finding the culprit, surviving failures.

Algorithms first: `join` (Join from scratch for `dp.DataParallel`), `ft`
(per-step fault tolerance from scratch), `goodput` (checkpoint-restart against
live recovery). Then the real-process demos: `uneven` (the DDP hang and its
fixes), `culprit` (timeouts, monitored_barrier, DETAIL, the Flight Recorder,
launch and simulator), `torchft_run` (torchft: kill, discard, continue,
recover). The notebook's helpers are in `lesson11`, its checkers in `exercises`.
"""
