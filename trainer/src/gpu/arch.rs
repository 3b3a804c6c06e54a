//! What NVRTC builds `kernels.cu` into for a device.
//!
//! PTX is compiled again by the driver when it is loaded, and a driver older than NVRTC
//! refuses newer PTX (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`: PyTorch's CUDA 13 libraries on a
//! host whose driver is CUDA 12, say). Machine code for the device's own architecture
//! (`sm_XY`, a cubin) needs no compilation at load, so it is tried first; PTX is the
//! fallback, for the device's architecture or, when this NVRTC does not know it (a device
//! newer than the toolkit), for the newest one it knows below it, which the driver compiles
//! for the device.

/// One way to build the kernels, by architecture number (`90` for `sm_90`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelImage {
    /// Machine code for `sm_<arch>`.
    Cubin(u32),
    /// PTX for `compute_<arch>`.
    Ptx(u32),
}

impl KernelImage {
    /// NVRTC's `--gpu-architecture` value.
    pub fn nvrtc_arch(self) -> String {
        match self {
            KernelImage::Cubin(a) => format!("sm_{a}"),
            KernelImage::Ptx(a) => format!("compute_{a}"),
        }
    }
}

impl std::fmt::Display for KernelImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelImage::Cubin(a) => write!(f, "sm_{a} cubin"),
            KernelImage::Ptx(a) => write!(f, "compute_{a} ptx"),
        }
    }
}

/// The images to try, in order, for a device of architecture `device` with an NVRTC that
/// supports `supported` (its `nvrtcGetSupportedArchs`); empty when NVRTC knows no
/// architecture at or below the device's.
pub fn images(device: u32, supported: &[u32]) -> Vec<KernelImage> {
    if supported.contains(&device) {
        return vec![KernelImage::Cubin(device), KernelImage::Ptx(device)];
    }
    supported
        .iter()
        .copied()
        .filter(|a| *a < device)
        .max()
        .map(|a| vec![KernelImage::Ptx(a)])
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_devices_own_code_first_then_ptx() {
        let nvrtc13 = [75, 80, 86, 87, 89, 90, 100, 103, 120];
        assert_eq!(
            images(90, &nvrtc13),
            vec![KernelImage::Cubin(90), KernelImage::Ptx(90)]
        );
        assert_eq!(KernelImage::Cubin(90).nvrtc_arch(), "sm_90");
        assert_eq!(KernelImage::Ptx(90).nvrtc_arch(), "compute_90");
    }

    #[test]
    fn a_device_newer_than_nvrtc_gets_the_newest_ptx_below_it() {
        let nvrtc12 = [50, 52, 60, 70, 75, 80, 86, 89, 90];
        assert_eq!(images(100, &nvrtc12), vec![KernelImage::Ptx(90)]);
        // An architecture between two known ones (sm_88, say).
        assert_eq!(images(88, &nvrtc12), vec![KernelImage::Ptx(86)]);
    }

    #[test]
    fn a_device_older_than_every_known_architecture_gets_nothing() {
        assert!(images(50, &[75, 80, 90]).is_empty());
        assert!(images(90, &[]).is_empty());
    }
}
