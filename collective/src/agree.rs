//! The elastic agreement on a communicator: the rounds of [`ringleader_protocol::Agree`]
//! (pure logic, the spec: docs/book/src/reference/protocol.md *The elastic agreement*), each
//! reduction run as an allreduce over the group. The trainer's re-form and the Python ranks'
//! (`Ring.agree`) both run it here.

use ringleader_protocol::{Agree, Holding, Outcome, Progress};

use crate::{CollectiveError, Communicator, ReduceOp};

impl Communicator {
    /// Runs the agreement with this rank's `mine`: the outcome, the same on every rank, and
    /// whether this rank holds the agreed commit as a holder (its own copy is the group's).
    pub async fn agree(&mut self, mine: Holding) -> Result<(Outcome, bool), CollectiveError> {
        let (mut rounds, mut ask) = Agree::new(self.rank(), mine);
        loop {
            let op = match ask.op {
                ringleader_protocol::ReduceOp::Max => ReduceOp::Max,
                ringleader_protocol::ReduceOp::Min => ReduceOp::Min,
            };
            self.allreduce(&mut ask.values, op).await?;
            match rounds.on_reduced(&ask.values) {
                Progress::Reduce(next) => ask = next,
                Progress::Done(outcome) => {
                    let holds = match outcome {
                        Outcome::Restore { step, .. } => rounds.holds(step),
                        Outcome::Fresh { .. } => false,
                    };
                    return Ok((outcome, holds));
                }
            }
        }
    }
}
