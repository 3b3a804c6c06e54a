//! Membership messages on one long-lived stream per peer and direction.
//!
//! A SWIM probe is a ping and an ack, each a message of its own; sent as requests of a
//! request-response protocol, every message opened a yamux substream, negotiated its
//! protocol, armed a timeout and waited for an empty response: about ten context switches
//! and a timer thread's wake-up per message, which made most of an idle node's CPU (the
//! note of issue 27 has the profile). Here each peer gets one outbound stream, opened on the
//! first message and kept while messages flow: a message is one length-prefixed frame
//! ([`wire::write_frame`]'s format) written on it.
//!
//! - **Writers.** One task per peer (`write_loop`) owns the outbound stream and a bounded
//!   queue ([`WRITER_QUEUE`]); a full queue drops the message (SWIM tolerates loss; it is
//!   counted as a send failure). A writer that cannot open its stream within
//!   [`OPEN_TIMEOUT_MS`], or whose write fails or stalls past [`WRITE_TIMEOUT_MS`], reports
//!   [`StreamEvent::Failed`] (the loop tells the core the peer is unreachable) and ends; one
//!   with nothing to send for [`WRITER_IDLE_MS`] closes its stream and ends.
//! - **Readers.** One task per inbound stream (`read_loop`) reads frames, each checked
//!   against the frame limit it was given before anything is allocated, and hands them to the
//!   loop. A frame that is oversized or cut short is reported as [`Frame::Bad`] and the
//!   stream is dropped: after a bad length nothing on it can be trusted.
//! - **Close.** A graceful leave queues a [`Out::Close`] behind its announcements and waits
//!   (bounded) until every writer closed its stream and saw the peer drop its side, which a
//!   reader does only once it has read every frame before the end: delivery, not merely a
//!   write into yamux's buffers.
//!
//! Every task lives in the [`PeerStreams`]' `JoinSet`, so dropping it (the event loop ending)
//! stops them all.

use std::{collections::HashMap, io, time::Duration};

use futures::{AsyncWriteExt, StreamExt};
use libp2p::{PeerId, Stream, StreamProtocol};
use tokio::{
    sync::{mpsc, oneshot},
    task::JoinSet,
};

use crate::wire;

/// Messages queued for one peer's writer; more are dropped.
pub const WRITER_QUEUE: usize = 256;
/// How long a writer may take to open its stream (dialing included), in milliseconds.
pub const OPEN_TIMEOUT_MS: u64 = 5_000;
/// How long one frame may take to write, in milliseconds.
pub const WRITE_TIMEOUT_MS: u64 = 5_000;
/// A writer with nothing to send for this long closes its stream, in milliseconds.
pub const WRITER_IDLE_MS: u64 = 60_000;
/// Depth of the queue of frames read (from every peer) into the event loop.
pub const INBOUND_QUEUE: usize = 1_024;

/// A frame as read off a stream: whole, or why there is none.
#[derive(Debug)]
pub enum Frame {
    /// A frame within the size limit (its contents are not checked yet).
    Bytes(Vec<u8>),
    /// A frame that was oversized or cut short; the stream it came on is dropped.
    Bad(String),
}

/// What the streams tell the event loop.
#[derive(Debug)]
pub enum StreamEvent {
    /// A frame from `from`.
    Frame { from: PeerId, frame: Frame },
    /// The writer `writer` to `peer` could not open or write its stream, and ended.
    Failed {
        peer: PeerId,
        writer: u64,
        error: String,
    },
    /// The writer `writer` to `peer` ended (idle, or failed after [`StreamEvent::Failed`]).
    Ended { peer: PeerId, writer: u64 },
}

/// What a writer is given.
pub enum Out {
    /// A message's encoded bytes.
    Frame(Vec<u8>),
    /// Close the stream after the messages queued before it and answer once the peer has
    /// read them all (its reader dropped its side) or the stream failed; the writer ends.
    Close(oneshot::Sender<()>),
}

/// Why a message was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum SendError {
    /// The peer's writer has [`WRITER_QUEUE`] messages waiting.
    QueueFull,
}

/// The outbound writers and inbound readers of one node's membership streams.
pub struct PeerStreams {
    control: libp2p_stream::Control,
    protocol: StreamProtocol,
    writers: HashMap<PeerId, (u64, mpsc::Sender<Out>)>,
    next_writer: u64,
    events: mpsc::Sender<StreamEvent>,
    tasks: JoinSet<()>,
}

impl PeerStreams {
    /// Accepts inbound streams of `protocol` on `control`; returns the streams and the queue
    /// of what they read and report.
    pub fn new(
        mut control: libp2p_stream::Control,
        protocol: StreamProtocol,
        frame_bytes_max: usize,
    ) -> io::Result<(Self, mpsc::Receiver<StreamEvent>)> {
        let (events, rx) = mpsc::channel(INBOUND_QUEUE);
        let mut incoming = control
            .accept(protocol.clone())
            .map_err(|e| io::Error::new(io::ErrorKind::AddrInUse, e.to_string()))?;
        let mut tasks = JoinSet::new();
        let to_loop = events.clone();
        tasks.spawn(async move {
            let mut readers = JoinSet::new();
            loop {
                tokio::select! {
                    next = incoming.next() => match next {
                        Some((peer, stream)) => {
                            readers.spawn(read_loop(peer, stream, frame_bytes_max, to_loop.clone()));
                        }
                        None => return,
                    },
                    // Reap ended readers so the set does not grow.
                    Some(_) = readers.join_next(), if !readers.is_empty() => {}
                }
            }
        });
        Ok((
            PeerStreams {
                control,
                protocol,
                writers: HashMap::new(),
                next_writer: 0,
                events,
                tasks,
            },
            rx,
        ))
    }

    /// Queues `out` for `to`, starting its writer if it has none.
    pub fn send(&mut self, to: PeerId, out: Out) -> Result<(), SendError> {
        let out = match self.writers.get(&to) {
            Some((_, tx)) => match tx.try_send(out) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::TrySendError::Full(_)) => return Err(SendError::QueueFull),
                // The writer ended and its event is not handled yet: start another.
                Err(mpsc::error::TrySendError::Closed(out)) => out,
            },
            None => out,
        };
        let (tx, rx) = mpsc::channel(WRITER_QUEUE);
        let _ = tx.try_send(out);
        self.next_writer += 1;
        let id = self.next_writer;
        self.writers.insert(to, (id, tx));
        self.tasks.spawn(write_loop(
            self.control.clone(),
            self.protocol.clone(),
            to,
            id,
            rx,
            self.events.clone(),
        ));
        Ok(())
    }

    /// Forgets the writer `writer` to `peer` once it ended (a newer one is kept).
    pub fn ended(&mut self, peer: &PeerId, writer: u64) {
        if self.writers.get(peer).is_some_and(|(id, _)| *id == writer) {
            self.writers.remove(peer);
        }
    }

    /// Reaps finished tasks (call now and then so the set does not grow).
    pub fn reap(&mut self) {
        while self.tasks.try_join_next().is_some() {}
    }
}

/// One peer's writer: opens the stream, writes what it is given, ends when idle or failed.
async fn write_loop(
    mut control: libp2p_stream::Control,
    protocol: StreamProtocol,
    peer: PeerId,
    writer: u64,
    mut rx: mpsc::Receiver<Out>,
    events: mpsc::Sender<StreamEvent>,
) {
    let failed = |error: String| StreamEvent::Failed {
        peer,
        writer,
        error,
    };
    let mut stream = match open(&mut control, peer, &protocol).await {
        Ok(stream) => Some(stream),
        Err(error) => {
            let _ = events.send(failed(error)).await;
            None
        }
    };
    let mut buf = Vec::new();
    while let Some(s) = stream.as_mut() {
        let next = tokio::time::timeout(Duration::from_millis(WRITER_IDLE_MS), rx.recv()).await;
        let out = match next {
            Ok(Some(out)) => out,
            // Idle, or the streams were dropped: close quietly.
            _ => {
                let _ = s.close().await;
                break;
            }
        };
        match out {
            Out::Close(done) => {
                use futures::AsyncReadExt;
                // The peer's reader drops its side at the end of the stream, after the
                // frames before it: our read then ends (the caller bounds the wait).
                if s.close().await.is_ok() {
                    let mut byte = [0u8; 1];
                    while let Ok(n) = s.read(&mut byte).await {
                        if n == 0 {
                            break;
                        }
                    }
                }
                let _ = done.send(());
                break;
            }
            Out::Frame(bytes) => {
                buf.clear();
                buf.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                buf.extend_from_slice(&bytes);
                let mut result = write(s, &buf).await;
                if result.is_err() {
                    // The peer may have dropped the stream unread: libp2p-stream drops an
                    // inbound stream that arrives while its accept queue is taken (many
                    // peers opening at once, as at a cluster's start or a partition's
                    // heal). One new stream, then the frame again; a peer that is gone
                    // fails the open as well.
                    result = match open(&mut control, peer, &protocol).await {
                        Ok(fresh) => {
                            *s = fresh;
                            write(s, &buf).await
                        }
                        Err(e) => Err(e),
                    };
                }
                if let Err(error) = result {
                    let _ = events.send(failed(error)).await;
                    stream = None;
                }
            }
        }
    }
    // Answer closes still queued: their messages will not be written, and the leave must
    // not wait for them.
    rx.close();
    while let Ok(out) = rx.try_recv() {
        if let Out::Close(done) = out {
            let _ = done.send(());
        }
    }
    let _ = events.send(StreamEvent::Ended { peer, writer }).await;
}

/// Opens a stream of `protocol` to `peer` (dialing it if need be), within
/// [`OPEN_TIMEOUT_MS`].
pub(super) async fn open(
    control: &mut libp2p_stream::Control,
    peer: PeerId,
    protocol: &StreamProtocol,
) -> Result<Stream, String> {
    match tokio::time::timeout(
        Duration::from_millis(OPEN_TIMEOUT_MS),
        control.open_stream(peer, protocol.clone()),
    )
    .await
    {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(format!("opening a stream: {e}")),
        Err(_) => Err(format!("opening a stream took over {OPEN_TIMEOUT_MS} ms")),
    }
}

/// Writes one encoded frame (length prefix included) and flushes it, within
/// [`WRITE_TIMEOUT_MS`].
pub(super) async fn write<W>(stream: &mut W, frame: &[u8]) -> Result<(), String>
where
    W: futures::AsyncWrite + Unpin,
{
    let write = async {
        stream.write_all(frame).await?;
        stream.flush().await
    };
    match tokio::time::timeout(Duration::from_millis(WRITE_TIMEOUT_MS), write).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("writing: {e}")),
        Err(_) => Err(format!("a write took over {WRITE_TIMEOUT_MS} ms")),
    }
}

/// One inbound stream's reader: frames to the loop until the stream ends or turns bad.
async fn read_loop(
    peer: PeerId,
    mut stream: Stream,
    frame_bytes_max: usize,
    events: mpsc::Sender<StreamEvent>,
) {
    loop {
        let frame = match wire::read_frame_or_end(&mut stream, frame_bytes_max).await {
            Ok(Some(bytes)) => Frame::Bytes(bytes),
            // The writer closed between frames.
            Ok(None) => return,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
                ) =>
            {
                Frame::Bad(e.to_string())
            }
            Err(_) => return,
        };
        let bad = matches!(frame, Frame::Bad(_));
        if events
            .send(StreamEvent::Frame { from: peer, frame })
            .await
            .is_err()
            || bad
        {
            return;
        }
    }
}
