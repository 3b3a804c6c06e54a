//! The queue of members whose state is to be gossiped, newest and least-sent first.

use super::hash::IdMap;
use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::hash::Hash;

/// Members queued for dissemination. Each entry names a member, not a snapshot: the
/// current local state of that member is what gets sent. Re-queuing a member resets its
/// transmit count. All operations are O(log n).
#[derive(Debug)]
pub(super) struct Broadcasts<I> {
    /// (transmits so far, newest first, id).
    order: BTreeSet<(u32, Reverse<u64>, I)>,
    index: IdMap<I, (u32, u64)>,
    next_gen: u64,
}

impl<I: Clone + Ord + Hash> Broadcasts<I> {
    pub(super) fn new() -> Self {
        Self {
            order: BTreeSet::new(),
            index: IdMap::default(),
            next_gen: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    /// Queues `id` (again) with zero transmits, ahead of older entries.
    pub(super) fn push(&mut self, id: &I) {
        self.remove(id);
        let gen = self.next_gen;
        self.next_gen += 1;
        self.order.insert((0, Reverse(gen), id.clone()));
        self.index.insert(id.clone(), (0, gen));
    }

    pub(super) fn remove(&mut self, id: &I) {
        if let Some((tx, gen)) = self.index.remove(id) {
            self.order.remove(&(tx, Reverse(gen), id.clone()));
        }
    }

    /// Takes up to `max` members to send, least-sent then newest first, counting one
    /// transmission each; entries reaching `limit` transmissions leave the queue.
    pub(super) fn take(&mut self, max: usize, limit: u32, skip: Option<&I>) -> Vec<I> {
        let mut picked: Vec<(u32, Reverse<u64>, I)> = Vec::with_capacity(max.min(self.len()));
        for entry in self.order.iter() {
            if picked.len() >= max {
                break;
            }
            if Some(&entry.2) == skip {
                continue;
            }
            picked.push(entry.clone());
        }
        let mut out = Vec::with_capacity(picked.len());
        for (tx, gen, id) in picked {
            self.order.remove(&(tx, gen, id.clone()));
            if tx + 1 >= limit {
                self.index.remove(&id);
            } else {
                self.order.insert((tx + 1, gen, id.clone()));
                if let Some(e) = self.index.get_mut(&id) {
                    e.0 = tx + 1;
                }
            }
            out.push(id);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_sent_then_newest_first_and_retired_at_limit() {
        let mut q = Broadcasts::new();
        for id in 1..=3u32 {
            q.push(&id);
        }
        assert_eq!(q.take(2, 2, None), vec![3, 2]);
        assert_eq!(q.take(2, 2, None), vec![1, 3]);
        q.push(&2); // requeued: sent first again
        assert_eq!(q.take(1, 2, None), vec![2]);
        assert_eq!(q.take(10, 2, Some(&2)), vec![1]);
        assert_eq!(q.take(10, 2, None), vec![2]);
        assert_eq!(q.len(), 0);
    }
}
