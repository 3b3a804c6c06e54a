//! The CUDA driver's device list, through cudarc's driver API loaded at run time.
//!
//! cudarc panics on its first call when libcuda is missing (and on a call whose symbol the
//! installed driver lacks), so the library's presence is checked first and the calls run
//! under `catch_unwind`: a host without a usable driver gets a reason, not a crash.
//!
//! Ordinals follow `CUDA_DEVICE_ORDER`, which the driver reads at `cuInit`: PCI bus order,
//! as nvidia-smi numbers devices, since the binary sets it first thing
//! ([`super::use_pci_device_order`]) and gives every rank with devices the same.

use cudarc::driver::{result, sys};

use super::bounded_model;
use crate::cluster::meta::Gpu;

/// The driver's devices in ordinal order, or why there are none to be had.
pub(super) fn list() -> Result<Vec<Gpu>, String> {
    // SAFETY: opens libcuda by its usual names and closes it; runs no code of the library
    // beyond its loader's initialisers.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver (libcuda) on this host".into());
    }
    std::panic::catch_unwind(list_present)
        .unwrap_or_else(|_| Err("the CUDA driver lacks a function ringleader calls".into()))
}

/// `cuDriverGetVersion`'s value (`1000 * major + 10 * minor`), or `None` without a usable
/// driver (no libcuda, or a call that fails or panics).
pub(super) fn version() -> Option<i32> {
    // SAFETY: as in `list`.
    if !unsafe { sys::is_culib_present() } {
        return None;
    }
    std::panic::catch_unwind(|| {
        let mut version: std::ffi::c_int = 0;
        // SAFETY: writes one int through a valid pointer; needs no `cuInit`.
        let status = unsafe { sys::cuDriverGetVersion(&mut version) };
        (status == sys::CUresult::CUDA_SUCCESS).then_some(version)
    })
    .ok()
    .flatten()
}

fn list_present() -> Result<Vec<Gpu>, String> {
    result::init().map_err(|e| format!("the CUDA driver failed to start: {e}"))?;
    let count = result::device::get_count().map_err(|e| format!("counting devices: {e}"))?;
    (0..count)
        .map(|ordinal| {
            let fail =
                |what: &str, e: result::DriverError| format!("device {ordinal}: {what}: {e}");
            let dev = result::device::get(ordinal).map_err(|e| fail("opening", e))?;
            let model = result::device::get_name(dev).map_err(|e| fail("name", e))?;
            // SAFETY: `dev` comes from `device::get`.
            let bytes = unsafe { result::device::total_mem(dev) }.map_err(|e| fail("memory", e))?;
            let uuid = result::device::get_uuid(dev).map_err(|e| fail("uuid", e))?;
            Ok(Gpu {
                index: u32::try_from(ordinal).map_err(|_| format!("device ordinal {ordinal}"))?,
                model: bounded_model(model.trim()),
                memory_mb: (bytes as u64) >> 20,
                uuid: uuid_text(&uuid.bytes.map(|b| b as u8)),
            })
        })
        .collect()
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as nvidia-smi prints a device's UUID.
fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex = hex::encode(bytes);
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_text_groups_like_nvidia_smi() {
        let bytes: [u8; 16] = core::array::from_fn(|i| (i as u8) * 17);
        assert_eq!(
            uuid_text(&bytes),
            "GPU-00112233-4455-6677-8899-aabbccddeeff"
        );
    }

    #[test]
    fn the_version_is_there_exactly_when_the_driver_lists() {
        // Every host: a driver that answers has a version; none has none (never a panic).
        if list().is_err() {
            assert_eq!(version(), None);
        } else {
            assert!(version().is_some_and(|v| v >= 1000));
        }
    }

    #[test]
    fn a_host_without_a_driver_lists_nothing_and_says_why() {
        // Every host: either the driver answers, or there is a reason (never a panic).
        match list() {
            Ok(gpus) => assert!(gpus.iter().enumerate().all(|(i, g)| g.index as usize == i)),
            Err(why) => assert!(!why.is_empty()),
        }
    }
}
