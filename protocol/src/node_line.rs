//! Node → rank: the control lines a node writes to an elastic rank's stdin ([`NodeLine`]).

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::NodeLineError;
use crate::{GENERATION_WORLD_MAX, NODE_LINE_BYTES_MAX};

/// Prefix of a generation line (followed by one space and the JSON object).
pub const GENERATION_LINE_PREFIX: &str = "ringleader-generation";
/// The stop line.
pub const STOP_LINE: &str = "ringleader-stop";

/// One generation of the ring as the node decided it: who this rank is in it and where
/// everyone listens.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generation {
    /// Generation number; a connection from another generation is refused.
    pub generation: u64,
    /// This rank's rank in it.
    pub rank: usize,
    /// Data-plane address of every rank, in rank order.
    pub addrs: Vec<SocketAddr>,
    /// Shared secret of the generation's data-plane connections.
    pub secret: String,
}

impl fmt::Debug for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Generation")
            .field("generation", &self.generation)
            .field("rank", &self.rank)
            .field("addrs", &self.addrs)
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl Generation {
    /// Ranks in the generation.
    pub fn world(&self) -> usize {
        self.addrs.len()
    }

    /// Checks the rank is inside the world and the world is within limits.
    pub fn validate(&self) -> Result<(), NodeLineError> {
        let world = self.world();
        if world == 0 || world > GENERATION_WORLD_MAX {
            return Err(NodeLineError::Invalid(format!(
                "{world} addresses (1..={GENERATION_WORLD_MAX})"
            )));
        }
        if self.rank >= world {
            return Err(NodeLineError::Invalid(format!(
                "rank {} of {world} addresses",
                self.rank
            )));
        }
        Ok(())
    }

    /// The control line announcing this generation (without the newline).
    pub fn to_line(&self) -> String {
        NodeLine::Generation(self.clone()).to_string()
    }
}

/// One line a node writes to a rank's stdin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeLine {
    /// `ringleader-generation {json}`: join this generation (newer ones supersede older ones
    /// not yet joined).
    Generation(Generation),
    /// `ringleader-stop`: end after the current step (so does the end of stdin).
    Stop,
}

impl fmt::Display for NodeLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeLine::Generation(g) => {
                let json = serde_json::to_string(g).map_err(|_| fmt::Error)?;
                write!(f, "{GENERATION_LINE_PREFIX} {json}")
            }
            NodeLine::Stop => f.write_str(STOP_LINE),
        }
    }
}

impl FromStr for NodeLine {
    type Err = NodeLineError;

    /// Parses one control line (surrounding whitespace ignored).
    fn from_str(line: &str) -> Result<NodeLine, NodeLineError> {
        if line.len() > NODE_LINE_BYTES_MAX {
            return Err(NodeLineError::TooLong {
                bytes: line.len(),
                max: NODE_LINE_BYTES_MAX,
            });
        }
        let line = line.trim();
        if line == STOP_LINE {
            return Ok(NodeLine::Stop);
        }
        let json = line
            .strip_prefix(GENERATION_LINE_PREFIX)
            .and_then(|r| r.strip_prefix([' ', '\t']))
            .ok_or_else(|| NodeLineError::Unknown(line.chars().take(40).collect()))?;
        let g: Generation =
            serde_json::from_str(json).map_err(|e| NodeLineError::Json(e.to_string()))?;
        g.validate()?;
        Ok(NodeLine::Generation(g))
    }
}
