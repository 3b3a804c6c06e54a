//! `submit`: a user's new job. Its id is its entry's log index; a token seen before
//! answers with the job it made (a retried submit makes no second job).

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::search::record::SearchRecord;
use crate::spec::{JobKind, JobSpec};
use crate::state::{
    tokens, users, BadCommand, ControlResponse, ControlState, EventKind, Job, JobId, JobState,
    TOKEN_BYTES_MAX,
};

/// A new job; its id is derived from this entry's log index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Submit {
    /// The validated spec (boxed: the other commands are small).
    pub spec: Box<JobSpec>,
    /// The client's idempotency token: a retried submit with the same token (after an
    /// answer was lost, say during an election) returns the first submit's id instead of
    /// creating a second job. At most [`TOKEN_BYTES_MAX`] bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The user the job belongs to: the submitting token's (see `domain::state::users`); a
    /// submit from before owners reads as [`users::ADMIN_USER`].
    #[serde(
        default = "users::admin_user",
        skip_serializing_if = "users::is_admin_user"
    )]
    pub owner: String,
}

impl Command for Submit {
    fn check(&self) -> Result<(), BadCommand> {
        match &self.token {
            Some(t) if t.is_empty() || t.len() > TOKEN_BYTES_MAX => Err(BadCommand::Token),
            _ => tokens::check_token_name(&self.owner)
                .map_err(|e| BadCommand::Owner(e.trim_start_matches("name: ").to_owned())),
        }
    }

    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        let Stamp { log_index, at_ms } = at;
        let (spec, token) = (&*self.spec, self.token.as_deref());
        if let Some(id) = token.and_then(|t| state.tokens.get(t)) {
            return ControlResponse::Submitted { id: *id };
        }
        let id = JobId::from_log_index(log_index);
        if let Some(t) = token {
            state.tokens.insert(t.to_owned(), id);
        }
        let mut job = Job::new(id, spec.clone(), &self.owner, at_ms);
        job.push_event(
            at_ms,
            EventKind::Submitted,
            format!("{} job {:?}", spec.kind, spec.name),
        );
        if spec.kind == JobKind::Search {
            // A search holds nothing itself: it runs from the start, its trials are jobs
            // placed by the chief.
            job.state = JobState::Running;
            job.started_at_ms = Some(at_ms);
            job.search = Some(SearchRecord::default());
        }
        state.jobs.insert(id, job);
        ControlResponse::Submitted { id }
    }

    fn origin(&self) -> Origin<'_> {
        Origin::Submit(&self.spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ops::testing::spec;

    #[test]
    fn submit_creates_a_job_and_a_token_names_it_once() {
        let mut state = ControlState::default();
        let submit = Submit {
            spec: Box::new(spec(1, 0)),
            token: Some("t".into()),
            owner: crate::state::users::admin_user(),
        };
        let first = submit.apply(
            &mut state,
            Stamp {
                log_index: 3,
                at_ms: 10,
            },
        );
        assert_eq!(
            first,
            ControlResponse::Submitted {
                id: JobId::from_log_index(3)
            }
        );
        let again = Stamp {
            log_index: 4,
            at_ms: 11,
        };
        assert_eq!(submit.apply(&mut state, again), first);
        assert_eq!(state.jobs.len(), 1);
        assert_eq!(
            state.jobs[&JobId::from_log_index(3)].state,
            JobState::Pending
        );
    }

    #[test]
    fn a_token_must_be_1_to_its_most_bytes() {
        let with = |t: &str| Submit {
            spec: Box::new(spec(1, 0)),
            token: Some(t.into()),
            owner: crate::state::users::admin_user(),
        };
        assert_eq!(with("").check(), Err(BadCommand::Token));
        assert_eq!(
            with(&"x".repeat(TOKEN_BYTES_MAX + 1)).check(),
            Err(BadCommand::Token)
        );
        assert_eq!(with("ok").check(), Ok(()));
    }

    #[test]
    fn a_job_records_its_owner_who_must_be_a_user_name() {
        let by = |owner: &str| Submit {
            spec: Box::new(spec(1, 0)),
            token: None,
            owner: owner.into(),
        };
        assert!(matches!(by("a b").check(), Err(BadCommand::Owner(_))));
        assert!(matches!(by("").check(), Err(BadCommand::Owner(_))));
        let mut state = ControlState::default();
        let at = Stamp {
            log_index: 1,
            at_ms: 1,
        };
        assert_eq!(by("alice").check(), Ok(()));
        by("alice").apply(&mut state, at);
        assert_eq!(state.jobs[&JobId::from_log_index(1)].owner, "alice");
        // The log holds an owner only when it is not the admin: old entries keep their bytes
        // and read back as the admin's.
        let json = serde_json::to_value(by("admin")).unwrap();
        assert!(json.get("owner").is_none(), "{json}");
        let back: Submit = serde_json::from_value(json).unwrap();
        assert_eq!(back.owner, "admin");
        assert_eq!(serde_json::to_value(by("bob")).unwrap()["owner"], "bob");
        // As a log entry too (a submit's entry is written by hand: `at_ms` before its token).
        let entry = crate::state::ControlCommand::new(5, super::super::Op::Submit(by("bob")));
        let text = serde_json::to_string(&entry).unwrap();
        assert!(text.ends_with(r#""at_ms":5,"owner":"bob"}"#), "{text}");
        assert_eq!(
            serde_json::from_str::<crate::state::ControlCommand>(&text).unwrap(),
            entry
        );
    }
}
