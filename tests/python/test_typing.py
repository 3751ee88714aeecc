"""The typed package: stubs (``rivet/*.pyi``) and ``py.typed`` ship with rivet, mypy accepts the
package and a typed user script, rejects wrong calls (so the stubs are not ``Any`` in disguise),
and every public name of ``rivet``, ``rivet.te`` and ``rivet._native`` has a stub entry.

mypy comes from the Makefile's VENV_DEPS. Outside CI a venv without it skips the mypy tests
(the stub-coverage tests below need no mypy and always run); in CI (``CI=true``) a missing
mypy is a failure.
"""

import ast
import inspect
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import rivet
import rivet._native as native
import rivet.error
import rivet.te

PKG = os.path.dirname(os.path.abspath(rivet.__file__))

# torch / jax / numpy are typed packages mypy would spend minutes on; the stubs name a few of
# their types, which read as Any here (user projects check them with their own settings).
MYPY_INI = """\
[mypy]
strict = True
warn_unused_ignores = True
[mypy-torch.*,jax.*,jaxlib.*,mxnet.*,numpy.*,tvm_ffi.*]
follow_imports = skip
ignore_missing_imports = True
"""


def _have_mypy():
    try:
        import mypy  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("mypy is missing from the venv: it is in the Makefile's VENV_DEPS, run make venv")
        pytest.skip("mypy is not installed in this venv (make venv installs it)")


def run_mypy(tmp_path, *args, env_path=None):
    """mypy in a subprocess (its own cache in tmp_path); returns (exit code, output lines)."""
    _have_mypy()
    ini = tmp_path / "mypy.ini"
    ini.write_text(MYPY_INI)
    env = dict(os.environ)
    # The rivet under test (an installed wheel, maybe first on PYTHONPATH) is what mypy sees.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [env_path or os.path.dirname(PKG), env.get("PYTHONPATH", "")] if p
    )
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ini), "--cache-dir", str(tmp_path / "cache"),
         "--show-error-codes", "--no-color-output", "--no-error-summary", *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )
    return r.returncode, [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]


# ---- what ships -------------------------------------------------------------------------------


def test_stubs_and_marker_ship_with_the_package():
    for name in ["py.typed", "_native.pyi", "te.pyi", "jax.pyi", "torch.pyi", "ipc.pyi"]:
        assert os.path.isfile(os.path.join(PKG, name)), f"{name} is not installed next to {rivet.__file__}"


# ---- every public name has a stub entry (no mypy needed) ----------------------------------------


def stub_names(path):
    """Top-level names a stub file defines, and per class the names its body defines."""
    tree = ast.parse(open(path).read())
    top, members = set(), {}

    def targets(node):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            return [node.name]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return [node.target.id]
        if isinstance(node, ast.Assign):
            return [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.ImportFrom):
            return [a.asname or a.name for a in node.names]
        return []

    for node in tree.body:
        top.update(targets(node))
        if isinstance(node, ast.ClassDef):
            members[node.name] = {n for b in node.body for n in targets(b)}
    return top, members


# Dunders every object has, and the ones pyo3 adds for its own use.
_IGNORED = {"__doc__", "__module__", "__new__", "__repr__", "__str__", "__init__", "__dict__",
            "__weakref__", "__text_signature__", "__qualname__", "__slots__"}


# pyo3 fills every comparison slot of a class defining __eq__ alone; those answer
# NotImplemented (a TypeError for `<`), so the stubs leave them out. Classes whose comparisons
# are real (Expr) declare them, and stubtest checks those.
_DERIVED_COMPARISONS = {"__ne__", "__lt__", "__le__", "__gt__", "__ge__"}


def test_every_native_name_has_a_stub():
    top, members = stub_names(os.path.join(PKG, "_native.pyi"))
    runtime = [n for n in dir(native) if not (n.startswith("__") and n != "__version__")]
    missing = sorted(set(runtime) - top)
    assert not missing, f"rivet/_native.pyi lacks {missing}"
    assert set(native.__all__) <= top
    for name in runtime:
        obj = getattr(native, name)
        if not inspect.isclass(obj):
            continue
        have = set(vars(obj)) - _IGNORED - _DERIVED_COMPARISONS
        lacking = sorted(have - members.get(name, set()))
        assert not lacking, f"rivet/_native.pyi: class {name} lacks {lacking}"


def test_every_public_name_of_the_package_has_a_type():
    # rivet/__init__.py is annotated inline: its names come from _native (stubbed above),
    # error.py, contrib/dlpack.py, or are defined there.
    init = ast.parse(open(os.path.join(PKG, "__init__.py")).read())
    defined = {n.name for n in init.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    imported = {a.asname or a.name for n in init.body if isinstance(n, ast.ImportFrom) for a in n.names}
    imported |= {a.asname or a.name for n in init.body if isinstance(n, ast.Import) for a in n.names}
    for name in rivet.__all__:
        assert name in defined or name in imported or name in rivet.error.__all__, name
    # The error classes are listed in rivet.__all__ by hand (so type checkers see them).
    assert set(rivet.error.__all__) <= set(rivet.__all__)
    top, _ = stub_names(os.path.join(PKG, "te.pyi"))
    missing = sorted(set(rivet.te.__all__) - top)
    assert not missing, f"rivet/te.pyi lacks {missing}"
    te_stub_all = next(
        ast.literal_eval(n.value) for n in ast.parse(open(os.path.join(PKG, "te.pyi")).read()).body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets)
    )
    assert te_stub_all == rivet.te.__all__
    for mod in ["jax", "torch", "ipc"]:
        top, _ = stub_names(os.path.join(PKG, f"{mod}.pyi"))
        src = ast.parse(open(os.path.join(PKG, f"{mod}.py")).read())
        public = {n.name for n in src.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_")}
        public |= {t.id for n in src.body if isinstance(n, ast.Assign) for t in n.targets
                   if isinstance(t, ast.Name) and not t.id.startswith("_")}
        missing = sorted(public - top)
        assert not missing, f"rivet/{mod}.pyi lacks {missing}"


# ---- mypy -------------------------------------------------------------------------------------------


def test_package_type_checks(tmp_path):
    # The package's sources and stubs, without the extension (its stub stands for it).
    dst = tmp_path / "src" / "rivet"
    shutil.copytree(PKG, dst, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    rc, out = run_mypy(tmp_path, str(dst), env_path=str(tmp_path / "src"))
    assert rc == 0 and not out, "\n".join(out)


def test_stubs_match_the_runtime(tmp_path):
    # mypy's stubtest imports rivet and compares every stub with the real object: a name the
    # stub lacks or invents, a parameter of another name, kind or default is an error.
    _have_mypy()
    ini = tmp_path / "mypy.ini"
    ini.write_text(MYPY_INI)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(PKG), env.get("PYTHONPATH", "")] if p)
    r = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "rivet", "--mypy-config-file", str(ini), "--concise"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr


GOOD = '''
from typing import Any, Callable, assert_type

import rivet
from rivet import te

t = rivet.zeros((2, 3), "float64")
assert_type(t, rivet.Tensor)
assert_type(t.shape, tuple[int, ...])
assert_type(t.dtype, str)
assert_type(t.read_only, bool)
assert_type(t.data_ptr, int)
assert_type(t.__dlpack_device__(), tuple[int, int])
assert_type(rivet.from_dlpack(t), rivet.Tensor)
sh = rivet.zeros((2, 3), shared=True)
assert_type(sh.is_shared, bool)
hd = rivet.ipc.share(sh)
assert_type(hd, rivet.ipc.Handle)
assert_type(hd.shape, tuple[int, ...])
assert_type(rivet.ipc.open(hd, device="cpu"), rivet.Tensor)

n = te.var("n")
assert_type(n, te.Expr)
A = te.placeholder((n,), "float32", name="A")
B = te.placeholder((n,), name="B")
assert_type(A, te.Tensor)
assert_type(A[0] + 1.0, te.Expr)
assert_type(2 * A[n - 1], te.Expr)
assert_type(A.shape, tuple[te.Expr | int, ...])
C = te.compute((n,), lambda i: A[i] + B[i] * 2, name="C")
k = te.reduce_axis((0, n), name="k")
assert_type(k, te.IterVar)
S = te.compute((1,), lambda i: te.sum(A[k], axis=k), name="S")
M = te.compute((n,), lambda i: te.max(A[i], B[i]), name="M")
assert_type(te.if_then_else(A[0] > 0, A[0], te.const(0.0)), te.Expr)
assert_type(te.exp(A[0]).astype("float64"), te.Expr)
assert_type(te.all(A[0] > 0, B[0] < 1), te.Expr)
assert_type(te.cast("int32", A[0]), te.Expr)

s = rivet.create_schedule(C)
assert_type(s, rivet.Schedule)
stage = s[C]
assert_type(stage, rivet.Stage)
outer, inner = stage.split(C.op.axis[0], factor=4)
assert_type(outer, te.IterVar)
stage.vectorize(inner)
m = rivet.build(s, [A, B, C], target="cpu", name="add")
assert_type(m, rivet.Module)
f = m["add"]
assert_type(f, rivet.Function)
assert_type(f.name, str)
assert_type(f.signature, str | None)
assert_type(f.output_shapes([[4], [4]]), list[tuple[list[int], str]])
params = f._params
if params is not None:
    assert_type(params[0]["name"], Any)
out: Any = f(t, t, t)
assert_type(m.function_names, list[str])
assert_type(m.get_source("ir"), str)

mm = rivet.kernels.matmul("float32")
assert_type(mm, rivet.Function)
assert_type(rivet.kernels.add("float32", ("n", 1), (1, "m")), rivet.Function)
assert_type(rivet.to_pytorch_func(mm), rivet.Function)
assert_type(rivet.get_global_func("x", allow_missing=True), rivet.Function | None)
assert_type(rivet.get_global_func("x"), rivet.Function)

@rivet.register_func("typing.double", override=True)
def double(x: int) -> int:
    return 2 * x

assert_type(double(3), int)  # the decorator keeps the function's type

try:
    f(t)
except rivet.ShapeError as e:
    assert_type(e, rivet.ShapeError)
except rivet.Error:
    pass

import rivet.jax
import rivet.torch
g = rivet.jax.ffi_func(f)
assert_type(g, Callable[..., Any])
'''

# Each line marked "# E: code" must be reported with that code, and no other line.
BAD = '''
import rivet
from rivet import te

t = rivet.zeros(3)  # E: arg-type
f = rivet.kernels.relu()
f([1, 2, 3])  # E: arg-type
t.shape = (1,)  # E: misc
te.placeholder((4,), name=3)  # E: arg-type
rivet.kernels.matmull()  # E: attr-defined
x: int = te.var("n") + 1  # E: assignment
A = te.placeholder((4,))
C = te.compute((4,), lambda i: A[i] * 2)
s = rivet.create_schedule(C)
s[C].split(C.op.axis[0], factor="4")  # E: arg-type
rivet.build(s, [A, C], target=1)  # E: arg-type
rivet.to_pytorch_func(3)  # E: arg-type
t.data_ptr()  # E: operator
f.name = "g"  # E: misc
te.sum(A[0], axis="k")  # E: arg-type
rivet.get_global_func("x", allow_missing=True).name  # E: union-attr
rivet.ipc.open("handle")  # E: arg-type
rivet.zeros((2,), shared="yes")  # E: arg-type
'''


def test_typed_user_script_checks(tmp_path):
    script = tmp_path / "user.py"
    script.write_text(textwrap.dedent(GOOD))
    rc, out = run_mypy(tmp_path, str(script))
    assert rc == 0 and not out, "\n".join(out)


def test_wrong_calls_are_reported(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text(textwrap.dedent(BAD))
    rc, out = run_mypy(tmp_path, str(script))
    assert rc == 1
    want = {}
    for no, line in enumerate(BAD.splitlines(), start=1):
        m = re.search(r"# E: ([\w-]+)", line)
        if m:
            want[no] = m.group(1)
    got = {}
    for line in out:
        m = re.match(r".*bad\.py:(\d+): error: .*\[([\w-]+)\]$", line)
        if m:
            got.setdefault(int(m.group(1)), set()).add(m.group(2))
    assert set(got) == set(want), "\n".join(out)
    for no, code in want.items():
        assert code in got[no], f"line {no}: want [{code}], got {got[no]}\n" + "\n".join(out)


def test_framework_submodules_load_on_first_use():
    # `import rivet` alone, then rivet.torch / rivet.jax: imported lazily (a fresh interpreter,
    # so no earlier test imported them), and `import rivet` itself imports neither framework.
    import subprocess
    import sys

    code = (
        "import sys, rivet\n"
        "assert 'torch' not in sys.modules and 'jax' not in sys.modules, 'import rivet imported a framework'\n"
        "assert callable(rivet.torch.custom_op) and callable(rivet.jax.ffi_func)\n"
        "assert 'torch' in dir(rivet) and 'jax' in dir(rivet)\n"
        "try:\n"
        "    rivet.no_such_thing\n"
        "except AttributeError as e:\n"
        "    assert 'no_such_thing' in str(e)\n"
        "else:\n"
        "    raise SystemExit('no AttributeError')\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
