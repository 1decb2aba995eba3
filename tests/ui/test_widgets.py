"""The dashboards display as their widget (what JupyterLab renders), not as a text repr."""

from __future__ import annotations

from unittest import mock

import matplotlib.pyplot as plt

from syncedu.ui import widgets


def test_dashboard_displays_its_widget():
    board = widgets.Dashboard()
    board.widget = widgets.w.IntSlider(description="world size")
    with mock.patch("IPython.display.display") as shown:
        board._ipython_display_()
    shown.assert_called_once_with(board.widget)


def test_every_lesson_dashboard_is_a_dashboard():
    from syncedu.collectives import lesson01, lesson02
    from syncedu.ps import lesson04
    from syncedu.syncbn import lesson06

    for cls in (widgets.WorldSizeExplorer, widgets.NetworkExplorer, widgets.Explorer,
                lesson01.CollectiveExplorer, lesson02.AlgorithmExplorer, lesson04.PSExplorer,
                lesson06.SmallBatchExplorer):
        assert issubclass(cls, widgets.Dashboard) and callable(cls._ipython_display_), cls


def test_figures_go_into_an_output_without_printing(capsys):
    out = widgets.w.Output()
    widgets.show_text(out, "hello")
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    widgets.show_figure(out, fig)
    assert [o["output_type"] for o in out.outputs] == ["stream", "display_data"]
    assert out.outputs[1]["data"]["image/png"] and capsys.readouterr().out == ""
