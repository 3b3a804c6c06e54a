//! Peers that speak the node's protocols badly: garbled, truncated and oversized membership
//! and call frames are dropped and counted, and the node carries on; control RPCs that only
//! the chief may originate, or that carry a spec the API would refuse, are refused.

use std::time::{Duration, Instant};

use futures::{AsyncWriteExt, StreamExt};
use libp2p::{swarm::SwarmEvent, StreamProtocol};
use ringleader::{
    cli::local::LocalCluster,
    cluster::{
        net::{MEMBERSHIP_PROTOCOL, RPC_PROTOCOL},
        wire,
    },
    control::protocol::{ProposeError, RpcRequest, RpcResponse},
    domain::state::{ops, ControlCommand, ControlResponse, JobId, Op, Slot},
    jobs::JobSpec,
};

fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

/// A member with a fresh identity and the cluster's key (a member that misbehaves) running
/// `behaviour`, connected to `cluster`'s node 0.
async fn member_swarm<B: libp2p::swarm::NetworkBehaviour>(
    cluster: &LocalCluster,
    behaviour: B,
) -> (libp2p::Swarm<B>, libp2p::PeerId) {
    let seed: libp2p::Multiaddr = cluster.seed_of(0).parse().unwrap();
    let psk = ringleader::cluster::identity::load_cluster_key(cluster.key_file())
        .unwrap()
        .psk;
    let key = libp2p::identity::Keypair::generate_ed25519();
    let transport = ringleader::cluster::net::build_transport(&key, Some(psk)).unwrap();
    let mut swarm = libp2p::SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_other_transport(|_| transport)
        .unwrap()
        .with_behaviour(|_| behaviour)
        .unwrap()
        .build();
    swarm.dial(seed).unwrap();
    let peer = loop {
        match tokio::time::timeout(Duration::from_secs(10), swarm.select_next_some()).await {
            Ok(SwarmEvent::ConnectionEstablished { peer_id, .. }) => break peer_id,
            Ok(_) => {}
            Err(_) => panic!("could not connect to the node"),
        }
    };
    (swarm, peer)
}

/// A misbehaving member's call stream to the node: control RPCs written by hand.
struct Caller {
    stream: libp2p::Stream,
    next_id: u64,
    driver: tokio::task::JoinHandle<()>,
}

impl Caller {
    /// Connects a member with a fresh identity to `cluster`'s node 0 and opens a call stream;
    /// returns it and the member's peer id.
    async fn connect(cluster: &LocalCluster) -> (Caller, String) {
        let (mut swarm, peer) = member_swarm(cluster, libp2p_stream::Behaviour::new()).await;
        let me = swarm.local_peer_id().to_string();
        let mut control = swarm.behaviour().new_control();
        let driver = tokio::spawn(async move {
            loop {
                swarm.select_next_some().await;
            }
        });
        let stream = control
            .open_stream(peer, StreamProtocol::new(RPC_PROTOCOL))
            .await
            .unwrap();
        let caller = Caller {
            stream,
            next_id: 0,
            driver,
        };
        (caller, me)
    }

    /// Writes every request at once, each with its own call id, then reads the answers
    /// (in whatever order they come) and returns them in the order of the requests.
    async fn calls(&mut self, reqs: &[RpcRequest]) -> Vec<RpcResponse> {
        let first = self.next_id + 1;
        for req in reqs {
            self.next_id += 1;
            let frame = wire::call_frame(self.next_id, &serde_json::to_vec(req).unwrap()).unwrap();
            self.stream.write_all(&frame).await.unwrap();
        }
        self.stream.flush().await.unwrap();
        let mut answers: Vec<Option<RpcResponse>> = reqs.iter().map(|_| None).collect();
        for _ in reqs {
            let body = tokio::time::timeout(
                Duration::from_secs(20),
                wire::read_frame(&mut self.stream, wire::CALL_FRAME_BYTES_MAX),
            )
            .await
            .unwrap_or_else(|_| panic!("no answer to {reqs:?} within 20 s"))
            .unwrap();
            let (id, answer) = wire::split_call(body).unwrap();
            let slot = &mut answers[(id - first) as usize];
            assert!(slot.is_none(), "two answers to call {id}");
            *slot = Some(serde_json::from_slice(&answer).unwrap());
        }
        answers.into_iter().map(Option::unwrap).collect()
    }

    /// One call and its answer.
    async fn call(&mut self, req: &RpcRequest) -> RpcResponse {
        self.calls(std::slice::from_ref(req)).await.remove(0)
    }
}

fn refused(resp: RpcResponse) -> String {
    match resp {
        RpcResponse::Propose(Err(ProposeError::Rejected(why))) => why,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_commands_only_a_chief_may_make_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::new(env!("CARGO_BIN_EXE_ringleader"), root.path());
    cluster.start("chief", &[]).unwrap();
    cluster
        .wait_all(Duration::from_secs(30), "a chief", |s| s.chief.is_some())
        .unwrap();
    let client = cluster.nodes[0].client();
    let spec_text = "name = \"held\"\nkind = \"command\"\ncommand = [\"sleep\", \"60\"]\n";
    let id_text = tokio::task::block_in_place(|| client.submit(spec_text)).unwrap();
    let id: JobId = id_text.parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::task::block_in_place(|| client.job(&id_text))
        .unwrap()
        .state
        != "running"
    {
        assert!(Instant::now() < deadline, "the job never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (mut caller, me) = Caller::connect(&cluster).await;

    // What only the chief decides.
    let place = ControlCommand {
        op: Op::Place(ops::Place {
            id,
            generation: 2,
            slots: vec![Slot {
                member: me.clone(),
                name: "intruder".into(),
                rank: 0,
                local_rank: 0,
                worker: 0,
                gpus: Vec::new(),
            }],
            secret: "ab".repeat(32),
        }),
        at_ms: 1,
    };
    let why = refused(caller.call(&RpcRequest::Propose(place)).await);
    assert!(why.contains("only the chief"), "{why}");
    let failed = ControlCommand {
        op: Op::AttemptFailed(ops::AttemptFailed {
            id,
            generation: 1,
            reason: "forged".into(),
        }),
        at_ms: 1,
    };
    // A rank's exit from a member that does not run it, in flight with the forged failure
    // on the same stream: each answer comes back with its call's id.
    let exited = ControlCommand {
        op: Op::WorkerExited(ops::WorkerExited {
            id,
            generation: 1,
            rank: 0,
            code: 0,
            end: None,
        }),
        at_ms: 1,
    };
    let mut answers = caller
        .calls(&[RpcRequest::Propose(failed), RpcRequest::Propose(exited)])
        .await
        .into_iter()
        .map(refused);
    let why = answers.next().unwrap();
    assert!(why.contains("only the chief"), "{why}");
    let why = answers.next().unwrap();
    assert!(why.contains("does not run on the sender"), "{why}");
    // A spec the API would refuse, sent already parsed: the field is named.
    let mut bad = JobSpec::parse(spec_text).unwrap();
    bad.workers = 0;
    let submit = |spec: JobSpec| ControlCommand {
        op: Op::Submit(ops::Submit {
            spec: Box::new(spec),
            token: None,
            owner: ringleader::domain::state::users::admin_user(),
        }),
        at_ms: 1,
    };
    let why = refused(caller.call(&RpcRequest::Propose(submit(bad))).await);
    assert!(why.starts_with("workers:"), "{why}");
    // What a member may forward still works.
    let ok = caller
        .call(&RpcRequest::Propose(submit(
            JobSpec::parse(spec_text).unwrap(),
        )))
        .await;
    assert!(
        matches!(
            ok,
            RpcResponse::Propose(Ok(ControlResponse::Submitted { .. }))
        ),
        "{ok:?}"
    );

    // Nothing forged took effect: the job runs its first generation on the chief.
    let doc = tokio::task::block_in_place(|| client.job(&id_text)).unwrap();
    assert_eq!(doc.state, "running");
    assert_eq!(doc.generation, 1);
    assert_eq!(doc.ring, vec!["chief".to_string()]);
    caller.driver.abort();
    cluster.stop_all();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbled_truncated_and_oversized_messages_are_dropped_and_counted() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::new(env!("CARGO_BIN_EXE_ringleader"), root.path());
    cluster.start("target", &[]).unwrap();
    // A member with the cluster's key that writes raw bytes on the membership and call
    // streams.
    let (mut swarm, peer) = member_swarm(&cluster, libp2p_stream::Behaviour::new()).await;
    let mut control = swarm.behaviour().new_control();
    let driver = tokio::spawn(async move {
        loop {
            swarm.select_next_some().await;
        }
    });

    let garbage: Vec<u8> = (0..200u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    // The well-framed bad messages go on one stream (the node reads on after each); each
    // bad frame goes on a stream of its own (the node drops a stream after one).
    let membership = MEMBERSHIP_PROTOCOL;
    let calls = RPC_PROTOCOL;
    let streams: [(&str, Vec<u8>); 6] = [
        // garbled, truncated, empty
        (
            membership,
            [frame(&garbage), frame(&[0x03]), frame(&[])].concat(),
        ),
        // declares 4 GiB: refused before allocating
        (membership, u32::MAX.to_le_bytes().to_vec()),
        // over the frame limit
        (membership, ((8u32 << 20) + 1).to_le_bytes().to_vec()),
        // truncated length prefix
        (membership, vec![0x05, 0x00]),
        // a call frame too short for its call id
        (calls, frame(&[1, 2, 3])),
        // a call frame over the limit (a message of 4 MiB and its id)
        (
            calls,
            ((wire::CALL_FRAME_BYTES_MAX + 1) as u32)
                .to_le_bytes()
                .to_vec(),
        ),
    ];
    // Bad messages each stream carries.
    let carried = [3, 1, 1, 1, 1, 1];
    let client = cluster.nodes[0].client();
    let bad_messages = || {
        tokio::task::block_in_place(|| client.status())
            .unwrap()
            .counters
    };
    // The streams are kept open until the counters are read: a dropped stream is reset,
    // and the node may see the reset before the bytes (a reset is no bad message). A
    // stream that arrives while the node's accept queue is taken is dropped unread
    // (libp2p-stream), so a stream whose messages are not counted within a while is sent
    // again, as the node's own writers do.
    let mut open = Vec::new();
    let mut expected = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    for ((protocol, bytes), n) in streams.into_iter().zip(carried) {
        expected += n;
        'send: loop {
            let mut s = control
                .open_stream(peer, StreamProtocol::new(protocol))
                .await
                .unwrap();
            // The node drops a stream as soon as it reads a bad length, so the write or
            // the close may find it gone: only the node's counters tell.
            if s.write_all(&bytes).await.is_ok() {
                let _ = s.close().await;
            }
            open.push(s);
            let resend = Instant::now() + Duration::from_secs(2);
            loop {
                let c = bad_messages();
                if c.bad_messages >= expected {
                    break 'send;
                }
                assert!(Instant::now() < deadline, "bad messages not counted: {c:?}");
                if Instant::now() > resend {
                    continue 'send;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    drop(open);
    driver.abort();
    // The node is alive and well.
    let status = tokio::task::block_in_place(|| client.status()).unwrap();
    assert_eq!(status.names_in("alive"), vec!["target"]);
    cluster.stop_all();
}
