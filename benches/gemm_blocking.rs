//! The packed GEMM's micro-kernel calls in three loop orders, one thread, float32 and float64:
//! what blocking the default schedule's GEMM over M and K (Goto's order) would gain before
//! anyone builds it into the schedule.
//!
//! The default CPU schedule calls the micro-kernel driver (`gemm_update`) once per 12 x 32
//! tile over all of K, column panels outside, row panels inside: every column panel re-reads
//! all of packed A (4 MiB at n = 1024 f32) from L3. This binary makes the same calls on the
//! same packed layouts (A `[mo][K][12]`, B `[no][K][32]`, C padded row-major) through the
//! real entry the JIT binds (`Variant::entry_f32` / `entry_f64`, its K slices included), in:
//!
//! - `today`: `for jo { for io { tile(all K) } }` (the schedule's order);
//! - `M blocks`: `for io-block of MB panels { for jo { for io in block { tile(all K) } } }`,
//!   so a block of A (MB x 12 rows) is reused from L2 across every column panel;
//! - `K+M blocks`: `for k-block of KC { for io-block { for jo { for io { tile(KC) } } } }`
//!   (Goto's order: A's block `MB*12 x KC` in L2, B's slice `KC x 32` in L1).
//!
//! Every order performs each element's multiply-adds in ascending p (K blocks store C and
//! load it back), so all orders give the same bits; the binary checks that. Timing is the
//! thread's CPU time (a loaded machine's waiting does not count), best of interleaved rounds,
//! next to the kernel's own ceiling (a tile whose panels stay in L1).
//!
//! With `--threads 2` the same orders run on two threads (wall clock, best of interleaved
//! rounds), each thread taking every other unit of the order's parallel loop: today's column
//! panels; `M blocks` parallel over the blocks of row panels (`par M`), or every block visited
//! by both threads, each on its half of the column panels (`split N`, no barrier: the threads
//! write disjoint columns). The one-thread time of today's order is printed beside them, so a
//! row's speed over it is the two-thread scaling.
//!
//! ```text
//! cargo run --release -p rivet-benches --bin gemm_blocking -- [--threads 2] [n ...]
//! ```

use rivet_compiler::codegen::cpu_lib::microkernel::{selected, Variant};

const MR: usize = 12;
const NR: usize = 32;

/// The calling thread's CPU time in seconds.
fn cpu_time() -> f64 {
    // SAFETY: `clock_gettime` writes the timespec it is given.
    unsafe {
        let mut ts = Timespec { sec: 0, nsec: 0 };
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts);
        ts.sec as f64 + ts.nsec as f64 * 1e-9
    }
}
#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}
const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// One element type: its name and the driver entry of the selected variant, as a closure over
/// `(mr, nr, k, c, c_rs, a, a_ks, b, b_ks)` with packed panels (unit stride along i and j).
trait Elem: Copy + Default + PartialEq + std::fmt::Debug {
    const NAME: &'static str;
    fn from_f64(v: f64) -> Self;
    /// # Safety
    /// The tile and the `k` rows of both panels are inside live allocations.
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile(
        v: Variant,
        k: usize,
        c: *mut Self,
        c_rs: usize,
        a: *const Self,
        a_ks: usize,
        b: *const Self,
        b_ks: usize,
    );
}

macro_rules! elem {
    ($t:ty, $name:expr, $entry:ident) => {
        impl Elem for $t {
            const NAME: &'static str = $name;
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            unsafe fn tile(
                v: Variant,
                k: usize,
                c: *mut Self,
                c_rs: usize,
                a: *const Self,
                a_ks: usize,
                b: *const Self,
                b_ks: usize,
            ) {
                let f = v.$entry();
                // SAFETY: forwarded (the caller vouches for the regions).
                unsafe {
                    f(
                        MR as i64,
                        NR as i64,
                        k as i64,
                        c,
                        c_rs as i64,
                        1,
                        a,
                        a_ks as i64,
                        1,
                        b,
                        b_ks as i64,
                        1,
                    )
                }
            }
        }
    };
}
elem!(f32, "float32", entry_f32);
elem!(f64, "float64", entry_f64);

#[derive(Clone, Copy)]
enum Order {
    Today,
    MBlocks(usize),
    KmBlocks(usize, usize),
    /// Two threads: M blocks of `mb` panels, the blocks dealt to the threads in turn.
    ParM(usize),
    /// Two threads: M blocks of `mb` panels (K blocks of `kc` when given), both threads on
    /// every block, each on its own half of the column panels.
    SplitN(usize, Option<usize>),
}

impl Order {
    fn name(self) -> String {
        match self {
            Order::Today => "today (jo, io, all K)".into(),
            Order::MBlocks(mb) => format!("M blocks of {mb} panels"),
            Order::KmBlocks(kc, mb) => format!("K {kc} + M blocks of {mb}"),
            Order::ParM(mb) => format!("2T par M blocks of {mb}"),
            Order::SplitN(mb, None) => format!("2T M {mb}, split N"),
            Order::SplitN(mb, Some(kc)) => format!("2T K {kc} + M {mb}, split N"),
        }
    }
}

/// The tile `(io, jo)` of an n x n GEMM on the packed layouts below, over products
/// `k0..k0 + kn`.
///
/// # Safety
/// `io < mo`, `jo < no`, `k0 + kn <= n` for the `Problem` whose buffers `a`, `b`, `c` are.
unsafe fn tile_at<T: Elem>(
    v: Variant,
    n: usize,
    (a, b, c): (*const T, *const T, *mut T),
    (io, jo): (usize, usize),
    (k0, kn): (usize, usize),
) {
    // SAFETY: forwarded (the caller vouches for the indices).
    unsafe {
        T::tile(
            v,
            kn,
            c.add(io * MR * n + jo * NR),
            n,
            a.add(io * n * MR + k0 * MR),
            MR,
            b.add(jo * n * NR + k0 * NR),
            NR,
        )
    }
}

/// Packed operands of an n x n GEMM: A `[mo][n][MR]`, B `[no][n][NR]`, C `(mo*MR) x n`.
struct Problem<T> {
    n: usize,
    mo: usize,
    no: usize,
    a: Vec<T>,
    b: Vec<T>,
    c: Vec<T>,
}

impl<T: Elem> Problem<T> {
    fn new(n: usize) -> Self {
        let (mo, no) = (n.div_ceil(MR), n / NR);
        // Small exact values (multiples of 1/64 in [-1, 1)): sums of products stay exact in
        // float32 at these sizes, so any order would agree; the bit check below still compares.
        let val = |i: usize| T::from_f64(((i * 2_654_435_761 % 128) as f64 - 64.0) / 64.0);
        Problem {
            n,
            mo,
            no,
            a: (0..mo * n * MR).map(val).collect(),
            b: (0..no * n * NR).map(|i| val(i + 7)).collect(),
            c: vec![T::default(); mo * MR * n],
        }
    }

    /// One GEMM in `order`; returns the thread's CPU seconds.
    fn run(&mut self, v: Variant, order: Order) -> f64 {
        self.c.iter_mut().for_each(|x| *x = T::default());
        let (n, mo, no) = (self.n, self.mo, self.no);
        let (a, b, c) = (self.a.as_ptr(), self.b.as_ptr(), self.c.as_mut_ptr());
        // SAFETY: every tile below is inside C, every panel slice inside A or B (io < mo,
        // jo < no, k0 + kn <= n).
        let call = |io, jo, k0, kn| unsafe { tile_at(v, n, (a, b, c), (io, jo), (k0, kn)) };
        let t0 = cpu_time();
        match order {
            Order::Today => {
                for jo in 0..no {
                    for io in 0..mo {
                        call(io, jo, 0, n);
                    }
                }
            }
            Order::MBlocks(mb) => {
                for i0 in (0..mo).step_by(mb) {
                    for jo in 0..no {
                        for io in i0..(i0 + mb).min(mo) {
                            call(io, jo, 0, n);
                        }
                    }
                }
            }
            Order::KmBlocks(kc, mb) => {
                for k0 in (0..n).step_by(kc) {
                    let kn = kc.min(n - k0);
                    for i0 in (0..mo).step_by(mb) {
                        for jo in 0..no {
                            for io in i0..(i0 + mb).min(mo) {
                                call(io, jo, k0, kn);
                            }
                        }
                    }
                }
            }
            Order::ParM(_) | Order::SplitN(..) => unreachable!("two-thread orders"),
        }
        cpu_time() - t0
    }

    /// One GEMM in `order` on `threads` threads; returns wall-clock seconds. Thread `t` takes
    /// units `t, t + threads, ..` of the order's parallel loop; every unit writes its own
    /// tiles of C, so the threads never write the same element.
    fn run_threads(&mut self, v: Variant, order: Order, threads: usize) -> f64 {
        self.c.iter_mut().for_each(|x| *x = T::default());
        let (n, mo, no) = (self.n, self.mo, self.no);
        let (a, b, c) = (
            self.a.as_ptr() as usize,
            self.b.as_ptr() as usize,
            self.c.as_mut_ptr() as usize,
        );
        let work = move |t: usize| {
            let (a, b, c) = (a as *const T, b as *const T, c as *mut T);
            // SAFETY: as in `run`; the threads' tiles are disjoint (module header).
            let call = |io, jo, k0, kn| unsafe { tile_at(v, n, (a, b, c), (io, jo), (k0, kn)) };
            let mine = move |x: usize| x % threads == t;
            match order {
                Order::Today => {
                    for jo in (0..no).filter(|&j| mine(j)) {
                        for io in 0..mo {
                            call(io, jo, 0, n);
                        }
                    }
                }
                Order::ParM(mb) => {
                    for (blk, i0) in (0..mo).step_by(mb).enumerate() {
                        if !mine(blk) {
                            continue;
                        }
                        for jo in 0..no {
                            for io in i0..(i0 + mb).min(mo) {
                                call(io, jo, 0, n);
                            }
                        }
                    }
                }
                Order::SplitN(mb, kc) => {
                    let kc = kc.unwrap_or(n);
                    let (j0, j1) = (no * t / threads, no * (t + 1) / threads);
                    for k0 in (0..n).step_by(kc) {
                        let kn = kc.min(n - k0);
                        for i0 in (0..mo).step_by(mb) {
                            for jo in j0..j1 {
                                for io in i0..(i0 + mb).min(mo) {
                                    call(io, jo, k0, kn);
                                }
                            }
                        }
                    }
                }
                Order::MBlocks(_) | Order::KmBlocks(..) => unreachable!("one-thread orders"),
            }
        };
        let t0 = std::time::Instant::now();
        std::thread::scope(|s| {
            for t in 1..threads {
                s.spawn(move || work(t));
            }
            work(0);
        });
        t0.elapsed().as_secs_f64()
    }
}

/// The kernel's ceiling: one tile over panels that stay in L1 (the same 64 rows of A and B
/// re-read), in GFLOP/s.
fn ceiling<T: Elem>(v: Variant) -> f64 {
    let rows = 64;
    let a = vec![T::from_f64(0.5); rows * MR];
    let b = vec![T::from_f64(0.25); rows * NR];
    let mut c = vec![T::default(); MR * NR];
    let reps = 20_000;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t0 = cpu_time();
        for _ in 0..reps {
            // SAFETY: a 12 x 32 tile in `c`, 64 rows of both panels.
            unsafe { T::tile(v, rows, c.as_mut_ptr(), NR, a.as_ptr(), MR, b.as_ptr(), NR) };
        }
        best = best.min(cpu_time() - t0);
        std::hint::black_box(&c);
    }
    2.0 * (MR * NR * rows * reps) as f64 / best * 1e-9
}

fn bench<T: Elem>(v: Variant, n: usize, threads: usize) {
    let mut p = Problem::<T>::new(n);
    let orders: Vec<(Order, usize)> = if threads > 1 {
        vec![
            (Order::Today, 1),
            (Order::Today, threads),
            (Order::ParM(4), threads),
            (Order::ParM(8), threads),
            (Order::SplitN(8, None), threads),
            (Order::SplitN(16, None), threads),
            (Order::SplitN(8, Some(256)), threads),
        ]
    } else {
        [
            Order::Today,
            Order::MBlocks(8),
            Order::KmBlocks(256, 8),
            Order::KmBlocks(512, 8),
            Order::KmBlocks(256, 16),
        ]
        .into_iter()
        .map(|o| (o, 1))
        .collect()
    };
    let mut reference: Option<Vec<T>> = None;
    let mut best = vec![f64::MAX; orders.len()];
    let rounds = if n <= 1024 { 7 } else { 3 };
    for _ in 0..rounds {
        for (k, &(o, th)) in orders.iter().enumerate() {
            let t = if threads > 1 {
                p.run_threads(v, o, th)
            } else {
                p.run(v, o)
            };
            best[k] = best[k].min(t);
            match &reference {
                None => reference = Some(p.c.clone()),
                Some(r) => assert!(
                    r == &p.c,
                    "{} gave other bits than the first order",
                    o.name()
                ),
            }
        }
    }
    let flops = 2.0 * (p.mo * MR) as f64 * (p.no * NR) as f64 * n as f64;
    let roof = ceiling::<T>(v);
    if threads > 1 {
        // The same ceiling on every thread at once: what the cores give side by side (a
        // shared FMA unit or a lower all-core clock shows here, not in the orders).
        let each: Vec<f64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads).map(|_| s.spawn(|| ceiling::<T>(v))).collect();
            hs.into_iter()
                .map(|h| h.join().expect("ceiling thread"))
                .collect()
        });
        let all: f64 = each.iter().sum();
        println!(
            "{} kernel ceiling on {threads} threads at once: {all:.1} GFLOP/s ({:.2}x one)",
            T::NAME,
            all / roof
        );
    }
    println!("{} n={n}, kernel ceiling {roof:.1} GFLOP/s", T::NAME);
    for (k, (o, th)) in orders.iter().enumerate() {
        let g = flops / best[k] * 1e-9;
        let name = if *th == 1 && threads > 1 {
            format!("1T {}", o.name())
        } else if matches!(o, Order::Today) && *th > 1 {
            format!("{th}T {}", o.name())
        } else {
            o.name()
        };
        println!(
            "  {:28} {:9.2} ms  {:6.1} GFLOP/s  {:4.0}% of 1T ceiling  {:.2}x (1T) today",
            name,
            best[k] * 1e3,
            g,
            100.0 * g / roof,
            best[0] / best[k]
        );
    }
}

fn main() {
    let v = selected().unwrap_or_else(|e| panic!("micro-kernel selection: {e}"));
    let mut threads = 1;
    let mut sizes: Vec<usize> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--threads" {
            threads = args
                .next()
                .and_then(|t| t.parse().ok())
                .filter(|&t| t >= 1)
                .expect("--threads takes a positive count");
        } else {
            sizes.push(a.parse().expect("sizes are positive integers"));
        }
    }
    let sizes = if sizes.is_empty() {
        vec![1024, 2048]
    } else {
        sizes
    };
    println!("micro-kernel variant: {}", v.name());
    for &n in &sizes {
        assert!(
            n >= NR && n % NR == 0,
            "n must be a positive multiple of {NR}"
        );
        bench::<f32>(v, n, threads);
        bench::<f64>(v, n, threads);
    }
}
