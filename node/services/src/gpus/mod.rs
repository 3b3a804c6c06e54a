//! This host's GPUs: which devices it has, which of them it offers to jobs, and what a rank
//! is told about the devices it is given.
//!
//! - [`discover`] lists the devices once, at start-up, from a [`Source`]: the CUDA driver
//!   (`driver`, through cudarc loaded at run time, so the same binary runs on hosts without
//!   CUDA: no libcuda, or a driver that fails, means no GPUs and a reason, never a panic), or,
//!   **for tests only**, the fake devices named by [`TEST_GPUS_ENV`] (`fake`); then keeps the
//!   devices `--gpus` names ([`Selection`]).
//! - [`visible_devices`]: a rank's `CUDA_VISIBLE_DEVICES` from the device indices the chief
//!   gave it (`Slot::gpus`).
//! - [`libraries`]: the CUDA libraries a rank given devices loads, of the newest CUDA major
//!   the driver supports ([`driver_cuda_major`]), found and linked once at start, first on
//!   its `LD_LIBRARY_PATH` ([`RankLibraries`]; a command rank gets the link directory
//!   alone).
//!
//! A device's index is the driver's ordinal as this node's process sees it, in PCI bus
//! order: the binary sets [`DEVICE_ORDER_ENV`] to [`DEVICE_ORDER`] first thing
//! ([`use_pci_device_order`]), and every rank given devices gets the same, so the node and
//! its ranks number devices alike (the driver's default order, fastest first, may differ
//! from nvidia-smi's, and two ranks numbering differently could share a GPU). A node started
//! with `CUDA_VISIBLE_DEVICES` itself sees only those devices, numbered from 0 within that
//! list ([`inherited_visible_devices`]), so a rank's device `i` is entry `i` of the node's
//! list.
//!
//! May use: `cluster::meta` (the [`Gpu`] record it reports). Used by: the node's start-up
//! and `jobs::launch`.

mod driver;
mod fake;
pub mod libraries;
mod selection;

pub use fake::parse_test_gpus;
pub use libraries::RankLibraries;
pub use selection::Selection;

use crate::cluster::meta::Gpu;

/// Test-only: when set, the node reports these fake devices instead of asking the driver;
/// `MODEL:MEMORY_MB` entries separated by commas (e.g. `H100:81559,H100:81559`), indices
/// 0.. in order, UUIDs `GPU-test-<index>`; empty: no GPUs. The node's train ranks inherit it
/// and then compute through the trainer's staged CPU twin ([`trainer::gpu::Device`]).
pub use trainer::gpu::TEST_GPUS_ENV;
/// Most GPUs a node advertises: member metadata travels in every gossip push-pull. A driver
/// that lists more offers the first ones.
pub const GPUS_MAX: usize = 64;
/// Longest model name advertised, in bytes; a longer one is cut at a character boundary.
pub const GPU_MODEL_BYTES_MAX: usize = 64;

/// The CUDA driver's variable that orders devices, and the order the node and its ranks
/// number devices in (PCI bus order, as nvidia-smi does): in the domain crate, whose spec
/// rules read them too.
pub use crate::domain::device_order::{DEVICE_ORDER, DEVICE_ORDER_ENV};

/// Makes this process number CUDA devices in PCI bus order ([`DEVICE_ORDER`]), whatever its
/// environment said: the driver reads the variable once, at its first call, and the node's
/// ranks given devices are told the same ([`crate::jobs::launch`]).
///
/// Call it first thing in `main`, while the process has one thread: changing the
/// environment races with any other thread reading it (which is why edition 2024 makes
/// `set_var` unsafe).
pub fn use_pci_device_order() {
    std::env::set_var(DEVICE_ORDER_ENV, DEVICE_ORDER);
}

/// Where a node's GPUs come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The CUDA driver.
    Driver,
    /// Test-only: the text of [`TEST_GPUS_ENV`].
    Test(String),
}

impl Source {
    /// [`Source::Test`] when [`TEST_GPUS_ENV`] is set in a debug build, else the driver: a
    /// release build never reads the test hook ([`trainer::worker::test_hook`] says why).
    pub fn from_env() -> Source {
        match trainer::worker::test_hook(TEST_GPUS_ENV) {
            Some(text) => Source::Test(text),
            None => Source::Driver,
        }
    }
}

/// What discovery found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Discovery {
    /// The devices the node offers, by ascending index.
    pub gpus: Vec<Gpu>,
    /// Why the host reports no GPUs at all (no driver, the driver failed), when it does not
    /// for want of devices alone; logged once at start.
    pub none_because: Option<String>,
}

/// A `--gpus` value or a test source that cannot be used: the node does not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// `--gpus` is neither `all`, `none` nor a list of device indices (clap names the flag
    /// and the value when it reports this).
    #[error("{problem}")]
    Selection {
        /// The value given.
        text: String,
        /// What is wrong with it.
        problem: String,
    },
    /// `--gpus` names a device this host does not have.
    #[error("--gpus: no GPU {index} on this host ({have})")]
    NoSuchDevice {
        /// The missing index.
        index: u32,
        /// What the host has, or why it has none.
        have: String,
    },
    /// [`TEST_GPUS_ENV`] is malformed.
    #[error("{TEST_GPUS_ENV}: {problem}")]
    TestGpus {
        /// What is wrong with it.
        problem: String,
    },
}

/// This host's GPUs from `source`, restricted to `selection`. An index `selection` names
/// that the host does not have is an error; a host without a usable driver has no GPUs
/// (and says why in [`Discovery::none_because`]).
pub fn discover(source: &Source, selection: &Selection) -> Result<Discovery, GpuError> {
    let (listed, none_because) = match source {
        Source::Test(text) => (parse_test_gpus(text)?, None),
        Source::Driver => match driver::list() {
            Ok(mut gpus) => {
                gpus.truncate(GPUS_MAX);
                (gpus, None)
            }
            Err(why) => (Vec::new(), Some(why)),
        },
    };
    let gpus = selection.restrict(listed, none_because.as_deref())?;
    Ok(Discovery { gpus, none_because })
}

/// The newest CUDA major this host's driver supports (`cuDriverGetVersion`), which the
/// CUDA libraries ranks load must not exceed ([`libraries::prepare`]); `None` without a
/// usable driver, and for [`Source::Test`] (its devices have none).
pub fn driver_cuda_major(source: &Source) -> Option<u32> {
    if *source != Source::Driver {
        return None;
    }
    driver::version().and_then(collective::cuda_libs::cuda_major_of_driver)
}

/// The node's own `CUDA_VISIBLE_DEVICES` entries, when it was started with a non-empty one
/// and its GPUs come from the driver (which numbers devices within that list); `None`
/// otherwise (a rank's device `i` is then named `i`).
pub fn inherited_visible_devices(source: &Source) -> Option<Vec<String>> {
    if *source != Source::Driver {
        return None;
    }
    let text = std::env::var("CUDA_VISIBLE_DEVICES").ok()?;
    let entries: Vec<String> = text
        .split(',')
        .map(|e| e.trim().to_owned())
        .filter(|e| !e.is_empty())
        .collect();
    (!entries.is_empty()).then_some(entries)
}

/// A rank's `CUDA_VISIBLE_DEVICES`: its device indices joined by commas, each named by the
/// node's own list when it has one ([`inherited_visible_devices`]; an index beyond that
/// list, which discovery never gives, is named by itself).
pub fn visible_devices(devices: &[u32], inherited: Option<&[String]>) -> String {
    devices
        .iter()
        .map(|&i| {
            inherited
                .and_then(|names| names.get(i as usize))
                .cloned()
                .unwrap_or_else(|| i.to_string())
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `model` cut to [`GPU_MODEL_BYTES_MAX`] at a character boundary.
fn bounded_model(model: &str) -> String {
    let mut end = model.len().min(GPU_MODEL_BYTES_MAX);
    while !model.is_char_boundary(end) {
        end -= 1;
    }
    model[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_source_then_selection() {
        let source = Source::Test("H100:81559,A100:40536".into());
        let all = discover(&source, &Selection::All).unwrap();
        assert_eq!(all.none_because, None);
        assert_eq!(
            all.gpus
                .iter()
                .map(|g| (g.index, g.model.as_str(), g.uuid.as_str()))
                .collect::<Vec<_>>(),
            [(0, "H100", "GPU-test-0"), (1, "A100", "GPU-test-1")]
        );
        let one = discover(&source, &"1".parse().unwrap()).unwrap();
        assert_eq!(one.gpus, all.gpus[1..]);
        assert!(discover(&source, &Selection::None).unwrap().gpus.is_empty());
        assert_eq!(
            discover(&source, &"0,2".parse().unwrap())
                .unwrap_err()
                .to_string(),
            "--gpus: no GPU 2 on this host (it has 0, 1)"
        );
        assert!(matches!(
            discover(&Source::Test("H100".into()), &Selection::All),
            Err(GpuError::TestGpus { .. })
        ));
    }

    #[test]
    fn visible_devices_name_indices_or_the_nodes_own_entries() {
        assert_eq!(visible_devices(&[0, 1], None), "0,1");
        assert_eq!(visible_devices(&[3], None), "3");
        let inherited = ["4".to_string(), "GPU-abc".to_string()];
        assert_eq!(visible_devices(&[1, 0], Some(&inherited)), "GPU-abc,4");
        assert_eq!(visible_devices(&[2], Some(&inherited)), "2");
        assert_eq!(visible_devices(&[], None), "");
    }

    #[test]
    fn inherited_list_only_for_the_driver() {
        assert_eq!(
            inherited_visible_devices(&Source::Test(String::new())),
            None
        );
    }

    #[test]
    fn long_models_are_cut_at_a_char_boundary() {
        let long = "é".repeat(GPU_MODEL_BYTES_MAX);
        let cut = bounded_model(&long);
        assert!(cut.len() <= GPU_MODEL_BYTES_MAX && long.starts_with(&cut));
        assert_eq!(bounded_model("H100"), "H100");
    }
}
