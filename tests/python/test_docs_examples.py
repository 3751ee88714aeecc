"""The Python examples of the docs run as written: every ```python block of every docs/*.md
page, and of the README's "Python quickstart" section, executes in a fresh namespace (their own
asserts check results) in a scratch directory, so the docs cannot rot. Blocks that are not
meant to run (fragments, mypy examples, the Python twin of a Rust block) are marked ```text."""

import glob
import os
import re
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))


def _blocks(path, section=None):
    text = open(os.path.join(ROOT, path)).read()
    if section is not None:
        start = text.index(section)
        end = text.find("\n## ", start + len(section))
        text = text[start: end if end >= 0 else None]
    # Blocks inside list items are indented: dedent them as Markdown does.
    return [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", text, re.S)]


CASES = [
    (p, s, i, code)
    for p, s in [(d, None) for d in DOCS] + [("README.md", "## Python quickstart")]
    for i, code in enumerate(_blocks(p, s))
]


def test_every_doc_with_examples_is_run():
    # The pages whose examples are the point of the page must keep runnable ones.
    must = {"docs/jax.md", "docs/torch.md", "docs/callbacks.md", "docs/gradient.md", "docs/dsl.md",
            "docs/python_api.md", "docs/ipc.md", "README.md"}
    assert must <= {p for p, _, _, _ in CASES}


@pytest.mark.parametrize("path,section,index,code", CASES, ids=[f"{p}#{i}" for p, _, i, _ in CASES])
def test_doc_example_runs(path, section, index, code, tmp_path, monkeypatch):
    pytest.importorskip("jax")
    monkeypatch.chdir(tmp_path)  # examples that save files (mod.save("mm.rivet")) write here
    exec(compile(code, f"{path} example {index}", "exec"), {"__name__": f"doc_example_{index}"})


def test_ipc_doc_shows_the_example_as_it_is():
    """docs/ipc.md's trainer example is bindings/examples/ipc_trainer.py, below its docstring."""
    text = open(os.path.join(ROOT, "docs", "ipc.md")).read()
    section = text[text.index("## Example: a trainer and an inference process"):]
    end = section.find("\n## ", 5)
    section = section if end < 0 else section[:end]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.S)
    example = open(os.path.join(ROOT, "bindings", "examples", "ipc_trainer.py")).read()
    body = example[example.index('"""', 3) + 3:].lstrip("\n")
    assert block == body, "docs/ipc.md's example differs from bindings/examples/ipc_trainer.py"


def test_make_demo_frameworks_example_runs():
    """`make demo`'s framework demo: a rivet op in torch.compile and in jax.jit, with backward."""
    import subprocess
    import sys

    pytest.importorskip("jax")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bindings", "examples", "frameworks.py")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "torch.compile" in p.stdout and "jax.jit" in p.stdout


def _rust_pages():
    return sorted(p for p in DOCS if re.search(r"^\s*```rust\b", open(os.path.join(ROOT, p)).read(), re.M))


def test_every_rust_block_of_the_book_is_compiled():
    """A docs page with a ```rust block is a doctest of the `rivet` crate (rivet/src/lib.rs,
    `docs_book`; docs/testing.md, whose blocks use the test crate's macros, of `rivet-tests`),
    so `cargo test` compiles and runs its blocks; the README's Rust quickstart is
    the source of examples/quickstart, compiled as a crate (below)."""
    lib = "".join(open(os.path.join(ROOT, crate, "src", "lib.rs")).read() for crate in ("rivet", "tests"))
    included = set(re.findall(r'include_str!\("\.\./\.\./(docs/[^"]+)"\)', lib))
    assert _rust_pages() and set(_rust_pages()) <= included, (_rust_pages(), included)


def _section_blocks(lang, section):
    text = open(os.path.join(ROOT, "README.md")).read()
    start = text.index(section)
    end = text.find("\n## ", start + len(section))
    return re.findall(rf"```{lang}\n(.*?)```", text[start:end], re.S)


def test_readme_rust_quickstart_runs():
    """The README's Rust quickstart, the whole path a kernel author takes: its Rust block is
    examples/quickstart/src/lib.rs as it is; the crate is built as a shared library, and the
    Python block (load_library -> rivet.torch.custom_op -> checked against torch, eager and
    under torch.compile) runs as written, from the repository root; the errors a newcomer hits
    first (wrong dtype, wrong rank, a misspelt name, a wrong path) are typed and say what was
    expected and what came."""
    import shutil
    import subprocess
    import sys

    if shutil.which("cargo") is None:
        pytest.skip("needs cargo (the Rust toolchain)")
    (rust,) = _section_blocks("rust", "## Rust quickstart")
    (python,) = _section_blocks("python", "## Rust quickstart")
    assert rust == open(os.path.join(ROOT, "examples", "quickstart", "src", "lib.rs")).read()
    assert len(rust.splitlines()) < 25 and len(python.splitlines()) < 25
    p = subprocess.run(["cargo", "build", "--release", "-q", "-p", "rivet-quickstart"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    python = python.replace('"target/release/', f'"{target}/release/')
    # Its own process: the op name and the library's functions are registered once per process.
    # The errors a new user hits first name the argument, what was expected and what came.
    python += textwrap.dedent("""
        import pytest
        with pytest.raises(rivet.DTypeError, match=r"argument 0 \\('x'\\) expected dtype float32, got float64"):
            rms_norm(torch.randn(4, 8, dtype=torch.float64))
        with pytest.raises(rivet.ShapeError, match=r"expected a 2-d tensor, got 3-d of shape \\(2, 4, 8\\)"):
            rms_norm(torch.randn(2, 4, 8))
        with pytest.raises(rivet.FunctionNotFoundError, match="quickstart.rms_norm"):
            rivet.get_global_func("quickstart.rms")
        with pytest.raises(rivet.ArgumentError, match="no file at"):
            rivet.load_library("target/release/no-such-library.so")
    """)
    p = subprocess.run([sys.executable, "-c", python], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]


def test_readme_python_quickstart_is_short():
    (python,) = _section_blocks("python", "## Python quickstart")
    assert len(python.splitlines()) < 25


def test_every_code_block_names_its_language():
    """A fence without a language is Rust to rustdoc (the pages are doctests) and plain text to
    mdBook: each block says what it is (rust, python, sh, text, c, json)."""
    bare = []
    for path in DOCS + ["README.md"]:
        inside = False
        for n, line in enumerate(open(os.path.join(ROOT, path)).read().splitlines(), 1):
            m = re.match(r"\s*```(.*)$", line)
            if m:
                if not inside and not m.group(1).strip():
                    bare.append(f"{path}:{n}")
                inside = not inside
    assert not bare, bare
