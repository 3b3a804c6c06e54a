//! The request bodies a node receives at once on its bodied routes (checkpoint uploads):
//! at most [`UPLOADS_MAX`] in all and [`UPLOADS_PER_PEER_MAX`] from one peer IP.
//!
//! Why: a body is streamed to the store a buffer at a time, so what one costs is a buffer
//! and a store writer; what bounds the node's memory and its store's writers is how many
//! run at once. A request is authorized on its path and headers first and takes a slot
//! only then; one that finds no slot is answered at once (`429` for its peer's share,
//! `503` for the node's), its body never read. A slot is given back when its
//! [`UploadSlot`] drops (the upload ended, failed, or its connection went).
//!
//! Pure counting behind a lock: no I/O.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
};

/// Most bodies received at once by one node.
pub const UPLOADS_MAX: usize = 16;
/// Most bodies received at once from one peer IP.
pub const UPLOADS_PER_PEER_MAX: usize = 4;

/// Why an upload got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NoSlot {
    /// Its peer has `max` bodies on the way.
    #[error("too many uploads at once from {peer}: at most {max}; retry when one ends")]
    Peer {
        /// The peer.
        peer: IpAddr,
        /// Its share.
        max: usize,
    },
    /// The node has `max` bodies on the way.
    #[error("too many uploads at once on this node: at most {max}; retry")]
    Node {
        /// The node's cap.
        max: usize,
    },
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

/// The bodies being received, by peer.
#[derive(Debug)]
pub struct Uploads {
    counts: Mutex<Counts>,
    max: usize,
    per_peer_max: usize,
}

impl Default for Uploads {
    fn default() -> Self {
        Uploads::new(UPLOADS_MAX, UPLOADS_PER_PEER_MAX)
    }
}

impl Uploads {
    /// At most `max` bodies at once, `per_peer_max` from one peer.
    pub fn new(max: usize, per_peer_max: usize) -> Uploads {
        Uploads {
            counts: Mutex::new(Counts::default()),
            max,
            per_peer_max,
        }
    }

    /// A slot for one body from `peer`, or why there is none.
    pub fn take(self: &Arc<Self>, peer: IpAddr) -> Result<UploadSlot, NoSlot> {
        let mut c = self.counts.lock().expect("uploads lock");
        let mine = c.per_peer.get(&peer).copied().unwrap_or(0);
        if mine >= self.per_peer_max {
            return Err(NoSlot::Peer {
                peer,
                max: self.per_peer_max,
            });
        }
        if c.total >= self.max {
            return Err(NoSlot::Node { max: self.max });
        }
        c.total += 1;
        *c.per_peer.entry(peer).or_default() += 1;
        Ok(UploadSlot {
            uploads: self.clone(),
            peer,
        })
    }

    /// Bodies on the way now.
    pub fn in_flight(&self) -> usize {
        self.counts.lock().expect("uploads lock").total
    }
}

/// One body's slot, given back on drop.
#[derive(Debug)]
pub struct UploadSlot {
    uploads: Arc<Uploads>,
    peer: IpAddr,
}

impl Drop for UploadSlot {
    fn drop(&mut self) {
        let mut c = self.uploads.counts.lock().expect("uploads lock");
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                c.per_peer.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_capped_per_peer_and_in_all_and_come_back_on_drop() {
        let u = Arc::new(Uploads::new(3, 2));
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let a1 = u.take(a).unwrap();
        let _a2 = u.take(a).unwrap();
        assert_eq!(u.take(a).unwrap_err(), NoSlot::Peer { peer: a, max: 2 });
        let _b1 = u.take(b).unwrap();
        let full = u.take(b).unwrap_err();
        assert_eq!(full, NoSlot::Node { max: 3 }, "the node's share is full");
        assert!(full.to_string().contains("at most 3"), "{full}");
        assert_eq!(u.in_flight(), 3);
        drop(a1);
        assert_eq!(u.in_flight(), 2);
        let _b2 = u.take(b).unwrap();
    }
}
