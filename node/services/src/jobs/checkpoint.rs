//! A command rank's checkpoint place: where `ringleader.checkpoint.save`/`load` keep its
//! state in the node's storage, and the capability that lets the rank reach that place,
//! and nothing else, through its own node's API (`api::checkpoints`).
//!
//! - The place ([`Place`]) is the job's, `jobs/<job-id>/files/`, or for a search's trial the
//!   trial's, `experiments/<search-id>/trials/<trial>/files/`: every run of a trial (a re-run
//!   after a failure, a speculative copy, a run after its node died) finds the same place.
//! - The capability ([`capability`]) names the job and the generation it was given for,
//!   `<job>.<generation>.<mac>`, the MAC being BLAKE3's keyed hash of the three (job,
//!   generation, place's path), keyed by [`CheckpointAccess::key`]: a random key each node
//!   draws at start and never shares, so a token is good on the node that launched the rank
//!   only, which is the one its URL names (a rank's node outlives its ranks: they stop with
//!   it). It is not derived from the cluster key: a host that holds the cluster key, a
//!   removed one among them until the key is rotated, could otherwise make a token for any
//!   job's place on every node. It opens its place only while that job lives at that generation
//!   ([`Grant::is_current`], checked against the replicated state at each request): a token
//!   that leaked (another job read it, a log kept it) stops working when the generation
//!   ends. Nothing new is stored or replicated: the node recomputes the MAC from the token
//!   and the route it is asked for.
//! - User code never holds the storage's credentials: it holds a token for one place.
//!
//! Pure: no I/O.

use std::fmt;

use crate::domain::state::{Job, JobId};

/// The most bytes one checkpoint object may hold (the body of a `PUT`), 64 MiB: the API
/// streams a body to the store and cuts it here (`api::checkpoints`).
pub const CHECKPOINT_BYTES_MAX: usize = 64 << 20;

/// The longest checkpoint name, in bytes.
pub const CHECKPOINT_NAME_BYTES_MAX: usize = 64;

/// The rank's variables with its place's URL (`PUT`/`GET <url>/<name>`), its capability
/// (`Authorization: Bearer <token>`) and the API's TLS pin (`sha256:HEX`, set when the URL
/// is https).
pub use ringleader_protocol::env::{
    CHECKPOINT_TLS_SHA256 as CHECKPOINT_TLS_ENV, CHECKPOINT_TOKEN as CHECKPOINT_TOKEN_ENV,
    CHECKPOINT_URL as CHECKPOINT_URL_ENV,
};

/// How a node gives its command ranks their checkpoint place.
#[derive(Clone)]
pub struct CheckpointAccess {
    /// The base URL ranks reach this node's API at (`http://127.0.0.1:PORT`).
    pub api_url: String,
    /// The API's TLS pin when `api_url` is https.
    pub tls_sha256: Option<String>,
    /// The capability key, this node's alone (see the module's doc).
    pub key: [u8; 32],
}

impl fmt::Debug for CheckpointAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckpointAccess")
            .field("api_url", &self.api_url)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// A checkpoint place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// A plain job's.
    Job(JobId),
    /// A search's trial's, shared by all its runs.
    Trial {
        /// The search job.
        search: JobId,
        /// The trial's id in it.
        trial: u32,
    },
}

impl Place {
    /// The place of `job`'s ranks.
    pub fn of(job: &Job) -> Place {
        match &job.trial_of {
            Some(of) => Place::Trial {
                search: of.search,
                trial: of.trial,
            },
            None => Place::Job(job.id),
        }
    }

    /// The directory in the store, with a trailing `/`.
    pub fn dir(&self) -> String {
        match self {
            Place::Job(id) => format!("jobs/{id}/files/"),
            Place::Trial { search, trial } => {
                format!("experiments/{search}/trials/{trial}/files/")
            }
        }
    }

    /// The API route of the place, below `/v1/checkpoints/`: `job/<id>` or
    /// `trial/<search>/<trial>`.
    pub fn route(&self) -> String {
        match self {
            Place::Job(id) => format!("job/{id}"),
            Place::Trial { search, trial } => format!("trial/{search}/{trial}"),
        }
    }
}

/// Who a capability was given to: a job's ranks at one generation
/// ([`Job::process_generation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The job.
    pub job: JobId,
    /// Its generation.
    pub generation: u32,
}

impl Grant {
    /// The grant of `job`'s ranks now.
    pub fn of(job: &Job) -> Grant {
        Grant {
            job: job.id,
            generation: job.process_generation(),
        }
    }

    /// Whether the grant still holds for `place`: its job (as the replicated state has it
    /// now) has not ended, is at the grant's generation, and its place is `place`.
    pub fn is_current(&self, job: Option<&Job>, place: &Place) -> bool {
        job.is_some_and(|j| {
            j.id == self.job
                && !j.state.is_terminal()
                && j.process_generation() == self.generation
                && Place::of(j) == *place
        })
    }
}

fn mac(key: &[u8; 32], grant: Grant, place: &Place) -> blake3::Hash {
    let text = format!(
        "job {} generation {} place {}",
        grant.job,
        grant.generation,
        place.dir()
    );
    blake3::keyed_hash(key, text.as_bytes())
}

/// The capability of `place` for `grant` under `key`: `<job>.<generation>.<64 hex digits>`.
pub fn capability(key: &[u8; 32], grant: Grant, place: &Place) -> String {
    format!(
        "{}.{}.{}",
        grant.job,
        grant.generation,
        mac(key, grant, place).to_hex()
    )
}

/// The grant `given` names, if it is a capability of `place` under `key` (the MAC compared
/// in constant time). Whether the grant is still current is [`Grant::is_current`]'s.
pub fn allows(key: &[u8; 32], place: &Place, given: &str) -> Option<Grant> {
    let mut parts = given.trim().splitn(3, '.');
    let (Some(job), Some(generation), Some(hex)) = (parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let grant = Grant {
        job: job.parse().ok()?,
        generation: generation.parse().ok()?,
    };
    let given = blake3::Hash::from_hex(hex).ok()?;
    // blake3::Hash's equality is constant-time.
    (given == mac(key, grant, place)).then_some(grant)
}

/// Why a checkpoint name was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("checkpoint name {shown:?}: want 1 to 64 of A-Z a-z 0-9 . _ - and not . or ..")]
pub struct BadName {
    /// The name, at most 80 characters of it.
    pub shown: String,
}

/// Checks a checkpoint name: `[A-Za-z0-9._-]{1,64}`, and not `.` or `..`.
pub fn check_name(name: &str) -> Result<(), BadName> {
    let ok = !name.is_empty()
        && name.len() <= CHECKPOINT_NAME_BYTES_MAX
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(BadName {
            shown: name.chars().take(80).collect(),
        })
    }
}

/// The environment a rank of `job` gets for its place.
pub fn rank_env(access: &CheckpointAccess, job: &Job) -> Vec<(String, String)> {
    let place = Place::of(job);
    let mut env = vec![
        (
            CHECKPOINT_URL_ENV.to_string(),
            format!("{}/v1/checkpoints/{}", access.api_url, place.route()),
        ),
        (
            CHECKPOINT_TOKEN_ENV.to_string(),
            capability(&access.key, Grant::of(job), &place),
        ),
    ];
    if let Some(pin) = &access.tls_sha256 {
        env.push((CHECKPOINT_TLS_ENV.to_string(), pin.clone()));
    }
    env
}

/// The address a rank reaches its node's API at, from the API's bound address: loopback
/// when the API listens on a loopback or unspecified address, else the bound address.
pub fn api_addr_for_ranks(bound: std::net::SocketAddr) -> std::net::SocketAddr {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let ip = match bound.ip() {
        IpAddr::V4(v4) if v4.is_loopback() => IpAddr::V4(v4),
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_loopback() || v6.is_unspecified() => {
            IpAddr::V6(Ipv6Addr::LOCALHOST)
        }
        other => other,
    };
    std::net::SocketAddr::new(ip, bound.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> JobId {
        s.parse().unwrap()
    }

    #[test]
    fn places_are_the_jobs_or_the_trials_in_every_run() {
        assert_eq!(Place::Job(id("j-1a")).dir(), "jobs/j-1a/files/");
        let t = Place::Trial {
            search: id("j-4"),
            trial: 7,
        };
        assert_eq!(t.dir(), "experiments/j-4/trials/7/files/");
        assert_eq!(t.route(), "trial/j-4/7");
        assert_eq!(Place::Job(id("j-1a")).route(), "job/j-1a");
    }

    #[test]
    fn a_capability_opens_its_own_place_only() {
        let key = [7u8; 32];
        let a = Place::Job(id("j-1"));
        let b = Place::Job(id("j-2"));
        let t = Place::Trial {
            search: id("j-1"),
            trial: 0,
        };
        let grant = Grant {
            job: id("j-1"),
            generation: 2,
        };
        let cap = capability(&key, grant, &a);
        assert!(cap.starts_with("j-1.2."), "{cap}");
        assert_eq!(allows(&key, &a, &cap), Some(grant));
        assert_eq!(allows(&key, &b, &cap), None);
        assert_eq!(allows(&key, &t, &cap), None);
        assert_eq!(allows(&[8u8; 32], &a, &cap), None, "another cluster's key");
        assert_eq!(allows(&key, &a, ""), None);
        assert_eq!(allows(&key, &a, "not hex"), None);
        assert_eq!(allows(&key, &a, &capability(&key, grant, &b)), None);
        // Another job's or generation's name on this MAC: refused.
        let mac = cap.rsplit('.').next().unwrap();
        for forged in [format!("j-2.2.{mac}"), format!("j-1.3.{mac}")] {
            assert_eq!(allows(&key, &a, &forged), None, "{forged}");
        }
    }

    #[test]
    fn a_grant_holds_while_its_job_lives_at_its_generation_only() {
        let mut state = crate::domain::state::ControlState::default();
        let j = crate::chief::tests::submit_text(
            &mut state,
            "name = \"c\"\nkind = \"command\"\ncommand = [\"true\"]\n",
        );
        let mut job = state.job(j).unwrap().clone();
        let place = Place::of(&job);
        let grant = Grant::of(&job);
        assert!(grant.is_current(Some(&job), &place));
        assert!(!grant.is_current(None, &place), "a job gone from the state");
        assert!(!grant.is_current(Some(&job), &Place::Job(id("j-zz"))));
        let mut other = job.clone();
        other.id = id("j-zz");
        assert!(!grant.is_current(Some(&other), &place), "another job");
        job.generation += 1;
        job.attempt_generation += 1;
        assert!(
            !grant.is_current(Some(&job), &place),
            "its generation ended"
        );
        job.generation -= 1;
        job.attempt_generation -= 1;
        job.state = crate::domain::state::JobState::Succeeded;
        assert!(!grant.is_current(Some(&job), &place), "its job ended");
    }

    #[test]
    fn names_are_short_and_plain() {
        for ok in [
            "state",
            "a",
            "model.pt",
            "epoch-3_b",
            &"x".repeat(64),
            "...",
        ] {
            assert_eq!(check_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "../x",
            "a b",
            "é",
            "a\0",
            &"x".repeat(65),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ranks_reach_their_own_node() {
        let at = |s: &str| api_addr_for_ranks(s.parse().unwrap()).to_string();
        assert_eq!(at("127.0.0.1:7071"), "127.0.0.1:7071");
        assert_eq!(at("127.0.0.2:7071"), "127.0.0.2:7071");
        assert_eq!(at("0.0.0.0:7071"), "127.0.0.1:7071");
        assert_eq!(at("[::]:7071"), "[::1]:7071");
        assert_eq!(at("10.0.0.5:7071"), "10.0.0.5:7071");
    }
}
