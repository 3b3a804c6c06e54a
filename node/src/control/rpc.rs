//! The server of the control plane's RPCs ([`super::protocol`]): Raft's own messages,
//! writes a member forwards to the chief and reads of a rank's log kept on the node that ran
//! it. Every peer that reaches this server passed
//! the swarm's handshake (and the cluster key, when the cluster has one); that makes it a
//! member, not the chief: [`authorize`] lets it forward only what a member may originate.

use std::sync::atomic::Ordering;

use openraft::raft::AppendEntriesResponse;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::{
    cluster::{net::InboundRpc, wire},
    control::{
        handle::ControlHandle,
        protocol::{ProposeError, RpcRequest, RpcResponse},
        state::{ControlCommand, ControlState, JobId},
    },
    jobs::logs::read_log,
};

/// Whether the member `from` (a peer id) may have `cmd` committed by forwarding it to the
/// chief. A member forwards what its users and its own ranks produce: a submit (whose spec
/// is admitted again exactly as the API admits one, see [`crate::jobs::admit`]), a cancel,
/// and the exits and metrics of ranks it runs in the job's current generation. What only the
/// chief decides (placements, failed attempts, unplaceable jobs) is never accepted from the
/// wire: the chief proposes those to its own Raft.
pub fn authorize(from: &str, cmd: &ControlCommand, state: &ControlState) -> Result<(), String> {
    let runs_in_current_generation = |id: JobId, generation: u32, rank: Option<u32>| {
        let job = state.job(id).ok_or_else(|| format!("no job {id}"))?;
        if job.generation != generation {
            return Err(format!(
                "job {id} is at generation {}, not {generation}",
                job.generation
            ));
        }
        let runs = job
            .assignment
            .iter()
            .any(|s| s.member == from && rank.is_none_or(|r| s.rank == r));
        if runs {
            Ok(())
        } else {
            Err(match rank {
                Some(r) => format!("rank {r} of job {id} does not run on the sender"),
                None => format!("job {id} has no rank on the sender"),
            })
        }
    };
    match cmd {
        ControlCommand::Submit { spec, .. } => crate::jobs::admit(spec),
        ControlCommand::Cancel { .. }
        | ControlCommand::DatasetAdd { .. }
        | ControlCommand::DatasetRemove { .. } => Ok(()),
        ControlCommand::WorkerExited {
            id,
            generation,
            rank,
            ..
        } => runs_in_current_generation(*id, *generation, Some(*rank)),
        ControlCommand::Metric { id, generation, .. }
        | ControlCommand::RankLost { id, generation, .. } => {
            runs_in_current_generation(*id, *generation, None)
        }
        ControlCommand::RankStats {
            id,
            generation,
            rank,
            ..
        }
        | ControlCommand::WorkerNote {
            id,
            generation,
            rank,
            ..
        } => runs_in_current_generation(*id, *generation, Some(*rank)),
        ControlCommand::TrialReport { id, generation, .. } => {
            runs_in_current_generation(*id, *generation, Some(0))
        }
        ControlCommand::Place { .. }
        | ControlCommand::TrialStart { .. }
        | ControlCommand::TrialPromote { .. }
        | ControlCommand::TrialCopy { .. }
        | ControlCommand::SearchFinished { .. }
        | ControlCommand::Compact { .. }
        | ControlCommand::Reform { .. }
        | ControlCommand::Blacklist { .. }
        | ControlCommand::Unplaceable { .. }
        | ControlCommand::AttemptFailed { .. } => {
            Err("only the chief places jobs, fails attempts and drives searches; not accepted from a peer".into())
        }
    }
}

/// Answers the peers' RPCs, each on a task of its own, until the node's event loop closes
/// the queue.
pub async fn serve(ctl: ControlHandle, mut rx: mpsc::Receiver<InboundRpc>) {
    while let Some(rpc) = rx.recv().await {
        let ctl = ctl.clone();
        tokio::spawn(async move {
            let resp = match wire::decode_json::<RpcRequest>(&rpc.payload) {
                Ok(RpcRequest::AppendEntries(r)) => {
                    let r = ctl.raft().append_entries(r).await;
                    // Anything but a higher vote means the sender leads this node's term.
                    if matches!(&r, Ok(resp) if !matches!(resp, AppendEntriesResponse::HigherVote(_)))
                    {
                        ctl.leader_contact_ms
                            .store(ctl.uptime_ms(), Ordering::Relaxed);
                    }
                    RpcResponse::AppendEntries(r)
                }
                Ok(RpcRequest::Vote(r)) => RpcResponse::Vote(ctl.raft().vote(r).await),
                Ok(RpcRequest::InstallSnapshot(chunk)) => match chunk.try_into() {
                    Ok(r) => RpcResponse::InstallSnapshot(ctl.raft().install_snapshot(r).await),
                    Err(e) => RpcResponse::Malformed(e),
                },
                Ok(RpcRequest::Propose(cmd)) => {
                    let from = rpc.from.to_string();
                    let allowed = cmd
                        .check()
                        .map_err(|e| e.to_string())
                        .and_then(|()| ctl.read(|s| authorize(&from, &cmd, s)));
                    let r = match allowed {
                        Err(e) => {
                            warn!(peer = %rpc.from, "forwarded command refused: {e}");
                            Err(ProposeError::Rejected(e))
                        }
                        Ok(()) => ctl.propose_local(cmd).await,
                    };
                    RpcResponse::Propose(r)
                }
                Ok(RpcRequest::Logs {
                    job,
                    generation,
                    worker,
                    offset,
                }) => RpcResponse::Logs(read_log(&ctl.jobs_dir, job, generation, worker, offset)),
                Err(e) => {
                    debug!(peer = %rpc.from, "malformed rpc: {e}");
                    RpcResponse::Malformed(e.to_string())
                }
            };
            let payload = wire::encode_json(&resp).unwrap_or_default();
            ctl.node.respond(rpc.key, payload).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        chief::{decide, tests as chief},
        cluster::membership::State,
    };

    #[test]
    fn members_forward_only_what_they_may_originate() {
        let mut state = ControlState::default();
        let id = chief::submit(&mut state, 1, 1);
        let members = vec![chief::member("a", State::Alive, 1)];
        let place = decide(&state, &members, 5, &mut || "ab".repeat(32));
        state.apply(2, &place[0]);
        let runner = members[0].id.to_string();
        let exited = ControlCommand::WorkerExited {
            id,
            generation: 1,
            rank: 0,
            code: 0,
            at_ms: 1,
        };
        assert_eq!(authorize(&runner, &exited, &state), Ok(()));
        assert!(authorize("someone-else", &exited, &state).is_err());
        let stale = ControlCommand::Metric {
            id,
            generation: 7,
            name: "loss".into(),
            value: 1.0,
            step: None,
            at_ms: 1,
        };
        assert!(authorize(&runner, &stale, &state).is_err());
        assert!(authorize(&runner, &place[0], &state)
            .unwrap_err()
            .contains("only the chief"));
        let cancel = ControlCommand::Cancel { id, at_ms: 1 };
        assert_eq!(authorize("anyone", &cancel, &state), Ok(()));
    }
}
