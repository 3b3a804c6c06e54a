//! The control state's API tokens, and the principal a request acts as.
//!
//! `ringleader token create NAME` makes a random token on the node whose API took the
//! request; only its BLAKE3 hash is replicated ([`TokenRecord`]), with the name, the time
//! and who made it, so a copy of the Raft log or a snapshot gives no token. Every node's API
//! accepts the admin token (derived from the cluster key) or a token whose hash is in its
//! replica's state; `token revoke NAME` drops the hash, and each replica refuses the token
//! once it applies the revocation (a heartbeat, about 150 ms, on a healthy cluster).
//! Each token belongs to a user and has a role (`token create NAME --user U --role R`; see
//! `domain::state::users`): a token made before users existed is a user of its own name
//! with role `user`.
//!
//! A [`Principal`] is who a request acts as: the admin, a replicated token (by its hash,
//! never the token), or the node itself. The API's auth middleware sets it for the
//! request's task ([`Principal::scope`]); `control::handle::ControlHandle::propose` and the
//! rank-log reads forward it to the chief or the member holding the log, which refuse a
//! token whose hash left the state meanwhile (`control::rpc::authorize`). Only the admin
//! makes and revokes tokens and removes members.
//!
//! Invariant: at most [`TOKENS_MAX`] tokens; names follow [`check_token_name`]; a hash is
//! [`TOKEN_HASH_HEX_LEN`] lowercase hex digits and names at most one token.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    ignored, rejected,
    users::{Actor, Role, ADMIN_USER},
    ControlResponse, ControlState,
};

/// Most API tokens in the state (every request compares against all of them).
pub const TOKENS_MAX: usize = 1_000;
/// Longest token name, in bytes.
pub const TOKEN_NAME_BYTES_MAX: usize = 64;
/// Length of a token's BLAKE3 hash in hex digits.
pub const TOKEN_HASH_HEX_LEN: usize = 64;
/// Random bytes in a made token (shown as twice as many hex digits).
pub const TOKEN_RANDOM_BYTES: usize = 32;
/// Hex digits of a hash shown by `token ls` (enough to tell tokens apart, not to find one).
pub const TOKEN_HASH_SHOWN_HEX: usize = 8;

/// Who a request acts as.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Principal {
    /// The cluster's admin token (or a `--token-file` token), or an open API (`--insecure`).
    Admin,
    /// A replicated token, by the hex of its BLAKE3 hash.
    Token {
        /// The hash ([`TOKEN_HASH_HEX_LEN`] hex digits).
        hash: String,
    },
    /// The node itself: rank reports, exits, the chief's decisions; what a peer that states
    /// no principal (an older node) is taken as.
    #[default]
    Node,
}

tokio::task_local! {
    /// The principal of the API request this task serves (see [`Principal::scope`]).
    static CURRENT: Principal;
}

impl Principal {
    /// Runs `f` as `self`: proposals and log reads made inside carry it.
    pub async fn scope<F: std::future::Future>(self, f: F) -> F::Output {
        CURRENT.scope(self, f).await
    }

    /// The principal of the API request this task serves; [`Principal::Node`] outside one.
    pub fn current() -> Principal {
        CURRENT.try_with(Clone::clone).unwrap_or_default()
    }

    /// For logs: `admin`, `token:<first hex digits>` or `node`.
    pub fn describe(&self) -> String {
        match self {
            Principal::Admin => "admin".into(),
            Principal::Token { hash } => {
                format!("token:{}", hash.get(..TOKEN_HASH_SHOWN_HEX).unwrap_or(hash))
            }
            Principal::Node => "node".into(),
        }
    }
}

/// One API token as the state keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// The BLAKE3 hash of the token, hex.
    pub hash: String,
    /// When it was made (proposer's clock, ms since the Unix epoch).
    pub created_at_ms: u64,
    /// Who made it (`admin`) and on which node (`admin@<node name>`).
    pub created_by: String,
    /// The user it belongs to (`None`: a token made before users existed, a user of its own
    /// name; see [`TokenRecord::user_or`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// What it may do (a token made before roles existed: `user`).
    #[serde(default, skip_serializing_if = "Role::is_user")]
    pub role: Role,
}

impl TokenRecord {
    /// The user this token, named `name`, belongs to: its own, or its name.
    pub fn user_or<'a>(&'a self, name: &'a str) -> &'a str {
        self.user.as_deref().unwrap_or(name)
    }
}

/// Checks a token's user and role (the error names the field): the user follows the token
/// names' rule, and [`ADMIN_USER`] (the cluster admin's name, who owns the jobs of logs from
/// before owners) goes only with [`Role::Admin`].
pub fn check_user(user: &str, role: Role) -> Result<(), String> {
    check_token_name(user).map_err(|e| format!("user{}", e.trim_start_matches("name")))?;
    if user == ADMIN_USER && role != Role::Admin {
        return Err(format!(
            "user: {ADMIN_USER:?} is the cluster admin's name; give it role admin, or another user"
        ));
    }
    Ok(())
}

/// Checks a token name (the error names the field): 1 to [`TOKEN_NAME_BYTES_MAX`] bytes of ASCII letters, digits, `.`, `_` and `-`, starting with a letter or digit.
pub fn check_token_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > TOKEN_NAME_BYTES_MAX {
        return Err(format!(
            "name: must be 1 to {TOKEN_NAME_BYTES_MAX} bytes, got {}",
            name.len()
        ));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err("name: must start with a letter or digit".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "name: {c:?} is not allowed (letters, digits, '.', '_', '-')"
        ));
    }
    Ok(())
}

/// Whether `hash` is [`TOKEN_HASH_HEX_LEN`] lowercase hex digits.
pub fn is_token_hash(hash: &str) -> bool {
    hash.len() == TOKEN_HASH_HEX_LEN
        && hash
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
}

/// A new random token ([`TOKEN_RANDOM_BYTES`] from the operating system, hex) and its hash.
pub fn new_token() -> (String, String) {
    use rand::RngCore;
    let mut bytes = [0u8; TOKEN_RANDOM_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let token = hex::encode(bytes);
    let hash = blake3::hash(token.as_bytes()).to_hex().to_string();
    (token, hash)
}

impl ControlState {
    /// Applies `TokenCreate` (the command is checked: name, hash, user and role well formed).
    pub(super) fn token_create(
        &mut self,
        name: &str,
        hash: &str,
        created_by: &str,
        (user, role): (Option<&str>, Role),
        at_ms: u64,
    ) -> ControlResponse {
        if self.api_tokens.contains_key(name) {
            return rejected(format!("token {name:?} exists"));
        }
        if self.api_tokens.values().any(|t| t.hash == hash) {
            return rejected("that token exists under another name".into());
        }
        if self.api_tokens.len() >= TOKENS_MAX {
            return rejected(format!(
                "the cluster holds {TOKENS_MAX} tokens already: revoke one"
            ));
        }
        self.api_tokens.insert(
            name.to_owned(),
            TokenRecord {
                hash: hash.to_owned(),
                created_at_ms: at_ms,
                created_by: created_by.to_owned(),
                user: user.map(str::to_owned),
                role,
            },
        );
        ControlResponse::Applied
    }

    /// Applies `TokenRevoke`.
    pub(super) fn token_revoke(&mut self, name: &str) -> ControlResponse {
        match self.api_tokens.remove(name) {
            Some(_) => ControlResponse::Applied,
            None => ignored(format!("no token {name:?}")),
        }
    }

    /// The name of the token whose hash is `hash`, if it is in the state.
    pub fn token_named_by_hash(&self, hash: &str) -> Option<&str> {
        self.api_tokens
            .iter()
            .find(|(_, t)| t.hash == hash)
            .map(|(n, _)| n.as_str())
    }

    /// The replicated tokens' hashes, for the API's check (malformed ones are skipped).
    pub fn token_hashes(&self) -> Vec<blake3::Hash> {
        self.api_tokens
            .values()
            .filter_map(|t| blake3::Hash::from_hex(&t.hash).ok())
            .collect()
    }
}

impl ControlState {
    /// Who `principal` acts as: the admin token and the node itself as [`Actor::admin`], a
    /// replicated token as its user and role; `None` for a token no longer in the state
    /// (revoked).
    pub fn actor(&self, principal: &Principal) -> Option<Actor> {
        match principal {
            Principal::Admin | Principal::Node => Some(Actor::admin()),
            Principal::Token { hash } => {
                self.api_tokens
                    .iter()
                    .find(|(_, t)| t.hash == *hash)
                    .map(|(name, t)| Actor {
                        user: t.user_or(name).to_owned(),
                        role: t.role,
                    })
            }
        }
    }
}

/// The tokens as `token ls` shows them: name → (user, role, created, by, the hash's first
/// digits).
pub fn listing(tokens: &BTreeMap<String, TokenRecord>) -> Vec<serde_json::Value> {
    tokens
        .iter()
        .map(|(name, t)| {
            serde_json::json!({
                "name": name,
                "user": t.user_or(name),
                "role": t.role,
                "created_at_ms": t.created_at_ms,
                "created_by": t.created_by,
                "hash_prefix": t.hash.get(..TOKEN_HASH_SHOWN_HEX).unwrap_or(""),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::JobSpec;
    use crate::state::{
        ops,
        users::{Action, Actor, Role},
        ControlCommand, JobState, Op,
    };

    fn create(name: &str, hash: &str) -> ControlCommand {
        ControlCommand {
            op: Op::TokenCreate(ops::TokenCreate {
                name: name.into(),
                hash: hash.into(),
                created_by: "admin@a".into(),
                user: None,
                role: Default::default(),
            }),
            at_ms: 7,
        }
    }

    #[test]
    fn a_token_is_created_once_and_revoked_once() {
        let mut s = ControlState::default();
        let (token, hash) = new_token();
        assert_eq!(token.len(), 2 * TOKEN_RANDOM_BYTES);
        assert!(is_token_hash(&hash));
        assert_eq!(s.apply(1, &create("ci", &hash)), ControlResponse::Applied);
        assert_eq!(s.api_tokens["ci"].created_at_ms, 7);
        assert_eq!(s.token_named_by_hash(&hash), Some("ci"));
        assert_eq!(
            s.token_hashes(),
            vec![blake3::hash(token.as_bytes())],
            "the state holds the token's hash, never the token"
        );
        assert!(!serde_json::to_string(&s).unwrap().contains(&token));
        // The same name, or the same hash under another name: refused.
        assert!(matches!(
            s.apply(2, &create("ci", &new_token().1)),
            ControlResponse::Rejected { reason } if reason.contains("exists")
        ));
        assert!(matches!(
            s.apply(3, &create("other", &hash)),
            ControlResponse::Rejected { .. }
        ));
        let revoke = ControlCommand {
            op: Op::TokenRevoke(ops::TokenRevoke { name: "ci".into() }),
            at_ms: 8,
        };
        assert_eq!(s.apply(4, &revoke), ControlResponse::Applied);
        assert!(s.token_hashes().is_empty());
        assert_eq!(s.token_named_by_hash(&hash), None);
        assert!(matches!(
            s.apply(5, &revoke),
            ControlResponse::Ignored { .. }
        ));
    }

    #[test]
    fn names_and_hashes_are_checked_and_the_count_is_capped() {
        for bad in ["", "-x", "a b", "a/b", "é", &"x".repeat(65)] {
            let e = check_token_name(bad).unwrap_err();
            assert!(e.starts_with("name:"), "{bad:?}: {e}");
        }
        for good in ["ci", "alice.laptop", "x_1-2", &"x".repeat(64)] {
            assert_eq!(check_token_name(good), Ok(()), "{good:?}");
        }
        let mut s = ControlState::default();
        assert!(matches!(
            s.apply(1, &create("bad name", &new_token().1)),
            ControlResponse::Rejected { .. }
        ));
        assert!(matches!(
            s.apply(2, &create("ok", "ABCD")),
            ControlResponse::Rejected { .. }
        ));
        assert!(s.api_tokens.is_empty());
        for i in 0..TOKENS_MAX {
            s.api_tokens.insert(
                format!("t{i}"),
                TokenRecord {
                    hash: format!("{i:064x}"),
                    created_at_ms: 0,
                    created_by: "admin".into(),
                    user: None,
                    role: Role::User,
                },
            );
        }
        assert!(matches!(
            s.apply(3, &create("one-more", &new_token().1)),
            ControlResponse::Rejected { reason } if reason.contains("1000")
        ));
    }

    #[test]
    fn a_tokens_user_follows_the_name_rule_and_admin_goes_with_role_admin() {
        assert_eq!(check_user("alice", Role::User), Ok(()));
        assert_eq!(check_user("admin", Role::Admin), Ok(()));
        let e = check_user("admin", Role::User).unwrap_err();
        assert!(e.starts_with("user:") && e.contains("role admin"), "{e}");
        let e = check_user("a b", Role::Viewer).unwrap_err();
        assert!(e.starts_with("user:"), "{e}");
        // The state refuses the same, whoever proposed it.
        let mut s = ControlState::default();
        let cmd = ControlCommand::new(
            1,
            Op::TokenCreate(ops::TokenCreate {
                name: "sneaky".into(),
                hash: new_token().1,
                created_by: "admin@a".into(),
                user: Some("admin".into()),
                role: Role::User,
            }),
        );
        assert!(matches!(
            s.apply(1, &cmd),
            ControlResponse::Rejected { reason } if reason.contains("user:")
        ));
    }

    #[tokio::test]
    async fn the_principal_is_scoped_to_the_request_task() {
        assert_eq!(Principal::current(), Principal::Node);
        let p = Principal::Token {
            hash: "ab".repeat(32),
        };
        let seen = p.clone().scope(async { Principal::current() }).await;
        assert_eq!(seen, p);
        assert_eq!(p.describe(), "token:abababab");
        assert_eq!(Principal::current(), Principal::Node);
        // The wire form, and what an older peer's missing field reads as.
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["kind"], "token");
        assert_eq!(serde_json::from_value::<Principal>(v).unwrap(), p);
    }

    fn token(name: &str, user: Option<&str>, role: Role, byte: u8) -> ControlCommand {
        ControlCommand::new(
            1,
            Op::TokenCreate(ops::TokenCreate {
                name: name.into(),
                hash: format!("{byte:02x}").repeat(32),
                created_by: "admin@a".into(),
                user: user.map(str::to_owned),
                role,
            }),
        )
    }

    fn by_hash(byte: u8) -> Principal {
        Principal::Token {
            hash: format!("{byte:02x}").repeat(32),
        }
    }

    #[test]
    fn a_principal_resolves_to_its_tokens_user_and_role() {
        let mut s = ControlState::default();
        assert_eq!(
            s.apply(1, &token("alice.laptop", Some("alice"), Role::User, 1)),
            ControlResponse::Applied
        );
        assert_eq!(
            s.apply(2, &token("ci", None, Role::Viewer, 2)),
            ControlResponse::Applied
        );
        assert_eq!(
            s.actor(&by_hash(1)),
            Some(Actor {
                user: "alice".into(),
                role: Role::User
            })
        );
        // A token without a user is a user of its own name.
        assert_eq!(
            s.actor(&by_hash(2)),
            Some(Actor {
                user: "ci".into(),
                role: Role::Viewer
            })
        );
        assert_eq!(s.actor(&Principal::Admin), Some(Actor::admin()));
        assert_eq!(s.actor(&Principal::Node), Some(Actor::admin()));
        assert_eq!(s.actor(&by_hash(3)), None, "not in the state");
    }

    #[test]
    fn a_removed_user_keeps_its_running_jobs() {
        let mut s = ControlState::default();
        s.apply(1, &token("alice", None, Role::User, 1));
        let spec =
            JobSpec::parse("name = \"a\"\nkind = \"command\"\nworkers = 1\ncommand = [\"true\"]\n")
                .unwrap();
        let submit = ControlCommand::new(
            2,
            Op::Submit(ops::Submit {
                spec: Box::new(spec),
                token: None,
                owner: "alice".into(),
            }),
        );
        let ControlResponse::Submitted { id } = s.apply(2, &submit) else {
            panic!("not submitted")
        };
        let slot = crate::state::Slot {
            member: "m".into(),
            name: "m".into(),
            rank: 0,
            local_rank: 0,
            worker: 0,
            gpus: vec![],
        };
        let place = ControlCommand::new(
            3,
            Op::Place(ops::Place {
                id,
                generation: 1,
                slots: vec![slot],
                secret: "a".repeat(64),
            }),
        );
        assert_eq!(s.apply(3, &place), ControlResponse::Applied);
        let revoke = ControlCommand::new(
            4,
            Op::TokenRevoke(ops::TokenRevoke {
                name: "alice".into(),
            }),
        );
        assert_eq!(s.apply(4, &revoke), ControlResponse::Applied);
        assert_eq!(s.actor(&by_hash(1)), None, "the token is refused now");
        let job = s.job(id).unwrap();
        assert_eq!(job.state, JobState::Running, "the job runs on");
        assert_eq!(job.owner, "alice", "owned by the same user name");
        // Another token of the same user name acts on it again.
        s.apply(5, &token("alice.new", Some("alice"), Role::User, 9));
        let alice = s.actor(&by_hash(9)).unwrap();
        assert_eq!(alice.may(Action::Cancel, Some("alice")), Ok(()));
        assert_eq!(s.job(id).unwrap().state, JobState::Running);
    }
}
