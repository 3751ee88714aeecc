//! The 64-byte IPC handles the double hands out, and their validation.
//!
//! A memory handle names the owner's memfd (`/proc/<pid>/fd/<fd>`) plus what the opener
//! checks against the memfd's header page: the allocation serial, size and device, so a
//! handle whose fd number was reused for another allocation is refused, never mapped.
//! An event handle names the owner process and its event; the owner runs an interprocess
//! event's record at once (see `api::queue::cuEventRecord`), so an opened event is always
//! complete for the receiver.

pub const MEM_MAGIC: &[u8; 8] = b"RVCDIPCM";
pub const EVENT_MAGIC: &[u8; 8] = b"RVCDIPCE";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemHandle {
    pub pid: u32,
    pub fd: i32,
    pub size: u64,
    pub device: u32,
    pub serial: u64,
}

fn field<const N: usize>(b: &[u8; 64], at: usize) -> [u8; N] {
    b[at..at + N].try_into().expect("in range")
}

impl MemHandle {
    pub fn encode(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[..8].copy_from_slice(MEM_MAGIC);
        b[8..12].copy_from_slice(&self.pid.to_le_bytes());
        b[12..16].copy_from_slice(&self.fd.to_le_bytes());
        b[16..24].copy_from_slice(&self.size.to_le_bytes());
        b[24..28].copy_from_slice(&self.device.to_le_bytes());
        b[28..36].copy_from_slice(&self.serial.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; 64]) -> Result<MemHandle, String> {
        if &b[..8] != MEM_MAGIC || b[36..].iter().any(|&x| x != 0) {
            return Err("not a memory handle made by cuIpcGetMemHandle of the double (bad magic or padding)".into());
        }
        Ok(MemHandle {
            pid: u32::from_le_bytes(field(b, 8)),
            fd: i32::from_le_bytes(field(b, 12)),
            size: u64::from_le_bytes(field(b, 16)),
            device: u32::from_le_bytes(field(b, 24)),
            serial: u64::from_le_bytes(field(b, 28)),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventHandle {
    pub pid: u32,
    pub event: u64,
}

impl EventHandle {
    pub fn encode(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[..8].copy_from_slice(EVENT_MAGIC);
        b[8..12].copy_from_slice(&self.pid.to_le_bytes());
        b[12..20].copy_from_slice(&self.event.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; 64]) -> Result<EventHandle, String> {
        if &b[..8] != EVENT_MAGIC || b[20..].iter().any(|&x| x != 0) {
            return Err("not an event handle made by cuIpcGetEventHandle of the double (bad magic or padding)".into());
        }
        Ok(EventHandle {
            pid: u32::from_le_bytes(field(b, 8)),
            event: u64::from_le_bytes(field(b, 12)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_garbage() {
        let m = MemHandle {
            pid: 7,
            fd: 9,
            size: 100,
            device: 1,
            serial: 3,
        };
        assert_eq!(MemHandle::decode(&m.encode()).unwrap(), m);
        let e = EventHandle {
            pid: 7,
            event: 0x7e57_0000_0010,
        };
        assert_eq!(EventHandle::decode(&e.encode()).unwrap(), e);
        assert!(MemHandle::decode(&e.encode()).is_err());
        assert!(EventHandle::decode(&[0; 64]).is_err());
        let mut bad = m.encode();
        bad[63] = 1;
        assert!(MemHandle::decode(&bad).is_err());
    }
}
