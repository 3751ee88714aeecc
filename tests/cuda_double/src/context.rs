//! The driver state behind one process-wide lock, and contexts.
//!
//! Invariants:
//! - one lock ([`with`]) guards everything, the executor included: queued work runs on
//!   whichever thread forces it, while that thread holds the lock;
//! - handles (contexts, streams, events, modules, functions, pools) are unique numbers from
//!   one counter, never reused, so a stale handle is always recognised;
//! - each device has at most one live primary context; retain/release count references, and
//!   a context released to zero stays known (dead) so its handle is `INVALID_CONTEXT`;
//! - the current context is per thread: a stack in thread-local storage, as the driver keeps
//!   it (`cuCtxSetCurrent` replaces the top, push/pop).

use crate::config::Config;
use crate::error::*;
use crate::memory::Memory;
use crate::report::refuse;
use crate::stream::{Event, Op, Stream};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

#[derive(Debug)]
pub struct Ctx {
    pub device: usize,
    pub refcount: u32,
    pub alive: bool,
    /// The sticky error (a failed kernel): every later call on the context returns it.
    pub sticky: Option<CuResult>,
    pub legacy: u64,
    /// Contexts whose memory this one may access (`cuCtxEnablePeerAccess`).
    pub peers: HashSet<u64>,
}

#[derive(Debug)]
pub struct ModuleRec {
    pub ctx: u64,
    pub module: crate::kernels::Module,
}

#[derive(Debug)]
pub struct FuncRec {
    pub module: u64,
    pub ctx: u64,
    pub func: Arc<crate::kernels::Function>,
}

#[derive(Debug)]
pub struct State {
    pub config: Config,
    pub ctxs: HashMap<u64, Ctx>,
    /// The live primary context of each device.
    pub primary: Vec<Option<u64>>,
    pub mem: Memory,
    pub streams: HashMap<u64, Stream>,
    /// The per-thread default stream (`CU_STREAM_PER_THREAD`) of (thread, context).
    pub per_thread: HashMap<(std::thread::ThreadId, u64), u64>,
    pub events: HashMap<u64, Event>,
    pub modules: HashMap<u64, ModuleRec>,
    pub functions: HashMap<u64, FuncRec>,
    /// Queued work not yet run, by sequence number (a dependency is always an earlier one).
    pub ops: BTreeMap<u64, Op>,
    pub next_seq: u64,
    next_handle: u64,
    /// Pool attributes set per device (attribute -> value).
    pub pool_attrs: Vec<HashMap<u32, u64>>,
    /// IPC openings: (owner pid, owner fd, serial) -> mapped base.
    pub ipc_open: HashMap<(u32, i32, u64), u64>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// Handles start here: far from small integers (the special stream handles 0, 1, 2) and
/// from anything a C caller could mistake for a pointer it owns.
const HANDLE_BASE: u64 = 0x7e57_0000_0000;

/// A device's memory pool handle (one default pool per device, fixed).
pub fn pool_handle(device: usize) -> u64 {
    0x7e56_0000_0000 + device as u64 * 16
}

impl State {
    pub fn new(config: Config) -> Result<State, Refusal> {
        let n = config.devices.len();
        Ok(State {
            mem: Memory::new(n)?,
            primary: vec![None; n],
            pool_attrs: vec![HashMap::new(); n],
            config,
            ctxs: HashMap::new(),
            streams: HashMap::new(),
            per_thread: HashMap::new(),
            events: HashMap::new(),
            modules: HashMap::new(),
            functions: HashMap::new(),
            ops: BTreeMap::new(),
            next_seq: 1,
            next_handle: HANDLE_BASE,
            ipc_open: HashMap::new(),
        })
    }

    pub fn handle(&mut self) -> u64 {
        self.next_handle += 16;
        self.next_handle
    }

    pub fn device(&self, ordinal: i32) -> Result<usize, Refusal> {
        if ordinal < 0 || ordinal as usize >= self.config.devices.len() {
            return refuse(
                CUDA_ERROR_INVALID_DEVICE,
                format!(
                    "device {ordinal} does not exist ({} configured)",
                    self.config.devices.len()
                ),
            );
        }
        Ok(ordinal as usize)
    }

    /// A context handle usable now: known, alive, no sticky error.
    pub fn live_ctx(&self, h: u64) -> Result<&Ctx, Refusal> {
        match self.ctxs.get(&h) {
            None => refuse(
                CUDA_ERROR_INVALID_CONTEXT,
                format!("{h:#x} is not a context"),
            ),
            Some(c) if !c.alive => refuse(
                CUDA_ERROR_INVALID_CONTEXT,
                format!("context {h:#x} was released (its primary context's count reached 0)"),
            ),
            Some(c) => match c.sticky {
                Some(code) => refuse(
                    code,
                    format!("context {h:#x} has a sticky error from an earlier failed kernel"),
                ),
                None => Ok(c),
            },
        }
    }

    /// The calling thread's current context, which the call needs.
    pub fn current(&self) -> Result<u64, Refusal> {
        let Some(h) = current_handle() else {
            return refuse(
                CUDA_ERROR_INVALID_CONTEXT,
                "no context is current on this thread (retain a primary context and cuCtxSetCurrent it first; current contexts are per thread)",
            );
        };
        self.live_ctx(h)?;
        Ok(h)
    }

    /// Retains device `dev`'s primary context, creating a fresh one when none is live.
    pub fn retain(&mut self, dev: usize) -> u64 {
        if let Some(h) = self.primary[dev] {
            if let Some(c) = self.ctxs.get_mut(&h) {
                c.refcount += 1;
                return h;
            }
        }
        let h = self.handle();
        let legacy = self.handle();
        self.streams.insert(legacy, Stream::new(h, false, true));
        self.ctxs.insert(
            h,
            Ctx {
                device: dev,
                refcount: 1,
                alive: true,
                sticky: None,
                legacy,
                peers: HashSet::new(),
            },
        );
        self.primary[dev] = Some(h);
        h
    }

    /// Releases one reference; at zero the context's work runs and everything it owns goes.
    pub fn release(&mut self, dev: usize) -> Result<(), Refusal> {
        let Some(h) = self.primary[dev] else {
            return refuse(
                CUDA_ERROR_INVALID_CONTEXT,
                format!("device {dev}'s primary context is not retained: release without a matching retain"),
            );
        };
        let c = self.ctxs.get_mut(&h).expect("primary is known");
        c.refcount -= 1;
        if c.refcount > 0 {
            return Ok(());
        }
        self.flush_ctx(h);
        let c = self.ctxs.get_mut(&h).expect("primary is known");
        c.alive = false;
        self.primary[dev] = None;
        let owned: Vec<u64> = self
            .mem
            .live
            .values()
            .filter(|a| a.ctx == h)
            .map(|a| a.base)
            .collect();
        for b in owned {
            self.mem.release(b);
        }
        self.ipc_open.retain(|_, b| self.mem.live.contains_key(b));
        self.functions.retain(|_, f| f.ctx != h);
        self.modules.retain(|_, m| m.ctx != h);
        for s in self.streams.values_mut().filter(|s| s.ctx == h) {
            s.destroyed = true;
        }
        for e in self.events.values_mut().filter(|e| e.ctx == h) {
            e.destroyed = true;
        }
        Ok(())
    }
}

/// Runs `f` on the state; `CUDA_ERROR_NOT_INITIALIZED` before a successful `cuInit`.
pub fn with<R>(f: impl FnOnce(&mut State) -> Result<R, Refusal>) -> Result<R, Refusal> {
    let mut g = STATE.lock().unwrap_or_else(|p| p.into_inner());
    match g.as_mut() {
        Some(s) => f(s),
        None => refuse(
            CUDA_ERROR_NOT_INITIALIZED,
            "called before cuInit(0) succeeded",
        ),
    }
}

/// Initialises the state once; later calls succeed without reading the configuration again.
pub fn init() -> Result<(), Refusal> {
    let mut g = STATE.lock().unwrap_or_else(|p| p.into_inner());
    if g.is_some() {
        return Ok(());
    }
    let config =
        crate::config::from_env().map_err(|e| Refusal::new(CUDA_ERROR_INVALID_VALUE, e))?;
    crate::report::open_log_fd();
    // Every allocation keeps a memfd open (IPC needs it): lift the soft descriptor limit.
    // SAFETY: get/setrlimit on plain structs.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
    *g = Some(State::new(config)?);
    crate::memory::install_fault_handler();
    Ok(())
}

thread_local! {
    static STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// The top of this thread's context stack.
pub fn current_handle() -> Option<u64> {
    STACK.with(|s| s.borrow().last().copied())
}

/// `cuCtxSetCurrent`: replaces the top (0 pops it, as the driver does with NULL).
pub fn set_current(h: u64) {
    STACK.with(|s| {
        let mut s = s.borrow_mut();
        s.pop();
        if h != 0 {
            s.push(h);
        }
    });
}

pub fn push_current(h: u64) {
    STACK.with(|s| s.borrow_mut().push(h));
}

pub fn pop_current() -> Option<u64> {
    STACK.with(|s| s.borrow_mut().pop())
}
