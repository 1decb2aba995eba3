"""Lesson 11, when a rank fails: uneven inputs, finding the culprit, surviving failures.

Algorithms first: `join` (Join from scratch for `dp.DataParallel`), `ft`
(per-step fault tolerance from scratch: quorum, commit, live recovery),
`goodput` (checkpoint-restart against live recovery, Young 1974 / Daly 2006).
Then the real-process demos: `uneven` (the DDP hang and its fixes), `culprit`
(timeouts, monitored_barrier, DETAIL, launch and simulator), `flight` (the
Flight Recorder on Gloo, with a workaround for torch 2.13), `torchft_run`
(torchft: kill, discard, continue, recover). The notebook's helpers are in
`lesson11`, its checkers in `exercises`.
"""
