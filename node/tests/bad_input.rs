//! A peer that speaks the membership protocol badly: garbled, truncated and oversized
//! frames are dropped and counted, and the node carries on.

use std::time::{Duration, Instant};

use futures::{AsyncWriteExt, StreamExt};
use libp2p::{
    request_response::{self, ProtocolSupport},
    swarm::SwarmEvent,
    StreamProtocol,
};
use ringleader::{local::LocalCluster, net::MEMBERSHIP_PROTOCOL};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbled_truncated_and_oversized_messages_are_dropped_and_counted() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::new(env!("CARGO_BIN_EXE_ringleader"), root.path());
    cluster.start("target", &[]).unwrap();
    let seed: libp2p::Multiaddr = cluster.seed_of(0).parse().unwrap();

    let mut swarm = libp2p::SwarmBuilder::with_new_identity()
        .with_tokio()
        .with_tcp(
            Default::default(),
            libp2p::noise::Config::new,
            libp2p::yamux::Config::default,
        )
        .unwrap()
        .with_behaviour(|_| {
            request_response::Behaviour::<RawCodec>::new(
                [(
                    StreamProtocol::new(MEMBERSHIP_PROTOCOL),
                    ProtocolSupport::Full,
                )],
                request_response::Config::default(),
            )
        })
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

    let garbage: Vec<u8> = (0..200u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    let bad_frames = [
        frame(&garbage),                           // garbled
        frame(&[0x03]),                            // truncated message
        frame(&[]),                                // empty
        u32::MAX.to_le_bytes().to_vec(),           // declares 4 GiB: refused before allocating
        ((8u32 << 20) + 1).to_le_bytes().to_vec(), // over the frame limit
        vec![0x05, 0x00],                          // truncated length prefix
    ];
    let sent = bad_frames.len() as u64;
    for f in bad_frames {
        swarm.behaviour_mut().send_request(&peer, f);
    }
    // Drive our swarm while polling the node's counters, with a deadline.
    let client = cluster.nodes[0].client();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let _ = tokio::time::timeout(Duration::from_millis(50), swarm.select_next_some()).await;
        let c = tokio::task::block_in_place(|| client.status())
            .unwrap()
            .counters;
        if c.bad_messages >= sent {
            break;
        }
        assert!(Instant::now() < deadline, "bad messages not counted: {c:?}");
    }
    // The node is alive and well.
    let status = tokio::task::block_in_place(|| client.status()).unwrap();
    assert_eq!(status.names_in("alive"), vec!["target"]);
    cluster.stop_all();
}
