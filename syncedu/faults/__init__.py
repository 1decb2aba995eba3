"""Lesson 11, when a rank fails: uneven inputs, finding the culprit, surviving failures.

Algorithms first: `join` (Join from scratch), `ft` (per-step fault tolerance from
scratch), `goodput` (checkpoint-restart against live recovery); then the real-process
demos `uneven`, `culprit` and `torchft_run`; the notebook's `lesson11` and `exercises`.
"""
