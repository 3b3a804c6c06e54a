//! `--gpus`: which of the host's devices a node offers to jobs. Pure.

use std::{collections::BTreeSet, str::FromStr};

use super::GpuError;
use crate::cluster::meta::Gpu;

/// Which devices a node offers: every one it has (the default), none, or those indices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Selection {
    /// Every device discovery lists (`--gpus all`, or no `--gpus`).
    #[default]
    All,
    /// No device (`--gpus none`): the node runs only jobs that ask for no GPU.
    None,
    /// These device indices (`--gpus 0,1`), each of which must exist.
    Only(BTreeSet<u32>),
}

impl FromStr for Selection {
    type Err = GpuError;

    /// `all`, `none`, or device indices separated by commas, each once.
    fn from_str(text: &str) -> Result<Selection, GpuError> {
        let bad = |problem: String| GpuError::Selection {
            text: text.to_owned(),
            problem,
        };
        match text.trim() {
            "all" => return Ok(Selection::All),
            "none" => return Ok(Selection::None),
            _ => {}
        }
        let mut indices = BTreeSet::new();
        for entry in text.split(',').map(str::trim) {
            let index: u32 = entry.parse().map_err(|_| {
                bad(format!(
                    "{entry:?} is not a device index: expected `all`, `none` or indices like 0,1"
                ))
            })?;
            if !indices.insert(index) {
                return Err(bad(format!("device {index} is named twice")));
            }
        }
        Ok(Selection::Only(indices))
    }
}

impl Selection {
    /// The devices of `gpus` this selection keeps, in index order. An index it names that
    /// `gpus` lacks is an error naming it (and what the host has, or `none_because`).
    pub fn restrict(
        &self,
        gpus: Vec<Gpu>,
        none_because: Option<&str>,
    ) -> Result<Vec<Gpu>, GpuError> {
        let mut gpus = gpus;
        gpus.sort_by_key(|g| g.index);
        match self {
            Selection::All => Ok(gpus),
            Selection::None => Ok(Vec::new()),
            Selection::Only(wanted) => {
                if let Some(&index) = wanted.iter().find(|i| !gpus.iter().any(|g| g.index == **i)) {
                    let have = if gpus.is_empty() {
                        match none_because {
                            Some(why) => format!("it has none: {why}"),
                            None => "it has none".to_owned(),
                        }
                    } else {
                        let list: Vec<String> = gpus.iter().map(|g| g.index.to_string()).collect();
                        format!("it has {}", list.join(", "))
                    };
                    return Err(GpuError::NoSuchDevice { index, have });
                }
                gpus.retain(|g| wanted.contains(&g.index));
                Ok(gpus)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32) -> Gpu {
        Gpu {
            index,
            model: "H100".into(),
            memory_mb: 81_559,
            uuid: format!("GPU-test-{index}"),
        }
    }

    fn parse(text: &str) -> Result<Selection, String> {
        text.parse::<Selection>().map_err(|e| e.to_string())
    }

    #[test]
    fn parses_all_none_and_index_lists() {
        assert_eq!(parse("all"), Ok(Selection::All));
        assert_eq!(parse("none"), Ok(Selection::None));
        assert_eq!(parse("1"), Ok(Selection::Only([1].into())));
        assert_eq!(parse("2, 0"), Ok(Selection::Only([0, 2].into())));
        assert_eq!(
            parse("0,x"),
            Err("\"x\" is not a device index: expected `all`, `none` or indices like 0,1".into())
        );
        assert!(parse("").is_err());
        assert!(parse("0,,1").is_err());
        assert!(parse("-1").is_err());
        assert_eq!(parse("1,1"), Err("device 1 is named twice".into()));
    }

    #[test]
    fn restricts_to_existing_devices_only() {
        let host = vec![gpu(2), gpu(0), gpu(1)];
        let kept = |s: &str| -> Result<Vec<u32>, String> {
            parse(s)?
                .restrict(host.clone(), None)
                .map(|g| g.iter().map(|g| g.index).collect())
                .map_err(|e| e.to_string())
        };
        assert_eq!(kept("all"), Ok(vec![0, 1, 2]), "sorted by index");
        assert_eq!(kept("none"), Ok(vec![]));
        assert_eq!(kept("2,1"), Ok(vec![1, 2]));
        assert_eq!(
            kept("1,5"),
            Err("--gpus: no GPU 5 on this host (it has 0, 1, 2)".into())
        );
        let e = Selection::Only([0].into())
            .restrict(Vec::new(), Some("no CUDA driver"))
            .unwrap_err();
        assert_eq!(
            e,
            GpuError::NoSuchDevice {
                index: 0,
                have: "it has none: no CUDA driver".into()
            }
        );
        assert_eq!(Selection::All.restrict(Vec::new(), Some("x")), Ok(vec![]));
    }
}
