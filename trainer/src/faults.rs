//! Test-only faults a rank drives into its own training: a slow step (a straggler) and a
//! forward pass that never returns (a rank deadlocked in its own computation).
//!
//! A [`Faults`] value is built only from the test environment variables
//! ([`Faults::from_env`], which reads them through [`crate::test_hooks::test_hook`], so a release
//! build never has any) and passed to the trainer ([`crate::Trainer::set_faults`],
//! [`crate::elastic::ElasticRun::with_faults`]). Production code holds
//! [`Faults::default`], which does nothing. Both faults wait asynchronously: the runtime's
//! threads stay free while a step is held up.

use std::time::Duration;

use anyhow::Context;

use crate::test_hooks::test_hook;

/// Test-only: milliseconds every step sleeps in its compute part (emulates a straggler).
pub const STEP_DELAY_ENV: &str = "RINGLEADER_TEST_STEP_DELAY_MS";
/// Test-only: `RANK:STEP`, the worker started as rank RANK hangs in step STEP's forward pass.
pub const HANG_ENV: &str = "RINGLEADER_TEST_HANG";

/// The faults a test asked of one rank. The default is none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Slept inside every step's compute part, counted as compute time; zero: none.
    pub step_delay: Duration,
    /// The step (1-based) whose forward pass never returns, its compute section open.
    pub hang_at_step: Option<u64>,
}

impl Faults {
    /// The faults [`STEP_DELAY_ENV`] and [`HANG_ENV`] ask of the worker started as `rank`
    /// (none in a release build); a malformed value is an error naming the variable.
    pub fn from_env(rank: usize) -> anyhow::Result<Faults> {
        Ok(Faults {
            step_delay: parse_step_delay(test_hook(STEP_DELAY_ENV).as_deref())?,
            hang_at_step: parse_hang(test_hook(HANG_ENV).as_deref(), rank)?,
        })
    }

    /// Before a step's compute: the straggler's delay, if any.
    pub(crate) async fn delay_step(&self) {
        if !self.step_delay.is_zero() {
            tokio::time::sleep(self.step_delay).await;
        }
    }

    /// Inside step `step`'s forward pass: never returns when this is the step to hang in.
    pub(crate) async fn hang_in_forward(&self, step: u64) {
        if self.hang_at_step == Some(step) {
            std::future::pending::<()>().await;
        }
    }
}

/// [`STEP_DELAY_ENV`]'s value: milliseconds (zero when unset).
fn parse_step_delay(value: Option<&str>) -> anyhow::Result<Duration> {
    match value {
        Some(v) => {
            let ms: u64 = v
                .trim()
                .parse()
                .with_context(|| format!("{STEP_DELAY_ENV}={v:?}: want milliseconds"))?;
            Ok(Duration::from_millis(ms))
        }
        None => Ok(Duration::ZERO),
    }
}

/// [`HANG_ENV`]'s value: the step to hang in, if it names `rank`.
fn parse_hang(value: Option<&str>, rank: usize) -> anyhow::Result<Option<u64>> {
    let Some(v) = value else {
        return Ok(None);
    };
    let parsed = v.split_once(':').and_then(|(r, s)| {
        Some((
            r.trim().parse::<usize>().ok()?,
            s.trim().parse::<u64>().ok()?,
        ))
    });
    let (r, step) = parsed.with_context(|| format!("{HANG_ENV}={v:?}: want RANK:STEP"))?;
    Ok((r == rank).then_some(step))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_and_bad_ones_name_their_variable() {
        assert_eq!(parse_step_delay(None).unwrap(), Duration::ZERO);
        assert_eq!(
            parse_step_delay(Some(" 250 ")).unwrap(),
            Duration::from_millis(250)
        );
        let e = parse_step_delay(Some("soon")).unwrap_err().to_string();
        assert!(e.starts_with(STEP_DELAY_ENV), "{e}");
        assert_eq!(parse_hang(None, 0).unwrap(), None);
        assert_eq!(parse_hang(Some("1:7"), 1).unwrap(), Some(7));
        assert_eq!(parse_hang(Some("1:7"), 0).unwrap(), None);
        let e = parse_hang(Some("7"), 0).unwrap_err().to_string();
        assert!(e.starts_with(HANG_ENV), "{e}");
    }

    #[tokio::test]
    async fn a_hang_holds_only_its_step_and_leaves_the_runtime_free() {
        let f = Faults {
            step_delay: Duration::ZERO,
            hang_at_step: Some(3),
        };
        f.hang_in_forward(2).await;
        let hung = tokio::time::timeout(Duration::from_millis(50), f.hang_in_forward(3)).await;
        assert!(hung.is_err(), "step 3 returned");
    }
}
