"""The Python examples of the framework docs run as written: every ```python block of
docs/jax.md, docs/torch.md, docs/callbacks.md and docs/gradient.md, and of the README's "JAX" section, executes in a fresh
namespace (their own asserts check results), so the docs cannot rot."""

import os
import re
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
    for p, s in [
        ("docs/jax.md", None),
        ("docs/torch.md", None),
        ("docs/callbacks.md", None),
        ("docs/gradient.md", None),
        ("README.md", "## JAX: rivet kernels inside"),
    ]
    for i, code in enumerate(_blocks(p, s))
]


def test_every_doc_has_examples():
    assert {p for p, _, _, _ in CASES} == {"docs/jax.md", "docs/torch.md", "docs/callbacks.md", "docs/gradient.md", "README.md"}


@pytest.mark.parametrize("path,section,index,code", CASES, ids=[f"{p}#{i}" for p, _, i, _ in CASES])
def test_doc_example_runs(path, section, index, code):
    pytest.importorskip("jax")
    exec(compile(code, f"{path} example {index}", "exec"), {"__name__": f"doc_example_{index}"})


def test_make_demo_frameworks_example_runs():
    """`make demo`'s framework demo: a rivet op in torch.compile and in jax.jit, with backward."""
    import subprocess
    import sys

    pytest.importorskip("jax")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bindings", "examples", "frameworks.py")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "torch.compile" in p.stdout and "jax.jit" in p.stdout
