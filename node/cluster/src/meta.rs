//! What a node tells the cluster about itself, spread by gossip with its membership state.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One GPU a member offers to jobs (see `gpus`, which discovers them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// Device index: the CUDA driver's ordinal on its host, as `--gpus` and a rank's
    /// `CUDA_VISIBLE_DEVICES` name it.
    #[serde(default)]
    pub index: u32,
    /// Model name as the driver gives it, e.g. `NVIDIA H100 80GB HBM3`.
    pub model: String,
    /// Device memory in MiB.
    pub memory_mb: u64,
    /// The device's UUID as nvidia-smi prints it, `GPU-` and 32 hex digits in 8-4-4-4-12
    /// groups (`GPU-test-<index>` for a test device).
    #[serde(default)]
    pub uuid: String,
}

/// Member metadata: versioned by the membership core, replaced whole on change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeMeta {
    /// Human name (`--name`), unique by convention, not enforced.
    pub name: String,
    /// libp2p addresses other members dial, as multiaddr strings.
    pub p2p_addrs: Vec<String>,
    /// HTTP API address, `host:port`.
    pub api_addr: String,
    /// Collective data-plane address, `host:port`.
    pub data_addr: String,
    /// Dataset transfer address, `host:port` (see `datasets::transport`).
    pub datasets_addr: String,
    /// The datasets this node holds, whole or in part (a fetch under way serves the chunks
    /// it has); at most [`HELD_DATASETS_MAX`], so metadata stays small.
    pub datasets: Vec<HeldDataset>,
    /// Logical CPUs.
    pub cpus: u32,
    /// Physical memory in MiB.
    pub memory_mb: u64,
    /// The GPUs this node offers to jobs, by ascending index (discovered at start, kept by
    /// `--gpus`).
    pub gpus: Vec<Gpu>,
    /// Free-form labels (`--label k=v`).
    pub labels: BTreeMap<String, String>,
    /// ringleader version.
    pub version: String,
}

/// Limits on what a member may advertise, so gossip frames stay small and a hostile member
/// cannot bloat every other member's view.
pub mod limits {
    /// Longest name, address, label key or value, model or version string, bytes.
    pub const TEXT_BYTES_MAX: usize = 256;
    /// Most labels.
    pub const LABELS_MAX: usize = 32;
    /// Most advertised libp2p addresses.
    pub const ADDRS_MAX: usize = 16;
    /// Most GPUs.
    pub const GPUS_MAX: usize = 64;
}

impl NodeMeta {
    /// Checks every field against [`limits`] (and [`HELD_DATASETS_MAX`]); the error names
    /// the field. A member whose metadata fails is not believed (its gossip is dropped).
    pub fn check(&self) -> Result<(), String> {
        use limits::*;
        let text = |what: &str, v: &str| {
            if v.len() > TEXT_BYTES_MAX {
                Err(format!(
                    "{what}: {} bytes, more than {TEXT_BYTES_MAX}",
                    v.len()
                ))
            } else {
                Ok(())
            }
        };
        text("name", &self.name)?;
        text("api_addr", &self.api_addr)?;
        text("data_addr", &self.data_addr)?;
        text("datasets_addr", &self.datasets_addr)?;
        text("version", &self.version)?;
        if self.p2p_addrs.len() > ADDRS_MAX {
            return Err(format!("p2p_addrs: more than {ADDRS_MAX}"));
        }
        for a in &self.p2p_addrs {
            text("p2p_addrs", a)?;
        }
        if self.labels.len() > LABELS_MAX {
            return Err(format!("labels: more than {LABELS_MAX}"));
        }
        for (k, v) in &self.labels {
            text("label key", k)?;
            text("label value", v)?;
        }
        if self.gpus.len() > GPUS_MAX {
            return Err(format!("gpus: more than {GPUS_MAX}"));
        }
        for g in &self.gpus {
            text("gpu model", &g.model)?;
            text("gpu uuid", &g.uuid)?;
        }
        if self.datasets.len() > HELD_DATASETS_MAX {
            return Err(format!("datasets: more than {HELD_DATASETS_MAX}"));
        }
        Ok(())
    }
}

/// Physical memory of this host in MiB (0 if unknown).
pub fn host_memory_mb() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb / 1024)
        .unwrap_or(0)
}

/// Logical CPUs available to this process.
pub fn host_cpus() -> u32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1)
}

/// Most datasets one member advertises in its metadata: a node holding more advertises the
/// whole copies first, then the newest fetches (the rest can still be fetched from it by
/// peers that learn of it later, but are not listed).
pub const HELD_DATASETS_MAX: usize = 32;

/// A dataset a member holds, by the first 8 bytes of its root: 9 bytes of gossip each. A
/// prefix collision is harmless: a fetcher checks what it gets against the full root.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HeldDataset {
    /// The first 8 bytes of the dataset's root, big-endian.
    pub root_prefix: u64,
    /// Whether the member holds every chunk (`false`: a fetch under way).
    pub complete: bool,
}

/// A node named by peer id and human name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRef {
    pub id: String,
    pub name: String,
}

#[cfg(any(test, feature = "testing"))]
impl NodeMeta {
    /// A member named `name` with `cpus` cpus and its data plane on `host`, for tests.
    pub fn for_test(name: &str, cpus: u32, host: &str) -> NodeMeta {
        NodeMeta {
            name: name.into(),
            p2p_addrs: Vec::new(),
            api_addr: String::new(),
            data_addr: format!("{host}:7072"),
            datasets_addr: format!("{host}:7073"),
            datasets: Vec::new(),
            cpus,
            memory_mb: 1024,
            gpus: Vec::new(),
            labels: BTreeMap::new(),
            version: "test".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_metadata_is_refused_naming_the_field() {
        let ok = NodeMeta::for_test("a", 1, "127.0.0.1");
        assert_eq!(ok.check(), Ok(()));
        let mut m = ok.clone();
        m.name = "x".repeat(limits::TEXT_BYTES_MAX + 1);
        assert!(m.check().unwrap_err().starts_with("name"));
        let mut m = ok.clone();
        for i in 0..=limits::LABELS_MAX {
            m.labels.insert(format!("k{i}"), "v".into());
        }
        assert!(m.check().unwrap_err().starts_with("labels"));
        let mut m = ok;
        m.datasets = vec![
            HeldDataset {
                root_prefix: 1,
                complete: true
            };
            HELD_DATASETS_MAX + 1
        ];
        assert!(m.check().unwrap_err().starts_with("datasets"));
    }
}
