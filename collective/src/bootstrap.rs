//! Bootstrapping NCCL over the TCP group, without the GPU: rank 0's unique id goes to every
//! rank, then every rank says whether it can go on, so that NCCL's initialisation (which
//! blocks until every rank has joined) starts only when all of them will join.
//!
//! Two rounds on the [`Communicator`]:
//! 1. rank 0 broadcasts an [`IdMessage`]: a status byte and the 128-byte id (zeros when it
//!    has no id, with the reason in the status);
//! 2. an allreduce (max) of one status code per rank ([`Unready`], 0 = ready), so every rank
//!    knows which ranks cannot join and why.
//!
//! Both builds run it: a rank built without `cuda` takes part and reports
//! [`Unready::NotBuilt`], so mixed groups fail at once on every rank instead of waiting.

use crate::communicator::Communicator;
use crate::error::{CollectiveError, DType, ReduceOp};

/// Bytes of an NCCL unique id (`NCCL_UNIQUE_ID_BYTES`).
pub(crate) const NCCL_ID_BYTES: usize = 128;
/// Bytes of an [`IdMessage`] on the wire: the status, then the id.
const ID_MESSAGE_BYTES: usize = 1 + NCCL_ID_BYTES;
/// Status byte of an [`IdMessage`] that carries an id.
const ID_PRESENT: u8 = 0;

/// Why a rank cannot join the NCCL communicator (a status code on the wire; 0 is ready).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Unready {
    /// libcuda or libnccl cannot be loaded.
    NoLibrary = 1,
    /// The CUDA device could not be opened.
    NoDevice = 2,
    /// NCCL could not create the unique id (rank 0).
    IdFailed = 3,
    /// The rank was built without the `cuda` feature.
    NotBuilt = 4,
    /// Rank 0 sent no id (another rank reports why).
    NoId = 5,
}

impl Unready {
    fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => Unready::NoLibrary,
            2 => Unready::NoDevice,
            3 => Unready::IdFailed,
            4 => Unready::NotBuilt,
            5 => Unready::NoId,
            _ => return None,
        })
    }

    fn describe(self) -> &'static str {
        match self {
            Unready::NoLibrary => "libcuda or libnccl not found",
            Unready::NoDevice => "cannot open the cuda device",
            Unready::IdFailed => "cannot create the nccl id",
            Unready::NotBuilt => "built without the cuda feature",
            Unready::NoId => "no nccl id from rank 0",
        }
    }
}

/// An NCCL unique id, as bytes.
pub(crate) type NcclId = [u8; NCCL_ID_BYTES];

/// What rank 0 broadcasts: its id, or why it has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdMessage(pub Result<NcclId, Unready>);

impl IdMessage {
    fn encode(&self) -> [u8; ID_MESSAGE_BYTES] {
        let mut b = [0u8; ID_MESSAGE_BYTES];
        match &self.0 {
            Ok(id) => b[1..].copy_from_slice(id),
            Err(u) => b[0] = *u as u8,
        }
        b
    }

    /// Decodes a message; anything but a known status is rank 0 having no id.
    fn decode(b: &[u8; ID_MESSAGE_BYTES]) -> Self {
        if b[0] == ID_PRESENT {
            let mut id = [0u8; NCCL_ID_BYTES];
            id.copy_from_slice(&b[1..]);
            return IdMessage(Ok(id));
        }
        IdMessage(Err(Unready::from_code(b[0]).unwrap_or(Unready::NoId)))
    }
}

/// The error every rank returns when some ranks cannot join: each unready rank and why.
fn unready_error(statuses: &[f64]) -> Option<CollectiveError> {
    let bad: Vec<String> = statuses
        .iter()
        .enumerate()
        .filter(|(_, s)| **s != 0.0)
        .map(|(r, s)| {
            let why = Unready::from_code(*s as u8).map_or("unknown status", Unready::describe);
            format!("rank {r}: {why}")
        })
        .collect();
    (!bad.is_empty())
        .then(|| CollectiveError::Nccl(format!("cannot bootstrap: {}", bad.join("; "))))
}

/// Agrees on an NCCL id over `group`. Rank 0 calls `make_id` (the others never do); then
/// every rank calls `prepare` (check the libraries, open the device). Returns the id and what `prepare` made when every rank is ready, else the same
/// [`CollectiveError::Nccl`] on every rank, naming each unready rank.
pub(crate) async fn agree<T>(
    group: &mut Communicator,
    make_id: impl FnOnce() -> Result<NcclId, Unready>,
    prepare: impl FnOnce() -> Result<T, Unready>,
) -> Result<(NcclId, T), CollectiveError> {
    let mut msg = if group.rank() == 0 {
        IdMessage(make_id()).encode()
    } else {
        [0u8; ID_MESSAGE_BYTES]
    };
    group.broadcast_raw(&mut msg, DType::U8, 0).await?;
    // A rank's own problem first; else rank 0 reports why it has no id, and the others
    // only that they got none.
    let local = prepare().and_then(|t| match IdMessage::decode(&msg).0 {
        Ok(id) => Ok((id, t)),
        Err(u) if group.rank() == 0 => Err(u),
        Err(_) => Err(Unready::NoId),
    });
    let mut statuses = vec![0f64; group.world()];
    if let Err(u) = &local {
        statuses[group.rank()] = *u as u8 as f64;
    }
    group.allreduce(&mut statuses, ReduceOp::Max).await?;
    if let Some(e) = unready_error(&statuses) {
        return Err(e);
    }
    local.map_err(|u| CollectiveError::Nccl(u.describe().into()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Limits;

    #[test]
    fn id_messages_round_trip() {
        let mut id = [0u8; NCCL_ID_BYTES];
        for (i, b) in id.iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        for m in [
            IdMessage(Ok(id)),
            IdMessage(Ok([0u8; NCCL_ID_BYTES])),
            IdMessage(Err(Unready::NoLibrary)),
            IdMessage(Err(Unready::NotBuilt)),
        ] {
            assert_eq!(IdMessage::decode(&m.encode()), m);
        }
        let mut junk = [0u8; ID_MESSAGE_BYTES];
        junk[0] = 200;
        assert_eq!(IdMessage::decode(&junk), IdMessage(Err(Unready::NoId)));
    }

    #[test]
    fn the_error_names_every_unready_rank() {
        assert_eq!(unready_error(&[0.0, 0.0]), None);
        let e = unready_error(&[1.0, 0.0, 2.0]).unwrap();
        assert_eq!(
            e,
            CollectiveError::Nccl(
                "cannot bootstrap: rank 0: libcuda or libnccl not found; \
                 rank 2: cannot open the cuda device"
                    .into()
            )
        );
    }

    /// Runs [`agree`] on every rank of an in-memory group, rank 0 making `id0`, rank `r`
    /// preparing `ready(r)`; a hang fails the test.
    async fn agree_all(
        world: usize,
        id0: Result<NcclId, Unready>,
        ready: fn(usize) -> Result<usize, Unready>,
    ) -> Vec<Result<(NcclId, usize), CollectiveError>> {
        let mut set = tokio::task::JoinSet::new();
        for mut c in Communicator::in_memory(world, Limits::for_test()).unwrap() {
            set.spawn(async move {
                let r = c.rank();
                let out = agree(&mut c, || id0, || ready(r)).await;
                (r, out)
            });
        }
        let all = tokio::time::timeout(Duration::from_secs(10), set.join_all())
            .await
            .expect("bootstrap hangs");
        let mut all = all;
        all.sort_by_key(|(r, _)| *r);
        all.into_iter().map(|(_, o)| o).collect()
    }

    #[tokio::test]
    async fn every_rank_gets_rank_0s_id() {
        let id = [9u8; NCCL_ID_BYTES];
        for world in 1..=4 {
            let out = agree_all(world, Ok(id), Ok).await;
            for (r, o) in out.into_iter().enumerate() {
                assert_eq!(o, Ok((id, r)));
            }
        }
    }

    #[tokio::test]
    async fn one_unready_rank_fails_every_rank_with_the_same_error() {
        let out = agree_all(3, Ok([1u8; NCCL_ID_BYTES]), |r| {
            if r == 2 {
                Err(Unready::NoDevice)
            } else {
                Ok(r)
            }
        })
        .await;
        let want =
            CollectiveError::Nccl("cannot bootstrap: rank 2: cannot open the cuda device".into());
        assert!(
            out.iter().all(|o| o.as_ref().err() == Some(&want)),
            "{out:?}"
        );
    }

    #[tokio::test]
    async fn rank_0_without_an_id_fails_every_rank() {
        let out = agree_all(3, Err(Unready::IdFailed), Ok).await;
        let want = CollectiveError::Nccl(
            "cannot bootstrap: rank 0: cannot create the nccl id; \
             rank 1: no nccl id from rank 0; rank 2: no nccl id from rank 0"
                .into(),
        );
        assert!(
            out.iter().all(|o| o.as_ref().err() == Some(&want)),
            "{out:?}"
        );
    }

    #[tokio::test]
    async fn no_library_anywhere_fails_every_rank_without_hanging() {
        let out = agree_all(2, Err(Unready::NoLibrary), |_| Err(Unready::NoLibrary)).await;
        let want = CollectiveError::Nccl(
            "cannot bootstrap: rank 0: libcuda or libnccl not found; \
             rank 1: libcuda or libnccl not found"
                .into(),
        );
        assert!(
            out.iter().all(|o| o.as_ref().err() == Some(&want)),
            "{out:?}"
        );
    }
}
