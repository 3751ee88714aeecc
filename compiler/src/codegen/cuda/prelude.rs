//! The helper functions every generated CUDA source starts with: the interpreter's scalar
//! semantics (`codegen::interp`, `codegen::cpu_lib::math`) written in CUDA C++, in one string.
//!
//! The prelude includes no header, so it compiles under NVRTC with no include path, and under
//! a host C++ compiler too (`RIVET_FN` is `static inline` there, bit casts use
//! `__builtin_memcpy`): the tests compile it with the machine's `c++` and compare every
//! helper with the interpreter bit for bit, which is how its semantics are checked on a
//! machine with no GPU.
//!
//! - float16 / bfloat16 are stored as their 16 bits (`unsigned short`) and computed in
//!   `float`; the conversions are bit manipulations mirroring the `half` crate's, which the
//!   interpreter uses (round to nearest even from float32; from float64: float16 through
//!   float32, rivet's rule on every backend, and bfloat16 from the high 32 bits as the crate
//!   does).
//! - integer `//` and `%` are Python's with a zero divisor giving 0 (`rivet_floordiv_i64`);
//!   uint64 divides unsigned.
//! - float -> int casts saturate, NaN -> 0 (Rust's `as`), through float64 as the interpreter.
//! - float `min` / `max` propagate NaN; float `//` and `%` are `floor(a / b)` and
//!   `a - floor(a / b) * b` with each operation rounded (no contraction into an FMA);
//!   the IR's explicit `Fma` is `RIVET_FMAF` / `RIVET_FMA` (`fmaf` / `fma`: one rounding).
//! - `rivet_allreduce_x`, the cross-thread reduction (`Stmt::AllReduce`): warp shuffles
//!   within each warp's share of a group, then shared memory across the warps, combining in
//!   exactly the order of `codegen::interp::gpu::allreduce_group`. It needs the warp
//!   intrinsics (`__shfl_down_sync`, `__shfl_sync`), so it exists only under NVRTC or where
//!   the includer emulates them (`RIVET_WARP_EMULATION`, the host tests).

/// The prelude: typedefs and `rivet_*` helpers.
pub const PRELUDE: &str = r#"// ---- rivet prelude: the interpreter's scalar semantics (codegen/interp, codegen/cpu_lib/math) ----
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define RIVET_FN __device__ __forceinline__
#define RIVET_DEVICE 1
#else
#define RIVET_FN static inline
#endif

typedef unsigned short rivet_f16;  /* float16 bits */
typedef unsigned short rivet_bf16; /* bfloat16 bits */

#ifndef RIVET_DEVICE
/* Host emulation: CUDA's 16-byte vector types (vectorized stores, lower::vectorize). */
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct alignas(16) double2 { double x, y; };
struct alignas(16) longlong2 { long long x, y; };
struct alignas(16) ulonglong2 { unsigned long long x, y; };
#endif
/* Whether a 16-byte vector access at `p` is aligned (checked at run time: tensors and views
   may start anywhere). */
RIVET_FN bool rivet_aligned16(const void* p) {
  return (((unsigned long long)p) & 15ull) == 0ull;
}

RIVET_FN unsigned int rivet_f32_bits(float x) {
#ifdef RIVET_DEVICE
  return __float_as_uint(x);
#else
  unsigned int b; __builtin_memcpy(&b, &x, 4); return b;
#endif
}
RIVET_FN float rivet_f32_from_bits(unsigned int b) {
#ifdef RIVET_DEVICE
  return __uint_as_float(b);
#else
  float x; __builtin_memcpy(&x, &b, 4); return x;
#endif
}
RIVET_FN unsigned long long rivet_f64_bits(double x) {
#ifdef RIVET_DEVICE
  return (unsigned long long)__double_as_longlong(x);
#else
  unsigned long long b; __builtin_memcpy(&b, &x, 8); return b;
#endif
}
RIVET_FN double rivet_f64_from_bits(unsigned long long b) {
#ifdef RIVET_DEVICE
  return __longlong_as_double((long long)b);
#else
  double x; __builtin_memcpy(&x, &b, 8); return x;
#endif
}

/* Rounded float operations (never contracted into an FMA, whatever -fmad says). */
#ifdef RIVET_DEVICE
#define RIVET_MULF(a, b) __fmul_rn((a), (b))
#define RIVET_MUL(a, b) __dmul_rn((a), (b))
#define RIVET_FLOORF(x) floorf(x)
#define RIVET_FLOOR(x) floor(x)
#define RIVET_FMAF(a, b, c) fmaf((a), (b), (c))
#define RIVET_FMA(a, b, c) fma((a), (b), (c))
#else
#define RIVET_MULF(a, b) ((a) * (b))
#define RIVET_MUL(a, b) ((a) * (b))
#define RIVET_FLOORF(x) __builtin_floorf(x)
#define RIVET_FLOOR(x) __builtin_floor(x)
#define RIVET_FMAF(a, b, c) __builtin_fmaf((a), (b), (c))
#define RIVET_FMA(a, b, c) __builtin_fma((a), (b), (c))
#endif

/* ---- float16 / bfloat16 <-> float32 (the half crate's algorithms) ---- */
RIVET_FN float rivet_f16_to_f32(unsigned short h) {
  unsigned int sign = (unsigned int)(h & 0x8000u) << 16;
  unsigned int exp = h & 0x7c00u, man = h & 0x3ffu;
  if ((h & 0x7fffu) == 0u) return rivet_f32_from_bits(sign);
  if (exp == 0x7c00u) {
    return rivet_f32_from_bits(man == 0u ? (sign | 0x7f800000u) : (sign | 0x7fc00000u | (man << 13)));
  }
  if (exp == 0u) {
    unsigned int e = 113u;
    while ((man & 0x400u) == 0u) { man <<= 1; e -= 1u; }
    return rivet_f32_from_bits(sign | (e << 23) | ((man & 0x3ffu) << 13));
  }
  return rivet_f32_from_bits(sign | (((exp >> 10) + 112u) << 23) | (man << 13));
}
RIVET_FN unsigned short rivet_f32_to_f16(float value) {
  unsigned int x = rivet_f32_bits(value);
  unsigned int sign = x & 0x80000000u, exp = x & 0x7f800000u, man = x & 0x007fffffu;
  if (exp == 0x7f800000u) {
    unsigned int nan_bit = man == 0u ? 0u : 0x0200u;
    return (unsigned short)((sign >> 16) | 0x7c00u | nan_bit | (man >> 13));
  }
  unsigned int half_sign = sign >> 16;
  int half_exp = (int)(exp >> 23) - 127 + 15;
  if (half_exp >= 0x1f) return (unsigned short)(half_sign | 0x7c00u);
  if (half_exp <= 0) {
    if (14 - half_exp > 24) return (unsigned short)half_sign;
    man = man | 0x00800000u;
    unsigned int half_man = man >> (14 - half_exp);
    unsigned int round_bit = 1u << (13 - half_exp);
    if ((man & round_bit) != 0u && (man & (3u * round_bit - 1u)) != 0u) half_man += 1u;
    return (unsigned short)(half_sign | half_man);
  }
  unsigned int r = half_sign | ((unsigned int)half_exp << 10) | (man >> 13);
  if ((man & 0x1000u) != 0u && (man & (3u * 0x1000u - 1u)) != 0u) r += 1u;
  return (unsigned short)r;
}
/* float64 -> float16 through float32: rivet's rule on every backend (codegen/interp header). */
RIVET_FN unsigned short rivet_f64_to_f16(double x) { return rivet_f32_to_f16((float)x); }
RIVET_FN float rivet_bf16_to_f32(unsigned short h) {
  unsigned int b = (unsigned int)h;
  if ((h & 0x7fffu) > 0x7f80u) b |= 0x0040u;
  return rivet_f32_from_bits(b << 16);
}
RIVET_FN unsigned short rivet_f32_to_bf16(float value) {
  unsigned int x = rivet_f32_bits(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x0040u);
  if ((x & 0x8000u) != 0u && (x & (3u * 0x8000u - 1u)) != 0u) return (unsigned short)((x >> 16) + 1u);
  return (unsigned short)(x >> 16);
}
RIVET_FN unsigned short rivet_f64_to_bf16(double value) {
  unsigned long long val = rivet_f64_bits(value);
  unsigned int x = (unsigned int)(val >> 32);
  unsigned int sign = x & 0x80000000u, exp = x & 0x7ff00000u, man = x & 0x000fffffu;
  if (exp == 0x7ff00000u) {
    unsigned int nan_bit = (man == 0u && (unsigned int)val == 0u) ? 0u : 0x0040u;
    return (unsigned short)((sign >> 16) | 0x7f80u | nan_bit | (man >> 13));
  }
  unsigned int half_sign = sign >> 16;
  long long half_exp = (long long)(exp >> 20) - 1023 + 127;
  if (half_exp >= 0xff) return (unsigned short)(half_sign | 0x7f80u);
  if (half_exp <= 0) {
    if (7 - half_exp > 21) return (unsigned short)half_sign;
    man = man | 0x00100000u;
    unsigned int half_man = man >> (14 - half_exp);
    unsigned int round_bit = 1u << (13 - half_exp);
    if ((man & round_bit) != 0u && (man & (3u * round_bit - 1u)) != 0u) half_man += 1u;
    return (unsigned short)(half_sign | half_man);
  }
  unsigned int r = half_sign | ((unsigned int)half_exp << 7) | (man >> 13);
  if ((man & 0x1000u) != 0u && (man & (3u * 0x1000u - 1u)) != 0u) r += 1u;
  return (unsigned short)r;
}
/* A float32 value rounded to float16 / bfloat16 and widened back (casts, stores). */
RIVET_FN float rivet_round_f16(float x) { return rivet_f16_to_f32(rivet_f32_to_f16(x)); }
RIVET_FN float rivet_round_bf16(float x) { return rivet_bf16_to_f32(rivet_f32_to_bf16(x)); }

/* ---- integers: Python's floor division and modulo, zero divisor -> 0 ---- */
RIVET_FN long long rivet_floordiv_i64(long long a, long long b) {
  if (b == 0) return 0;
  if (b == -1) return (long long)(0ull - (unsigned long long)a); /* MIN // -1 wraps */
  long long q = a / b, r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? q - 1 : q;
}
RIVET_FN long long rivet_floormod_i64(long long a, long long b) {
  if (b == 0 || b == -1) return 0;
  long long r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
RIVET_FN unsigned long long rivet_floordiv_u64(unsigned long long a, unsigned long long b) {
  return b == 0ull ? 0ull : a / b;
}
RIVET_FN unsigned long long rivet_floormod_u64(unsigned long long a, unsigned long long b) {
  return b == 0ull ? 0ull : a % b;
}
/* Wrapping abs (abs(MIN) is MIN), computed in the unsigned type U. */
template <typename T, typename U> RIVET_FN T rivet_iabs(T x) { return (T)(x < 0 ? (U)0 - (U)x : (U)x); }
template <typename T> RIVET_FN T rivet_min(T a, T b) { return a < b ? a : b; }
template <typename T> RIVET_FN T rivet_max(T a, T b) { return a > b ? a : b; }

/* ---- floats: NaN-propagating min / max, floor division and modulo ---- */
RIVET_FN float rivet_fminf(float a, float b) {
  return (a != a || b != b) ? rivet_f32_from_bits(0x7fc00000u) : (a < b ? a : b);
}
RIVET_FN float rivet_fmaxf(float a, float b) {
  return (a != a || b != b) ? rivet_f32_from_bits(0x7fc00000u) : (a > b ? a : b);
}
RIVET_FN double rivet_fmin(double a, double b) {
  return (a != a || b != b) ? rivet_f64_from_bits(0x7ff8000000000000ull) : (a < b ? a : b);
}
RIVET_FN double rivet_fmax(double a, double b) {
  return (a != a || b != b) ? rivet_f64_from_bits(0x7ff8000000000000ull) : (a > b ? a : b);
}
RIVET_FN float rivet_floordivf(float a, float b) { return RIVET_FLOORF(a / b); }
RIVET_FN float rivet_floormodf(float a, float b) { return a - RIVET_MULF(RIVET_FLOORF(a / b), b); }
RIVET_FN double rivet_floordiv(double a, double b) { return RIVET_FLOOR(a / b); }
RIVET_FN double rivet_floormod(double a, double b) { return a - RIVET_MUL(RIVET_FLOOR(a / b), b); }

/* ---- float -> int: saturating, NaN -> 0, from the exact float64 value (Rust's `as`) ---- */
RIVET_FN long long rivet_f2i(double x, double lo, double hi_excl, long long lo_i, long long hi_i) {
  if (x != x) return 0;
  if (x <= lo) return lo_i;
  if (x >= hi_excl) return hi_i;
  return (long long)x;
}
RIVET_FN signed char rivet_f2i8(double x) { return (signed char)rivet_f2i(x, -128.0, 128.0, -128, 127); }
RIVET_FN short rivet_f2i16(double x) { return (short)rivet_f2i(x, -32768.0, 32768.0, -32768, 32767); }
RIVET_FN int rivet_f2i32(double x) {
  return (int)rivet_f2i(x, -2147483648.0, 2147483648.0, -2147483647LL - 1, 2147483647LL);
}
RIVET_FN long long rivet_f2i64(double x) {
  return rivet_f2i(x, -9223372036854775808.0, 9223372036854775808.0, -9223372036854775807LL - 1,
                   9223372036854775807LL);
}
RIVET_FN unsigned char rivet_f2u8(double x) { return (unsigned char)rivet_f2i(x, 0.0, 256.0, 0, 255); }
RIVET_FN unsigned short rivet_f2u16(double x) { return (unsigned short)rivet_f2i(x, 0.0, 65536.0, 0, 65535); }
RIVET_FN unsigned int rivet_f2u32(double x) {
  return (unsigned int)rivet_f2i(x, 0.0, 4294967296.0, 0, 4294967295LL);
}
RIVET_FN unsigned long long rivet_f2u64(double x) {
  if (x != x || x <= 0.0) return 0ull;
  if (x >= 18446744073709551616.0) return 18446744073709551615ull;
  return (unsigned long long)x;
}

/* ---- cross-thread reduction over threadIdx.x (ir::Stmt::AllReduce) ---- */
#if defined(RIVET_DEVICE) || defined(RIVET_WARP_EMULATION)
/* The shuffles move 32- and 64-bit values: narrower integers travel as int / unsigned. */
#define RIVET_SHFL(T, W)                                                                    \
  RIVET_FN T rivet_shfl_down(unsigned m, T v, int d) { return (T)__shfl_down_sync(m, (W)v, d); } \
  RIVET_FN T rivet_shfl(unsigned m, T v, int l) { return (T)__shfl_sync(m, (W)v, l); }
RIVET_SHFL(signed char, int)
RIVET_SHFL(short, int)
RIVET_SHFL(int, int)
RIVET_SHFL(unsigned char, unsigned int)
RIVET_SHFL(unsigned short, unsigned int)
RIVET_SHFL(unsigned int, unsigned int)
RIVET_SHFL(long long, long long)
RIVET_SHFL(unsigned long long, unsigned long long)
RIVET_SHFL(float, float)
RIVET_SHFL(double, double)
#undef RIVET_SHFL
/* The shfl_down tree of codegen::interp::gpu (shuffle_tree) over the `len` values of lanes
   `m = 0..len` of a run: for each offset from the largest power of two below `width` down to
   1, lane m takes op(own, lane m + off) when m + off < len. */
template <typename T, typename F>
RIVET_FN T rivet_shfl_tree(T v, F op, unsigned mask, int m, int len, int width) {
  int off = 0;
  for (int p = 1; p < width; p *= 2) off = p;
  for (; off > 0; off /= 2) {
    T o = rivet_shfl_down(mask, v, off);
    if (m + off < len) v = op(v, o);
  }
  return v;
}
/* Called by every thread of the block with its value `v`; returns the `op`-combination of
   the values of its group (the threads of equal threadIdx.y and threadIdx.z), the same in
   every thread of the group, in the order of codegen::interp::gpu::allreduce_group: each
   warp's share of the group (a run of up to 32 consecutive threadIdx.x) by shuffles, then,
   when the group spans several warps, the runs' results through `scratch` (shared memory,
   ceil(nx / 32) elements per group) by the group's first warp, broadcast back through
   `scratch` between barriers. nx, ny: blockDim.x, blockDim.y; nthreads: the block's size.
   With several groups nx is a power of two (ir::verify::gpu), so a warp holds whole groups
   (nx <= 32) or a 32-thread share of one. Masks name exactly the warp's threads. */
template <typename T, typename F>
RIVET_FN T rivet_allreduce_x(T v, F op, T* scratch, int nx, int ny, int nthreads) {
  const int x = (int)threadIdx.x;
  const int tid = x + nx * ((int)threadIdx.y + ny * (int)threadIdx.z);
  const int left = nthreads - (tid & ~31);
  const unsigned mask = left >= 32 ? 0xffffffffu : ((1u << left) - 1u);
  const int m = x & 31;
  const int len = nx - (x & ~31) < 32 ? nx - (x & ~31) : 32;
  v = rivet_shfl_tree(v, op, mask, m, len, nx < 32 ? nx : 32);
  const int runs = (nx + 31) / 32;
  if (runs == 1) return rivet_shfl(mask, v, (tid & 31) - m);
  T* mine = scratch + (tid / nx) * runs;
  if (m == 0) mine[x / 32] = v;
  __syncthreads();
  if (x < 32) { /* the group's first warp: 32 threads, all present */
    if (m < runs) v = mine[m];
    v = rivet_shfl_tree(v, op, 0xffffffffu, m, runs, runs);
    if (m == 0) mine[0] = v;
  }
  __syncthreads();
  v = mine[0];
  __syncthreads(); /* before `scratch` is written again */
  return v;
}
#endif
// ---- end of the rivet prelude ----
"#;
