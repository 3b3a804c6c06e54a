//! Helpers shared by the collective's integration tests.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use collective::{CollectiveError, Communicator, GroupConfig, Limits, ReduceOp};
use tokio::{net::TcpListener, task::JoinSet, time::Instant};

/// How long each rank may take to finish its first operation.
const STARTED_WAIT: Duration = Duration::from_secs(20);
/// How long the survivors may take to fail once a rank is killed (far inside the operation
/// deadline of the tests that use it).
const FAIL_WAIT: Duration = Duration::from_secs(10);

/// Every rank (`(rank, its connect)`) allreduces `len` f32 in a loop; once each finished one
/// operation (the group is busy), `victim`'s task is killed: its sockets close, as when its
/// process dies. Returns each survivor's rank, error and the moment it failed, and the moment
/// of the kill. Panics if a rank does not start within 20 s or a survivor hangs for 10 s.
pub async fn allreduce_until_a_rank_is_killed<F>(
    ranks: Vec<(usize, F)>,
    victim: usize,
    len: usize,
) -> (Vec<(usize, CollectiveError, Instant)>, Instant)
where
    F: Future<Output = Communicator> + Send + 'static,
{
    let world = ranks.len();
    let mut set = JoinSet::new();
    let (started_tx, mut started_rx) = tokio::sync::mpsc::channel::<usize>(world);
    let mut killed = None;
    for (rank, connect) in ranks {
        let started = started_tx.clone();
        let fut = async move {
            let mut c = connect.await;
            let mut buf = vec![1.0f32; len];
            let mut ops = 0u64;
            loop {
                if ops == 1 {
                    let _ = started.send(c.rank()).await;
                }
                if let Err(e) = c.allreduce(&mut buf, ReduceOp::Max).await {
                    return (c.rank(), e, Instant::now());
                }
                ops += 1;
            }
        };
        if rank == victim {
            killed = Some(tokio::spawn(fut));
        } else {
            set.spawn(fut);
        }
    }
    for _ in 0..world {
        tokio::time::timeout(STARTED_WAIT, started_rx.recv())
            .await
            .expect("every rank finishes an operation");
    }
    killed.expect("the victim is one of the ranks").abort();
    let killed_at = Instant::now();
    let res = tokio::time::timeout(FAIL_WAIT, set.join_all())
        .await
        .expect("no hang");
    (res, killed_at)
}

/// The group's secret in these tests.
pub const SECRET: &[u8] = b"test secret";

/// Binds one listener per rank on `127.0.0.{hosts[rank]}` (ephemeral ports: no port races)
/// and gives each its rank's config of group `group_id`, generation `generation`.
pub async fn group_on_hosts(
    hosts: &[u8],
    group_id: u64,
    generation: u64,
    limits: Limits,
) -> Vec<(GroupConfig, TcpListener)> {
    let mut ls = Vec::new();
    for h in hosts {
        ls.push(TcpListener::bind(format!("127.0.0.{h}:0")).await.unwrap());
    }
    let addrs: Vec<SocketAddr> = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    ls.into_iter()
        .enumerate()
        .map(|(rank, l)| {
            let cfg = GroupConfig {
                rank,
                world: hosts.len(),
                group_id,
                generation,
                addrs: addrs.clone(),
                secret: SECRET.to_vec(),
                limits: limits.clone(),
            };
            (cfg, l)
        })
        .collect()
}
