//! `fuzz`: rivet's stable-Rust fuzzer (docs/testing.md, "Fuzzing").
//!
//! ```text
//! cargo run --release -p rivet-tests --bin fuzz -- --seconds 60 [--seed S] [--generator te,module,dlpack,capi,xla]
//! cargo run --release -p rivet-tests --bin fuzz -- --generator te --replay 0x1234   # one case, described
//! ```
//!
//! The process you start is a supervisor: it runs the cases in a worker child (this same
//! binary with `--worker`), round-robin over the generators, and reads one line per case
//! start and end. A worker that dies in a case (a signal, an abort) is a crash; one that goes
//! `--hang-seconds` without finishing a case is killed and the case is a hang; either way the
//! case is reported with its generator and seed, and a fresh worker goes on with the next
//! case. The worker runs under a virtual-memory limit, so a huge allocation fails (and must
//! be a typed error) instead of swapping the machine. Checked mode (`RIVET_CHECKED=1`) is on
//! unless `--unchecked`.
//!
//! Output: one summary line per generator, then `N passed, M failed` (what CI greps); the
//! exit status is non-zero when anything failed, crashed or hung.

#[path = "../fuzz/mod.rs"]
mod fuzz;

use fuzz::rng::case_seed;
use fuzz::{generators, Generator, Outcome, Tally};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

struct Opts {
    seconds: f64,
    seed: u64,
    gens: Vec<String>,
    replay: Option<u64>,
    hang_seconds: u64,
    checked: bool,
    mem_mib: u64,
    current_file: String,
    verbose: bool,
    /// Run only this generator's cases of the mixed sequence (case numbers and seeds stay
    /// those of the full run), to re-check one generator's share of a long soak.
    only: Option<String>,
    // worker only (`--start` also sets the supervisor's first case)
    worker: bool,
    start: u64,
    deadline_ms: u128,
}

fn parse_u64(s: &str) -> u64 {
    let s = s.trim();
    let r = if let Some(h) = s.strip_prefix("0x") {
        u64::from_str_radix(h, 16)
    } else {
        s.parse()
    };
    r.unwrap_or_else(|_| usage(&format!("not a number: {s}")))
}

fn usage(msg: &str) -> ! {
    eprintln!("fuzz: {msg}\nusage: fuzz [--seconds N] [--seed S] [--generator te,module,dlpack,capi,xla] [--replay SEED] [--hang-seconds N] [--mem-mib N] [--unchecked] [--verbose] [--start CASE] [--only GENERATOR]");
    std::process::exit(2)
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

fn parse() -> Opts {
    let mut o = Opts {
        seconds: 60.0,
        seed: (now_ms() as u64) ^ 0x5151_7a7a,
        gens: generators().iter().map(|g| g.name.to_string()).collect(),
        replay: None,
        hang_seconds: 20,
        checked: true,
        mem_mib: 8192,
        current_file: std::env::temp_dir()
            .join("rivet-fuzz-current.txt")
            .display()
            .to_string(),
        verbose: false,
        only: None,
        worker: false,
        start: 0,
        deadline_ms: 0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--seconds" => o.seconds = val().parse().unwrap_or_else(|_| usage("bad --seconds")),
            "--seed" => o.seed = parse_u64(&val()),
            "--generator" => o.gens = val().split(',').map(str::to_string).collect(),
            "--replay" => o.replay = Some(parse_u64(&val())),
            "--hang-seconds" => o.hang_seconds = parse_u64(&val()),
            "--mem-mib" => o.mem_mib = parse_u64(&val()),
            "--current-file" => o.current_file = val(),
            "--unchecked" => o.checked = false,
            "--verbose" | "-v" => o.verbose = true,
            "--only" => o.only = Some(val()),
            "--worker" => o.worker = true,
            "--start" => o.start = parse_u64(&val()),
            "--deadline-ms" => {
                o.deadline_ms = val().parse().unwrap_or_else(|_| usage("bad --deadline-ms"))
            }
            other => usage(&format!("unknown argument {other}")),
        }
    }
    let known: Vec<&str> = generators().iter().map(|g| g.name).collect();
    if let Some(g) = o.gens.iter().find(|g| !known.contains(&g.as_str())) {
        usage(&format!(
            "unknown generator '{g}' (known: {})",
            known.join(", ")
        ));
    }
    o
}

fn selected(o: &Opts) -> Vec<Generator> {
    let all = generators();
    o.gens
        .iter()
        .map(|n| {
            let g = all.iter().find(|g| g.name == n).expect("validated");
            Generator {
                name: g.name,
                run: g.run,
            }
        })
        .collect()
}

/// Runs one case, a panic being a failure.
fn run_one(g: &Generator, seed: u64, verbose: bool) -> Outcome {
    match catch_unwind(AssertUnwindSafe(|| (g.run)(seed, verbose))) {
        Ok(o) => o,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Outcome::Fail(format!("panic: {msg}"))
        }
    }
}

fn main() {
    let o = parse();
    if o.checked {
        // Before any thread exists (the worker inherits it too).
        std::env::set_var("RIVET_CHECKED", "1");
    }
    if let Some(seed) = o.replay {
        let gens = selected(&o);
        let g = &gens[0];
        let out = run_one(g, seed, true);
        println!("{} {seed:#x}: {out:?}", g.name);
        std::process::exit(i32::from(matches!(out, Outcome::Fail(_))));
    }
    if o.worker {
        worker(&o);
        return;
    }
    supervise(&o);
}

fn worker(o: &Opts) {
    // Panics are reported as failures by `run_one`; keep their default message short.
    let gens = selected(o);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut i = o.start;
    while now_ms() < o.deadline_ms {
        let g = &gens[(i % gens.len() as u64) as usize];
        let seed = case_seed(o.seed, i);
        if o.only.as_deref().is_some_and(|n| n != g.name) {
            i += 1;
            continue;
        }
        let _ = std::fs::write(&o.current_file, format!("{} {seed:#x} case {i}\n", g.name));
        if writeln!(out, "S {i} {} {seed:#x}", g.name)
            .and_then(|_| out.flush())
            .is_err()
        {
            return;
        }
        let res = run_one(g, seed, o.verbose);
        let line = match &res {
            Outcome::Pass => "P -".to_string(),
            Outcome::Typed(k) => format!("T {k}"),
            Outcome::Fail(m) => {
                eprintln!(
                    "\nFAIL {} seed {seed:#x} (case {i}): {m}\n  repro: cargo run --release -p rivet-tests --bin fuzz -- --generator {} --replay {seed:#x}\n",
                    g.name, g.name
                );
                "F -".to_string()
            }
        };
        if writeln!(out, "R {i} {line}")
            .and_then(|_| out.flush())
            .is_err()
        {
            return;
        }
        i += 1;
    }
    let _ = writeln!(out, "E {i}");
}

enum Msg {
    Line(String),
    Eof,
}

fn supervise(o: &Opts) {
    let start = Instant::now();
    let deadline = now_ms() + (o.seconds * 1000.0) as u128;
    let exe = std::env::current_exe().expect("the fuzz binary's path");
    let mut tallies: BTreeMap<String, Tally> = BTreeMap::new();
    let mut kinds: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for g in &o.gens {
        tallies.insert(g.clone(), Tally::default());
    }
    let mut problems: Vec<String> = Vec::new();
    let mut next = o.start;
    eprintln!(
        "fuzz: seed {:#x}, {} s, generators {}, checked mode {}, workers limited to {} MiB",
        o.seed,
        o.seconds,
        o.gens.join(","),
        if o.checked { "on" } else { "off" },
        o.mem_mib
    );
    while now_ms() < deadline {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(format!(
                "ulimit -v {} 2>/dev/null; exec \"$0\" \"$@\"",
                o.mem_mib * 1024
            ))
            .arg(&exe)
            .args([
                "--worker",
                "--seed",
                &o.seed.to_string(),
                "--start",
                &next.to_string(),
            ])
            .args([
                "--deadline-ms",
                &deadline.to_string(),
                "--generator",
                &o.gens.join(","),
            ])
            .args(["--current-file", &o.current_file])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if o.verbose {
            cmd.arg("--verbose");
        }
        if let Some(n) = &o.only {
            cmd.args(["--only", n]);
        }
        if !o.checked {
            cmd.arg("--unchecked");
        }
        let mut child = cmd.spawn().expect("spawning a fuzz worker");
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                match line {
                    Ok(l) => {
                        if tx.send(Msg::Line(l)).is_err() {
                            return;
                        }
                    }
                    Err(_) => break,
                }
            }
            let _ = tx.send(Msg::Eof);
        });
        let mut pending: Option<(u64, String, String)> = None;
        let mut finished = false;
        loop {
            match rx.recv_timeout(Duration::from_secs(o.hang_seconds)) {
                Ok(Msg::Line(l)) => {
                    let f: Vec<&str> = l.splitn(4, ' ').collect();
                    match f.as_slice() {
                        ["S", i, g, s] => {
                            pending = Some((parse_u64(i), g.to_string(), s.to_string()))
                        }
                        ["R", _, res, k] => {
                            if let Some((i, g, _)) = pending.take() {
                                let t = tallies.entry(g.clone()).or_default();
                                t.cases += 1;
                                match *res {
                                    "P" => t.passed += 1,
                                    "T" => {
                                        t.typed += 1;
                                        *kinds
                                            .entry(g)
                                            .or_default()
                                            .entry(k.to_string())
                                            .or_default() += 1;
                                    }
                                    _ => {
                                        t.failed += 1;
                                        problems.push(
                                            format!(
                                                "wrong/internal: {g} seed {}",
                                                case_seed(o.seed, i)
                                            )
                                            .replace(
                                                &case_seed(o.seed, i).to_string(),
                                                &format!("{:#x}", case_seed(o.seed, i)),
                                            ),
                                        );
                                    }
                                }
                                next = i + 1;
                            }
                        }
                        ["E", ..] => finished = true,
                        _ => {}
                    }
                }
                Ok(Msg::Eof) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait().ok();
                    if let Some((i, g, s)) = pending.take() {
                        let t = tallies.entry(g.clone()).or_default();
                        t.cases += 1;
                        t.crashed += 1;
                        let what = format!("CRASH {g} seed {s} (case {i}): worker ended with {status:?}\n  repro: cargo run --release -p rivet-tests --bin fuzz -- --generator {g} --replay {s}");
                        eprintln!("\n{what}\n");
                        problems.push(what);
                        next = i + 1;
                    } else if !finished {
                        eprintln!("fuzz: worker exited early ({status:?}) between cases");
                    }
                    break;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some((i, g, s)) = pending.take() {
                        let _ = child.kill();
                        let _ = child.wait();
                        let t = tallies.entry(g.clone()).or_default();
                        t.cases += 1;
                        t.hung += 1;
                        let what = format!("HANG {g} seed {s} (case {i}): no result after {} s\n  repro: cargo run --release -p rivet-tests --bin fuzz -- --generator {g} --replay {s}", o.hang_seconds);
                        eprintln!("\n{what}\n");
                        problems.push(what);
                        next = i + 1;
                        break;
                    }
                    // Between cases (start-up): keep waiting.
                }
            }
        }
        if finished {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let mut total = Tally::default();
    for (g, t) in &tallies {
        let top: Vec<String> = kinds
            .get(g)
            .map(|k| {
                let mut v: Vec<(&String, &u64)> = k.iter().collect();
                v.sort_by(|a, b| b.1.cmp(a.1));
                v.iter().take(6).map(|(k, n)| format!("{k}={n}")).collect()
            })
            .unwrap_or_default();
        println!(
            "fuzz: {g}: {t}; typed errors by kind: {}",
            if top.is_empty() {
                "-".into()
            } else {
                top.join(" ")
            }
        );
        total.cases += t.cases;
        total.failed += t.failed;
        total.crashed += t.crashed;
        total.hung += t.hung;
    }
    let bad = total.failed + total.crashed + total.hung;
    for p in &problems {
        eprintln!("fuzz: {p}");
    }
    println!(
        "fuzz: {} passed, {} failed ({} wrong/internal, {} crashes, {} hangs) in {:.0} s, seed {:#x}",
        total.cases - bad,
        bad,
        total.failed,
        total.crashed,
        total.hung,
        secs,
        o.seed
    );
    std::process::exit(i32::from(bad > 0));
}
