//! The CUDA libraries of ranks given GPUs: found once at start, linked under the data
//! directory ([`CUDA_LIBS_DIR`]) by the names cudarc loads, and put first on those ranks'
//! `LD_LIBRARY_PATH` ([`collective::cuda_libs`] says why: cudarc never asks for
//! `libcublas.so.13` nor `libnccl.so.2`, and the loader reads the path only at a process's
//! start).
//!
//! Only majors the driver supports are taken (`cuDriverGetVersion`, [`super::driver_cuda_major`]):
//! any CUDA 13 file would otherwise win under a 12.x driver, where cuBLAS 13 and NVRTC 13
//! fail. A command rank (a PyTorch script, whose wheel brings its own libraries) gets the
//! link directory alone ([`RankLibraries::link_dir_path`]).
//!
//! Done only by a node that offers GPUs: only ranks given devices get the path, and only
//! such a node gives devices. The search is a few `stat`s and one `ldconfig -p`, in both
//! builds (a command job's ranks may load the libraries through cudarc too).

use std::path::Path;

use collective::cuda_libs::{self, Found, SearchRoots};
use tracing::{info, warn};

/// The link directory under the node's data directory.
pub const CUDA_LIBS_DIR: &str = "cuda-libs";

/// The loader's search path variable.
pub const LIBRARY_PATH_ENV: &str = "LD_LIBRARY_PATH";

/// What a rank given devices puts on its `LD_LIBRARY_PATH`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RankLibraries {
    /// The link directory, then the directories the libraries were found in
    /// ([`cuda_libs::link_dir`]); `None` when none was found or the links could not be
    /// made: ranks then get the path they would have had.
    pub prefix: Option<String>,
    /// The node's own `LD_LIBRARY_PATH` at start (when set and not empty): what follows
    /// the prefix for a rank whose spec sets none.
    pub inherited: Option<String>,
}

impl RankLibraries {
    /// The `LD_LIBRARY_PATH` of a rank given devices whose environment (its spec's `env`)
    /// sets `spec` (`None`: unset): the prefix, then that value or else the node's own,
    /// kept whole ([`cuda_libs::library_path`]). `None`: leave the variable as it is.
    pub fn library_path(&self, spec: Option<&str>) -> Option<String> {
        Some(self.before(self.prefix.as_deref()?, spec))
    }

    /// The `LD_LIBRARY_PATH` of a command rank given devices (a PyTorch script, say): at
    /// most the link directory (the prefix's first entry), then `spec`'s value or else the
    /// node's. Never the directories the libraries were found in: a toolkit's or another
    /// virtualenv's CUDA libraries first on the path break `import torch` when their minor
    /// version differs from the wheel's (pytorch/pytorch#111469, #134929), and the link
    /// directory holds only the unversioned names (`libcublas.so`) no wheel loads.
    pub fn link_dir_path(&self, spec: Option<&str>) -> Option<String> {
        let link_dir = self.prefix.as_deref()?.split(':').next()?;
        Some(self.before(link_dir, spec))
    }

    /// `entries` then `spec`'s path or else the node's.
    fn before(&self, entries: &str, spec: Option<&str>) -> String {
        cuda_libs::library_path(entries, spec.or(self.inherited.as_deref()))
    }
}

/// Finds this host's libraries of CUDA majors up to `driver_cuda_major`
/// ([`super::driver_cuda_major`]; `None`: any), makes `<data_dir>/`[`CUDA_LIBS_DIR`] hold their links, and
/// logs once what was found (info) and, when `warn_missing` (the devices come from the
/// driver, not the test-only fake source), what is missing and what that costs (warn).
pub fn prepare(
    data_dir: &Path,
    driver_cuda_major: Option<u32>,
    warn_missing: bool,
) -> RankLibraries {
    let found = cuda_libs::find(&SearchRoots {
        driver_cuda_major,
        ..SearchRoots::of_host()
    });
    let dir = data_dir.join(CUDA_LIBS_DIR);
    let prefix = link(&dir, &found);
    if warn_missing {
        for name in &found.missing {
            warn!(library = %name, "{}", missing_cost(name));
        }
    }
    RankLibraries {
        prefix,
        inherited: std::env::var(LIBRARY_PATH_ENV)
            .ok()
            .filter(|v| !v.is_empty()),
    }
}

/// Links what `found` holds in `dir` and logs it; the prefix, or `None`.
fn link(dir: &Path, found: &Found) -> Option<String> {
    if found.libraries.is_empty() {
        info!(
            missing = ?found.missing,
            "no cuda libraries found: ranks given GPUs keep the node's LD_LIBRARY_PATH"
        );
        return None;
    }
    match cuda_libs::link_dir(dir, found) {
        Ok(prefix) => {
            info!(
                libraries = %found,
                missing = ?found.missing,
                dir = %dir.display(),
                "cuda libraries found and linked for ranks given GPUs"
            );
            Some(prefix)
        }
        Err(e) => {
            warn!(
                libraries = %found,
                dir = %dir.display(),
                error = %e,
                "cannot link the cuda libraries: ranks given GPUs keep the node's LD_LIBRARY_PATH"
            );
            None
        }
    }
}

/// What a host offering GPUs loses without library `name` (a [`cuda_libs::WANTED`] name).
pub fn missing_cost(name: &str) -> String {
    let cost = match name {
        "cuda" => "ranks given GPUs cannot use them",
        "cublas" | "nvrtc" => "train ranks given GPUs fail to start",
        "cublasLt" => "libcublas does not load without it: train ranks given GPUs fail to start",
        "nccl" => "all-GPU jobs will average gradients over TCP",
        _ => "ranks given GPUs may fail to start",
    };
    format!("no lib{name}: {cost}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_gets_the_prefix_then_its_specs_path_or_the_nodes() {
        let libs = RankLibraries {
            prefix: Some("/d/cuda-libs:/opt/cuda/lib".into()),
            inherited: Some("/node/lib".into()),
        };
        assert_eq!(
            libs.library_path(None).as_deref(),
            Some("/d/cuda-libs:/opt/cuda/lib:/node/lib")
        );
        assert_eq!(
            libs.library_path(Some("/spec/lib:/x")).as_deref(),
            Some("/d/cuda-libs:/opt/cuda/lib:/spec/lib:/x")
        );
        // A spec that empties it: the prefix alone.
        assert_eq!(
            libs.library_path(Some("")).as_deref(),
            Some("/d/cuda-libs:/opt/cuda/lib")
        );
        // A command rank: the link directory alone before the rest.
        assert_eq!(
            libs.link_dir_path(None).as_deref(),
            Some("/d/cuda-libs:/node/lib")
        );
        assert_eq!(
            libs.link_dir_path(Some("/opt/cuda/lib:/x")).as_deref(),
            Some("/d/cuda-libs:/opt/cuda/lib:/x")
        );
        let nothing = RankLibraries {
            prefix: None,
            ..libs
        };
        assert_eq!(nothing.library_path(Some("/spec/lib")), None);
        assert_eq!(nothing.link_dir_path(Some("/spec/lib")), None);
        assert_eq!(RankLibraries::default().library_path(None), None);
    }

    #[test]
    fn every_wanted_library_has_its_cost() {
        for wanted in cuda_libs::WANTED {
            let cost = missing_cost(wanted.name);
            assert!(
                cost.starts_with(&format!("no lib{}: ", wanted.name)),
                "{cost}"
            );
            assert!(!cost.contains("may fail"), "{cost}");
        }
        assert_eq!(
            missing_cost("nccl"),
            "no libnccl: all-GPU jobs will average gradients over TCP"
        );
    }

    #[test]
    fn prepare_links_what_this_host_has() {
        // Whatever the host has (no CUDA on most test hosts): a prefix exactly when
        // something was found, starting with the link directory.
        let dir = tempfile::tempdir().unwrap();
        let libs = prepare(dir.path(), None, false);
        let found = cuda_libs::find(&SearchRoots::of_host());
        match &libs.prefix {
            Some(prefix) => {
                assert!(!found.libraries.is_empty());
                let link_dir = dir.path().join(CUDA_LIBS_DIR);
                assert!(prefix.starts_with(&link_dir.display().to_string()));
                for library in &found.libraries {
                    let link = link_dir.join(format!("lib{}.so", library.name));
                    assert_eq!(std::fs::read_link(link).unwrap(), library.target);
                }
            }
            None => assert!(found.libraries.is_empty()),
        }
    }
}
