/* rivet-cuda-double: the CUDA emulation a recorded kernel source is compiled under for the
   host (included before the source; the wrappers the double generates follow it).

   Invariants:
   - a launch is the state of one call (`rivet_emu::launch`, on the caller's stack), never
     statics shared across kernels or modules; the emulated threads find it through a
     thread-local pointer;
   - blocks run one after another; within a block either one OS thread per CUDA thread (a
     kernel whose source may synchronise: `__syncthreads`, warp shuffles, ...) or the
     threads one after another on the calling thread (the double decides from the source
     text; a kernel run that way which reaches a barrier fails the launch instead of giving a
     wrong answer);
   - every barrier and warp operation goes through one mutex per launch, which sees when all
     the block's threads wait and none can go on: a barrier not reached by every thread of
     the block (some returned), or a warp operation not reached by every thread of its warp,
     fails the launch with the reason (stricter than a GPU, where it is undefined);
   - a failure (`__trap()`, a bad shuffle mask, a divergent barrier) unwinds every emulated
     thread (a C++ exception caught at each thread's top) and the launch returns the reason;
     nothing escapes into the caller;
   - shuffle masks must name exactly the warp's threads (32, the last warp of a block its
     remainder), as rivet's code does; a source lane outside the warp reads 0xA5 bytes;
   - dynamic shared memory is the launch's buffer, filled with 0xA5 before every block (as
     undefined as a GPU's, and visibly so); static `__shared__` variables are function
     statics, shared by the block's threads and kept from block to block. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __shared__ static
#define __constant__ static
#define __managed__
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) alignas(n)
#define warpSize 32
/* rivet's prelude defines its cross-thread reduction only where warp shuffles exist. */
#define RIVET_WARP_EMULATION 1

struct uint3 { unsigned int x, y, z; };
struct dim3 { unsigned int x, y, z; };

/* What the Rust side passes to a kernel's `rivet_double_run_<i>` (its #[repr(C)] twin is in
   kernels/host.rs). */
struct rivet_launch_args {
  unsigned int grid[3];
  unsigned int block[3];
  unsigned long long dynamic_shared;
  void** params;
  char* why;
  unsigned long long why_cap;
};

static thread_local uint3 threadIdx, blockIdx;
static thread_local dim3 blockDim, gridDim;

namespace rivet_emu {

struct abort_launch {};

enum { RUNNING = 0, AT_SYNC = 1, AT_WARP = 2, AT_END = 3 };

struct launch {
  unsigned int n = 0;  /* threads per block */
  bool threaded = false;
  std::vector<unsigned char> dyn;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> st; /* per thread: RUNNING, AT_SYNC, ... */
  unsigned int blocked = 0;
  unsigned int at_sync = 0, at_end = 0;
  unsigned long long sync_gen = 0, end_gen = 0;
  long long sync_sum = 0, sync_and = 1, sync_or = 0;
  long long sync_res_sum = 0, sync_res_and = 1, sync_res_or = 0;
  std::vector<unsigned int> warp_at;
  std::vector<unsigned long long> warp_gen;
  std::vector<unsigned long long> slot, snap;
  bool failed = false;
  std::string why;
};

static thread_local launch* cur = nullptr;
static thread_local unsigned int tid = 0;

static std::string where() {
  char b[160];
  snprintf(b, sizeof b, "thread (%u,%u,%u) of block (%u,%u,%u)", threadIdx.x, threadIdx.y,
           threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z);
  return b;
}

/* Records the first failure and wakes every waiter; the caller holds `mu`. */
static void fail_locked(launch* L, const std::string& why) {
  if (!L->failed) {
    L->failed = true;
    L->why = why;
  }
  L->cv.notify_all();
}

[[noreturn]] static void fail(const std::string& why) {
  launch* L = cur;
  {
    std::lock_guard<std::mutex> g(L->mu);
    fail_locked(L, why);
  }
  throw abort_launch();
}

static unsigned int warp_size(launch* L, unsigned int w) {
  return L->n - w * 32 < 32 ? L->n - w * 32 : 32;
}

/* Called by the last thread to block (mu held): every thread of the block waits and none
   was released, so none ever will be. */
[[noreturn]] static void stuck(launch* L) {
  unsigned int sync = 0, warp = 0, end = 0;
  for (int s : L->st) {
    sync += s == AT_SYNC;
    warp += s == AT_WARP;
    end += s == AT_END;
  }
  char b[400];
  snprintf(b, sizeof b,
           "block (%u,%u,%u) cannot go on: %u of its %u threads wait at __syncthreads, %u at a "
           "warp operation (shuffle, __syncwarp, vote) and %u have returned; a barrier must be "
           "reached by every thread of the block and a warp operation by every thread of the "
           "warp (undefined on a GPU)",
           blockIdx.x, blockIdx.y, blockIdx.z, sync, L->n, warp, end);
  fail_locked(L, b);
  throw abort_launch();
}

/* A block-wide barrier (`__syncthreads*`, or the end of the block when `kind` is AT_END). */
static void block_wait(int kind, int pred = 0) {
  launch* L = cur;
  if (!L->threaded) {
    if (L->n == 1) {
      L->sync_res_sum = pred != 0;
      L->sync_res_and = pred != 0;
      L->sync_res_or = pred != 0;
      return;
    }
    fail("internal: the double ran this kernel's threads one after another (it found no "
         "barrier or warp operation in its source) but " + where() +
         " reached __syncthreads; report the source");
  }
  std::unique_lock<std::mutex> g(L->mu);
  if (L->failed) throw abort_launch();
  unsigned int& count = kind == AT_SYNC ? L->at_sync : L->at_end;
  unsigned long long& gen = kind == AT_SYNC ? L->sync_gen : L->end_gen;
  const unsigned long long mine = gen;
  if (kind == AT_SYNC) {
    L->sync_sum += pred != 0;
    L->sync_and &= pred != 0;
    L->sync_or |= pred != 0;
  }
  L->st[tid] = kind;
  L->blocked++;
  if (++count == L->n) {
    count = 0;
    gen++;
    for (unsigned int t = 0; t < L->n; ++t) L->st[t] = RUNNING;
    L->blocked -= L->n;
    if (kind == AT_SYNC) {
      L->sync_res_sum = L->sync_sum;
      L->sync_res_and = L->sync_and;
      L->sync_res_or = L->sync_or;
      L->sync_sum = 0;
      L->sync_and = 1;
      L->sync_or = 0;
    } else if (!L->dyn.empty()) {
      memset(L->dyn.data(), 0xA5, L->dyn.size());
    }
    L->cv.notify_all();
    return;
  }
  if (L->blocked == L->n) stuck(L);
  L->cv.wait(g, [&] { return gen != mine || L->failed; });
  if (gen == mine) throw abort_launch();
}

/* Every thread of the caller's warp puts in `bits`; returns the warp's values by lane
   (`out[l]` for l < the warp's size). `mask` must name exactly the warp's threads. */
static unsigned int warp_exchange(unsigned int mask, unsigned long long bits,
                                  unsigned long long out[32]) {
  launch* L = cur;
  const unsigned int w = tid / 32, n = warp_size(L, w);
  const unsigned int full = n >= 32 ? 0xffffffffu : ((1u << n) - 1u);
  if (mask != full) {
    char b[200];
    snprintf(b, sizeof b, "a warp operation with mask %#x in %s: the warp's threads are %#x",
             mask, where().c_str(), full);
    fail(b);
  }
  if (!L->threaded) {
    if (n == 1) {
      out[0] = bits;
      return n;
    }
    fail("internal: the double ran this kernel's threads one after another (it found no "
         "barrier or warp operation in its source) but " + where() +
         " reached a warp operation; report the source");
  }
  std::unique_lock<std::mutex> g(L->mu);
  if (L->failed) throw abort_launch();
  const unsigned long long mine = L->warp_gen[w];
  L->slot[tid] = bits;
  L->st[tid] = AT_WARP;
  L->blocked++;
  if (++L->warp_at[w] == n) {
    L->warp_at[w] = 0;
    L->warp_gen[w]++;
    for (unsigned int l = 0; l < n; ++l) {
      L->snap[w * 32 + l] = L->slot[w * 32 + l];
      L->st[w * 32 + l] = RUNNING;
    }
    L->blocked -= n;
    L->cv.notify_all();
  } else {
    if (L->blocked == L->n) stuck(L);
    L->cv.wait(g, [&] { return L->warp_gen[w] != mine || L->failed; });
    if (L->warp_gen[w] == mine) throw abort_launch();
  }
  for (unsigned int l = 0; l < n; ++l) out[l] = L->snap[w * 32 + l];
  return n;
}

template <typename T> static T shuffle(unsigned int mask, T v, int src) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                "warp shuffles move values of up to 8 bytes");
  unsigned long long bits = 0, all[32];
  memcpy(&bits, &v, sizeof(T));
  const unsigned int n = warp_exchange(mask, bits, all);
  T r;
  if (src >= 0 && (unsigned int)src < n) memcpy(&r, &all[src], sizeof(T));
  else memset(&r, 0xA5, sizeof(T));
  return r;
}

static int lane() { return (int)(tid & 31); }

/* An argument's value from its bytes (which may be unaligned). */
template <typename T> static T load(void* p) {
  typename std::remove_cv<T>::type v;
  memcpy((void*)&v, p, sizeof(T));
  return v;
}

template <typename... A, size_t... I>
static std::tuple<typename std::remove_cv<A>::type...> args(void** p,
                                                            std::index_sequence<I...>) {
  return std::tuple<typename std::remove_cv<A>::type...>(load<A>(p[I])...);
}

struct thread_job {
  launch* L;
  const rivet_launch_args* a;
  unsigned int t;
  void (*body)(void*);
  void* ctx;
};

static void set_dims(const rivet_launch_args* a) {
  gridDim = dim3{a->grid[0], a->grid[1], a->grid[2]};
  blockDim = dim3{a->block[0], a->block[1], a->block[2]};
}

static void set_thread(const rivet_launch_args* a, unsigned int t) {
  tid = t;
  threadIdx = uint3{t % a->block[0], t / a->block[0] % a->block[1],
                    t / (a->block[0] * a->block[1])};
}

/* One emulated thread of a threaded launch: the same CUDA thread of every block in turn. */
static void* thread_main(void* p) {
  thread_job* j = (thread_job*)p;
  cur = j->L;
  set_dims(j->a);
  set_thread(j->a, j->t);
  try {
    for (unsigned int z = 0; z < j->a->grid[2]; ++z)
      for (unsigned int y = 0; y < j->a->grid[1]; ++y)
        for (unsigned int x = 0; x < j->a->grid[0]; ++x) {
          blockIdx = uint3{x, y, z};
          j->body(j->ctx);
          block_wait(AT_END);
        }
  } catch (abort_launch&) {
  } catch (...) {
    std::lock_guard<std::mutex> g(j->L->mu);
    fail_locked(j->L, "a C++ exception in " + where());
  }
  cur = nullptr;
  return nullptr;
}

static void point_dynamic_shared_hook();

/* Runs the grid; 0, or 1 with the reason in a->why. */
static int run(const rivet_launch_args* a, bool threaded, void (*body)(void*), void* ctx) {
  launch L;
  const unsigned long long n64 =
      (unsigned long long)a->block[0] * a->block[1] * a->block[2];
  if (n64 == 0 || n64 > 1024 || a->grid[0] == 0 || a->grid[1] == 0 || a->grid[2] == 0) {
    snprintf(a->why, a->why_cap, "a launch of grid (%u,%u,%u) and block (%u,%u,%u)",
             a->grid[0], a->grid[1], a->grid[2], a->block[0], a->block[1], a->block[2]);
    return 1;
  }
  L.n = (unsigned int)n64;
  L.threaded = threaded;
  L.dyn.assign(a->dynamic_shared, 0xA5);
  L.st.assign(L.n, RUNNING);
  const unsigned int warps = (L.n + 31) / 32;
  L.warp_at.assign(warps, 0);
  L.warp_gen.assign(warps, 0);
  L.slot.assign(warps * 32, 0);
  L.snap.assign(warps * 32, 0);
  launch* outer = cur;
  cur = &L;
  point_dynamic_shared_hook();
  if (!threaded) {
    set_dims(a);
    try {
      for (unsigned int z = 0; z < a->grid[2]; ++z)
        for (unsigned int y = 0; y < a->grid[1]; ++y)
          for (unsigned int x = 0; x < a->grid[0]; ++x) {
            blockIdx = uint3{x, y, z};
            if (!L.dyn.empty()) memset(L.dyn.data(), 0xA5, L.dyn.size());
            for (unsigned int t = 0; t < L.n; ++t) {
              set_thread(a, t);
              body(ctx);
            }
          }
    } catch (abort_launch&) {
    } catch (...) {
      L.failed = true;
      L.why = "a C++ exception in " + where();
    }
  } else {
    std::vector<thread_job> jobs(L.n);
    std::vector<pthread_t> ids(L.n);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 20);
    unsigned int started = 0;
    for (; started < L.n; ++started) {
      jobs[started] = thread_job{&L, a, started, body, ctx};
      if (pthread_create(&ids[started], &attr, thread_main, &jobs[started]) != 0) {
        std::lock_guard<std::mutex> g(L.mu);
        fail_locked(&L, "cannot start an OS thread for every thread of the block (" +
                            std::to_string(L.n) + ")");
        break;
      }
    }
    pthread_attr_destroy(&attr);
    for (unsigned int t = 0; t < started; ++t) pthread_join(ids[t], nullptr);
  }
  cur = outer;
  if (L.failed) {
    snprintf(a->why, a->why_cap, "%s", L.why.c_str());
    return 1;
  }
  return 0;
}

template <typename... A> struct call_ctx {
  void (*f)(A...);
  std::tuple<typename std::remove_cv<A>::type...> args;
};

template <typename... A> static void call_body(void* p) {
  call_ctx<A...>* c = (call_ctx<A...>*)p;
  std::apply(c->f, c->args);
}

/* A kernel's launch: its parameters' types are those of its own declaration. */
template <typename... A>
static int run_kernel(void (*f)(A...), bool threaded, const rivet_launch_args* a) {
  try {
    call_ctx<A...> c{f, args<A...>(a->params, std::index_sequence_for<A...>{})};
    return run(a, threaded, call_body<A...>, &c);
  } catch (...) { /* nothing may unwind into the Rust caller (bad_alloc, ...) */
    snprintf(a->why, a->why_cap, "the emulation could not set the launch up (out of memory?)");
    return 1;
  }
}

/* A kernel's parameters: each one's size and whether it is a pointer; returns how many. */
template <typename... A>
static int param_info(void (*)(A...), unsigned long long* sizes, unsigned char* ptrs,
                      int cap) {
  const unsigned long long s[] = {0ull, (unsigned long long)sizeof(A)...};
  const unsigned char p[] = {0, (unsigned char)std::is_pointer<A>::value...};
  const int n = (int)sizeof...(A);
  for (int i = 0; i < n && i < cap; ++i) {
    sizes[i] = s[i + 1];
    ptrs[i] = p[i + 1];
  }
  return n;
}

template <typename T> static T atomic_rmw(T* p, T v, T (*op)(T, T)) {
  T old;
  memcpy(&old, p, sizeof(T));
  for (;;) {
    T next = op(old, v);
    if (__atomic_compare_exchange(p, &old, &next, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
      return old;
  }
}

}  // namespace rivet_emu

/* ---- the CUDA device API the emulation provides ---- */
static void* rivet_dynamic_shared() { return rivet_emu::cur->dyn.data(); }

static inline void __syncthreads() { rivet_emu::block_wait(rivet_emu::AT_SYNC); }
static inline int __syncthreads_count(int p) {
  rivet_emu::block_wait(rivet_emu::AT_SYNC, p);
  return (int)rivet_emu::cur->sync_res_sum;
}
static inline int __syncthreads_and(int p) {
  rivet_emu::block_wait(rivet_emu::AT_SYNC, p);
  return (int)rivet_emu::cur->sync_res_and;
}
static inline int __syncthreads_or(int p) {
  rivet_emu::block_wait(rivet_emu::AT_SYNC, p);
  return (int)rivet_emu::cur->sync_res_or;
}
static inline void __syncwarp(unsigned int mask = 0xffffffffu) {
  unsigned long long all[32];
  rivet_emu::warp_exchange(mask, 0, all);
}
template <typename T> static T __shfl_sync(unsigned int mask, T v, int src, int width = 32) {
  const int l = rivet_emu::lane();
  return rivet_emu::shuffle(mask, v, (l & ~(width - 1)) + (src & (width - 1)));
}
template <typename T>
static T __shfl_down_sync(unsigned int mask, T v, unsigned int d, int width = 32) {
  const int l = rivet_emu::lane();
  return rivet_emu::shuffle(mask, v, (l & (width - 1)) + (int)d < width ? l + (int)d : l);
}
template <typename T>
static T __shfl_up_sync(unsigned int mask, T v, unsigned int d, int width = 32) {
  const int l = rivet_emu::lane();
  return rivet_emu::shuffle(mask, v, (l & (width - 1)) >= (int)d ? l - (int)d : l);
}
template <typename T>
static T __shfl_xor_sync(unsigned int mask, T v, int m, int width = 32) {
  const int l = rivet_emu::lane(), s = l ^ m;
  return rivet_emu::shuffle(mask, v, (s & ~(width - 1)) == (l & ~(width - 1)) ? s : l);
}
static inline unsigned int __ballot_sync(unsigned int mask, int p) {
  unsigned long long all[32];
  const unsigned int n = rivet_emu::warp_exchange(mask, p != 0, all);
  unsigned int r = 0;
  for (unsigned int l = 0; l < n; ++l) r |= (unsigned int)all[l] << l;
  return r;
}
static inline int __any_sync(unsigned int mask, int p) { return __ballot_sync(mask, p) != 0; }
static inline int __all_sync(unsigned int mask, int p) {
  return __ballot_sync(mask, p) == mask;
}
static inline unsigned int __activemask() {
  const unsigned int n = rivet_emu::warp_size(rivet_emu::cur, rivet_emu::tid / 32);
  return n >= 32 ? 0xffffffffu : ((1u << n) - 1u);
}

[[noreturn]] static inline void __trap() {
  rivet_emu::fail("__trap() in " + rivet_emu::where());
}
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <typename T> static inline T __ldg(const T* p) { return *p; }

/* Atomics: the host's, sequentially consistent. */
template <typename T> static T atomicAdd(T* p, T v) {
  if constexpr (std::is_integral<T>::value) return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
  else return rivet_emu::atomic_rmw<T>(p, v, [](T a, T b) { return a + b; });
}
template <typename T> static T atomicSub(T* p, T v) {
  return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST);
}
template <typename T> static T atomicExch(T* p, T v) {
  T old;
  __atomic_exchange(p, &v, &old, __ATOMIC_SEQ_CST);
  return old;
}
template <typename T> static T atomicMin(T* p, T v) {
  return rivet_emu::atomic_rmw<T>(p, v, [](T a, T b) { return b < a ? b : a; });
}
template <typename T> static T atomicMax(T* p, T v) {
  return rivet_emu::atomic_rmw<T>(p, v, [](T a, T b) { return b > a ? b : a; });
}
template <typename T> static T atomicAnd(T* p, T v) {
  return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST);
}
template <typename T> static T atomicOr(T* p, T v) {
  return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);
}
template <typename T> static T atomicXor(T* p, T v) {
  return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST);
}
template <typename T> static T atomicCAS(T* p, T expected, T desired) {
  __atomic_compare_exchange(p, &expected, &desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expected;
}
static inline unsigned int atomicInc(unsigned int* p, unsigned int v) {
  return rivet_emu::atomic_rmw<unsigned int>(
      p, v, [](unsigned int a, unsigned int b) { return a >= b ? 0u : a + 1u; });
}
static inline unsigned int atomicDec(unsigned int* p, unsigned int v) {
  return rivet_emu::atomic_rmw<unsigned int>(
      p, v, [](unsigned int a, unsigned int b) { return (a == 0u || a > b) ? b : a - 1u; });
}

/* Bit casts and rounded arithmetic (the host rounds every operation: -ffp-contract=off). */
static inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
static inline int __float_as_int(float x) { int i; memcpy(&i, &x, 4); return i; }
static inline float __uint_as_float(unsigned int x) { float f; memcpy(&f, &x, 4); return f; }
static inline unsigned int __float_as_uint(float x) { unsigned int i; memcpy(&i, &x, 4); return i; }
static inline double __longlong_as_double(long long x) { double f; memcpy(&f, &x, 8); return f; }
static inline long long __double_as_longlong(double x) { long long i; memcpy(&i, &x, 8); return i; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
static inline float __fdividef(float a, float b) { return a / b; }
/* glibc declares __expf and friends itself: macros, not functions. */
#define __expf(x) expf(x)
#define __logf(x) logf(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __powf(a, b) powf((a), (b))
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
static inline int __popc(unsigned int x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned int)x); }
static inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll((unsigned long long)x);
}
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
static inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) {
  return a < b ? a : b;
}
static inline unsigned long long max(unsigned long long a, unsigned long long b) {
  return a > b ? a : b;
}
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }

/* ---- the recorded source follows ---- */
