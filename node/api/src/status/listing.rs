//! Bounded lists at size: the filters, pages and summary of `GET /v1/status` and
//! `GET /v1/jobs`, so that a client of a cluster of 1,000 members and 10,000 jobs need not
//! fetch everything.
//!
//! - Members are listed by name; a page starts after `members_after` (a name).
//! - Jobs are listed by id (submission order); a page is the newest `limit` jobs older than
//!   `jobs_before` (`before` on `/v1/jobs`), listed oldest first, so the default page shows
//!   the latest activity and a client walks back in time with the cursor it is given.
//! - Each list holds at most [`STATUS_ROWS_DEFAULT`] rows unless `limit` says otherwise
//!   (at most [`LIST_ROWS_MAX`]): a cluster smaller than that gets the whole lists, as
//!   before. The [`Summary`] block counts every member and job by state whatever the page.
//!
//! Pure functions over the documents and [`ControlState`], without I/O (the bench and the
//! tests call them on a synthetic state).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{JobSummary, MemberDoc, StatusDoc, UsageDoc};
use crate::domain::state::{ControlState, JobId};

/// Rows of each list (members, jobs) that `GET /v1/status` and `GET /v1/jobs` return
/// without a `limit`.
pub const STATUS_ROWS_DEFAULT: usize = 500;
/// The largest `limit` taken, in rows.
pub const LIST_ROWS_MAX: usize = 10_000;
/// Members' states as the API spells them.
pub const MEMBER_STATES: [&str; 5] = ["alive", "suspect", "dead", "left", "removed"];
/// Jobs' states as the API spells them.
/// (`stopped`: a trial's job its search stopped, `domain::state::Job::state_text`.)
pub const JOB_STATES: [&str; 6] = [
    "pending",
    "running",
    "succeeded",
    "failed",
    "cancelled",
    "stopped",
];

/// A bad query: the field and why.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{field}: {why}")]
pub struct BadQuery {
    pub field: &'static str,
    pub why: String,
}

/// `GET /v1/status?member_state=…&job_state=…&limit=…&members_after=NAME&jobs_before=ID`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct StatusQuery {
    /// Only members in this state.
    pub member_state: Option<String>,
    /// Only jobs in this state.
    pub job_state: Option<String>,
    /// Rows of each list, at most [`LIST_ROWS_MAX`]; [`STATUS_ROWS_DEFAULT`] when absent.
    pub limit: Option<usize>,
    /// Members whose name sorts after this one.
    pub members_after: Option<String>,
    /// Jobs older than this one (its id).
    pub jobs_before: Option<String>,
}

/// `GET /v1/jobs?state=…&limit=…&before=ID`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct JobsQuery {
    /// Only jobs in this state.
    pub state: Option<String>,
    /// Rows, at most [`LIST_ROWS_MAX`]; [`STATUS_ROWS_DEFAULT`] when absent.
    pub limit: Option<usize>,
    /// Jobs older than this one (its id).
    pub before: Option<String>,
}

/// The `summary` block of the status document: every member and job counted by state,
/// whatever the filters and page, and where the next page starts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub members_total: usize,
    /// Members per state (only states with members).
    pub members_by_state: BTreeMap<String, usize>,
    pub jobs_total: usize,
    /// Jobs per state (only states with jobs).
    pub jobs_by_state: BTreeMap<String, usize>,
    /// Rows in this answer's `members` and `jobs`.
    pub members_listed: usize,
    pub jobs_listed: usize,
    /// The `members_after` of the next page; null on the last.
    pub members_next: Option<String>,
    /// The `jobs_before` of the next (older) page; null on the last.
    pub jobs_next: Option<String>,
    /// The cpus and GPUs of every alive member, whatever the filters and page: what the
    /// scheduler shares out (the dashboard's scale for each user's bar). Zero from nodes
    /// older than the field.
    #[serde(default)]
    pub capacity: UsageDoc,
}

/// `limit`, checked: 1 to [`LIST_ROWS_MAX`], [`STATUS_ROWS_DEFAULT`] when absent.
pub fn rows(limit: Option<usize>) -> Result<usize, BadQuery> {
    match limit {
        None => Ok(STATUS_ROWS_DEFAULT),
        Some(n) if (1..=LIST_ROWS_MAX).contains(&n) => Ok(n),
        Some(n) => Err(BadQuery {
            field: "limit",
            why: format!("{n} is not 1 to {LIST_ROWS_MAX}"),
        }),
    }
}

/// A state filter, checked against `known`.
fn state_filter<'a>(
    field: &'static str,
    value: &'a Option<String>,
    known: &[&str],
) -> Result<Option<&'a str>, BadQuery> {
    match value.as_deref() {
        None => Ok(None),
        Some(s) if known.contains(&s) => Ok(Some(s)),
        Some(s) => Err(BadQuery {
            field,
            why: format!("{s:?} is not one of {}", known.join(", ")),
        }),
    }
}

fn job_cursor(field: &'static str, value: &Option<String>) -> Result<Option<JobId>, BadQuery> {
    value
        .as_deref()
        .map(|s| {
            s.parse().map_err(|_| BadQuery {
                field,
                why: format!("{s:?} is not a job id (like j-1a)"),
            })
        })
        .transpose()
}

/// A page of jobs from `s`: the newest `limit` jobs in `state` older than `before`, oldest
/// first; and the cursor of the next (older) page, if any.
pub fn job_page(
    s: &ControlState,
    state: Option<&str>,
    before: Option<JobId>,
    limit: usize,
) -> (Vec<JobSummary>, Option<String>) {
    let older = match before {
        Some(b) => s.jobs.range(..b),
        None => s.jobs.range(..),
    };
    let mut page: Vec<JobSummary> = Vec::with_capacity(limit.min(s.jobs.len()));
    let mut next = None;
    for j in older.rev().map(|(_, j)| j) {
        if state.is_some_and(|st| st != j.state_text()) {
            continue;
        }
        if page.len() == limit {
            next = page.last().map(|p: &JobSummary| p.id.clone());
            break;
        }
        page.push(JobSummary::of(j));
    }
    page.reverse();
    (page, next)
}

/// `GET /v1/jobs`: a page of job summaries and the next page's `before`.
pub fn jobs(
    s: &ControlState,
    q: &JobsQuery,
) -> Result<(Vec<JobSummary>, Option<String>), BadQuery> {
    let state = state_filter("state", &q.state, &JOB_STATES)?;
    let before = job_cursor("before", &q.before)?;
    Ok(job_page(s, state, before, rows(q.limit)?))
}

/// Jobs per state in `s`.
pub fn jobs_by_state(s: &ControlState) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for j in s.jobs.values() {
        *by.entry(j.state_text().to_string()).or_insert(0) += 1;
    }
    by
}

/// Cuts `doc` (its members all listed, its jobs not yet) down to the page `q` asks for,
/// taking the jobs from `s`, and fills in its summary.
pub fn page_status(doc: &mut StatusDoc, s: &ControlState, q: &StatusQuery) -> Result<(), BadQuery> {
    let limit = rows(q.limit)?;
    let member_state = state_filter("member_state", &q.member_state, &MEMBER_STATES)?;
    let job_state = state_filter("job_state", &q.job_state, &JOB_STATES)?;
    let before = job_cursor("jobs_before", &q.jobs_before)?;
    let mut members_by_state = BTreeMap::new();
    for m in &doc.members {
        *members_by_state.entry(m.state.clone()).or_insert(0) += 1;
    }
    let members_total = doc.members.len();
    let capacity = doc.alive_capacity().into();
    let members: Vec<MemberDoc> = std::mem::take(&mut doc.members)
        .into_iter()
        .filter(|m| member_state.is_none_or(|st| m.state == st))
        .filter(|m| q.members_after.as_ref().is_none_or(|a| m.name > *a))
        .collect();
    let members_next = (members.len() > limit).then(|| members[limit - 1].name.clone());
    doc.members = members;
    doc.members.truncate(limit);
    let (jobs, jobs_next) = job_page(s, job_state, before, limit);
    doc.jobs = jobs;
    doc.summary = Some(Summary {
        members_total,
        members_by_state,
        jobs_total: s.jobs.len(),
        jobs_by_state: jobs_by_state(s),
        members_listed: doc.members.len(),
        jobs_listed: doc.jobs.len(),
        members_next,
        jobs_next,
        capacity,
    });
    Ok(())
}

/// Counts as `alive 998, dead 2`, in the order of `known` (then any other).
pub fn counts_text(by: &BTreeMap<String, usize>, known: &[&str]) -> String {
    let mut parts: Vec<String> = known
        .iter()
        .filter_map(|k| by.get(*k).map(|n| format!("{k} {n}")))
        .collect();
    parts.extend(
        by.iter()
            .filter(|(k, _)| !known.contains(&k.as_str()))
            .map(|(k, n)| format!("{k} {n}")),
    );
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// A synthetic cluster for tests, without I/O: a status document of `members`
/// members (every 50th dead, every 100th suspect; named `m00000`…, `m00000` answering)
/// and a control state of `jobs` command jobs in every state (4 in 5 succeeded).
#[cfg(any(test, feature = "testing"))]
pub fn synthetic(members: usize, jobs: usize) -> (StatusDoc, ControlState) {
    use crate::domain::state::{ops, ControlCommand, ControlResponse, JobState, Op};
    let members = (0..members)
        .map(|i| {
            let state = match i {
                i if i % 100 == 99 => "suspect",
                i if i % 50 == 49 => "dead",
                _ => "alive",
            };
            let mut m = MemberDoc::for_test(&format!("m{i:05}"), state);
            m.is_self = i == 0;
            m.cpus = 8;
            m.memory_mb = 65_536;
            m.api_addr = format!("10.0.{}.{}:7947", i / 250, i % 250);
            m.data_addr = format!("10.0.{}.{}:7948", i / 250, i % 250);
            m
        })
        .collect();
    let doc = StatusDoc {
        node: crate::cluster::meta::NodeRef {
            id: "id-m00000".into(),
            name: "m00000".into(),
        },
        chief: None,
        term: Some(1),
        members,
        jobs: Vec::new(),
        counters: Default::default(),
        control_fault: None,
        insecure: false,
        api_tls: None,
        summary: None,
        users: Vec::new(),
        seeds_never_reached: Vec::new(),
        python: None,
    };
    let spec = crate::domain::spec::JobSpec::parse(
        "name = \"sweep\"\nkind = \"command\"\nworkers = 1\ncommand = [\"true\"]\n",
    )
    .expect("a valid spec");
    let mut state = ControlState::default();
    for i in 0..jobs {
        let mut spec = spec.clone();
        spec.name = format!("sweep-{i}");
        let cmd = ControlCommand {
            op: Op::Submit(ops::Submit {
                spec: Box::new(spec),
                token: None,
                owner: crate::domain::state::users::admin_user(),
            }),
            at_ms: 1,
        };
        let ControlResponse::Submitted { id } = state.apply(i as u64 + 1, &cmd) else {
            panic!("job {i} not submitted");
        };
        if let Some(j) = state.jobs.get_mut(&id) {
            j.state = match i % 20 {
                0..=15 => JobState::Succeeded,
                16 => JobState::Failed,
                17 => JobState::Cancelled,
                18 => JobState::Running,
                _ => JobState::Pending,
            };
        }
    }
    (doc, state)
}

#[cfg(test)]
mod tests;
