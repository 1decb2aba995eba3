"""`show(collectives.ring_allreduce)`: the code a learner reads is the code the checked cells
run (no copy in the notebook to drift)."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import textwrap

# The repository: syncedu/, and beside it examples/ and benchmarks/.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def program(name: str):
    """Import `examples/<name>.py`, one of the whole programs beside the package (not part of
    it: scripts for torchrun, which import syncedu and each other as plain modules). As when
    torchrun runs one, `examples/` goes first on `sys.path`, and stays there."""
    folder = os.path.join(ROOT, "examples")
    found = sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".py")) \
        if os.path.isdir(folder) else []
    if name not in found:
        raise ValueError(f"name={name!r} is not a program in {folder}; choose one of {found} "
                         "(the examples live in the repository, beside the package)")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)


def where(obj) -> str:
    """The file that defines `obj`, relative to the repository (syncedu/dp/buckets.py)."""
    obj = inspect.unwrap(obj)  # a decorated function (e.g. @torch.no_grad) is shown as written
    path = inspect.getsourcefile(obj) or "?"
    rel = os.path.relpath(path, ROOT)
    if not rel.startswith(".."):
        return rel.replace(os.sep, "/")
    # An installed library: the path below site-packages, the same on every machine.
    head, sep, tail = path.replace(os.sep, "/").rpartition("site-packages/")
    return tail if sep else os.path.basename(path)


def source(*objs) -> str:
    """The dedented source of each function, class, method or module, headed by its file."""
    if not objs:
        raise ValueError("objs: pass at least one function, class, method or module")
    parts = []
    for obj in objs:
        try:
            code = textwrap.dedent(inspect.getsource(obj)).rstrip()
        except (TypeError, OSError) as e:
            raise ValueError(f"objs: {obj!r} has no Python source to show; pass a function, "
                             f"class, method or module defined in a .py file ({e})") from None
        parts.append(f"# {where(obj)}\n{code}")
    return "\n\n\n".join(parts)


def show(*objs) -> None:
    """Display the source of `objs` (see `source`): highlighted in a notebook, else printed."""
    code = source(*objs)
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is None or get_ipython() is None:
        print(code)
        return
    from pygments import highlight  # comes with IPython
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    # inline styles: the same colours in JupyterLab and on GitHub
    html = highlight(code, PythonLexer(), HtmlFormatter(noclasses=True, style="default"))
    display({"text/plain": code, "text/html": html}, raw=True)
