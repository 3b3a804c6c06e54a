//! Agreement after a re-form: which commit every rank restores, and moving it to the ranks
//! that lack it. The rounds' logic is [`ringleader_protocol::Agree`] (pure, shared with the
//! Python ranks); this module runs its reductions on the communicator and moves the state.
//!
//! Protocol, run by every rank of the new generation on its fresh communicator (every step
//! is a collective, so all ranks take the same branches):
//! 1. `Max` over ranks of each rank's last generation (the one it last restored or started
//!    in; none for a joiner) and of the steps each rank had reached. Only the ranks whose
//!    last generation is the newest are *holders*: ranks that missed a generation may hold
//!    commits of an abandoned history at the same step numbers, so their logs are ignored.
//! 2. The newest step every holder has: start from `c = ∞`; each round is a `Min` over
//!    holders of their newest commit at or before `c` (non-holders say ∞); a fixpoint is a
//!    step every holder has. Each round lowers `c` to one of the holders' steps, so it ends
//!    within the commits held ([`AGREE_ROUNDS_MAX`] caps it). All ∞: no holder. A holder
//!    with nothing at or before `c`: no common commit; then the newest commit anyone holds
//!    is taken instead (`Max`).
//! 3. `Min` of (rank if it holds that step, else ∞) picks the root, the lowest holder; if
//!    some rank lacks the step, the root broadcasts the encoded state (its length first,
//!    checked against [`STATE_BROADCAST_BYTES_MAX`], then the bytes).
//!
//! No holder at all: [`agree_on_checkpoint`] falls back to the durable checkpoint, else the
//! run starts fresh.

use std::sync::Arc;

use collective::{Communicator, ReduceOp};
use ringleader_protocol::Outcome;

use crate::checkpoint::CheckpointStore;
use crate::commit_log::CommitLog;
use crate::error::TrainError;
use crate::state::{StateMeta, TrainState};

/// Largest encoded train state accepted from a broadcast, bytes (checked before
/// allocating).
pub const STATE_BROADCAST_BYTES_MAX: u64 = 16 << 30;
pub use ringleader_protocol::AGREE_ROUNDS_MAX;
/// Magic at the start of an encoded state.
const STATE_MAGIC: &[u8; 8] = b"RLSTATE1";

/// Where the state a rank restored came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreSource {
    /// Its own in-memory commit log.
    Memory,
    /// Broadcast by the lowest rank holding the agreed commit.
    Broadcast,
    /// The durable checkpoint (no rank held a commit).
    Checkpoint,
    /// Nothing anywhere: a fresh start from the seed.
    Fresh,
}

impl std::fmt::Display for RestoreSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RestoreSource::Memory => "memory",
            RestoreSource::Broadcast => "broadcast",
            RestoreSource::Checkpoint => "checkpoint",
            RestoreSource::Fresh => "fresh",
        })
    }
}

/// What one rank brings to the agreement.
#[derive(Debug, Clone, Copy)]
pub struct Holding<'a> {
    /// Its commits.
    pub log: &'a CommitLog,
    /// The generation it last restored or started in; `None` for a joiner (a new process).
    pub last_generation: Option<u64>,
    /// Steps it had reached (0 for a joiner).
    pub step_reached: u64,
}

/// The outcome of [`agree`], the same on every rank except for `source`.
#[derive(Debug, Clone)]
pub struct Agreement {
    /// The state to restore; `None` when no rank held a commit.
    pub state: Option<Arc<TrainState>>,
    /// Where this rank's state came from ([`RestoreSource::Fresh`] when `state` is `None`).
    pub source: RestoreSource,
    /// The most steps any rank had reached (for counting the steps lost).
    pub group_step: u64,
}

/// Agrees with the other ranks of `comm` on the state to restore (see the module doc): the
/// rounds are [`ringleader_protocol::Agree`]'s, each reduction run on `comm`
/// ([`Communicator::agree`]).
pub async fn agree(comm: &mut Communicator, mine: Holding<'_>) -> Result<Agreement, TrainError> {
    let rank = comm.rank();
    let holding = ringleader_protocol::Holding {
        last_generation: mine.last_generation,
        step_reached: mine.step_reached,
        commits: mine.log.steps(),
    };
    let (outcome, holds) = comm.agree(holding).await?;
    let (step, root, everyone_holds, group_step) = match outcome {
        Outcome::Fresh { group_step } => {
            return Ok(Agreement {
                state: None,
                source: RestoreSource::Fresh,
                group_step,
            })
        }
        Outcome::Restore {
            step,
            root,
            everyone_holds,
            group_step,
        } => (step, root, everyone_holds, group_step),
    };
    let has = if holds { mine.log.get(step) } else { None };
    if everyone_holds {
        let state = has.expect("every rank holds the step").clone();
        return Ok(Agreement {
            state: Some(state),
            source: RestoreSource::Memory,
            group_step,
        });
    }
    let encoded = match has {
        Some(s) if rank == root => encode_state(s)?,
        _ => Vec::new(),
    };
    let bytes = broadcast_bytes(comm, encoded, root).await?;
    let (state, source) = match has {
        Some(s) => (s.clone(), RestoreSource::Memory),
        None => (Arc::new(decode_state(&bytes)?), RestoreSource::Broadcast),
    };
    if state.meta.step != step {
        return Err(TrainError::Corrupt {
            what: format!("state broadcast by rank {root}"),
            detail: format!("step {}, agreed {step}", state.meta.step),
        });
    }
    Ok(Agreement {
        state: Some(state),
        source,
        group_step,
    })
}

/// Broadcasts `root`'s bytes (length first); the other ranks' `bytes` are ignored.
async fn broadcast_bytes(
    comm: &mut Communicator,
    bytes: Vec<u8>,
    root: usize,
) -> Result<Vec<u8>, TrainError> {
    let mut len = [bytes.len() as f64];
    comm.broadcast(&mut len, root).await?;
    let n = len[0];
    if !(0.0..=STATE_BROADCAST_BYTES_MAX as f64).contains(&n) {
        return Err(TrainError::Corrupt {
            what: format!("state broadcast by rank {root}"),
            detail: format!("length {n} (at most {STATE_BROADCAST_BYTES_MAX} bytes)"),
        });
    }
    let n = n as usize;
    // The bytes travel as f32 words; the broadcast copies bits, it never computes.
    let mut words: Vec<f32> = vec![0.0; n.div_ceil(4)];
    if comm.rank() == root {
        for (w, c) in words.iter_mut().zip(bytes.chunks(4)) {
            let mut b = [0u8; 4];
            b[..c.len()].copy_from_slice(c);
            *w = f32::from_bits(u32::from_le_bytes(b));
        }
    }
    comm.broadcast(&mut words, root).await?;
    if comm.rank() == root {
        return Ok(bytes);
    }
    let mut out: Vec<u8> = words
        .iter()
        .flat_map(|w| w.to_bits().to_le_bytes())
        .collect();
    out.truncate(n);
    Ok(out)
}

/// Every rank loads the latest durable checkpoint; it is restored only when every rank
/// sees the same step (a shared store). `None`: no checkpoint, or the ranks disagree.
pub async fn agree_on_checkpoint(
    comm: &mut Communicator,
    store: &CheckpointStore,
) -> Result<Option<TrainState>, TrainError> {
    let latest = store.load_latest().await?;
    let mine = latest.as_ref().map_or(-1.0, |s| s.meta.step as f64);
    let mut agree = [mine, -mine];
    comm.allreduce(&mut agree, ReduceOp::Max).await?;
    if agree[0] == -agree[1] {
        return Ok(latest);
    }
    tracing::warn!(
        rank = comm.rank(),
        "checkpoints differ across ranks (per-node storage?): starting over"
    );
    Ok(None)
}

/// Encodes a whole train state: magic, then three sections each with a little-endian `u64`
/// length: the meta as JSON, the parameters and the optimizer state as safetensors.
pub fn encode_state(state: &TrainState) -> Result<Vec<u8>, TrainError> {
    let meta = serde_json::to_vec(&state.meta)
        .map_err(|e| TrainError::StateMismatch(format!("meta: {e}")))?;
    let params = TrainState::encode_tensors(&state.params)?;
    let optimizer = TrainState::encode_tensors(&state.optimizer)?;
    let mut out = Vec::with_capacity(8 + 24 + meta.len() + params.len() + optimizer.len());
    out.extend_from_slice(STATE_MAGIC);
    for part in [&meta, &params, &optimizer] {
        out.extend_from_slice(&(part.len() as u64).to_le_bytes());
        out.extend_from_slice(part);
    }
    Ok(out)
}

/// Decodes [`encode_state`]'s bytes, checking every length before using it.
pub fn decode_state(bytes: &[u8]) -> Result<TrainState, TrainError> {
    let corrupt = |d: &str| TrainError::Corrupt {
        what: "encoded train state".into(),
        detail: d.into(),
    };
    let mut rest = bytes
        .strip_prefix(STATE_MAGIC.as_slice())
        .ok_or_else(|| corrupt("bad magic"))?;
    let mut parts = Vec::with_capacity(3);
    for _ in 0..3 {
        if rest.len() < 8 {
            return Err(corrupt("truncated length"));
        }
        let (len, tail) = rest.split_at(8);
        let len = u64::from_le_bytes(len.try_into().expect("8 bytes"));
        if len > tail.len() as u64 {
            return Err(corrupt("section longer than the bytes left"));
        }
        let (part, tail) = tail.split_at(len as usize);
        parts.push(part);
        rest = tail;
    }
    if !rest.is_empty() {
        return Err(corrupt("trailing bytes"));
    }
    let meta: StateMeta =
        serde_json::from_slice(parts[0]).map_err(|e| corrupt(&format!("meta: {e}")))?;
    Ok(TrainState {
        meta,
        params: TrainState::decode_tensors(parts[1], "broadcast parameters")?,
        optimizer: TrainState::decode_tensors(parts[2], "broadcast optimizer state")?,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::sampler::DataCursor;
    use crate::spec::{Arch, OptimizerKind};
    use crate::state::{NamedTensor, STATE_FORMAT};

    /// A small state at `step` whose values are `v`.
    pub(crate) fn state_at(step: u64, v: f32) -> TrainState {
        TrainState {
            meta: StateMeta {
                format: STATE_FORMAT,
                step,
                epoch: 0,
                cursor: DataCursor {
                    epoch: 0,
                    offset: step as usize * 8,
                },
                rng: step,
                world: 2,
                optimizer: OptimizerKind::Sgd,
                optimizer_steps: step,
                arch: Arch::Mlp,
                num_params: 3,
                metrics: HashMap::from([("loss".to_string(), 0.5)]),
            },
            params: vec![NamedTensor {
                name: "fc0.weight".into(),
                shape: vec![3],
                data: vec![v, -v, f32::NAN],
            }],
            optimizer: vec![NamedTensor {
                name: "fc0.weight.momentum".into(),
                shape: vec![3],
                data: vec![v * 0.5; 3],
            }],
        }
    }

    #[test]
    fn state_round_trips_and_damage_is_corrupt() {
        let s = state_at(12, 1.5);
        let bytes = encode_state(&s).unwrap();
        let back = decode_state(&bytes).unwrap();
        assert_eq!(back.meta, s.meta);
        assert_eq!(back.optimizer, s.optimizer);
        assert!(back.params[0].data[2].is_nan());
        assert_eq!(back.params[0].data[..2], s.params[0].data[..2]);
        for cut in [0, 7, 9, 20, bytes.len() - 1] {
            assert!(
                matches!(decode_state(&bytes[..cut]), Err(TrainError::Corrupt { .. })),
                "cut at {cut}"
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(decode_state(&long).is_err());
        let mut huge = bytes;
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            decode_state(&huge),
            Err(TrainError::Corrupt { .. })
        ));
    }
}
