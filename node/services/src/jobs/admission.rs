//! A submit's admission on the node that took it: the one function the API's submit route
//! calls ([`admit_submit`]), handed what it needs, answering the spec to propose or why
//! not ([`Refused`], which the route only maps to an HTTP status).
//!
//! In order: the spec's text (TOML, or JSON by the request's type) is parsed and checked
//! ([`super::admit_spec_text`], [`super::admit_spec_json`]; off the async runtime, since a
//! search's every trial is checked); its `[secrets]` are sealed with the cluster's secrets
//! key, so they enter the log sealed and only the node that starts a rank opens them; a
//! `[data] dataset` must be one the cluster has (the domain's rule,
//! `ControlState::unknown_dataset`, asked after the registry had a moment to catch up);
//! last, the sharing rules (`domain::admission::refuse`). A refusal names the field and,
//! for a TOML spec, the field's line.

use crate::{
    cluster::key_ring::DerivedKey,
    control::handle::ControlHandle,
    datasets::Datasets,
    domain::{
        admission::{MemberSize, Refusal},
        spec::JobSpec,
        state::users::Actor,
    },
};

use super::AdmitError;

/// What [`admit_submit`] reads besides the spec.
pub struct SubmitContext<'a> {
    /// Who submits (the sharing rules depend on the owner and its role).
    pub actor: &'a Actor,
    /// The key `[secrets]` are sealed with; `None` on an open cluster (`--insecure`), where
    /// a spec with `[secrets]` is refused.
    pub secrets_key: Option<&'a DerivedKey>,
    /// The dataset service: the registry as this node has it.
    pub datasets: &'a Datasets,
    /// The control plane's handle (the replicated state the rules read).
    pub control: &'a ControlHandle,
    /// The members that could hold ranks (empty: none known yet).
    pub members: &'a [MemberSize],
}

/// Why a submit was refused.
#[derive(Debug)]
pub enum Refused {
    /// The spec is malformed or asks what the cluster refuses: the field and, for a TOML
    /// spec, its line (400).
    Spec(AdmitError),
    /// `[secrets]` on an open cluster, which has no key to seal them with (400).
    NoSecretsKey(String),
    /// The owner's role does not allow what the spec asks (403).
    Role(String),
    /// The admission itself failed (its task panicked: 500).
    Failed(String),
}

/// The message of [`Refused::NoSecretsKey`].
pub const NO_SECRETS_KEY: &str = "secrets: this node runs an open cluster (--insecure), which \
     has no key to seal them with: use a keyed cluster, or env for values that are not secret";

/// Admits a submit's `body` (JSON when `json`, TOML otherwise) as `context.actor`'s job:
/// the spec to propose, its secrets sealed; see the module doc for the rules and their
/// order.
pub async fn admit_submit(
    body: String,
    json: bool,
    context: SubmitContext<'_>,
) -> Result<JobSpec, Refused> {
    // The text lines of later errors point into: the TOML's (a JSON spec's lines are not
    // known past its parse).
    let text = if json { None } else { Some(body.clone()) };
    // Admission parses and checks every trial a search could make: CPU work, kept off the
    // async runtime so the node's Raft and membership timers run meanwhile.
    let mut spec = tokio::task::spawn_blocking(move || match json {
        true => super::admit_spec_json(&body),
        false => super::admit_spec_text(&body),
    })
    .await
    .map_err(|e| Refused::Failed(format!("admission failed: {e}")))?
    .map_err(Refused::Spec)?;
    // `[secrets]` enter the log sealed; the node that starts a rank opens them.
    if !spec.secrets.is_empty() {
        let Some(key) = context.secrets_key.map(DerivedKey::current) else {
            return Err(Refused::NoSecretsKey(NO_SECRETS_KEY.into()));
        };
        for (name, value) in spec.secrets.iter_mut() {
            *value = crate::security::sealed::seal(&key, name, value);
        }
    }
    if let Some(name) = spec
        .tables()
        .data
        .as_ref()
        .and_then(|d| d.get("dataset"))
        .and_then(|v| v.as_str())
        .filter(|n| !crate::datasets::BUILTIN.contains(n))
    {
        // The registry as this node has it, given a moment to catch up with a dataset added
        // just before; the refusal is the domain's (the chief asks it again of a forwarded
        // submit).
        if context.datasets.lookup(name).await.is_none() {
            if let Some(refusal) = context.control.read(|s| s.unknown_dataset(&spec)) {
                return Err(Refused::Spec(refused(text.as_deref(), refusal)));
            }
        }
    }
    // The sharing rules: a priority above the owner's ceiling, `preemptible = false` its
    // role does not allow, a job no member could ever hold.
    let actor = context.actor;
    let refusal = context.control.read(|s| {
        crate::domain::admission::refuse(&spec, &actor.user, actor.role, s, context.members)
    });
    match refusal {
        None => Ok(spec),
        Some((Refusal::Role, field, problem)) => Err(Refused::Role(format!("{field}: {problem}"))),
        Some((Refusal::Spec, field, problem)) => {
            Err(Refused::Spec(refused(text.as_deref(), (field, problem))))
        }
    }
}

/// A spec refused for `(field, problem)`, with the field's line in the TOML `text` when
/// there is one.
fn refused(text: Option<&str>, (field, problem): (&str, String)) -> AdmitError {
    AdmitError {
        message: format!("{field}: {problem}"),
        line: text.and_then(|t| crate::domain::spec::line_of_field(t, field)),
        field: Some(field.into()),
    }
}
