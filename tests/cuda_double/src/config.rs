//! The devices the double pretends to have, from `RIVET_CUDA_DOUBLE`, read once at `cuInit`.
//!
//! Format: `key=value` pairs separated by `;`, e.g. `devices=sm_90,sm_80;memory=1073741824;
//! pools=1;peer=1`. Keys: `devices` (a comma list of `sm_<major><minor>`), `memory` (bytes
//! per device), `pools` (0/1: `CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`), `peer` (0/1:
//! whether devices can access each other). Unset keys take the defaults: one sm_90 device,
//! 1 GiB, pools=1, peer=1. Anything else (an unknown key, a bad number) is an error, so a
//! typo in a test's configuration fails loudly instead of testing the defaults.

/// One pretend device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSpec {
    pub major: u32,
    pub minor: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub devices: Vec<DeviceSpec>,
    /// Bytes of memory per device.
    pub memory: usize,
    pub pools: bool,
    pub peer: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            devices: vec![DeviceSpec { major: 9, minor: 0 }],
            memory: 1 << 30,
            pools: true,
            peer: true,
        }
    }
}

fn arch(s: &str) -> Result<DeviceSpec, String> {
    let digits = s
        .strip_prefix("sm_")
        .filter(|d| d.len() >= 2 && d.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| format!("device '{s}' is not of the form sm_<major><minor> (e.g. sm_90)"))?;
    let (maj, min) = digits.split_at(digits.len() - 1);
    Ok(DeviceSpec {
        major: maj
            .parse()
            .map_err(|_| format!("device '{s}': bad major"))?,
        minor: min
            .parse()
            .map_err(|_| format!("device '{s}': bad minor"))?,
    })
}

fn flag(key: &str, v: &str) -> Result<bool, String> {
    match v {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(format!("'{key}' must be 0 or 1, got '{v}'")),
    }
}

/// Parses a `RIVET_CUDA_DOUBLE` value (the empty string is the defaults).
pub fn parse(text: &str) -> Result<Config, String> {
    let mut c = Config::default();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("'{part}' is not key=value"))?;
        match k.trim() {
            "devices" => {
                c.devices = v
                    .split(',')
                    .map(|d| arch(d.trim()))
                    .collect::<Result<_, _>>()?;
                if c.devices.is_empty() {
                    return Err("'devices' is empty".into());
                }
            }
            "memory" => {
                c.memory = v
                    .trim()
                    .parse()
                    .ok()
                    .filter(|&m: &usize| m > 0)
                    .ok_or_else(|| format!("'memory' must be a positive byte count, got '{v}'"))?;
            }
            "pools" => c.pools = flag("pools", v.trim())?,
            "peer" => c.peer = flag("peer", v.trim())?,
            other => {
                return Err(format!(
                    "unknown key '{other}' (known: devices, memory, pools, peer)"
                ))
            }
        }
    }
    Ok(c)
}

/// The configuration of this process (`RIVET_CUDA_DOUBLE`, unset: the defaults).
pub fn from_env() -> Result<Config, String> {
    match std::env::var("RIVET_CUDA_DOUBLE") {
        Ok(s) => parse(&s).map_err(|e| format!("RIVET_CUDA_DOUBLE='{s}': {e}")),
        Err(std::env::VarError::NotPresent) => Ok(Config::default()),
        Err(e) => Err(format!("RIVET_CUDA_DOUBLE: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses() {
        let c = parse("devices=sm_90,sm_86;memory=4096;pools=0;peer=0").unwrap();
        assert_eq!(c.devices[1], DeviceSpec { major: 8, minor: 6 });
        assert_eq!((c.memory, c.pools, c.peer), (4096, false, false));
        assert_eq!(parse("").unwrap(), Config::default());
        assert_eq!(parse("devices=sm_120").unwrap().devices[0].major, 12);
        for bad in [
            "devices=90",
            "memory=-1",
            "memory=0",
            "pools=2",
            "color=red",
            "peer",
        ] {
            assert!(parse(bad).is_err(), "{bad} parsed");
        }
    }
}
