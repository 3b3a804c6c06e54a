//! Elastic training, the worker's side: surviving workers stay alive when a rank is lost
//! and go on in a new ring generation (Horovod Elastic, torchft), instead of the whole job
//! restarting from storage.
//!
//! This module owns:
//! - the in-memory [`CommitLog`]: every `checkpoint.commit_every_steps` steps the trainer
//!   commits its [`crate::TrainState`]; the last [`COMMITS_KEPT`] are kept;
//! - the [`agree`]ment after a re-form: on the new generation's communicator the ranks pick
//!   the newest commit every rank holding state has, and the lowest rank holding it
//!   broadcasts it to those that lack it (joiners); with no commit anywhere, the durable
//!   checkpoint ([`agree_on_checkpoint`]) or a fresh start;
//! - the control channel from the node: a [`Generation`] (number, rank, addresses, secret)
//!   from a [`GenerationSource`] ([`GenerationChannel`], fed from stdin control lines by
//!   [`forward_control_lines`]), and how a generation's ring is connected
//!   ([`RingConnector`]: [`TcpConnector`], [`MemoryRing`]);
//! - the loop, [`ElasticRun`]: train; on a re-formable collective failure report it, wait
//!   for the next generation, connect, agree, restore into a new [`crate::Trainer`] and go
//!   on; count the steps lost. A newer generation (or a stop) arriving inside a step that
//!   does not end within [`ABORT_GRACE_MS`] aborts the step's communicator, so that a step
//!   blocked on a silent peer does not wait for the collective's silence bound or deadline.
//!
//! Which ranks form a generation, and when, is the node's decision (its chief), not this
//! module's. A worker left out of a generation should be told to stop (or be restarted):
//! its commits may belong to an abandoned history, and the agreement ignores the commits
//! of ranks that missed a generation for that reason.

pub(crate) mod agreement;
mod error;
mod generation;
mod ring;
mod runner;

pub use crate::commit_log::{CommitLog, COMMITS_KEPT};
pub use agreement::{
    agree, agree_on_checkpoint, decode_state, encode_state, Agreement, Holding, RestoreSource,
    AGREE_ROUNDS_MAX, STATE_BROADCAST_BYTES_MAX,
};
pub use error::ElasticError;
pub use generation::{
    forward_control_lines, generation_channel, parse_control_line, read_bounded_line, Control,
    ControlLineError, Generation, GenerationChannel, GenerationSource, CONTROL_QUEUE_DEPTH,
    GENERATION_LINE_BYTES_MAX, GENERATION_LINE_PREFIX, GENERATION_WORLD_MAX, STOP_LINE,
};
pub use ring::{MemoryRing, RingConnector, TcpConnector};
pub use runner::{reformable, ElasticEvent, ElasticRun, ElasticSummary, Resumed, ABORT_GRACE_MS};
