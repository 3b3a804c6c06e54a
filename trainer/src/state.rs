//! The train state: everything needed to continue a run exactly where it stopped.

use std::collections::HashMap;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::{Deserialize, Serialize};

use crate::error::TrainError;
use crate::sampler::DataCursor;
use crate::spec::{Arch, OptimizerKind};

/// Version of the checkpoint layout written in [`StateMeta::format`].
pub const STATE_FORMAT: u32 = 1;
/// Largest tensor accepted from a checkpoint, elements (refuses a corrupt header early).
pub const TENSOR_ELEMS_MAX: usize = 1 << 31;

/// A named `f32` tensor, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedTensor {
    /// Parameter name (e.g. `fc0.weight`), or `<param>.<state>` for optimizer state.
    pub name: String,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Values.
    pub data: Vec<f32>,
}

/// Scalars of the train state; stored as the checkpoint's `meta.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateMeta {
    /// Layout version ([`STATE_FORMAT`]).
    pub format: u32,
    /// Optimizer steps done.
    pub step: u64,
    /// Current epoch (same as `cursor.epoch`).
    pub epoch: u64,
    /// Data position.
    pub cursor: DataCursor,
    /// State of the run's random stream (SplitMix64), advanced once per step.
    pub rng: u64,
    /// World size that produced the state (informative: the cursor is world-independent).
    pub world: usize,
    /// Optimizer kind and updates applied (AdamW bias correction).
    pub optimizer: OptimizerKind,
    /// Optimizer updates applied.
    pub optimizer_steps: u64,
    /// Model architecture, checked on restore.
    pub arch: Arch,
    /// Scalar parameters in all, checked on restore.
    pub num_params: usize,
    /// Latest metrics by name (train loss, validation loss and accuracy), informative.
    pub metrics: HashMap<String, f64>,
}

/// Parameters, optimizer state and scalars. Cheap to move; cloning copies every buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainState {
    /// Scalars.
    pub meta: StateMeta,
    /// Parameters in parameter order (sorted by name).
    pub params: Vec<NamedTensor>,
    /// Optimizer state, `<param>.<state>` (e.g. `fc0.weight.momentum`), sorted by name.
    pub optimizer: Vec<NamedTensor>,
}

impl TrainState {
    /// Serializes tensors as safetensors (`f32`, little-endian), readable by Python's
    /// `safetensors` and PyTorch.
    pub fn encode_tensors(tensors: &[NamedTensor]) -> Result<Vec<u8>, TrainError> {
        let bytes: Vec<Vec<u8>> = tensors
            .iter()
            .map(|t| t.data.iter().flat_map(|v| v.to_le_bytes()).collect())
            .collect();
        let views = tensors
            .iter()
            .zip(&bytes)
            .map(|(t, b)| {
                TensorView::new(Dtype::F32, t.shape.clone(), b)
                    .map(|v| (t.name.clone(), v))
                    .map_err(|e| TrainError::StateMismatch(format!("{}: {e}", t.name)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let info = HashMap::from([("format".to_string(), "ringleader".to_string())]);
        safetensors::tensor::serialize(views, Some(info))
            .map_err(|e| TrainError::StateMismatch(format!("safetensors: {e}")))
    }

    /// Parses safetensors bytes into tensors sorted by name; `what` names the source in errors.
    pub fn decode_tensors(bytes: &[u8], what: &str) -> Result<Vec<NamedTensor>, TrainError> {
        let corrupt = |d: String| TrainError::Corrupt {
            what: what.into(),
            detail: d,
        };
        let st = SafeTensors::deserialize(bytes).map_err(|e| corrupt(e.to_string()))?;
        let mut out = Vec::new();
        for (name, view) in st.tensors() {
            if view.dtype() != Dtype::F32 {
                return Err(corrupt(format!(
                    "{name}: dtype {:?}, want F32",
                    view.dtype()
                )));
            }
            let n: usize = view.shape().iter().product();
            if n > TENSOR_ELEMS_MAX || view.data().len() != n * 4 {
                return Err(corrupt(format!("{name}: bad length")));
            }
            let data = view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect();
            out.push(NamedTensor {
                name,
                shape: view.shape().to_vec(),
                data,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

/// Advances a SplitMix64 state and returns the next draw.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_round_trip_and_garbage_is_corrupt() {
        let ts = vec![
            NamedTensor {
                name: "a.weight".into(),
                shape: vec![2, 3],
                data: (0..6).map(|i| i as f32 * 0.5).collect(),
            },
            NamedTensor {
                name: "a.bias".into(),
                shape: vec![2],
                data: vec![-1.0, f32::MIN_POSITIVE],
            },
        ];
        let bytes = TrainState::encode_tensors(&ts).unwrap();
        let back = TrainState::decode_tensors(&bytes, "t").unwrap();
        assert_eq!(back, vec![ts[1].clone(), ts[0].clone()]);
        assert!(matches!(
            TrainState::decode_tensors(&bytes[..bytes.len() - 3], "t"),
            Err(TrainError::Corrupt { .. })
        ));
    }
}
