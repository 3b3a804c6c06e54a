//! Datasets held in memory: the shipped 8×8 digits, generated images, and the project's own
//! text for the character-level language model.

use std::io::Read;

use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::TrainError;
use crate::spec::DataSpec;

/// The shipped digits (see `examples/data/README.md`): gzip of a small binary format.
static DIGITS_GZ: &[u8] = include_bytes!("../../examples/data/digits.bin.gz");
/// Digits records in the training split (the first ones); the rest (297) validate.
pub const DIGITS_TRAIN: usize = 1500;
/// Digits records in the file.
pub const DIGITS_TOTAL: usize = 1797;
/// Decompressed size bound of the digits file, bytes (refuses a corrupted length).
const DIGITS_RAW_BYTES_MAX: usize = 1 << 20;

/// The project's own text (this crate's sources and the data README): the language model's
/// corpus, embedded at build time so no file is read at run time.
static PROJECT_TEXT: &[&str] = &[
    include_str!("../../examples/data/README.md"),
    include_str!("lib.rs"),
    include_str!("spec.rs"),
    include_str!("dataset.rs"),
    include_str!("sampler.rs"),
    include_str!("model.rs"),
    include_str!("mlp.rs"),
    include_str!("cnn.rs"),
    include_str!("transformer.rs"),
    include_str!("grad_sync.rs"),
    include_str!("checkpointer.rs"),
    include_str!("optimizer.rs"),
    include_str!("schedule.rs"),
    include_str!("state.rs"),
    include_str!("checkpoint.rs"),
    include_str!("trainer.rs"),
];
/// Character vocabulary of the language model: 7-bit ASCII (other bytes map to `?`).
pub const TEXT_VOCAB: usize = 128;
/// Fraction of the corpus (its tail) held out for validation, percent.
const TEXT_VAL_PERCENT: usize = 10;

/// What a batch holds.
#[derive(Debug, Clone)]
enum Samples {
    /// Images `[n, c, h, w]` (row-major, f32) with one label each.
    Images {
        x: Vec<f32>,
        y: Vec<u32>,
        shape: [usize; 3],
        classes: usize,
    },
    /// Token windows: sample `i` is `tokens[starts[i]..starts[i] + seq_len + 1]`, inputs the
    /// first `seq_len`, targets the last `seq_len`.
    Text {
        tokens: Vec<u32>,
        starts: Vec<usize>,
        seq_len: usize,
    },
}

/// One split (training or validation) of a dataset, in memory.
#[derive(Debug, Clone)]
pub struct Dataset {
    samples: Samples,
}

/// A batch as tensors: inputs and integer targets (one per prediction, flattened).
#[derive(Debug)]
pub struct Batch {
    /// Inputs: `[b, c, h, w]` f32 for images, `[b, seq_len]` u32 for text.
    pub x: Tensor,
    /// Targets: `[b]` for images, `[b · seq_len]` for text (u32).
    pub y: Tensor,
}

impl Dataset {
    /// Loads the training and validation splits a spec asks for. `seq_len` is the language
    /// model's context (text only).
    pub fn load(
        spec: &DataSpec,
        seq_len: usize,
        seed: u64,
    ) -> Result<(Dataset, Dataset), TrainError> {
        match spec.dataset.as_str() {
            "digits" => Self::digits(),
            "synthetic" => Ok(Self::synthetic(spec, seed)),
            "text" => Ok(Self::project_text(seq_len)),
            other => Err(TrainError::Spec(format!("unknown dataset {other:?}"))),
        }
    }

    /// The shipped 8×8 digits, pixels scaled to [0, 1]: (train 1,500, validation 297).
    pub fn digits() -> Result<(Dataset, Dataset), TrainError> {
        let corrupt = |d: &str| TrainError::Corrupt {
            what: "digits.bin.gz".into(),
            detail: d.into(),
        };
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(DIGITS_GZ)
            .take(DIGITS_RAW_BYTES_MAX as u64)
            .read_to_end(&mut raw)
            .map_err(|e| corrupt(&e.to_string()))?;
        if raw.len() < 16 || &raw[..8] != b"RLDIGIT1" {
            return Err(corrupt("bad magic"));
        }
        let n = u32::from_le_bytes(raw[8..12].try_into().expect("4 bytes")) as usize;
        let pixels = u32::from_le_bytes(raw[12..16].try_into().expect("4 bytes")) as usize;
        if n != DIGITS_TOTAL || pixels != 64 || raw.len() != 16 + n * (pixels + 1) {
            return Err(corrupt("unexpected size"));
        }
        let mut x = Vec::with_capacity(n * pixels);
        let mut y = Vec::with_capacity(n);
        for rec in raw[16..].chunks_exact(pixels + 1) {
            x.extend(rec[..pixels].iter().map(|&p| p as f32 / 16.0));
            let label = rec[pixels];
            if label > 9 || rec[..pixels].iter().any(|&p| p > 16) {
                return Err(corrupt("value out of range"));
            }
            y.push(label as u32);
        }
        let split = |lo: usize, hi: usize| Dataset {
            samples: Samples::Images {
                x: x[lo * pixels..hi * pixels].to_vec(),
                y: y[lo..hi].to_vec(),
                shape: [1, 8, 8],
                classes: 10,
            },
        };
        Ok((split(0, DIGITS_TRAIN), split(DIGITS_TRAIN, n)))
    }

    /// Generated image classification: class `k` has a random prototype image; a sample is
    /// its prototype plus Gaussian-like noise of std `noise`. Deterministic in `seed`.
    pub fn synthetic(spec: &DataSpec, seed: u64) -> (Dataset, Dataset) {
        let shape = [spec.shape[0], spec.shape[1], spec.shape[2]];
        let dim = shape.iter().product::<usize>();
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_da7a);
        let protos: Vec<f32> = (0..spec.classes * dim)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let mut make = |n: usize| {
            let mut x = Vec::with_capacity(n * dim);
            let mut y = Vec::with_capacity(n);
            for _ in 0..n {
                let k = rng.gen_range(0..spec.classes);
                // Sum of three uniforms: cheap, bell-shaped, variance 1 after scaling.
                x.extend(protos[k * dim..(k + 1) * dim].iter().map(|&p| {
                    let u: f32 = rng.gen_range(-1.0..1.0f32)
                        + rng.gen_range(-1.0..1.0f32)
                        + rng.gen_range(-1.0..1.0f32);
                    p + spec.noise * u
                }));
                y.push(k as u32);
            }
            Dataset {
                samples: Samples::Images {
                    x,
                    y,
                    shape,
                    classes: spec.classes,
                },
            }
        };
        let train = make(spec.samples);
        let val = make(spec.val_samples);
        (train, val)
    }

    /// The project's own text as overlapping windows of `seq_len + 1` characters (stride
    /// `seq_len / 2`); the last tenth of the corpus validates.
    pub fn project_text(seq_len: usize) -> (Dataset, Dataset) {
        let tokens: Vec<u32> = PROJECT_TEXT
            .iter()
            .flat_map(|s| s.bytes())
            .map(|b| {
                if (b as usize) < TEXT_VOCAB {
                    b as u32
                } else {
                    b'?' as u32
                }
            })
            .collect();
        let cut = tokens.len() * (100 - TEXT_VAL_PERCENT) / 100;
        let windows = |toks: Vec<u32>| {
            let stride = (seq_len / 2).max(1);
            let starts: Vec<usize> = (0..toks.len().saturating_sub(seq_len))
                .step_by(stride)
                .collect();
            Dataset {
                samples: Samples::Text {
                    tokens: toks,
                    starts,
                    seq_len,
                },
            }
        };
        (
            windows(tokens[..cut].to_vec()),
            windows(tokens[cut..].to_vec()),
        )
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        match &self.samples {
            Samples::Images { y, .. } => y.len(),
            Samples::Text { starts, .. } => starts.len(),
        }
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Image shape `[c, h, w]` (text: `[1, 1, seq_len]`).
    pub fn input_shape(&self) -> [usize; 3] {
        match &self.samples {
            Samples::Images { shape, .. } => *shape,
            Samples::Text { seq_len, .. } => [1, 1, *seq_len],
        }
    }

    /// Number of classes (text: the vocabulary).
    pub fn classes(&self) -> usize {
        match &self.samples {
            Samples::Images { classes, .. } => *classes,
            Samples::Text { .. } => TEXT_VOCAB,
        }
    }

    /// The images and labels of `indices` as flat buffers (`xs`: `[b, c, h, w]`), reusing
    /// their allocations; an error for a text dataset.
    pub fn image_batch_into(
        &self,
        indices: &[usize],
        xs: &mut Vec<f32>,
        ys: &mut Vec<u32>,
    ) -> Result<(), TrainError> {
        let Samples::Images { x, y, shape, .. } = &self.samples else {
            return Err(TrainError::Spec(
                "an image model needs an image dataset".into(),
            ));
        };
        let dim = shape.iter().product::<usize>();
        xs.clear();
        ys.clear();
        for &i in indices {
            xs.extend_from_slice(&x[i * dim..(i + 1) * dim]);
            ys.push(y[i]);
        }
        Ok(())
    }

    /// The samples at `indices`, in that order, as tensors on `device`.
    pub fn batch(&self, indices: &[usize], device: &Device) -> Result<Batch, TrainError> {
        let b = indices.len();
        match &self.samples {
            Samples::Images { x, y, shape, .. } => {
                let dim = shape.iter().product::<usize>();
                let mut xs = Vec::with_capacity(b * dim);
                let mut ys = Vec::with_capacity(b);
                for &i in indices {
                    xs.extend_from_slice(&x[i * dim..(i + 1) * dim]);
                    ys.push(y[i]);
                }
                Ok(Batch {
                    x: Tensor::from_vec(xs, (b, shape[0], shape[1], shape[2]), device)?,
                    y: Tensor::from_vec(ys, b, device)?,
                })
            }
            Samples::Text {
                tokens,
                starts,
                seq_len,
            } => {
                let mut xs = Vec::with_capacity(b * seq_len);
                let mut ys = Vec::with_capacity(b * seq_len);
                for &i in indices {
                    let s = starts[i];
                    xs.extend_from_slice(&tokens[s..s + seq_len]);
                    ys.extend_from_slice(&tokens[s + 1..s + seq_len + 1]);
                }
                Ok(Batch {
                    x: Tensor::from_vec(xs, (b, *seq_len), device)?,
                    y: Tensor::from_vec(ys, b * seq_len, device)?,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_load_with_fixed_split_and_all_classes() {
        let (train, val) = Dataset::digits().unwrap();
        assert_eq!((train.len(), val.len()), (1500, 297));
        let Samples::Images { y, x, .. } = &val.samples else {
            panic!()
        };
        let mut counts = [0usize; 10];
        y.iter().for_each(|&k| counts[k as usize] += 1);
        assert_eq!(counts, [24, 30, 35, 25, 34, 27, 27, 27, 34, 34]);
        assert!(x.iter().all(|&p| (0.0..=1.0).contains(&p)));
    }

    #[test]
    fn synthetic_is_deterministic_and_text_windows_fit() {
        let spec = DataSpec {
            dataset: "synthetic".into(),
            samples: 10,
            val_samples: 3,
            shape: vec![1, 4, 4],
            ..DataSpec::default()
        };
        let (a, _) = Dataset::synthetic(&spec, 1);
        let (b, _) = Dataset::synthetic(&spec, 1);
        let (ba, bb) = (
            a.batch(&[3, 1], &Device::Cpu).unwrap(),
            b.batch(&[3, 1], &Device::Cpu).unwrap(),
        );
        assert_eq!(
            ba.x.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            bb.x.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
        let (t, v) = Dataset::project_text(32);
        assert!(t.len() > 100 && v.len() > 10);
        let batch = t.batch(&[0, t.len() - 1], &Device::Cpu).unwrap();
        assert_eq!(batch.x.dims(), &[2, 32]);
        assert_eq!(batch.y.dims(), &[64]);
    }
}
