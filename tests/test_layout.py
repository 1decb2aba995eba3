"""The package's layout: short names bound eagerly, a light engine, imports one way, no cycles.

DESIGN.md, "Layout": comm <- train <- topic <- that topic's notebook helpers; a
topic may use an earlier topic's algorithms, never another topic's helpers; no
cycles; a rank process that imports the engine never imports matplotlib or
ipywidgets.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "syncedu"
# The topics in course order; a topic may import the algorithms of the ones before it.
TOPICS = ("collectives", "dp", "ps", "syncbn", "compress", "horovod", "tuning", "zero", "faults",
          "decentralized")
HELPER = re.compile(r"^(lesson\d\d|exercises(\d\d|_\w+)?|plots)$")  # a topic's notebook helpers

LIGHT = """
import sys
import syncedu, syncedu.comm, syncedu.train, syncedu.zero
from syncedu import (launch, sim, collectives, cost, dp, syncbn, train, ps, compress, data,
                     models, zero, tuning, horovod, Network, PRESETS)
heavy = sorted(m for m in ("matplotlib", "ipywidgets", "IPython", "horovod") if m in sys.modules)
print(heavy)
"""


def test_importing_the_package_and_every_topic_stays_light():
    out = subprocess.run([sys.executable, "-c", LIGHT], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_short_names_are_the_real_modules():
    import syncedu
    from syncedu import (
        collectives,
        compress,
        cost,
        data,
        dp,
        launch,
        models,
        ps,
        sim,
        syncbn,
        train,
        zero,
    )
    from syncedu.collectives import cost as collectives_cost
    from syncedu.comm import launch as comm_launch
    from syncedu.comm import sim as comm_sim
    from syncedu.train import data as train_data
    from syncedu.train import models as train_models

    assert (cost, data, models, launch, sim) == (collectives_cost, train_data, train_models,
                                                 comm_launch, comm_sim)
    assert syncedu.comm.TorchComm.__name__ == "TorchComm"
    assert callable(train.run) and callable(ps.run) and callable(cost.allreduce_time)
    assert callable(collectives.allreduce) and "ring" in collectives.ALGORITHMS
    assert dp.DataParallel and syncbn.SyncBatchNorm and compress.TopK and zero.ZeroDataParallel
    assert not hasattr(syncedu, "__getattr__")  # no lazy names: what you see is bound
    assert not any(type(f).__module__.startswith("syncedu") for f in sys.meta_path)


def test_every_strategy_is_registered_by_its_topic():
    """One registry (issue 44): `train.strategies.register` carries every flag; no module keeps
    a list of strategy names beside it."""
    import syncedu.train.config as config
    from syncedu import train
    from syncedu.train import strategies

    assert train.STRATEGIES is strategies.FACTORIES
    assert not {"STRATEGIES", "COMPRESSIBLE", "FLOAT64"} & set(vars(config))
    assert {"single", "naive", "flat", "bucketed", "ddp", "horovod", "zero1", "local_sgd", "syncbn",
            "diloco", "noise_scale", "dpsgd", "streaming_diloco"} <= set(strategies.FACTORIES)
    assert strategies.names(strategies.FLOAT64) == ("single", "naive", "syncbn")
    assert strategies.names(strategies.COMPRESSIBLE) == ("naive", "flat", "bucketed", "ddp",
                                                         "horovod")
    assert {"ddp", "horovod", "zero_redundancy", "fsdp2"} <= strategies.REAL_ONLY
    assert strategies.FACTORIES["bucketed"].__module__ == "syncedu.dp.train_strategies"
    assert strategies.FACTORIES["zero1"].__module__ == "syncedu.zero.train_strategies"
    assert strategies.FACTORIES["local_sgd"].__module__ == "syncedu.tuning.train_strategies"
    assert strategies.FACTORIES["syncbn"].__module__ == "syncedu.syncbn.train_strategies"


# ------------------------------------------------------------------ the import graph
def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PKG.rglob("*.py")}


def _imports(name: str) -> set[str]:
    """Every syncedu module `name` imports, at module level or inside a function."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {m: _imports(m) for m in MODULES if not m.startswith("syncedu.comm")}


def _place(name: str) -> tuple[str, int, bool]:
    """(area, course position, is a notebook helper) of a module."""
    parts = name.split(".")
    area = parts[1] if len(parts) > 1 else ""
    helper = area in TOPICS and len(parts) > 2 and bool(HELPER.match(parts[2]))
    order = {"comm": 0, "train": 1, "ui": 1, **{t: 2 + i for i, t in enumerate(TOPICS)}}
    return area, order.get(area, 99), helper


def test_no_import_cycles_outside_comm():
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(GRAPH.get(m, ())):
            if state.get(n) == 1:
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state and m != "syncedu":
            visit(m)


def test_imports_run_one_way():
    bad = []
    for m, deps in sorted(GRAPH.items()):
        area, pos, helper = _place(m)
        if m == "syncedu":  # the top: it may bind any algorithm
            bad += [f"{m} -> {d}" for d in deps if _place(d)[2]]
            continue
        for d in sorted(deps):
            d_area, d_pos, d_helper = _place(d)
            if d == "syncedu":
                continue
            if area == "ui" and d_area not in ("comm", "ui"):
                bad.append(f"{m} -> {d} (ui is shared by every lesson: it imports no topic)")
            elif area == "train" and d_area not in ("comm", "train"):
                bad.append(f"{m} -> {d} (the harness imports no topic)")
            elif area in TOPICS and d_area in TOPICS and (d_pos > pos or (
                    d_helper and (d_area != area or not helper))):
                bad.append(f"{m} -> {d} (a topic uses earlier topics' algorithms only; "
                           "helpers only its own)")
            elif area in TOPICS and d_area == "ui" and not helper:
                bad.append(f"{m} -> {d} (an algorithm imports no notebook helper)")
    assert not bad, "\n".join(bad)


def test_no_two_public_classes_share_a_name():
    """Issue 21: one meaning per class name, so a learner's grep or IDE finds one thing."""
    homes: dict[str, list[str]] = {}
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                homes.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    assert {k: v for k, v in homes.items() if len(v) > 1} == {}


def _lines(paths) -> int:
    return sum(len(p.read_text().splitlines()) for p in paths)


def code_lines(text: str) -> int:
    """Lines that hold code: not blank, not only a comment, not part of a docstring.

    Budgets count code, never prose (DESIGN.md, "Layout"): a budget that counted docstrings
    was met by deleting explanations (issue 44). A docstring is the first statement of a
    module, class or function when it is a string; any other string is code.
    """
    prose: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                prose.update(range(first.lineno, first.end_lineno + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER, tokenize.ENCODING}
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in skip:
            code.update(range(tok.start[0], tok.end[0] + 1))
    return len(code - prose)


def _code(paths) -> int:
    return sum(code_lines(p.read_text()) for p in paths)


def test_code_lines_skip_prose():
    text = '''"""Module doc."""
# a comment

def f(x):
    """Doc,
    two lines."""
    s = """not a docstring"""  # code
    return x
'''
    assert code_lines(text) == 3


def test_line_budgets_that_hold():
    """DESIGN.md, "Layout": budgets count code lines (not blank, a comment or a docstring):
    the package <= 11,000, the engine (comm + train) <= 3,600; no file over 400 lines in all
    (benchmarks/ and examples/ live beside the package)."""
    over = {str(p.relative_to(PKG)): n for p in sorted(PKG.rglob("*.py"))
            if (n := _lines([p])) > 400}
    assert not over, f"files over 400 lines: {over}"
    engine = _code(p for d in ("comm", "train") for p in (PKG / d).rglob("*.py"))
    assert engine <= 3_600, f"the engine (comm + train) is {engine:,} code lines (budget 3,600)"
    package = _code(PKG.rglob("*.py"))
    assert package <= 11_000, f"the package is {package:,} code lines (budget 11,000)"


def test_each_topic_within_its_budget():
    """DESIGN.md, "Layout": each topic package (every folder under syncedu/ but the engine's
    comm and train, and ui) is at most 1,000 code lines."""
    topics = [d for d in sorted(PKG.iterdir())
              if d.is_dir() and d.name not in ("comm", "train", "ui") and any(d.glob("*.py"))]
    over = {d.name: n for d in topics if (n := _code(d.rglob("*.py"))) > 1_000}
    assert {d.name for d in topics} >= set(TOPICS)
    assert not over, f"topics over 1,000 code lines: {over}"


def test_what_a_lesson_shows_and_calls_is_public():
    # Issue 21: notebooks use only public names, and the functions a lesson show()s are
    # public. A private name is `x._y` or `_Y` in a code cell (os._exit and torch's own
    # private names, which a lesson quotes as torch's, aside).
    import json
    allowed = {"os._exit", "batchnorm._BatchNorm"}
    found = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] != "code":
                continue
            for m in re.finditer(r"\b(\w+)\.(_[A-Za-z]\w*)", "".join(cell["source"])):
                if m.group(0) not in allowed:
                    found.append(f"{path.name} cell {i}: {m.group(0)}")
    assert not found, found


def test_the_programs_beside_the_package_are_not_imported_by_it():
    """benchmarks/ and examples/ are programs that import syncedu; syncedu imports neither
    (`syncedu.ui.show.program` loads an example by its path, for a lesson to show and run)."""
    programs = r"\s*(from|import)\s+(benchmarks|examples|ddp_program|elastic_ddp|hello_allreduce)\b"
    bad = [f"{p.relative_to(ROOT)}: {line.strip()}" for p in sorted(PKG.rglob("*.py"))
           for line in p.read_text().splitlines() if re.match(programs, line)]
    assert not bad, bad
    assert {p.name for p in (ROOT / "benchmarks").glob("*.py")} >= {"__main__.py", "sim.py"}
    assert {p.name for p in (ROOT / "examples").glob("*.py")} == {
        "ddp_program.py", "elastic_ddp.py", "hello_allreduce.py"}


def _public_defs(body, where: str):
    """(kind, "where:qualified name", has a docstring) of every public class and function in
    `body`, methods included (nothing inside a private class or a function)."""
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and not node.name.startswith("_"):
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            yield kind, f"{where}{node.name}", ast.get_docstring(node) is not None
            if isinstance(node, ast.ClassDef):
                yield from _public_defs(node.body, f"{where}{node.name}.")


def test_every_public_class_and_most_functions_say_why():
    """DESIGN.md, "Layout" (issue 44): every public class and at least 90% of public functions
    have a docstring. Prose is free in the budgets: never cut it to make room."""
    defs = [d for p in sorted(PKG.rglob("*.py"))
            for d in _public_defs(ast.parse(p.read_text()).body, f"{p.relative_to(PKG)}:")]
    bare_classes = [name for kind, name, doc in defs if kind == "class" and not doc]
    functions = [(name, doc) for kind, name, doc in defs if kind == "function"]
    share = sum(doc for _, doc in functions) / len(functions)
    assert not bare_classes, f"public classes without a docstring: {bare_classes}"
    assert share >= 0.90, (f"{share:.1%} of {len(functions)} public functions have a docstring "
                           f"(floor 90%); without: {[n for n, doc in functions if not doc]}")
