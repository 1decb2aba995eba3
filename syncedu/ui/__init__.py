"""What every lesson's notebook shares: `show`, the widget base, common figures and the
checkers' helpers (each topic's own live in its folder). Only notebook helpers import
ipywidgets or matplotlib."""
