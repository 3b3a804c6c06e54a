//! Peers that speak the node's protocols badly: garbled, truncated and oversized membership
//! frames are dropped and counted, and the node carries on; control RPCs that only the chief
//! may originate, or that carry a spec the API would refuse, are refused.

use std::time::{Duration, Instant};

use futures::{AsyncWriteExt, StreamExt};
use libp2p::{
    request_response::{self, ProtocolSupport},
    swarm::SwarmEvent,
    StreamProtocol,
};
use ringleader::{
    cli::local::LocalCluster,
    cluster::net::{MEMBERSHIP_PROTOCOL, RPC_PROTOCOL},
    control::protocol::{ProposeError, RpcRequest, RpcResponse},
    domain::state::{ControlCommand, ControlResponse, JobId, Op, Slot},
    jobs::JobSpec,
};

/// Writes requests as raw bytes, with no length prefix of its own, so a test can send any
/// frame header it likes.
#[derive(Clone, Default)]
struct RawCodec;

impl request_response::Codec for RawCodec {
    type Protocol = StreamProtocol;
    type Request = Vec<u8>;
    type Response = Vec<u8>;

    async fn read_request<T>(&mut self, _: &StreamProtocol, _: &mut T) -> std::io::Result<Vec<u8>>
    where
        T: futures::AsyncRead + Unpin + Send,
    {
        Ok(Vec::new())
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> std::io::Result<Vec<u8>>
    where
        T: futures::AsyncRead + Unpin + Send,
    {
        let mut buf = Vec::new();
        futures::AsyncReadExt::read_to_end(io, &mut buf).await?;
        Ok(buf)
    }

    async fn write_request<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        req: Vec<u8>,
    ) -> std::io::Result<()>
    where
        T: futures::AsyncWrite + Unpin + Send,
    {
        io.write_all(&req).await?;
        io.close().await
    }

    async fn write_response<T>(
        &mut self,
        _: &StreamProtocol,
        _: &mut T,
        _: Vec<u8>,
    ) -> std::io::Result<()>
    where
        T: futures::AsyncWrite + Unpin + Send,
    {
        Ok(())
    }
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

type RawSwarm = libp2p::Swarm<request_response::Behaviour<RawCodec>>;

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

/// A misbehaving member that speaks `protocol` with [`RawCodec`].
async fn raw_peer(cluster: &LocalCluster, protocol: &'static str) -> (RawSwarm, libp2p::PeerId) {
    let behaviour = request_response::Behaviour::<RawCodec>::new(
        [(StreamProtocol::new(protocol), ProtocolSupport::Full)],
        request_response::Config::default(),
    );
    member_swarm(cluster, behaviour).await
}

/// Sends one control RPC and decodes the node's answer (a length-prefixed JSON frame).
async fn call(swarm: &mut RawSwarm, peer: libp2p::PeerId, req: &RpcRequest) -> RpcResponse {
    let id = swarm
        .behaviour_mut()
        .send_request(&peer, frame(&serde_json::to_vec(req).unwrap()));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, swarm.select_next_some()).await {
            Ok(SwarmEvent::Behaviour(request_response::Event::Message {
                message:
                    request_response::Message::Response {
                        request_id,
                        response,
                    },
                ..
            })) if request_id == id => {
                assert!(response.len() >= 4, "short answer: {response:?}");
                return serde_json::from_slice(&response[4..]).unwrap();
            }
            Ok(SwarmEvent::Behaviour(request_response::Event::OutboundFailure {
                error, ..
            })) => panic!("rpc failed: {error}"),
            Ok(_) => {}
            Err(_) => panic!("no answer to {req:?} within 20 s"),
        }
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
    let (mut swarm, peer) = raw_peer(&cluster, RPC_PROTOCOL).await;
    let me = swarm.local_peer_id().to_string();

    // What only the chief decides.
    let place = ControlCommand {
        op: Op::Place {
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
        },
        at_ms: 1,
    };
    let why = refused(call(&mut swarm, peer, &RpcRequest::Propose(place)).await);
    assert!(why.contains("only the chief"), "{why}");
    let failed = ControlCommand {
        op: Op::AttemptFailed {
            id,
            generation: 1,
            reason: "forged".into(),
        },
        at_ms: 1,
    };
    let why = refused(call(&mut swarm, peer, &RpcRequest::Propose(failed)).await);
    assert!(why.contains("only the chief"), "{why}");
    // A rank's exit from a member that does not run it.
    let exited = ControlCommand {
        op: Op::WorkerExited {
            id,
            generation: 1,
            rank: 0,
            code: 0,
        },
        at_ms: 1,
    };
    let why = refused(call(&mut swarm, peer, &RpcRequest::Propose(exited)).await);
    assert!(why.contains("does not run on the sender"), "{why}");
    // A spec the API would refuse, sent already parsed: the field is named.
    let mut bad = JobSpec::parse(spec_text).unwrap();
    bad.workers = 0;
    let submit = |spec: JobSpec| ControlCommand {
        op: Op::Submit {
            spec: Box::new(spec),
            token: None,
        },
        at_ms: 1,
    };
    let why = refused(call(&mut swarm, peer, &RpcRequest::Propose(submit(bad))).await);
    assert!(why.starts_with("workers:"), "{why}");
    // What a member may forward still works.
    let ok = call(
        &mut swarm,
        peer,
        &RpcRequest::Propose(submit(JobSpec::parse(spec_text).unwrap())),
    )
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
    cluster.stop_all();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbled_truncated_and_oversized_messages_are_dropped_and_counted() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::new(env!("CARGO_BIN_EXE_ringleader"), root.path());
    cluster.start("target", &[]).unwrap();
    // A member with the cluster's key that writes raw bytes on the membership streams.
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
    let streams: [Vec<u8>; 4] = [
        [frame(&garbage), frame(&[0x03]), frame(&[])].concat(), // garbled, truncated, empty
        u32::MAX.to_le_bytes().to_vec(), // declares 4 GiB: refused before allocating
        ((8u32 << 20) + 1).to_le_bytes().to_vec(), // over the frame limit
        vec![0x05, 0x00],                // truncated length prefix
    ];
    // Bad messages each stream carries.
    let carried = [3, 1, 1, 1];
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
    for (bytes, n) in streams.into_iter().zip(carried) {
        expected += n;
        'send: loop {
            let mut s = control
                .open_stream(peer, StreamProtocol::new(MEMBERSHIP_PROTOCOL))
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
