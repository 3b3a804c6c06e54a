//! Test-only fake devices: the text of [`super::TEST_GPUS_ENV`]. Pure.

use super::{GpuError, GPUS_MAX, GPU_MODEL_BYTES_MAX};
use crate::cluster::meta::Gpu;

/// The devices `text` names: `MODEL:MEMORY_MB` entries separated by commas, indices 0.. in
/// order, UUIDs `GPU-test-<index>`; an empty (or blank) text names none.
pub fn parse_test_gpus(text: &str) -> Result<Vec<Gpu>, GpuError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let entries: Vec<&str> = text.split(',').map(str::trim).collect();
    if entries.len() > GPUS_MAX {
        return Err(GpuError::TestGpus {
            problem: format!("at most {GPUS_MAX} devices, got {}", entries.len()),
        });
    }
    entries
        .into_iter()
        .enumerate()
        .map(|(index, entry)| {
            let bad = || GpuError::TestGpus {
                problem: format!(
                    "{entry:?}: expected MODEL:MEMORY_MB (a model of 1 to \
                     {GPU_MODEL_BYTES_MAX} bytes, memory in MiB)"
                ),
            };
            let (model, memory) = entry.rsplit_once(':').ok_or_else(bad)?;
            let model = model.trim();
            if model.is_empty() || model.len() > GPU_MODEL_BYTES_MAX {
                return Err(bad());
            }
            let index = u32::try_from(index).expect("at most GPUS_MAX devices");
            Ok(Gpu {
                index,
                model: model.to_owned(),
                memory_mb: memory.trim().parse().map_err(|_| bad())?,
                uuid: format!("GPU-test-{index}"),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_models_and_memory_in_order() {
        let gpus = parse_test_gpus("H100:81559, RTX 4090:24564").unwrap();
        assert_eq!(
            gpus,
            [
                Gpu {
                    index: 0,
                    model: "H100".into(),
                    memory_mb: 81_559,
                    uuid: "GPU-test-0".into()
                },
                Gpu {
                    index: 1,
                    model: "RTX 4090".into(),
                    memory_mb: 24_564,
                    uuid: "GPU-test-1".into()
                },
            ]
        );
        assert!(parse_test_gpus("").unwrap().is_empty());
        assert!(parse_test_gpus("  ").unwrap().is_empty());
    }

    #[test]
    fn rejects_malformed_entries() {
        for bad in ["H100", ":100", "H100:", "H100:-1", "H100:1,", "H100:x"] {
            let e = parse_test_gpus(bad).unwrap_err().to_string();
            assert!(e.starts_with("RINGLEADER_TEST_GPUS: "), "{bad}: {e}");
        }
        let many = vec!["G:1"; GPUS_MAX + 1].join(",");
        assert!(parse_test_gpus(&many)
            .unwrap_err()
            .to_string()
            .contains("at most 64 devices"));
        let long = format!("{}:1", "x".repeat(GPU_MODEL_BYTES_MAX + 1));
        assert!(parse_test_gpus(&long).is_err());
    }
}
