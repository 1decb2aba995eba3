"""`show` displays the package's own source: highlighted in IPython, printed elsewhere."""

from __future__ import annotations

import pytest

from syncedu import collectives
from syncedu.ui import show as show_mod


def test_source_names_the_file_and_keeps_the_steps():
    text = show_mod.source(collectives.ring_allreduce, collectives.ring_reduce_scatter_chunks)
    assert text.startswith("# syncedu/collectives/algorithms.py\ndef ring_allreduce(")
    assert "# Step 2" in text and "def ring_reduce_scatter_chunks(" in text


def test_show_prints_outside_ipython(capsys):
    show_mod.show(collectives.tree_allreduce)
    assert "def tree_allreduce(comm" in capsys.readouterr().out


def test_show_displays_html_in_ipython(monkeypatch):
    import IPython
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: object())
    monkeypatch.setattr(IPython.display, "display", lambda data, raw: shown.append(data))
    show_mod.show(collectives.naive_allreduce)
    (bundle,) = shown
    assert bundle["text/plain"].startswith("# syncedu/collectives/algorithms.py")
    assert "<span" in bundle["text/html"] and "naive_allreduce" in bundle["text/html"]


@pytest.mark.parametrize("bad", [len, 3, "ring"])
def test_objects_without_source_are_refused(bad):
    with pytest.raises(ValueError, match="objs: .* has no Python source"):
        show_mod.show(bad)
    with pytest.raises(ValueError, match="at least one"):
        show_mod.show()
