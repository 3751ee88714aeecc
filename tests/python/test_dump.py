"""RIVET_DUMP=dir writes the loop IR after each pass and the generated Cranelift IR."""

import os
import subprocess
import sys
import textwrap


def test_rivet_dump_writes_each_pass_and_cranelift_ir(tmp_path):
    script = textwrap.dedent(
        """
        import rivet
        from rivet import te
        n = te.var("n")
        A = te.placeholder((n,), "float32", name="A")
        B = te.compute((n,), lambda i: A[i] * 2.0, name="B")
        rivet.build(rivet.create_schedule(B), [A, B], target="cpu", name="double")
        """
    )
    env = dict(os.environ, RIVET_DUMP=str(tmp_path))
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=120)
    names = sorted(p.name for p in tmp_path.iterdir())
    for expected in ["double.01.nest.ir", "double.02.bounds.ir", "double.03.simplify.ir", "double.04.flatten.ir", "double.05.split.ir", "double.06.cpu.src"]:
        assert expected in names, names
    assert "func double(" in (tmp_path / "double.04.flatten.ir").read_text()
    clif = (tmp_path / "double.06.cpu.src").read_text()
    assert "function" in clif and "fmul" in clif
