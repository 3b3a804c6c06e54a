//! A search's part of the replicated domain: its spec and each trial's job spec ([`spec`]),
//! its record of trials ([`record`]) and the leaderboard made from it ([`leaderboard`]).
//! The control state applies a search's commands with them (`state::trials`); the `search`
//! part above writes summaries and the chief decides what to start (`chief::search`).

pub mod leaderboard;
pub mod record;
pub mod spec;
