//! The control plane's remote calls (Raft's messages, forwarded writes, log reads) on one
//! long-lived stream per peer.
//!
//! Sent as requests of libp2p's request-response protocol, every call opened a yamux
//! substream, negotiated its protocol, armed a timeout on futures-timer's thread and closed
//! the substream again: the chief's Raft heartbeats (then every 150 ms to every member) were
//! most of an idle chief's CPU, and the answers most of an idle follower's
//! (`docs/book/src/design/scale-history.md`, "Idle cost", has the figures). Here a caller keeps one
//! outbound stream per peer ([`RPC_PROTOCOL`]) and carries its calls on it, each answered on the
//! same stream:
//!
//! - **Frames.** Both ways a frame is [`wire::call_frame`]: the 4-byte length, a call id, the
//!   message. The caller numbers its calls; the callee answers each with the id of its
//!   request, in whatever order the answers are ready. A frame longer than
//!   [`wire::CALL_FRAME_BYTES_MAX`] (refused before anything is allocated), cut short, or
//!   too short to hold its id is reported ([`BadCall`]) and its stream dropped: after a bad
//!   length nothing on it can be trusted.
//! - **Callers.** One task per peer (`caller_loop`) owns the stream's write half and the
//!   calls waiting for their answers (at most [`CALLS_IN_FLIGHT_MAX`]); a reader task per
//!   stream hands it the answers. A write that fails opens one new stream and writes the call
//!   again (the peer may have dropped the stream unread, as with the membership streams,
//!   [`super::streams`], whose open and write this shares); a second failure, or an open
//!   that fails, answers the call [`RpcError::Unreachable`] (openraft is told the peer is
//!   unreachable and retries). When a stream ends or turns bad, every call still waiting on
//!   it is answered `Unreachable` at once. A caller with no call for
//!   [`streams::WRITER_IDLE_MS`] closes its stream and ends. `NodeHandle::rpc` bounds each
//!   call by [`CALL_TIMEOUT_MS`].
//! - **Callees.** One task per inbound stream (`callee_loop`) reads requests and hands each
//!   to the handler ([`InboundRpc`]; a full handler queue makes it wait, which stops reading
//!   the stream: nothing is dropped), and writes the answers ([`Reply`]) back on the stream.
//!
//! Every task lives in the [`PeerCalls`]' `JoinSet`, so dropping it stops them all.

use std::{collections::HashMap, io, time::Duration};

use futures::{
    io::{ReadHalf, WriteHalf},
    AsyncReadExt, AsyncWriteExt, StreamExt,
};
use libp2p::{PeerId, Stream, StreamProtocol};
use tokio::{
    sync::{mpsc, oneshot},
    task::JoinSet,
};

use super::{streams, wire};

/// The protocol of the remote calls between nodes (2: every call of a peer on one
/// long-lived stream with call ids; 1 sent each as a request-response substream).
pub const RPC_PROTOCOL: &str = "/ringleader/rpc/2";
/// Longest a call waits for its answer, in milliseconds (snapshot chunks included).
pub const CALL_TIMEOUT_MS: u64 = 10_000;
/// Calls to one peer waiting for their answers; more are answered `Unreachable` at once.
pub const CALLS_IN_FLIGHT_MAX: usize = 256;
/// Calls queued for one peer's caller before it writes them; more are answered
/// `Unreachable` at once.
pub const CALL_QUEUE: usize = 256;
/// Answers queued for one inbound stream's writer.
pub const ANSWER_QUEUE: usize = 64;
/// Depth of the queue of bad frames reported to the event loop.
const BAD_QUEUE: usize = 64;

/// Why a call got no answer.
#[derive(Clone, Debug, thiserror::Error)]
pub enum RpcError {
    /// The peer could not be reached, or the stream failed before the answer came.
    #[error("peer {peer} unreachable: {reason}")]
    Unreachable { peer: PeerId, reason: String },
    /// The request could not be framed (over the frame limit): a bug of the caller.
    #[error("request not sent: {0}")]
    Unsendable(wire::WireError),
    /// The node is shutting down.
    #[error("node is shutting down")]
    ShuttingDown,
}

/// A call from a peer, waiting for its handler's answer.
#[derive(Debug)]
pub struct InboundRpc {
    /// The authenticated sender.
    pub from: PeerId,
    /// The request (not yet decoded).
    pub payload: Vec<u8>,
    /// Where the answer goes.
    pub reply: Reply,
}

/// The way back to the caller of one [`InboundRpc`].
#[derive(Debug)]
pub struct Reply {
    id: u64,
    answers: mpsc::Sender<(u64, Vec<u8>)>,
}

impl Reply {
    /// Sends `answer` back on the stream the request came on (nothing, if it is gone).
    pub async fn send(self, answer: Vec<u8>) {
        let _ = self.answers.send((self.id, answer)).await;
    }
}

/// A frame from `peer` that was oversized, cut short or had no whole call id; the stream it
/// came on was dropped.
#[derive(Debug)]
pub struct BadCall {
    pub peer: PeerId,
    pub reason: String,
}

/// A call handed to a peer's caller.
struct Call {
    payload: Vec<u8>,
    reply: oneshot::Sender<Result<Vec<u8>, RpcError>>,
}

/// One node's callers (one per peer called) and callees (one per inbound stream).
pub struct PeerCalls {
    control: libp2p_stream::Control,
    protocol: StreamProtocol,
    callers: HashMap<PeerId, mpsc::Sender<Call>>,
    bad: mpsc::Sender<BadCall>,
    tasks: JoinSet<()>,
}

impl PeerCalls {
    /// Calls on `control`; returns them and the queue of bad frames they read.
    pub fn new(control: libp2p_stream::Control) -> (Self, mpsc::Receiver<BadCall>) {
        let (bad, bad_rx) = mpsc::channel(BAD_QUEUE);
        let calls = PeerCalls {
            control,
            protocol: StreamProtocol::new(RPC_PROTOCOL),
            callers: HashMap::new(),
            bad,
            tasks: JoinSet::new(),
        };
        (calls, bad_rx)
    }

    /// Accepts the peers' call streams and hands their requests to `handler`.
    pub fn serve(&mut self, handler: mpsc::Sender<InboundRpc>) -> io::Result<()> {
        let mut incoming = self
            .control
            .accept(self.protocol.clone())
            .map_err(|e| io::Error::new(io::ErrorKind::AddrInUse, e.to_string()))?;
        let bad = self.bad.clone();
        self.tasks.spawn(async move {
            let mut callees = JoinSet::new();
            loop {
                tokio::select! {
                    next = incoming.next() => match next {
                        Some((peer, stream)) => {
                            callees.spawn(callee_loop(peer, stream, handler.clone(), bad.clone()));
                        }
                        None => return,
                    },
                    // Reap ended callees so the set does not grow.
                    Some(_) = callees.join_next(), if !callees.is_empty() => {}
                }
            }
        });
        Ok(())
    }

    /// Calls `to` with `payload`; `reply` gets the answer or why there is none.
    pub fn call(
        &mut self,
        to: PeerId,
        payload: Vec<u8>,
        reply: oneshot::Sender<Result<Vec<u8>, RpcError>>,
    ) {
        let call = Call { payload, reply };
        let call = match self.callers.get(&to) {
            Some(tx) => match tx.try_send(call) {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Full(call)) => {
                    let _ = call.reply.send(Err(RpcError::Unreachable {
                        peer: to,
                        reason: format!("{CALL_QUEUE} calls already queued"),
                    }));
                    return;
                }
                // The caller ended (idle): start another.
                Err(mpsc::error::TrySendError::Closed(call)) => call,
            },
            None => call,
        };
        while self.tasks.try_join_next().is_some() {}
        self.callers.retain(|_, tx| !tx.is_closed());
        let (tx, rx) = mpsc::channel(CALL_QUEUE);
        let _ = tx.try_send(call);
        self.callers.insert(to, tx);
        self.tasks.spawn(caller_loop(
            self.control.clone(),
            self.protocol.clone(),
            to,
            rx,
            self.bad.clone(),
        ));
    }
}

/// An open outbound stream: its write half, and the answers its reader task reads.
struct Line {
    writer: WriteHalf<Stream>,
    answers: mpsc::Receiver<(u64, Vec<u8>)>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Line {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Opens a stream to `peer` and starts its reader.
async fn open_line(
    control: &mut libp2p_stream::Control,
    peer: PeerId,
    protocol: &StreamProtocol,
    bad: &mpsc::Sender<BadCall>,
) -> Result<Line, String> {
    let (reader, writer) = streams::open(control, peer, protocol).await?.split();
    let (tx, answers) = mpsc::channel(CALLS_IN_FLIGHT_MAX);
    let reader = tokio::spawn(read_frames(peer, reader, tx, bad.clone()));
    Ok(Line {
        writer,
        answers,
        reader,
    })
}

/// The next answer on `line`; never, while there is no stream.
async fn next_answer(line: &mut Option<Line>) -> Option<(u64, Vec<u8>)> {
    match line {
        Some(line) => line.answers.recv().await,
        None => std::future::pending().await,
    }
}

/// Answers every call in `waiting` with `Unreachable` (their stream is gone).
fn fail_waiting(
    waiting: &mut HashMap<u64, oneshot::Sender<Result<Vec<u8>, RpcError>>>,
    peer: PeerId,
    reason: &str,
) {
    for (_, reply) in waiting.drain() {
        let _ = reply.send(Err(RpcError::Unreachable {
            peer,
            reason: reason.to_owned(),
        }));
    }
}

/// One peer's caller: writes calls on its stream (opened on the first), matches answers to
/// calls by id, ends when idle or when the [`PeerCalls`] are dropped.
async fn caller_loop(
    mut control: libp2p_stream::Control,
    protocol: StreamProtocol,
    peer: PeerId,
    mut calls: mpsc::Receiver<Call>,
    bad: mpsc::Sender<BadCall>,
) {
    let unreachable = |reason: String| Err(RpcError::Unreachable { peer, reason });
    let mut line: Option<Line> = None;
    let mut waiting = HashMap::new();
    let mut next_id: u64 = 0;
    loop {
        tokio::select! {
            call = calls.recv() => {
                let Some(Call { payload, reply }) = call else { break };
                // Calls whose callers gave up (timed out) wait no more.
                waiting.retain(|_, w: &mut oneshot::Sender<_>| !w.is_closed());
                if waiting.len() >= CALLS_IN_FLIGHT_MAX {
                    let _ = reply.send(unreachable(format!(
                        "{CALLS_IN_FLIGHT_MAX} calls already wait for answers"
                    )));
                    continue;
                }
                next_id += 1;
                let frame = match wire::call_frame(next_id, &payload) {
                    Ok(frame) => frame,
                    Err(e) => {
                        let _ = reply.send(Err(RpcError::Unsendable(e)));
                        continue;
                    }
                };
                let mut sent = match line.as_mut() {
                    Some(l) => streams::write(&mut l.writer, &frame).await,
                    None => Err("no stream".to_owned()),
                };
                if let Err(first) = sent {
                    // The calls waiting on a failed stream get no answer on a new one.
                    if line.take().is_some() {
                        fail_waiting(&mut waiting, peer, &format!("the stream failed: {first}"));
                    }
                    sent = match open_line(&mut control, peer, &protocol, &bad).await {
                        Ok(mut fresh) => {
                            let r = streams::write(&mut fresh.writer, &frame).await;
                            if r.is_ok() {
                                line = Some(fresh);
                            }
                            r
                        }
                        Err(e) => Err(e),
                    };
                }
                match sent {
                    Ok(()) => {
                        waiting.insert(next_id, reply);
                    }
                    Err(e) => {
                        let _ = reply.send(unreachable(e));
                    }
                }
            }
            answer = next_answer(&mut line) => match answer {
                Some((id, answer)) => {
                    if let Some(reply) = waiting.remove(&id) {
                        let _ = reply.send(Ok(answer));
                    }
                }
                None => {
                    line = None;
                    fail_waiting(&mut waiting, peer, "the stream ended before the answer");
                }
            },
            _ = tokio::time::sleep(Duration::from_millis(streams::WRITER_IDLE_MS)) => {
                waiting.retain(|_, w| !w.is_closed());
                if waiting.is_empty() {
                    break;
                }
            }
        }
    }
    if let Some(mut l) = line.take() {
        let _ = l.writer.close().await;
    }
    fail_waiting(&mut waiting, peer, "the caller ended");
}

/// One inbound stream: its requests to `handler`, their answers back on the stream, until
/// the caller closes it (answers still due are written first) or it turns bad.
async fn callee_loop(
    peer: PeerId,
    stream: Stream,
    handler: mpsc::Sender<InboundRpc>,
    bad: mpsc::Sender<BadCall>,
) {
    let (reader, mut writer): (ReadHalf<Stream>, WriteHalf<Stream>) = stream.split();
    let (requests_tx, mut requests) = mpsc::channel(ANSWER_QUEUE);
    let (answers_tx, mut answers) = mpsc::channel::<(u64, Vec<u8>)>(ANSWER_QUEUE);
    let read = read_frames(peer, reader, requests_tx, bad);
    // `answers_tx` (and each reply's clone) drops when the requests end and their calls are
    // answered: the writer then writes the last answers and closes.
    let dispatch = async move {
        while let Some((id, payload)) = requests.recv().await {
            let reply = Reply {
                id,
                answers: answers_tx.clone(),
            };
            let rpc = InboundRpc {
                from: peer,
                payload,
                reply,
            };
            if handler.send(rpc).await.is_err() {
                return;
            }
        }
    };
    let write = async move {
        while let Some((id, answer)) = answers.recv().await {
            // Answers are encoded within the frame limit (`wire::encode_json`).
            let Ok(frame) = wire::call_frame(id, &answer) else {
                continue;
            };
            if streams::write(&mut writer, &frame).await.is_err() {
                return;
            }
        }
        let _ = writer.close().await;
    };
    tokio::join!(read, dispatch, write);
}

/// Reads call frames from `io` into `out` until the stream ends, `out` is dropped, or a frame
/// is bad (reported on `bad`).
async fn read_frames<R>(
    peer: PeerId,
    mut io: R,
    out: mpsc::Sender<(u64, Vec<u8>)>,
    bad: mpsc::Sender<BadCall>,
) where
    R: futures::AsyncRead + Unpin,
{
    loop {
        match next_call(&mut io).await {
            Ok(Some(frame)) => {
                if out.send(frame).await.is_err() {
                    return;
                }
            }
            Ok(None) => return,
            Err(reason) => {
                let _ = bad.send(BadCall { peer, reason }).await;
                return;
            }
        }
    }
}

/// The next call frame on `io`: `Ok(None)` once the stream ended (cleanly or broken), `Err`
/// with why for a frame oversized, cut short or without a whole call id.
async fn next_call<R>(io: &mut R) -> Result<Option<(u64, Vec<u8>)>, String>
where
    R: futures::AsyncRead + Unpin,
{
    match wire::read_frame_or_end(io, wire::CALL_FRAME_BYTES_MAX).await {
        Ok(Some(body)) => wire::split_call(body).map(Some).map_err(|e| e.to_string()),
        Ok(None) => Ok(None),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
            ) =>
        {
            Err(e.to_string())
        }
        Err(_) => Ok(None),
    }
}
