"""The compiler's import graph keeps its layers (tests/module_graph.py reads the imports):
no arrow runs back up the layers, and the only circles are between the IR's own data types,
which refer to each other by nature (an Expr's deferred drop holds Exprs; a Stmt::Call holds an
Intrin whose model is a Stmt). Every module is placed in a layer, so a new one cannot slip in
unplaced."""

import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))
HARMLESS = [["ir::deferred_drop", "ir::expr"], ["ir::intrin", "ir::stmt"]]


def _graph():
    spec = importlib.util.spec_from_file_location("module_graph", os.path.join(HERE, "..", "module_graph.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_arrow_runs_back_up_the_layers():
    circles, back, unknown = _graph().report()
    assert not back, back
    assert not unknown, f"modules missing from module_graph.LAYERS: {unknown}"


def test_the_only_circles_are_between_the_irs_data_types():
    circles, _, _ = _graph().report()
    assert sorted(circles) == HARMLESS, circles
