//! Users, roles and who may do what to whose job: the pure rules of a shared cluster.
//!
//! Every API token belongs to a *user* and has a *role* ([`Role`]); the cluster's admin
//! token is user [`ADMIN_USER`] with role [`Role::Admin`]. A job, search, trial and dataset
//! records its owner: the user of the token that submitted or added it (a trial, its
//! search's). Tokens made before users existed are users of their own name with role
//! `user`, and jobs in logs written before owners existed belong to [`ADMIN_USER`]
//! (`#[serde(default)]`), so a replayed log keeps working.
//!
//! The rules ([`may`]) are a pure function of the actor's role and user, the action and the
//! subject's owner:
//!
//! | role | may |
//! | --- | --- |
//! | `admin` | everything |
//! | `user` | submit, add and fetch datasets, read every job's summary; cancel, read the logs, metrics, checkpoints and secrets' names of, and remove, what it owns |
//! | `viewer` | read summaries (jobs, datasets, status) |
//!
//! Token management, member removal and key rotation ([`Action::Administer`]) are the
//! admins'. A refusal names the owner (`j-7 belongs to alice; bob may not cancel it`).
//!
//! A user removed (its tokens revoked) keeps its jobs: the owner is a name on the job, not a
//! reference to a token, so its running jobs run on, owned by the same user name.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The cluster admin's user name: the admin token's, and the owner of every job submitted
/// before owners existed.
pub const ADMIN_USER: &str = "admin";

/// The owner a record written before owners existed reads as (serde's default).
pub fn admin_user() -> String {
    ADMIN_USER.to_owned()
}

/// Whether `owner` is [`ADMIN_USER`] (serde skips it, so old records keep their bytes).
pub fn is_admin_user(owner: &str) -> bool {
    owner == ADMIN_USER
}

/// What a token may do ([`may`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything, as the cluster's admin token.
    Admin,
    /// Submits, and acts on what it owns.
    #[default]
    User,
    /// Reads summaries only.
    Viewer,
}

impl Role {
    /// The spelling used in the API and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::User => "user",
            Role::Viewer => "viewer",
        }
    }

    /// Whether this is [`Role::User`] (serde skips it: a token made before roles existed
    /// keeps its bytes).
    pub fn is_user(&self) -> bool {
        *self == Role::User
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Role, String> {
        match s {
            "admin" => Ok(Role::Admin),
            "user" => Ok(Role::User),
            "viewer" => Ok(Role::Viewer),
            other => Err(format!("role: {other:?} is not one of admin, user, viewer")),
        }
    }
}

/// Who a request acts as, resolved from its principal (`ControlState::actor`, in
/// `domain::state::tokens`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// The user.
    pub user: String,
    /// Its token's role.
    pub role: Role,
}

impl Actor {
    /// The cluster's admin (the admin token, an open API, the node itself).
    pub fn admin() -> Actor {
        Actor {
            user: admin_user(),
            role: Role::Admin,
        }
    }

    /// [`may`] for this actor.
    pub fn may(&self, action: Action, owner: Option<&str>) -> Result<(), Refusal> {
        may(self.role, &self.user, action, owner)
    }
}

/// What a request asks to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Read summaries: the job list, a job's state, owner and resources, datasets, status.
    ReadSummary,
    /// Submit a job.
    Submit,
    /// Add a dataset (from the node's `--dataset-source` roots, for a non-admin).
    AddDataset,
    /// Fetch a dataset onto a node (and write it below `--dataset-dest`, for a non-admin).
    FetchDataset,
    /// Cancel a job (owner-scoped).
    Cancel,
    /// Read a job's logs (owner-scoped).
    ReadLogs,
    /// Read a job's metrics and their history (owner-scoped).
    ReadMetrics,
    /// Fetch a job's checkpoints (owner-scoped).
    ReadCheckpoints,
    /// Read the names of a job's secrets (owner-scoped).
    ReadSecretNames,
    /// Remove a dataset (owner-scoped).
    RemoveDataset,
    /// Make or revoke tokens, remove members, rotate the key: the admins'.
    Administer,
}

impl Action {
    /// Whether the action is on something owned, and a `user` may do it to its own.
    fn owner_scoped(self) -> bool {
        matches!(
            self,
            Action::Cancel
                | Action::ReadLogs
                | Action::ReadMetrics
                | Action::ReadCheckpoints
                | Action::ReadSecretNames
                | Action::RemoveDataset
        )
    }

    /// The refusal's verb phrase about the subject (`cancel it`, `read its logs`).
    fn about_it(self) -> &'static str {
        match self {
            Action::ReadSummary => "read it",
            Action::Submit => "submit jobs",
            Action::AddDataset => "add datasets",
            Action::FetchDataset => "fetch it",
            Action::Cancel => "cancel it",
            Action::ReadLogs => "read its logs",
            Action::ReadMetrics => "read its metrics",
            Action::ReadCheckpoints => "fetch its checkpoints",
            Action::ReadSecretNames => "read its secrets' names",
            Action::RemoveDataset => "remove it",
            Action::Administer => "manage tokens, members or the key",
        }
    }

    /// The refusal's verb phrase without a subject (`submit jobs`, `cancel jobs`).
    fn in_general(self) -> &'static str {
        match self {
            Action::ReadSummary => "read summaries",
            Action::Submit => "submit jobs",
            Action::AddDataset => "add datasets",
            Action::FetchDataset => "fetch datasets",
            Action::Cancel => "cancel jobs",
            Action::ReadLogs => "read logs",
            Action::ReadMetrics => "read metrics",
            Action::ReadCheckpoints => "fetch checkpoints",
            Action::ReadSecretNames => "read secrets' names",
            Action::RemoveDataset => "remove datasets",
            Action::Administer => "manage tokens, members or the key",
        }
    }
}

/// Why [`may`] refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The subject belongs to another user.
    NotOwner {
        /// Who asked.
        user: String,
        /// Whose it is.
        owner: String,
        /// What was asked.
        action: Action,
    },
    /// The actor's role does not allow the action at all.
    Role {
        /// Who asked.
        user: String,
        /// Its role.
        role: Role,
        /// What was asked.
        action: Action,
    },
}

impl Refusal {
    /// The message for an API answer (403), naming `subject` (a job id, a dataset's name)
    /// and its owner: `j-7 belongs to alice; bob may not cancel it`.
    pub fn message(&self, subject: &str) -> String {
        match self {
            Refusal::NotOwner {
                user,
                owner,
                action,
            } => format!(
                "{subject} belongs to {owner}; {user} may not {}",
                action.about_it()
            ),
            Refusal::Role { user, role, action } => format!(
                "{user} has role {role}, which may not {}",
                action.in_general()
            ),
        }
    }
}

/// Whether `user` with `role` may do `action` to something owned by `owner` (`None`: an
/// action on nothing owned, such as a submit). The whole rule of the table in the module
/// doc; pure.
pub fn may(role: Role, user: &str, action: Action, owner: Option<&str>) -> Result<(), Refusal> {
    let by_role = || Refusal::Role {
        user: user.to_owned(),
        role,
        action,
    };
    match role {
        Role::Admin => Ok(()),
        Role::Viewer if action == Action::ReadSummary => Ok(()),
        Role::Viewer => Err(by_role()),
        Role::User => match action {
            Action::ReadSummary | Action::Submit | Action::AddDataset | Action::FetchDataset => {
                Ok(())
            }
            Action::Administer => Err(by_role()),
            _ if action.owner_scoped() => match owner {
                Some(owner) if owner == user => Ok(()),
                Some(owner) => Err(Refusal::NotOwner {
                    user: user.to_owned(),
                    owner: owner.to_owned(),
                    action,
                }),
                // Nothing owned to act on: only an admin acts on what has no owner.
                None => Err(by_role()),
            },
            _ => Err(by_role()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNED: [Action; 6] = [
        Action::Cancel,
        Action::ReadLogs,
        Action::ReadMetrics,
        Action::ReadCheckpoints,
        Action::ReadSecretNames,
        Action::RemoveDataset,
    ];

    #[test]
    fn an_admin_does_everything() {
        for action in
            OWNED
                .into_iter()
                .chain([Action::Submit, Action::Administer, Action::ReadSummary])
        {
            assert_eq!(may(Role::Admin, "root", action, Some("alice")), Ok(()));
            assert_eq!(may(Role::Admin, "root", action, None), Ok(()));
        }
    }

    #[test]
    fn a_user_acts_on_what_it_owns_and_reads_every_summary() {
        for action in OWNED {
            assert_eq!(may(Role::User, "alice", action, Some("alice")), Ok(()));
            let refused = may(Role::User, "bob", action, Some("alice")).unwrap_err();
            assert!(
                matches!(&refused, Refusal::NotOwner { owner, .. } if owner == "alice"),
                "{refused:?}"
            );
        }
        for action in [
            Action::Submit,
            Action::AddDataset,
            Action::FetchDataset,
            Action::ReadSummary,
        ] {
            assert_eq!(may(Role::User, "bob", action, None), Ok(()));
            assert_eq!(may(Role::User, "bob", action, Some("alice")), Ok(()));
        }
        assert!(matches!(
            may(Role::User, "bob", Action::Administer, None),
            Err(Refusal::Role { .. })
        ));
        // The admin's jobs are not a user's either.
        assert!(may(Role::User, "bob", Action::Cancel, Some(ADMIN_USER)).is_err());
        let msg = may(Role::User, "bob", Action::Cancel, Some("alice"))
            .unwrap_err()
            .message("j-7");
        assert_eq!(msg, "j-7 belongs to alice; bob may not cancel it");
        let msg = may(Role::User, "bob", Action::ReadLogs, Some("alice"))
            .unwrap_err()
            .message("j-7");
        assert_eq!(msg, "j-7 belongs to alice; bob may not read its logs");
    }

    #[test]
    fn a_viewer_only_reads_summaries() {
        assert_eq!(
            may(Role::Viewer, "carol", Action::ReadSummary, Some("alice")),
            Ok(())
        );
        for action in OWNED.into_iter().chain([
            Action::Submit,
            Action::AddDataset,
            Action::FetchDataset,
            Action::Administer,
        ]) {
            // Not even on what it owns.
            let refused = may(Role::Viewer, "carol", action, Some("carol")).unwrap_err();
            assert!(matches!(refused, Refusal::Role { .. }), "{action:?}");
        }
        let msg = may(Role::Viewer, "carol", Action::Submit, None)
            .unwrap_err()
            .message("j-1");
        assert_eq!(msg, "carol has role viewer, which may not submit jobs");
    }

    #[test]
    fn roles_parse_and_print() {
        for role in [Role::Admin, Role::User, Role::Viewer] {
            assert_eq!(role.as_str().parse::<Role>(), Ok(role));
            assert_eq!(
                serde_json::to_value(role).unwrap(),
                serde_json::json!(role.as_str())
            );
        }
        let e = "root".parse::<Role>().unwrap_err();
        assert!(e.starts_with("role:"), "{e}");
        assert_eq!(Role::default(), Role::User);
    }
}
