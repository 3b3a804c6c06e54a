//! The in-memory commit log: the last few committed train states of one worker.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::state::TrainState;

/// Commits a worker keeps in memory. Two, so that ranks one commit apart (one rank
/// committed step `s + k` just before the failure, another had not yet) still share one.
pub const COMMITS_KEPT: usize = 2;

/// The last `kept` commits of one worker, oldest first.
///
/// Invariant: steps strictly increase from oldest to newest. Pushing a state whose step is
/// not past the newest first drops the commits at or after its step (they belong to a
/// branch of history that was abandoned when the run was restored to an older commit).
#[derive(Debug, Clone)]
pub struct CommitLog {
    commits: VecDeque<Arc<TrainState>>,
    kept: usize,
}

impl Default for CommitLog {
    fn default() -> Self {
        CommitLog::new(COMMITS_KEPT)
    }
}

impl CommitLog {
    /// An empty log keeping the last `kept` commits (at least one).
    pub fn new(kept: usize) -> Self {
        CommitLog {
            commits: VecDeque::new(),
            kept: kept.max(1),
        }
    }

    /// Appends `state`, dropping commits at or after its step and the oldest beyond `kept`.
    pub fn push(&mut self, state: Arc<TrainState>) {
        self.truncate_after(state.meta.step.saturating_sub(1));
        if state.meta.step == 0 {
            self.commits.clear();
        }
        self.commits.push_back(state);
        while self.commits.len() > self.kept {
            self.commits.pop_front();
        }
        debug_assert!(self
            .commits
            .iter()
            .zip(self.commits.iter().skip(1))
            .all(|(a, b)| a.meta.step < b.meta.step));
    }

    /// Drops the commits after `step`.
    pub fn truncate_after(&mut self, step: u64) {
        while self.commits.back().is_some_and(|c| c.meta.step > step) {
            self.commits.pop_back();
        }
    }

    /// Drops every commit.
    pub fn clear(&mut self) {
        self.commits.clear();
    }

    /// The newest commit.
    pub fn latest(&self) -> Option<&Arc<TrainState>> {
        self.commits.back()
    }

    /// The commit of `step`, if kept.
    pub fn get(&self, step: u64) -> Option<&Arc<TrainState>> {
        self.commits.iter().find(|c| c.meta.step == step)
    }

    /// The step of the newest commit at or before `step`.
    pub fn newest_at_or_before(&self, step: u64) -> Option<u64> {
        self.commits
            .iter()
            .rev()
            .map(|c| c.meta.step)
            .find(|&s| s <= step)
    }

    /// Steps of the kept commits, oldest first.
    pub fn steps(&self) -> Vec<u64> {
        self.commits.iter().map(|c| c.meta.step).collect()
    }

    /// Commits kept.
    pub fn len(&self) -> usize {
        self.commits.len()
    }

    /// Whether no commit is kept.
    pub fn is_empty(&self) -> bool {
        self.commits.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elastic::agreement::tests::state_at;

    #[test]
    fn keeps_the_last_commits_and_drops_an_abandoned_branch() {
        let mut log = CommitLog::new(2);
        for s in [4, 8, 12] {
            log.push(Arc::new(state_at(s, 1.0)));
        }
        assert_eq!(log.steps(), vec![8, 12]);
        assert_eq!(log.newest_at_or_before(11), Some(8));
        assert_eq!(log.newest_at_or_before(7), None);
        // Restored to 8 and trained again: the old 12 is another history.
        log.push(Arc::new(state_at(10, 2.0)));
        assert_eq!(log.steps(), vec![8, 10]);
        log.truncate_after(9);
        assert_eq!(log.steps(), vec![8]);
        assert_eq!(log.get(8).map(|c| c.meta.step), Some(8));
    }
}
