"""Lesson 08 waits for the background Horovod build that `make lab` starts, and says so."""

from __future__ import annotations

import subprocess
import sys

import pytest

from syncedu.horovod import launch as horovod_launch


def test_no_build_running_returns_at_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(horovod_launch, "BUILDING_STAMP", tmp_path / "building")
    horovod_launch.wait_for_build(timeout=1)
    assert capsys.readouterr().out == ""


def test_waits_for_a_running_build_with_status_lines(tmp_path, monkeypatch, capsys):
    stamp = tmp_path / "building"
    build = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2.5)"])
    try:
        stamp.write_text(str(build.pid))
        monkeypatch.setattr(horovod_launch, "BUILDING_STAMP", stamp)
        # A finished child stays a zombie (kill(pid, 0) succeeds) until reaped: reap it.
        monkeypatch.setattr(horovod_launch, "_build_running",
                            lambda: None if build.poll() is not None else build.pid)
        horovod_launch.wait_for_build(timeout=30, every=1)
    finally:
        build.kill()
        build.wait()
    out = capsys.readouterr().out
    assert f"pid {build.pid}" in out and "still building" in out and "finished" in out


def test_a_build_past_the_timeout_raises(monkeypatch):
    monkeypatch.setattr(horovod_launch, "_build_running", lambda: 12345)
    with pytest.raises(TimeoutError, match="12345"):
        horovod_launch.wait_for_build(timeout=0.2, every=1)
