//! How the node and its ranks number CUDA devices: PCI bus order, as nvidia-smi does. The
//! constants live here, at the bottom, because both the GPU discovery (the node's `gpus`,
//! which re-exports them and sets the order at start) and a job spec's rule on its
//! environment ([`crate::spec`]) read them.

/// The CUDA driver's variable that orders devices.
pub const DEVICE_ORDER_ENV: &str = "CUDA_DEVICE_ORDER";
/// The order the node and its ranks number devices in: PCI bus order, as nvidia-smi does.
pub const DEVICE_ORDER: &str = "PCI_BUS_ID";
