"""Numbers mixed with expressions in the Python DSL: every case of ``tests/mixed_types.txt``,
the table that ``tests/tests/te_mixed_types.rs`` runs through the Rust DSL, so both languages are
seen to refuse and accept the same cases (``i * 0.5`` is an error in both, never ``i * 0``).
The rule itself lives once, in Rust (``rivet_compiler::te::number``).
"""

import operator
import pathlib

import numpy as np
import pytest

import rivet
from rivet import te

TABLE = pathlib.Path(__file__).resolve().parent.parent / "mixed_types.txt"

OPS = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "div": operator.truediv,
    "mod": operator.mod,
    "floordiv": operator.floordiv,
    "pow": operator.pow,
    "max": te.max,
    "min": te.min,
    "lt": operator.lt,
    "eq": operator.eq,
    "and": operator.and_,
    "or": operator.or_,
}


def parse_number(s):
    if s in ("true", "false"):
        return s == "true"
    if any(c in s for c in ".en"):
        return float(s)
    return int(s)


def read_cases():
    cases = []
    for n, line in enumerate(TABLE.read_text().splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        dtype, op, number, side, expect = (f.strip() for f in line.split("|"))
        assert side in ("lhs", "rhs"), (n, line)
        cases.append(pytest.param(dtype, op, parse_number(number), side, expect, id=f"line{n}"))
    return cases


CASES = read_cases()


def numpy_scalar(v):
    """The same number as a numpy scalar (numpy scalars act as Python numbers)."""
    if isinstance(v, bool):
        return np.bool_(v)
    if isinstance(v, int):
        return np.int64(v)
    return np.float64(v)


def test_the_table_was_read():
    assert len(CASES) > 40


@pytest.mark.parametrize("as_numpy", [False, True], ids=["python", "numpy"])
@pytest.mark.parametrize("dtype,op,number,side,expect", CASES)
def test_python_dsl_follows_the_shared_table(dtype, op, number, side, expect, as_numpy):
    X = te.placeholder((4,), dtype, name="X")
    x = X[0]
    num = numpy_scalar(number) if as_numpy else number
    f = OPS[op]

    def make():
        return f(num, x) if side == "lhs" else f(x, num)

    if expect.startswith("error: "):
        with pytest.raises(rivet.CompileError) as info:
            make()
        assert expect[len("error: ") :] in str(info.value)
        return
    e = make()
    dt, _, printed = expect.partition(" = ")
    assert e.dtype == dt
    if printed:
        assert str(e) == printed


def test_refusals_name_the_operation_the_operand_and_both_dtypes():
    i = te.var("i")
    with pytest.raises(rivet.CompileError) as info:
        i * 0.5
    m = str(info.value)
    for part in ["Mul", "float 0.5", "int64 constant", "the other operand, i, is int64"]:
        assert part in m, (part, m)
    X = te.placeholder((4,), "int8", name="X")
    with pytest.raises(rivet.CompileError) as info:
        X[0] + 300
    m = str(info.value)
    for part in ["Add", "int 300", "does not fit in int8", "X[0]"]:
        assert part in m, (part, m)


def test_integral_float_index_is_the_int():
    A = te.placeholder((8,), "float32", name="A")
    B = te.compute((4,), lambda i: A[i * 2.0], name="B")
    assert str(B.op.body[0]) == "A[(i * 2)]"
    with pytest.raises(rivet.CompileError, match="cannot be used as a int64 constant"):
        te.compute((4,), lambda i: A[i * 0.5], name="C")
