//! Streams and events as lazy queues, and the executor that runs them.
//!
//! Nothing queued runs when it is queued. An operation runs only when the real driver would
//! guarantee it finished (a synchronize, a synchronous copy, a query seen twice, ...), and
//! running it first runs what it depends on. So a consumer whose wait on its producer is
//! missing runs before the producer and reads the 0xFF poison: a detectably wrong result.
//!
//! Invariants:
//! - `State::ops` holds the pending operations by sequence number; an operation's `deps` are
//!   earlier sequence numbers (the previous operation of its stream, the record an event
//!   wait captured, the legacy-stream rules), so running the dependency closure in ascending
//!   order respects every dependency;
//! - legacy default stream semantics: an operation on the legacy stream depends on the last
//!   queued operation of every blocking stream of its context, and an operation on a
//!   blocking stream on the last legacy one; non-blocking streams take part in neither;
//! - device memory is accessible only while [`State::run`] executes (`Memory::open`);
//! - a context with a sticky error runs nothing more: its queued work is dropped.

use crate::context::State;
use crate::error::*;
use crate::report::report;
use std::sync::Arc;

#[derive(Debug)]
pub struct Stream {
    pub ctx: u64,
    pub nonblocking: bool,
    pub legacy: bool,
    pub destroyed: bool,
    /// The last operation queued on it (it may have run since).
    pub tail: Option<u64>,
}

impl Stream {
    pub fn new(ctx: u64, nonblocking: bool, legacy: bool) -> Stream {
        Stream {
            ctx,
            nonblocking,
            legacy,
            destroyed: false,
            tail: None,
        }
    }
}

pub const CU_EVENT_BLOCKING_SYNC: u32 = 1;
pub const CU_EVENT_DISABLE_TIMING: u32 = 2;
pub const CU_EVENT_INTERPROCESS: u32 = 4;

#[derive(Debug)]
pub struct Event {
    pub ctx: u64,
    pub flags: u32,
    pub destroyed: bool,
    /// The operation its last `cuEventRecord` queued (complete once that has run).
    pub last_record: Option<u64>,
    /// Opened from another process's handle: the sender ran its record already.
    pub ipc_opened: bool,
}

/// What an operation does when it runs.
#[derive(Debug)]
pub enum Work {
    Launch {
        func: Arc<crate::kernels::Function>,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        params: Vec<Vec<u8>>,
    },
    Memset {
        dst: u64,
        value: u8,
        n: usize,
    },
    /// Host bytes copied at enqueue time (pageable memory: the caller may reuse its buffer).
    HtoD {
        dst: u64,
        data: Vec<u8>,
    },
    /// Into host memory the caller keeps alive until it synchronizes.
    DtoH {
        dst: usize,
        src: u64,
        n: usize,
    },
    DtoD {
        dst: u64,
        src: u64,
        n: usize,
    },
    /// `cuMemFreeAsync`: the memory goes when this runs.
    Free {
        base: u64,
    },
    /// An event record, a wait, an async allocation: ordering only.
    Marker,
}

#[derive(Debug)]
pub struct Op {
    pub ctx: u64,
    pub stream: u64,
    pub deps: Vec<u64>,
    pub work: Work,
    /// A query saw it pending once (the next query runs it).
    pub queried: bool,
}

/// The special stream handles of `cuda.h`.
pub const CU_STREAM_LEGACY: u64 = 0x1;
pub const CU_STREAM_PER_THREAD: u64 = 0x2;

impl State {
    /// The stream a handle names for context `ctx`: 0 and `CU_STREAM_LEGACY` the legacy
    /// stream, `CU_STREAM_PER_THREAD` this thread's blocking stream, else a created one of
    /// this context.
    pub fn stream(&mut self, ctx: u64, h: u64) -> Result<u64, Refusal> {
        if h == 0 || h == CU_STREAM_LEGACY {
            return Ok(self.ctxs[&ctx].legacy);
        }
        if h == CU_STREAM_PER_THREAD {
            let key = (std::thread::current().id(), ctx);
            if let Some(&s) = self.per_thread.get(&key) {
                return Ok(s);
            }
            let s = self.handle();
            self.streams.insert(s, Stream::new(ctx, false, false));
            self.per_thread.insert(key, s);
            return Ok(s);
        }
        match self.streams.get(&h) {
            None => Err(Refusal::new(
                CUDA_ERROR_INVALID_HANDLE,
                format!("{h:#x} is not a stream"),
            )),
            Some(s) if s.destroyed => Err(Refusal::new(
                CUDA_ERROR_INVALID_HANDLE,
                format!("stream {h:#x} was destroyed"),
            )),
            Some(s) if s.ctx != ctx => Err(Refusal::new(
                CUDA_ERROR_INVALID_HANDLE,
                format!(
                    "stream {h:#x} belongs to context {:#x}, not the current context {ctx:#x}",
                    s.ctx
                ),
            )),
            Some(_) => Ok(h),
        }
    }

    fn pending(&self, seq: Option<u64>) -> Option<u64> {
        seq.filter(|s| self.ops.contains_key(s))
    }

    /// Queues `work` on stream `s` (after `extra` too); returns its sequence number.
    pub fn enqueue(&mut self, s: u64, work: Work, extra: Option<u64>) -> u64 {
        let st = &self.streams[&s];
        let ctx = st.ctx;
        let mut deps: Vec<u64> = self.pending(st.tail).into_iter().collect();
        if st.legacy {
            for o in self.streams.values() {
                if o.ctx == ctx && !o.legacy && !o.nonblocking {
                    deps.extend(self.pending(o.tail));
                }
            }
        } else if !st.nonblocking {
            let legacy = self.ctxs[&ctx].legacy;
            deps.extend(self.pending(self.streams[&legacy].tail));
        }
        deps.extend(self.pending(extra));
        let seq = self.next_seq;
        self.next_seq += 1;
        self.ops.insert(
            seq,
            Op {
                ctx,
                stream: s,
                deps,
                work,
                queried: false,
            },
        );
        self.streams.get_mut(&s).expect("stream").tail = Some(seq);
        seq
    }

    /// A marker after all the work queued so far on every stream of context `ctx`
    /// (`cuCtxRecordEvent`); no stream's later work waits for it.
    pub fn enqueue_ctx_marker(&mut self, ctx: u64) -> u64 {
        let deps: Vec<u64> = self
            .streams
            .values()
            .filter(|o| o.ctx == ctx)
            .filter_map(|o| self.pending(o.tail))
            .collect();
        let legacy = self.ctxs[&ctx].legacy;
        let seq = self.next_seq;
        self.next_seq += 1;
        self.ops.insert(
            seq,
            Op {
                ctx,
                stream: legacy,
                deps,
                work: Work::Marker,
                queried: false,
            },
        );
        seq
    }

    /// Runs everything `targets` depend on, and them.
    pub fn run(&mut self, targets: &[u64]) {
        let mut todo: Vec<u64> = targets
            .iter()
            .copied()
            .filter(|t| self.ops.contains_key(t))
            .collect();
        let mut closure = std::collections::BTreeSet::new();
        while let Some(t) = todo.pop() {
            if closure.insert(t) {
                if let Some(op) = self.ops.get(&t) {
                    todo.extend(op.deps.iter().filter(|d| self.ops.contains_key(d)));
                }
            }
        }
        if closure.is_empty() {
            return;
        }
        self.mem.open(true);
        for seq in closure {
            let Some(op) = self.ops.remove(&seq) else {
                continue;
            };
            self.execute(op);
        }
        self.mem.open(false);
    }

    fn execute(&mut self, op: Op) {
        if self.ctxs.get(&op.ctx).is_some_and(|c| c.sticky.is_some()) {
            // A failed kernel left the context unusable: the real driver runs nothing more.
            if let Work::Free { base } = op.work {
                self.mem.release(base);
            }
            return;
        }
        match op.work {
            Work::Launch {
                func,
                grid,
                block,
                shared,
                params,
            } => {
                // SAFETY: every pointer parameter was checked against live memory reachable
                // from the context at enqueue time, and memory is open for the run.
                let r = unsafe { func.run(grid, block, shared, &params) };
                if let Err(why) = r {
                    report(
                        "cuLaunchKernel",
                        &format!(
                            "kernel '{}' failed when it ran: {why}; the context now holds the sticky error CUDA_ERROR_LAUNCH_FAILED",
                            func.name()
                        ),
                    );
                    if let Some(c) = self.ctxs.get_mut(&op.ctx) {
                        c.sticky = Some(CUDA_ERROR_LAUNCH_FAILED);
                    }
                }
            }
            // The four copies: device ranges were checked against live allocations at
            // enqueue time and memory is open; host pointers are the caller's contract.
            // SAFETY: as above.
            Work::Memset { dst, value, n } => unsafe {
                std::ptr::write_bytes(dst as *mut u8, value, n)
            },
            // SAFETY: as above.
            Work::HtoD { dst, data } => unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, data.len())
            },
            // SAFETY: as above.
            Work::DtoH { dst, src, n } => unsafe {
                std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n)
            },
            // SAFETY: as above.
            Work::DtoD { dst, src, n } => unsafe {
                std::ptr::copy(src as *const u8, dst as *mut u8, n)
            },
            Work::Free { base } => self.mem.release(base),
            Work::Marker => {}
        }
    }

    /// Runs all queued work of context `ctx` (`cuCtxSynchronize`).
    pub fn flush_ctx(&mut self, ctx: u64) {
        let mine: Vec<u64> = self
            .ops
            .iter()
            .filter(|(_, o)| o.ctx == ctx)
            .map(|(s, _)| *s)
            .collect();
        self.run(&mine);
    }

    /// Runs the work of stream `s` queued so far.
    pub fn flush_stream(&mut self, s: u64) {
        if let Some(t) = self.streams[&s].tail {
            self.run(&[t]);
        }
    }

    /// A query of `target`: `NOT_READY` the first time it is seen pending, run on the next.
    pub fn query(&mut self, target: Option<u64>) -> Result<(), Refusal> {
        let Some(t) = self.pending(target) else {
            return Ok(());
        };
        let op = self.ops.get_mut(&t).expect("pending");
        if !op.queried {
            op.queried = true;
            return Err(Refusal::new(CUDA_ERROR_NOT_READY, ""));
        }
        self.run(&[t]);
        Ok(())
    }

    /// The sticky error of `ctx`, as a refusal, after a synchronization.
    pub fn sticky(&self, ctx: u64) -> Result<(), Refusal> {
        match self.ctxs.get(&ctx).and_then(|c| c.sticky) {
            Some(code) => Err(Refusal::new(
                code,
                format!("context {ctx:#x}: a kernel failed earlier (sticky error)"),
            )),
            None => Ok(()),
        }
    }

    /// A live event handle.
    pub fn event(&self, h: u64) -> Result<&Event, Refusal> {
        match self.events.get(&h) {
            None => Err(Refusal::new(
                CUDA_ERROR_INVALID_HANDLE,
                format!("{h:#x} is not an event"),
            )),
            Some(e) if e.destroyed => Err(Refusal::new(
                CUDA_ERROR_INVALID_HANDLE,
                format!("event {h:#x} was destroyed"),
            )),
            Some(e) => Ok(e),
        }
    }
}
