//! Tests of `store` (a sibling file: the module is long enough without them).

use std::collections::BTreeSet;

use openraft::storage::RaftLogStorageExt;
use openraft::testing::{StoreBuilder, Suite};
use openraft::{CommittedLeaderId, Membership, RaftLogReader};
use proptest::prelude::*;
use tempfile::TempDir;

use super::*;
use crate::domain::spec::JobSpec;
use crate::domain::state::{ops, JobId, JobState, Op};

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<NodeId>> {
        let dir = TempDir::new().expect("temp dir");
        let (log, sm) = open(dir.path()).expect("open store");
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite() {
    Suite::test_all(Builder).unwrap();
}

fn log_id(term: u64, index: u64) -> LogId<NodeId> {
    LogId {
        leader_id: CommittedLeaderId::new(term, 1),
        index,
    }
}

fn blank(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Blank,
    }
}

fn submit(term: u64, index: u64) -> Entry<TypeConfig> {
    let spec = JobSpec::parse("name = \"t\"\nkind = \"command\"\ncommand = [\"true\"]\n").unwrap();
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(ControlCommand {
            op: Op::Submit(ops::Submit {
                spec: Box::new(spec),
                token: None,
                owner: crate::domain::state::users::admin_user(),
            }),
            at_ms: index,
        }),
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Appends and waits for the flush callback, as openraft does.
async fn append(log: &mut LogStore, entries: Vec<Entry<TypeConfig>>) {
    log.blocking_append(entries).await.unwrap();
}

async fn indexes(log: &mut LogStore) -> Vec<u64> {
    log.try_get_log_entries(..)
        .await
        .unwrap()
        .iter()
        .map(|e| e.log_id.index)
        .collect()
}

fn log_path(dir: &TempDir) -> PathBuf {
    dir.path().join(LOG_FILE)
}

#[test]
fn node_id_is_stable_and_spreads() {
    assert_eq!(node_id_of("12D3KooWA"), node_id_of("12D3KooWA"));
    assert_ne!(node_id_of("12D3KooWA"), node_id_of("12D3KooWB"));
}

#[test]
fn reopen_keeps_entries_vote_committed_purge_and_truncate() {
    let dir = TempDir::new().unwrap();
    rt().block_on(async {
        let mut log = LogStore::open(dir.path()).unwrap();
        for i in 1..=10 {
            append(&mut log, vec![blank(1, i)]).await;
        }
        log.save_vote(&Vote::new(3, 7)).await.unwrap();
        log.save_committed(Some(log_id(1, 6))).await.unwrap();
        log.truncate(log_id(1, 8)).await.unwrap();
        log.purge(log_id(1, 3)).await.unwrap();
        assert_eq!(indexes(&mut log).await, [4, 5, 6, 7]);
    });
    rt().block_on(async {
        let mut log = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&mut log).await, [4, 5, 6, 7]);
        assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(3, 7)));
        assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1, 6)));
        let st = log.get_log_state().await.unwrap();
        assert_eq!(
            (st.last_purged_log_id, st.last_log_id),
            (Some(log_id(1, 3)), Some(log_id(1, 7)))
        );
    });
}

#[test]
fn membership_and_command_entries_survive_reopen() {
    let dir = TempDir::new().unwrap();
    let node = RaftNode {
        peer_id: "12D3KooWA".into(),
        name: "gpu-a".into(),
    };
    let membership = Membership::new(vec![BTreeSet::from([7])], BTreeMap::from([(7, node)]));
    let entries = vec![
        Entry {
            log_id: log_id(1, 1),
            payload: EntryPayload::Membership(membership),
        },
        submit(1, 2),
    ];
    rt().block_on(async {
        let mut log = LogStore::open(dir.path()).unwrap();
        append(&mut log, entries.clone()).await;
    });
    rt().block_on(async {
        let mut log = LogStore::open(dir.path()).unwrap();
        let got = log.try_get_log_entries(..).await.unwrap();
        assert_eq!(got, entries);
    });
}

#[test]
fn torn_tail_is_cut_and_appends_go_on() {
    let dir = TempDir::new().unwrap();
    rt().block_on(async {
        let mut log = LogStore::open(dir.path()).unwrap();
        for i in 1..=3 {
            append(&mut log, vec![blank(1, i)]).await;
        }
    });
    // Cut the last record short, as a crash in the middle of the write would.
    let len = fs::metadata(log_path(&dir)).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(log_path(&dir))
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    rt().block_on(async {
        let mut log = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&mut log).await, [1, 2]);
        append(&mut log, vec![blank(1, 3), blank(1, 4)]).await;
    });
    // Zero-filled pages after the end (a write whose data never landed).
    let mut f = OpenOptions::new()
        .append(true)
        .open(log_path(&dir))
        .unwrap();
    f.write_all(&[0u8; 300]).unwrap();
    drop(f);
    rt().block_on(async {
        let mut log = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&mut log).await, [1, 2, 3, 4]);
    });
}

#[test]
fn corruption_before_the_tail_is_refused() {
    let dir = TempDir::new().unwrap();
    rt().block_on(async {
        let mut log = LogStore::open(dir.path()).unwrap();
        for i in 1..=3 {
            append(&mut log, vec![blank(1, i)]).await;
        }
    });
    let mut bytes = fs::read(log_path(&dir)).unwrap();
    let at = LOG_MAGIC.len() + FRAME_HEADER_BYTES + 3; // inside the first record's payload
    bytes[at] ^= 0x20;
    fs::write(log_path(&dir), &bytes).unwrap();
    match LogStore::open(dir.path()) {
        Err(StoreError::Corrupt { offset, reason, .. }) => {
            assert_eq!(offset, LOG_MAGIC.len() as u64);
            assert_eq!(reason, "checksum mismatch");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("corrupt log opened"),
    }
    // A damaged length field is not mistaken for a torn tail.
    bytes[at] ^= 0x20;
    bytes[LOG_MAGIC.len()] ^= 0x7f;
    fs::write(log_path(&dir), &bytes).unwrap();
    assert!(matches!(
        LogStore::open(dir.path()),
        Err(StoreError::Corrupt { .. })
    ));
    fs::write(log_path(&dir), b"something else").unwrap();
    assert!(matches!(
        LogStore::open(dir.path()),
        Err(StoreError::Corrupt { offset: 0, .. })
    ));
}

#[test]
fn log_is_rewritten_after_purge() {
    let dir = TempDir::new().unwrap();
    rt().block_on(async {
        let mut log = LogStore::open(dir.path()).unwrap();
        log.file.lock().unwrap().compact_bytes_min = 0;
        for i in 1..=50 {
            append(&mut log, vec![blank(1, i)]).await;
        }
        log.save_vote(&Vote::new(2, 1)).await.unwrap();
        let before = fs::metadata(log_path(&dir)).unwrap().len();
        log.purge(log_id(1, 45)).await.unwrap();
        let after = fs::metadata(log_path(&dir)).unwrap().len();
        assert!(after < before / 4, "{before} -> {after}");
        append(&mut log, vec![blank(1, 51)]).await;
    });
    rt().block_on(async {
        let mut log = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&mut log).await, [46, 47, 48, 49, 50, 51]);
        assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(2, 1)));
        assert_eq!(
            log.get_log_state().await.unwrap().last_purged_log_id,
            Some(log_id(1, 45))
        );
    });
    assert!(!dir.path().join("raft-log.tmp").exists());
}

#[test]
fn state_machine_applies_commands_and_survives_restart_through_snapshot() {
    let dir = TempDir::new().unwrap();
    rt().block_on(async {
        let mut sm = StateMachineStore::open(dir.path()).unwrap();
        let mut applied = sm.subscribe();
        let membership = Entry {
            log_id: log_id(1, 1),
            payload: EntryPayload::Membership(Membership::new(vec![BTreeSet::from([1])], ())),
        };
        let out = sm
            .apply(vec![membership, submit(1, 2), blank(2, 3)])
            .await
            .unwrap();
        let id = JobId::from_log_index(2);
        assert_eq!(
            out,
            [
                ControlResponse::Empty,
                ControlResponse::Submitted { id },
                ControlResponse::Empty
            ]
        );
        assert!(applied.has_changed().unwrap());
        assert_eq!(*applied.borrow_and_update(), 3);
        assert_eq!(
            sm.read(|s| s.job(id).map(|j| j.state)),
            Some(JobState::Pending)
        );
        let snap = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        assert_eq!(snap.meta.last_log_id, Some(log_id(2, 3)));
    });
    rt().block_on(async {
        let mut sm = StateMachineStore::open(dir.path()).unwrap();
        let (last, membership) = sm.applied_state().await.unwrap();
        assert_eq!(last, Some(log_id(2, 3)));
        assert_eq!(membership.log_id(), &Some(log_id(1, 1)));
        assert_eq!(sm.read(|s| s.jobs.len()), 1);
        assert!(sm.get_current_snapshot().await.unwrap().is_some());
    });
    // A damaged snapshot is refused.
    let path = dir.path().join(SNAPSHOT_FILE);
    let mut bytes = fs::read(&path).unwrap();
    let last = bytes.len() - 2;
    bytes[last] ^= 1;
    fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        StateMachineStore::open(dir.path()),
        Err(StoreError::Corrupt { .. })
    ));
}

/// A snapshot file over the limit (sparse here) is refused before it is read.
#[test]
fn an_oversized_snapshot_file_is_refused_before_reading() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join(SNAPSHOT_FILE);
    let f = File::create(&path).unwrap();
    f.set_len(SNAPSHOT_FILE_BYTES_MAX + 1).unwrap();
    match StateMachineStore::open(dir.path()) {
        Err(StoreError::Corrupt { reason, .. }) => {
            assert!(reason.contains("over the limit"), "{reason}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("an oversized snapshot file opened"),
    }
}

#[test]
fn install_snapshot_refuses_garbage() {
    let dir = TempDir::new().unwrap();
    rt().block_on(async {
        let mut sm = StateMachineStore::open(dir.path()).unwrap();
        let meta = SnapshotMeta {
            last_log_id: Some(log_id(1, 5)),
            last_membership: StoredMembership::default(),
            snapshot_id: "x".into(),
        };
        let garbage = Box::new(Cursor::new(b"not json".to_vec()));
        assert!(sm.install_snapshot(&meta, garbage).await.is_err());
        assert_eq!(sm.applied_state().await.unwrap().0, None);
        assert!(sm.get_current_snapshot().await.unwrap().is_none());
    });
}

fn frames_buf(payloads: &[Vec<u8>]) -> (Vec<u8>, Vec<usize>) {
    let mut buf = LOG_MAGIC.to_vec();
    let mut starts = Vec::new();
    for p in payloads {
        starts.push(buf.len());
        encode_frame(p, &mut buf);
    }
    (buf, starts)
}

proptest! {
    #[test]
    fn any_cut_of_a_log_is_a_torn_tail_keeping_a_prefix(
        payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..6),
        cut_frac in 0.0f64..1.0,
    ) {
        let (buf, starts) = frames_buf(&payloads);
        let cut = LOG_MAGIC.len() + ((buf.len() - LOG_MAGIC.len()) as f64 * cut_frac) as usize;
        let frames = read_frames(&buf[..cut], LOG_MAGIC.len());
        let n = frames.good.len();
        prop_assert!(frames.good.iter().zip(&payloads).all(|((_, got), want)| got == &want.as_slice()));
        match frames.end {
            FrameEnd::Clean => prop_assert!(cut == buf.len() || starts.contains(&cut)),
            FrameEnd::Torn { offset, .. } => prop_assert_eq!(offset, starts[n]),
            FrameEnd::Corrupt { .. } => prop_assert!(false, "cut read as corruption"),
        }
    }

    #[test]
    fn any_byte_flip_before_the_last_frame_is_corruption(
        payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 2..6),
        pos_frac in 0.0f64..1.0,
        flip in 1u8..=255,
    ) {
        let (mut buf, starts) = frames_buf(&payloads);
        let last = *starts.last().unwrap();
        let pos = LOG_MAGIC.len() + ((last - LOG_MAGIC.len()) as f64 * pos_frac) as usize;
        buf[pos] ^= flip;
        let frames = read_frames(&buf, LOG_MAGIC.len());
        let is_corrupt = matches!(frames.end, FrameEnd::Corrupt { .. });
        prop_assert!(is_corrupt, "{:?}", frames.end);
    }
}

/// Replication reads only entries that begin where it asks (`replicable`): after a purge a
/// range from before it answers none, not the entries after the purge (which a stream would
/// send after a gap); the store's own read keeps openraft's contract and leaves them out.
#[test]
fn replication_reads_nothing_from_a_purged_start() {
    let dir = TempDir::new().unwrap();
    rt().block_on(async {
        let mut log = LogStore::open(dir.path()).unwrap();
        for i in 1..=10 {
            append(&mut log, vec![blank(1, i)]).await;
        }
        log.purge(log_id(1, 5)).await.unwrap();
        let mut reader = log.get_log_reader().await;
        let read = |entries: Vec<Entry<TypeConfig>>| -> Vec<u64> {
            entries.iter().map(|e| e.log_id.index).collect()
        };
        assert_eq!(
            read(reader.try_get_log_entries(3..8).await.unwrap()),
            Vec::<u64>::new()
        );
        assert_eq!(
            read(reader.try_get_log_entries(6..8).await.unwrap()),
            [6, 7]
        );
        assert_eq!(
            read(reader.try_get_log_entries(9..).await.unwrap()),
            [9, 10]
        );
        assert_eq!(read(log.try_get_log_entries(3..8).await.unwrap()), [6, 7]);
    });
}
