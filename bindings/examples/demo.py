"""rivet CPU demo: one native packed function working in place on PyTorch, NumPy and JAX memory.

Run with `make demo`. Each section prints its pointers and checks, then one "OK" line;
the script exits non-zero if any check fails.
"""
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import torch

import rivet

axpy = rivet.get_global_func("testing.axpy")  # y <- alpha * x + y, in place (float32/float64)
echo = rivet.get_global_func("testing.echo")  # returns its argument (tensors: same memory)


def check(cond, what):
    print(f"  {'ok  ' if cond else 'FAIL'} {what}")
    if not cond:
        raise AssertionError(what)


def section_torch():
    # A large contiguous tensor (takes the parallel path): y's own memory is written, no copy.
    x, y = torch.rand(1 << 17), torch.rand(1 << 17)
    ref = 2.0 * x + y  # reference computed before the call
    before = y.data_ptr()
    axpy(2.0, x, y)
    view = rivet.from_dlpack(y).data_ptr
    print(f"  y.data_ptr(): before={before:#x} after={y.data_ptr():#x} rivet view={view:#x}")
    check(before == y.data_ptr() == view, "rivet sees and writes torch's own buffer")
    torch.testing.assert_close(y, ref)
    check(True, "contiguous result matches torch reference")

    # A transposed, strided view of a larger buffer: only the viewed elements change.
    base = torch.rand(8, 12, dtype=torch.float64)
    y2 = base[:, ::2].t()  # shape (6, 8), strides (2, 12): neither contiguous nor row-major
    x2 = torch.rand(6, 8, dtype=torch.float64)
    ref2, untouched = 0.5 * x2 + y2, base[:, 1::2].clone()
    t2 = rivet.from_dlpack(y2)
    print(f"  strided view: shape={t2.shape} strides={t2.strides} data_ptr={t2.data_ptr:#x}")
    check(t2.data_ptr == y2.data_ptr() and tuple(t2.strides) == y2.stride(), "view keeps torch's strides")
    axpy(0.5, x2, y2)
    torch.testing.assert_close(y2, ref2)
    check(torch.equal(base[:, 1::2], untouched), "elements outside the view are untouched")

    # The torch wrapper: returned tensors come back as torch tensors over the same memory.
    echo_t = rivet.to_pytorch_func(echo)
    back = echo_t(y2)
    check(isinstance(back, torch.Tensor) and back.data_ptr() == y2.data_ptr(), "to_pytorch_func(echo) returns y2 itself")


def section_numpy():
    x = np.random.rand(5, 3)
    y = np.random.rand(5, 3)
    ref, before = 3.0 * x + y, y.ctypes.data
    axpy(3.0, x, y)
    view = rivet.from_dlpack(y)
    print(f"  y.ctypes.data: before={before:#x} after={y.ctypes.data:#x} rivet view={view.data_ptr:#x}")
    check(before == y.ctypes.data == view.data_ptr, "rivet writes numpy's own buffer")
    np.testing.assert_allclose(y, ref, rtol=1e-12)
    check(True, "result matches numpy reference")

    # .numpy() is a view, not a copy: writes through it land in the original array.
    a = np.arange(6.0).reshape(2, 3)
    v = rivet.from_dlpack(a).numpy()
    check(np.shares_memory(v, a), "rivet.from_dlpack(a).numpy() shares memory with a")
    v[0, 0] = 42.0
    check(a[0, 0] == 42.0, "a write through the view is visible in a")


def section_jax():
    ja = jnp.arange(1.0, 7.0, dtype=jnp.float32)  # JAX arrays are immutable
    t = rivet.from_dlpack(ja)
    print(f"  jax buffer={ja.unsafe_buffer_pointer():#x} rivet view={t.data_ptr:#x} read_only={t.read_only}")
    check(t.read_only, "a jax array imports as read-only")
    check(t.data_ptr == ja.unsafe_buffer_pointer(), "rivet views the jax buffer without a copy")

    # Writing into a jax array is refused, and the array keeps its values.
    saved = np.array(ja)
    try:
        axpy(1.0, np.ones(6, np.float32), ja)
        raised = False
    except rivet.ReadOnlyError as e:
        raised = True
        print(f"  expected error: {type(e).__name__}: {e}")
    check(raised, "a jax array as the axpy output raises rivet.ReadOnlyError")
    check(np.array_equal(np.asarray(ja), saved), "the jax array is unchanged")

    # A jax array is fine as an input: x from jax, y from numpy.
    y = np.random.rand(6).astype(np.float32)
    ref = 2.0 * saved + y
    axpy(2.0, ja, y)
    np.testing.assert_allclose(y, ref, rtol=1e-6)
    check(True, "axpy(2.0, jax x, numpy y) matches the reference")

    # The jax wrapper: tensors come back as jax arrays.
    out = rivet.to_jax_func(echo)(ja)
    check(isinstance(out, jax.Array) and np.array_equal(np.asarray(out), saved), "to_jax_func(echo) returns a jax array")


def section_callback():
    @rivet.register_func("demo.square", override=True)
    def square(v):
        if isinstance(v, rivet.Tensor):  # tensors reach Python as zero-copy rivet views
            a = v.numpy()
            np.multiply(a, a, out=a)
            return v
        return v * v

    sq = rivet.get_global_func("demo.square")  # the Python callable, as a packed function
    check(sq(7) == 49, "demo.square(7) == 49 through the registry")
    t = torch.tensor([1.0, 2.0, 3.0])
    out = rivet.to_pytorch_func(sq)(t)
    check(torch.equal(t, torch.tensor([1.0, 4.0, 9.0])), "the callback squared the torch tensor in place")
    check(out.data_ptr() == t.data_ptr(), "and handed back the same memory")


def main():
    print(f"rivet demo: torch {torch.__version__}, jax {jax.__version__}, numpy {np.__version__}")
    failed = []
    for name, fn in [("torch", section_torch), ("numpy", section_numpy),
                     ("jax", section_jax), ("python callback", section_callback)]:
        print(f"[{name}]")
        try:
            fn()
            print(f"OK {name}")
        except Exception:
            traceback.print_exc()
            print(f"FAILED {name}")
            failed.append(name)
    print("all sections OK" if not failed else f"FAILED sections: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
