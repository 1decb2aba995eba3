"""torchft for real: kill, discard, continue, recover; nothing beyond loopback; no orphans."""

from __future__ import annotations

import psutil
import pytest

from syncedu.faults import torchft_run

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(torchft_run.available() is not None,
                                 reason=str(torchft_run.available()))]


def _children():
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_kill_discard_continue_recover_on_loopback_only(tmp_path):
    before = _children()
    result = torchft_run.run(folder=str(tmp_path))
    v = torchft_run.verdicts(result)
    for claim in ("discarded, parameters unchanged", "quorum shrank, survivor trained on",
                  "restarted replica healed from its peer", "final weights bit-identical",
                  "SIGKILLed (exit code -9)", "only 127.0.0.1 listening"):
        assert v[claim], claim
    # lighthouse + for each of 2 replicas: manager server, TCPStore, checkpoint server, Gloo
    assert len(result["listening"]) >= 5
    assert 0 < v["detect_s"] < 1.5 and 1.0 < v["shrink_s"] < 6.0 and v["recover_s"] < 3.0
    assert _children() <= before


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="kill_after"):
        torchft_run.Config(kill_after=-1)
