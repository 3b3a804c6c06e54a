//! The transport under the algorithms: per peer, a frame [`Reader`] and a frame [`Writer`],
//! over TCP (the data plane) or over in-memory channels (tests and single-process groups).
//!
//! The communicator is the one owner of its links: only one operation runs at a time
//! (`&mut self`), and it reads from and writes into the caller's buffer directly, so there is
//! no extra copy on the data path. Every error on a link means that peer is lost.

use std::io::IoSlice;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::error::{CollectiveError, OpDesc};
use crate::frame::{Abort, Header, HEADER_BYTES};

/// Read-buffer size of a TCP link: holds a header and a small payload in one syscall;
/// larger payloads bypass it and land directly in the destination.
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// Frames queued per direction of an in-memory link.
const MEM_QUEUE_FRAMES: usize = 64;
/// Zero bytes written per call when padding out a half-written frame before an abort.
const PAD_BYTES: usize = 64 * 1024;

/// Why an operation failed, and what to relay to the other ranks.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    /// Returned to the caller.
    pub error: CollectiveError,
    /// Sent to every peer in an abort frame.
    pub relay: Abort,
}

impl Failure {
    pub fn lost(rank: usize) -> Self {
        Failure {
            error: CollectiveError::PeerLost { rank },
            relay: Abort::PeerLost { rank },
        }
    }
    pub fn relayed(abort: Abort, ours: Option<OpDesc>) -> Self {
        Failure {
            error: abort.to_error(ours),
            relay: abort,
        }
    }
}

/// One in-memory frame.
struct MemFrame {
    header: [u8; HEADER_BYTES],
    payload: Vec<u8>,
}

enum ReadSide {
    Tcp(BufReader<OwnedReadHalf>),
    Mem {
        rx: mpsc::Receiver<MemFrame>,
        payload: Vec<u8>,
    },
}

enum WriteSide {
    Tcp(OwnedWriteHalf),
    Mem(mpsc::Sender<MemFrame>),
}

/// Receiving half of a link to `peer`.
pub(crate) struct Reader {
    peer: usize,
    side: ReadSide,
    /// Header bytes read so far (header reads are cancel-safe).
    hdr: [u8; HEADER_BYTES],
    hdr_filled: usize,
    /// A header already read by a watcher, delivered by the next [`Reader::next_header`].
    pending: Option<Header>,
}

/// Sending half of a link to `peer`.
pub(crate) struct Writer {
    peer: usize,
    side: WriteSide,
    /// Bytes of the current frame not yet written: non-zero only when a write was cancelled
    /// half-way, in which case they are padded out before an abort frame.
    frame_left: usize,
}

/// Both halves of a link.
pub(crate) struct Link {
    pub reader: Reader,
    pub writer: Writer,
}

impl Link {
    /// A link over an established, authenticated TCP stream.
    pub fn tcp(peer: usize, stream: TcpStream) -> Link {
        let (r, w) = stream.into_split();
        Link {
            reader: Reader::new(
                peer,
                ReadSide::Tcp(BufReader::with_capacity(READ_BUFFER_BYTES, r)),
            ),
            writer: Writer {
                peer,
                side: WriteSide::Tcp(w),
                frame_left: 0,
            },
        }
    }

    /// A pair of connected in-memory links: `(a's link to b, b's link to a)`.
    pub fn mem_pair(a: usize, b: usize) -> (Link, Link) {
        let (tx_ab, rx_ab) = mpsc::channel(MEM_QUEUE_FRAMES);
        let (tx_ba, rx_ba) = mpsc::channel(MEM_QUEUE_FRAMES);
        let mk = |peer, rx, tx| Link {
            reader: Reader::new(
                peer,
                ReadSide::Mem {
                    rx,
                    payload: Vec::new(),
                },
            ),
            writer: Writer {
                peer,
                side: WriteSide::Mem(tx),
                frame_left: 0,
            },
        };
        (mk(b, rx_ba, tx_ab), mk(a, rx_ab, tx_ba))
    }

    /// Relays `abort` to the peer, closes our sending side and drains the receiving side for
    /// up to `linger` so the peer reads the abort frame rather than a reset.
    pub async fn close_with(mut self, abort: Abort, linger: Duration) {
        let deadline = tokio::time::Instant::now() + linger;
        let _ = tokio::time::timeout_at(deadline, self.writer.write_abort(abort)).await;
        let _ = tokio::time::timeout_at(deadline, self.reader.drain()).await;
    }
}

impl Reader {
    fn new(peer: usize, side: ReadSide) -> Self {
        Reader {
            peer,
            side,
            hdr: [0; HEADER_BYTES],
            hdr_filled: 0,
            pending: None,
        }
    }

    /// The peer's rank.
    pub fn peer(&self) -> usize {
        self.peer
    }

    /// The next header. Cancel-safe: a cancelled call loses nothing.
    pub async fn next_header(&mut self) -> Result<Header, Failure> {
        if let Some(h) = self.pending.take() {
            return Ok(h);
        }
        let peer = self.peer;
        match &mut self.side {
            ReadSide::Tcp(r) => {
                while self.hdr_filled < HEADER_BYTES {
                    match r.read(&mut self.hdr[self.hdr_filled..]).await {
                        Ok(0) | Err(_) => return Err(Failure::lost(peer)),
                        Ok(n) => self.hdr_filled += n,
                    }
                }
                self.hdr_filled = 0;
            }
            ReadSide::Mem { rx, payload } => {
                let f = rx.recv().await.ok_or_else(|| Failure::lost(peer))?;
                self.hdr = f.header;
                *payload = f.payload;
            }
        }
        Header::decode(&self.hdr).map_err(|detail| Failure {
            error: CollectiveError::Protocol { rank: peer, detail },
            relay: Abort::PeerLost { rank: peer },
        })
    }

    /// Reads the next header and keeps it for [`Reader::next_header`]. Cancel-safe.
    pub async fn peek_header(&mut self) -> Result<Header, Failure> {
        let h = self.next_header().await?;
        self.pending = Some(h);
        Ok(h)
    }

    /// Reads exactly `buf.len()` payload bytes of the frame whose header was just read.
    /// Not cancel-safe (a cancelled operation poisons the communicator anyway).
    pub async fn read_payload(&mut self, buf: &mut [u8]) -> Result<(), Failure> {
        let peer = self.peer;
        match &mut self.side {
            ReadSide::Tcp(r) => {
                r.read_exact(buf).await.map_err(|_| Failure::lost(peer))?;
            }
            ReadSide::Mem { payload, .. } => {
                if payload.len() != buf.len() {
                    return Err(Failure {
                        error: CollectiveError::Protocol {
                            rank: peer,
                            detail: "payload length".into(),
                        },
                        relay: Abort::PeerLost { rank: peer },
                    });
                }
                buf.copy_from_slice(payload);
            }
        }
        Ok(())
    }

    /// Reads and discards until the peer closes.
    async fn drain(&mut self) {
        match &mut self.side {
            ReadSide::Tcp(r) => {
                let mut sink = [0u8; 16 * 1024];
                while let Ok(n) = r.read(&mut sink).await {
                    if n == 0 {
                        break;
                    }
                }
            }
            ReadSide::Mem { rx, .. } => while rx.recv().await.is_some() {},
        }
    }
}

impl Writer {
    /// Writes one frame: `header` then `payload`.
    pub async fn write_frame(&mut self, header: &Header, payload: &[u8]) -> Result<(), Failure> {
        let hdr = header.encode();
        let peer = self.peer;
        match &mut self.side {
            WriteSide::Tcp(w) => {
                let total = HEADER_BYTES + payload.len();
                let mut done = 0;
                while done < total {
                    let n = if done < HEADER_BYTES {
                        let bufs = [IoSlice::new(&hdr[done..]), IoSlice::new(payload)];
                        w.write_vectored(&bufs).await
                    } else {
                        w.write(&payload[done - HEADER_BYTES..]).await
                    };
                    match n {
                        Ok(0) | Err(_) => return Err(Failure::lost(peer)),
                        Ok(n) => {
                            done += n;
                            self.frame_left = total - done;
                        }
                    }
                }
            }
            WriteSide::Mem(tx) => {
                let frame = MemFrame {
                    header: hdr,
                    payload: payload.to_vec(),
                };
                tx.send(frame).await.map_err(|_| Failure::lost(peer))?;
            }
        }
        Ok(())
    }

    /// Finishes any half-written frame with zeros, writes an abort frame and closes the
    /// sending direction.
    async fn write_abort(&mut self, abort: Abort) {
        let hdr = Header::Abort(abort).encode();
        match &mut self.side {
            WriteSide::Tcp(w) => {
                let zeros = [0u8; PAD_BYTES];
                while self.frame_left > 0 {
                    let n = self.frame_left.min(PAD_BYTES);
                    if w.write_all(&zeros[..n]).await.is_err() {
                        return;
                    }
                    self.frame_left -= n;
                }
                let _ = w.write_all(&hdr).await;
                let _ = w.shutdown().await;
            }
            WriteSide::Mem(tx) => {
                let _ = tx
                    .send(MemFrame {
                        header: hdr,
                        payload: Vec::new(),
                    })
                    .await;
            }
        }
    }
}
