//! Test hooks: `RINGLEADER_TEST_*` variables that drive faults into ranks in debug builds
//! only. A leaf, so that every module reading a hook (the worker, the GPU device choice) can
//! without depending on the worker.

/// What every test hook's variable name starts with.
pub const TEST_HOOK_PREFIX: &str = "RINGLEADER_TEST_";

/// The value of the test hook `name` (a `RINGLEADER_TEST_*` variable: `worker::STEP_DELAY_ENV`,
/// `worker::HANG_ENV`, [`crate::gpu::TEST_GPUS_ENV`]) in debug builds, and always `None` in
/// release builds.
///
/// Why compiled out: a hook drives faults (a hang, a slow step, fake devices) into ranks.
/// In a production node, a job spec's `env` (refused by the node's spec validation too) or
/// a local user who can set the node's environment could otherwise hang or slow every rank
/// of a job, or make a node advertise GPUs it does not have. Tests are debug builds, so
/// they keep the hooks; every read of a `RINGLEADER_TEST_*` variable goes through here.
pub fn test_hook(name: &str) -> Option<String> {
    debug_assert!(
        name.starts_with(TEST_HOOK_PREFIX),
        "{name} is not a test hook"
    );
    #[cfg(debug_assertions)]
    {
        std::env::var(name).ok()
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = name;
        None
    }
}
