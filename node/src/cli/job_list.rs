//! `ringleader jobs`'s table: the jobs users submitted, each search's trials folded into
//! one line under it (`  ↳ 12 trials: 3 running, 7 done, 2 stopped`), or listed under it
//! one by one with `--trials`; steps done of the total, and an ETA while a job runs.
//!
//! A trial's job is a job of its own in the API (`GET /v1/jobs` lists it, with its
//! search's id in `search`), but not one its user submitted: listed beside the user's own
//! jobs, the trials of one search buried them. A trial whose search is not on the page (an
//! older page holds it) is listed as a job, naming its search.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::api::status::{progress::progress_text, JobSummary};

/// How a trial's state reads in the folded line (`succeeded` is `done`), in the line's
/// order; other states follow by name.
const TRIAL_STATE_WORDS: [(&str, &str); 6] = [
    ("running", "running"),
    ("pending", "pending"),
    ("succeeded", "done"),
    ("stopped", "stopped"),
    ("failed", "failed"),
    ("cancelled", "cancelled"),
];

/// The table of `jobs` (a page, oldest first): a row per job that is not a trial of a
/// search on the page, then its trials folded (or, with `trials`, listed). `now_ms`: the
/// reader's clock, for ETAs.
pub fn table(jobs: &[JobSummary], trials: bool, now_ms: u64) -> String {
    let mut of_search: BTreeMap<&str, Vec<&JobSummary>> = BTreeMap::new();
    for j in jobs {
        if let Some(search) = j.search.as_deref() {
            if jobs.iter().any(|s| s.id == search) {
                of_search.entry(search).or_default().push(j);
            }
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<10} {:<24} {:<16} {:<8} {:<10} PROGRESS",
        "ID", "NAME", "OWNER", "KIND", "STATE"
    );
    for j in jobs {
        if j.search
            .as_deref()
            .is_some_and(|s| of_search.contains_key(s))
        {
            continue;
        }
        let mut name = j.name.clone();
        if let Some(search) = &j.search {
            name = format!("{name} (trial of {search})");
        }
        let _ = writeln!(
            out,
            "{:<10} {:<24} {:<16} {:<8} {:<10} {}",
            j.id,
            name,
            j.owner,
            j.kind,
            j.state,
            progress_text(&j.progress(), now_ms)
        );
        let Some(rows) = of_search.get(j.id.as_str()) else {
            continue;
        };
        if trials {
            for t in rows {
                let _ = writeln!(
                    out,
                    "  ↳ {:<8} {:<24} {:<10} {}",
                    t.id,
                    t.name,
                    t.state,
                    progress_text(&t.progress(), now_ms)
                );
            }
        } else {
            let _ = writeln!(out, "  ↳ {}", folded(rows));
        }
    }
    out
}

/// `12 trials: 3 running, 7 done, 2 stopped`.
fn folded(trials: &[&JobSummary]) -> String {
    let mut by: BTreeMap<&str, usize> = BTreeMap::new();
    for t in trials {
        *by.entry(t.state.as_str()).or_default() += 1;
    }
    let mut parts: Vec<String> = TRIAL_STATE_WORDS
        .iter()
        .filter_map(|(state, word)| by.remove(state).map(|n| format!("{n} {word}")))
        .collect();
    parts.extend(by.iter().map(|(state, n)| format!("{n} {state}")));
    let noun = if trials.len() == 1 { "trial" } else { "trials" };
    format!("{} {noun}: {}", trials.len(), parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, kind: &str, state: &str, search: Option<&str>) -> JobSummary {
        serde_json::from_value(serde_json::json!({
            "id": id, "name": format!("n-{id}"), "owner": "alice", "kind": kind,
            "state": state, "search": search,
        }))
        .unwrap()
    }

    /// A page: a train job, a search with five trials, a trial of an older search.
    fn page() -> Vec<JobSummary> {
        let mut train = job("j-1", "train", "succeeded", None);
        (train.step, train.total_steps) = (Some(1350), Some(1350));
        let mut running = job("j-4", "command", "running", Some("j-2"));
        (running.step, running.total_steps, running.eta_at_ms) =
            (Some(300), Some(1350), Some(145_000));
        vec![
            train,
            job("j-2", "search", "running", None),
            job("j-3", "command", "succeeded", Some("j-2")),
            running,
            job("j-5", "command", "stopped", Some("j-2")),
            job("j-6", "command", "stopped", Some("j-2")),
            job("j-7", "command", "pending", Some("j-2")),
            job("j-9", "command", "running", Some("j-0")),
        ]
    }

    #[test]
    fn a_searchs_trials_fold_into_one_line_under_it() {
        let text = table(&page(), false, 40_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert!(lines[0].starts_with("ID "), "{text}");
        assert!(lines[1].starts_with("j-1 ") && lines[1].ends_with(" 1350 / 1350"));
        assert!(lines[2].starts_with("j-2 ") && lines[2].contains(" search "));
        assert_eq!(
            lines[3],
            "  ↳ 5 trials: 1 running, 1 pending, 1 done, 2 stopped"
        );
        // Its search is on an older page: listed, naming it.
        assert!(lines[4].starts_with("j-9 ") && lines[4].contains("(trial of j-0)"));
    }

    #[test]
    fn trials_lists_each_under_its_search_with_its_progress() {
        let text = table(&page(), true, 40_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 9, "{text}");
        assert!(lines[3].starts_with("  ↳ j-3 "), "{text}");
        assert!(lines[4].starts_with("  ↳ j-4 "), "{text}");
        assert!(
            lines[4].ends_with("running    300 / 1350  ETA 1m45s"),
            "{text}"
        );
        assert!(lines[5].contains(" stopped "), "{text}");
    }

    #[test]
    fn one_trial_reads_singular() {
        let page = [
            job("j-2", "search", "running", None),
            job("j-3", "command", "failed", Some("j-2")),
        ];
        assert!(table(&page, false, 0).ends_with("  ↳ 1 trial: 1 failed\n"));
    }
}
