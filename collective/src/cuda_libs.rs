//! Where this host's CUDA libraries are, and a directory of links through which cudarc
//! loads them.
//!
//! Why it exists: cudarc 0.19, built for CUDA 12.8 with `dynamic-loading`, `dlopen`s a
//! library only by the names its `get_lib_name_candidates` makes: `lib{name}.so`, a few
//! Windows-style `lib{name}64_…` variants and `lib{name}.so.{12,11,10,9,1}`. So it never
//! loads `libcublas.so.13` or `libnvrtc.so.13` (CUDA 13), nor `libnccl.so.2` (the only NCCL
//! file of NVIDIA's runtime packages and of PyTorch's wheels); the unversioned
//! `lib{name}.so` comes only with a toolkit's development files. And glibc reads
//! `LD_LIBRARY_PATH` once, when a process starts. So the node, before it starts ranks,
//! finds the libraries ([`find`]), links each one as `lib{name}.so` in a directory of its
//! own ([`link_dir`]), and starts every rank given GPUs with that directory first on its
//! `LD_LIBRARY_PATH`, followed by the directories the libraries were found in (their own
//! dependencies, libcublasLt for libcublas, load from there) and then the value the rank
//! would have had ([`library_path`]).
//!
//! The search ([`SearchRoots::of_host`]) is the one of `scripts/cuda-libs.sh`, its shell
//! twin for benchmarks and the `cuda` test binaries. For each library of [`WANTED`], newest
//! major first (`libcublas.so.13`, then `libcublas.so.12`) of those the driver supports
//! ([`SearchRoots::driver_cuda_major`]: a 12.x driver gets CUDA 12's), the first existing
//! file in:
//!
//! 1. the entries of `LD_LIBRARY_PATH`;
//! 2. the CUDA toolkits: `$CUDA_HOME`, `$CUDA_PATH`, `/usr/local/cuda`, then
//!    `/usr/local/cuda-*` newest version first, each's `lib64` and `targets/*/lib` (CUDA 13);
//! 3. the `nvidia/*/lib` directories of NVIDIA's Python wheels (`nvidia/cublas/lib`, CUDA
//!    13's `nvidia/cu13/lib`) in the `site-packages` and `dist-packages` of the Python
//!    installations at `$VIRTUAL_ENV`, `$CONDA_PREFIX`, each `PATH` entry's parent when the
//!    entry holds a `python3` (a virtualenv's `bin`), `$HOME/.local`, `/usr/local` and
//!    `/usr`. Python itself is not run: the node's start never waits on an interpreter,
//!    and a virtualenv's layout says where its packages are;
//! 4. the loader's own directories ([`SYSTEM_DIRS`]);
//! 5. the linker cache, `ldconfig -p` ([`linker_cache`]).
//!
//! A library found in the loader's directories or through its cache needs no
//! `LD_LIBRARY_PATH` entry for its dependencies, and gets none: putting `/usr/lib` in front
//! of a rank's inherited path would shadow, say, a conda environment's newer libstdc++.
//!
//! Pure std, built with and without the `cuda` feature (the node calls it in both builds:
//! its ranks may run another binary, a PyTorch script say). Unix only, like the crate.

use std::{
    ffi::OsString,
    fmt, fs, io,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

/// A library cudarc loads, by its `dlopen` name, and the majors of its file names looked
/// for, newest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wanted {
    /// `cublas` for `libcublas.so.13`.
    pub name: &'static str,
    /// The file name's major versions looked for, in order.
    pub majors: &'static [u32],
    /// Whether those majors are CUDA's (cuBLAS 13 is CUDA 13's): then only those the
    /// driver supports are looked for ([`SearchRoots::driver_cuda_major`]). libcuda and
    /// NCCL version their files on their own.
    pub follows_cuda: bool,
}

impl Wanted {
    /// The majors looked for under a driver supporting CUDA up to `driver_cuda_major`
    /// (`None`: no driver known, all of them), newest first.
    pub fn majors_for(&self, driver_cuda_major: Option<u32>) -> impl Iterator<Item = u32> + '_ {
        self.majors.iter().copied().filter(move |&major| {
            !self.follows_cuda || driver_cuda_major.is_none_or(|max| major <= max)
        })
    }
}

/// The newest CUDA major a driver supports, from `cuDriverGetVersion`'s value
/// (`1000 * major + 10 * minor`: 12080 for CUDA 12.8); `None` for a value that is not one.
/// A library of a newer major fails under it (cuBLAS 13's and NVRTC 13's images under a
/// 12.x driver, R535 to R570, common on H100 images), so [`find`] skips those.
pub fn cuda_major_of_driver(version: i32) -> Option<u32> {
    u32::try_from(version)
        .ok()
        .filter(|&v| v >= 1000)
        .map(|v| v / 1000)
}

/// The libraries looked for, in the order they are reported: the driver, cuBLAS (and
/// cuBLASLt, which it needs), NVRTC (the trainer compiles its kernels with it) and NCCL.
pub const WANTED: [Wanted; 5] = [
    Wanted {
        name: "cuda",
        majors: &[1],
        follows_cuda: false,
    },
    Wanted {
        name: "cublas",
        majors: &[13, 12],
        follows_cuda: true,
    },
    Wanted {
        name: "cublasLt",
        majors: &[13, 12],
        follows_cuda: true,
    },
    Wanted {
        name: "nvrtc",
        majors: &[13, 12],
        follows_cuda: true,
    },
    Wanted {
        name: "nccl",
        majors: &[2],
        follows_cuda: false,
    },
];

/// The loader's default directories (glibc's trusted directories on x86-64 and arm64,
/// merged-`/usr` or not): searched after everything else, and never put on a rank's
/// `LD_LIBRARY_PATH`, since the loader looks there anyway.
pub const SYSTEM_DIRS: [&str; 8] = [
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib",
    "/lib",
];

/// Most directories a search visits (after duplicates are removed); later ones are
/// dropped.
pub const SEARCH_DIRS_MAX: usize = 512;
/// Most entries read from one directory while expanding a pattern (`/usr/local/cuda-*`,
/// `lib/python3*`, `nvidia/*`).
const LIST_ENTRIES_MAX: usize = 65_536;
/// Where `ldconfig` may be: on `PATH`, or in the `sbin` directories a user's `PATH` often
/// lacks.
const LDCONFIG: [&str; 3] = ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"];

/// Where [`find`] looks, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SearchRoots {
    /// Existing directories searched for each major, in order, without duplicates (by
    /// canonical path); ends with the [`SYSTEM_DIRS`] not listed earlier.
    pub dirs: Vec<PathBuf>,
    /// The loader's directories, as [`SYSTEM_DIRS`] under the root searched: a library
    /// found in one of them is [`Origin::SystemDir`].
    pub system_dirs: Vec<PathBuf>,
    /// The linker cache as `ldconfig -p` prints it, searched after `dirs` for each major
    /// (empty: none).
    pub linker_cache: String,
    /// The newest CUDA major the host's driver supports ([`cuda_major_of_driver`]): newer
    /// majors of a [`Wanted::follows_cuda`] library are not looked for. `None` (no driver
    /// known, the default): every major, newest first.
    pub driver_cuda_major: Option<u32>,
}

impl SearchRoots {
    /// This host's search: its environment, its file system from `/`, its [`linker_cache`].
    pub fn of_host() -> SearchRoots {
        SearchRoots::new(&|key| std::env::var_os(key), Path::new("/"), linker_cache())
    }

    /// The search with environment `env` (`LD_LIBRARY_PATH`, `CUDA_HOME`, `CUDA_PATH`,
    /// `VIRTUAL_ENV`, `CONDA_PREFIX`, `PATH`, `HOME`, used as given) over the fixed
    /// locations (`/usr/local/cuda*`, `/usr`, [`SYSTEM_DIRS`]) under `root` (`/` but in
    /// tests), with `linker_cache` as `ldconfig -p` prints it.
    pub fn new(
        env: &dyn Fn(&str) -> Option<OsString>,
        root: &Path,
        linker_cache: String,
    ) -> SearchRoots {
        let at = |p: &str| root.join(p.trim_start_matches('/'));
        let var = |key: &str| env(key).filter(|v| !v.is_empty());
        let mut dirs: Vec<PathBuf> = Vec::new();
        if let Some(paths) = var("LD_LIBRARY_PATH") {
            dirs.extend(std::env::split_paths(&paths));
        }
        let mut toolkits: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
            .into_iter()
            .filter_map(|key| var(key).map(PathBuf::from))
            .collect();
        toolkits.push(at("/usr/local/cuda"));
        toolkits.extend(children(&at("/usr/local"), "cuda-"));
        for toolkit in &toolkits {
            dirs.push(toolkit.join("lib64"));
            dirs.extend(
                children(&toolkit.join("targets"), "")
                    .into_iter()
                    .map(|t| t.join("lib")),
            );
        }
        for prefix in python_prefixes(&var, &at) {
            for lib in ["lib", "lib64"] {
                for python in children(&prefix.join(lib), "python3") {
                    for packages in ["site-packages", "dist-packages"] {
                        let nvidia = python.join(packages).join("nvidia");
                        dirs.extend(children(&nvidia, "").into_iter().map(|p| p.join("lib")));
                    }
                }
            }
        }
        let system_dirs: Vec<PathBuf> = SYSTEM_DIRS.iter().map(|d| at(d)).collect();
        dirs.extend(system_dirs.iter().cloned());
        SearchRoots {
            dirs: usable(dirs),
            system_dirs,
            linker_cache,
            driver_cuda_major: None,
        }
    }
}

/// The prefixes of the Python installations whose wheels are searched: `$VIRTUAL_ENV`,
/// `$CONDA_PREFIX`, the parent of each `PATH` entry that holds a `python3`,
/// `$HOME/.local`, `/usr/local`, `/usr`.
fn python_prefixes(
    var: &dyn Fn(&str) -> Option<OsString>,
    at: &dyn Fn(&str) -> PathBuf,
) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .into_iter()
        .filter_map(|key| var(key).map(PathBuf::from))
        .collect();
    if let Some(paths) = var("PATH") {
        for bin in std::env::split_paths(&paths) {
            if bin.join("python3").exists() {
                out.extend(bin.parent().map(Path::to_path_buf));
            }
        }
    }
    out.extend(var("HOME").map(|home| PathBuf::from(home).join(".local")));
    out.push(at("/usr/local"));
    out.push(at("/usr"));
    out
}

/// The directories in `dir` whose names start with `prefix`, newest version first (by the
/// numbers in their names: `cuda-13.0`, `cuda-12.10`, `cuda-12.8`), then by name; none if
/// `dir` cannot be read.
fn children(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(Vec<u32>, String, PathBuf)> = entries
        .take(LIST_ENTRIES_MAX)
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let path = e.path();
            (name.starts_with(prefix) && path.is_dir()).then(|| (version_key(&name), name, path))
        })
        .collect();
    out.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    out.into_iter().map(|(_, _, path)| path).collect()
}

/// The numbers in `name`, in order: `cuda-12.8` → `[12, 8]`, `python3.12` → `[3, 12]`.
fn version_key(name: &str) -> Vec<u32> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// `dirs` that are absolute existing directories, without repeats (the same canonical
/// path), at most [`SEARCH_DIRS_MAX`].
fn usable(dirs: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut seen: Vec<PathBuf> = Vec::new();
    let mut out = Vec::new();
    for dir in dirs {
        if out.len() >= SEARCH_DIRS_MAX {
            break;
        }
        if !dir.is_absolute() {
            continue;
        }
        let Ok(canonical) = fs::canonicalize(&dir) else {
            continue;
        };
        if canonical.is_dir() && !seen.contains(&canonical) {
            seen.push(canonical);
            out.push(dir);
        }
    }
    out
}

/// This host's linker cache: `ldconfig -p`'s whole output (empty when no `ldconfig` runs).
/// Read to its end, never through a pipe closed early: that would kill `ldconfig` with
/// SIGPIPE. `ldconfig -p` only prints the cache file; it does not scan directories.
pub fn linker_cache() -> String {
    for exe in LDCONFIG {
        let out = Command::new(exe)
            .arg("-p")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output();
        if let Ok(out) = out {
            if out.status.success() {
                return String::from_utf8_lossy(&out.stdout).into_owned();
            }
        }
    }
    String::new()
}

/// The paths `cache` (`ldconfig -p`'s output) gives for the file name `file`, 64-bit
/// entries first on a 64-bit target, else in the cache's order. A line reads
/// `\tlibnccl.so.2 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnccl.so.2`.
fn cache_entries(cache: &str, file: &str) -> Vec<PathBuf> {
    let mut entries: Vec<(bool, PathBuf)> = cache
        .lines()
        .filter_map(|line| {
            let (left, path) = line.split_once(" => ")?;
            let (name, flags) = left.trim().split_once(char::is_whitespace)?;
            let wide = flags.contains("64") == cfg!(target_pointer_width = "64");
            (name == file).then(|| (wide, PathBuf::from(path.trim())))
        })
        .collect();
    // Stable: the cache's order within each kind.
    entries.sort_by_key(|(wide, _)| !wide);
    entries.into_iter().map(|(_, path)| path).collect()
}

/// How a library was found: says whether its directory must go on a rank's
/// `LD_LIBRARY_PATH` for the loader to find its dependencies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// In a searched directory the loader does not know: it goes on the path.
    Dir,
    /// In one of the loader's own directories ([`SYSTEM_DIRS`]).
    SystemDir,
    /// Through the linker cache, which holds its dependencies too.
    LinkerCache,
}

/// A library found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Library {
    /// Its [`Wanted::name`].
    pub name: &'static str,
    /// The major of the file found (`13` for `libcublas.so.13`).
    pub major: u32,
    /// Where it was found: `<dir>/lib<name>.so.<major>`.
    pub path: PathBuf,
    /// `path` with every link resolved: what the link in [`link_dir`] points to.
    pub target: PathBuf,
    /// How it was found.
    pub origin: Origin,
}

/// What [`find`] found, in the order of [`WANTED`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// The libraries found.
    pub libraries: Vec<Library>,
    /// The [`Wanted::name`]s of those not found.
    pub missing: Vec<&'static str>,
}

impl Found {
    /// The library called `name` (a [`Wanted::name`]), if found.
    pub fn get(&self, name: &str) -> Option<&Library> {
        self.libraries.iter().find(|l| l.name == name)
    }
}

/// `cuda=/usr/lib/x86_64-linux-gnu/libcuda.so.1 cublas=/usr/local/cuda/lib64/libcublas.so.13`
/// (the paths where they were found), or `none`.
impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.libraries.is_empty() {
            return f.write_str("none");
        }
        for (i, lib) in self.libraries.iter().enumerate() {
            let sep = if i == 0 { "" } else { " " };
            write!(f, "{sep}{}={}", lib.name, lib.path.display())?;
        }
        Ok(())
    }
}

/// Each library of [`WANTED`] as `roots` has it: for each major in turn (those the driver
/// supports, [`Wanted::majors_for`]), the first of `roots.dirs` holding
/// `lib<name>.so.<major>`, else the linker cache's entry for it.
pub fn find(roots: &SearchRoots) -> Found {
    let system: Vec<PathBuf> = roots
        .system_dirs
        .iter()
        .filter_map(|d| fs::canonicalize(d).ok())
        .collect();
    let mut found = Found::default();
    for wanted in &WANTED {
        let library = wanted
            .majors_for(roots.driver_cuda_major)
            .find_map(|major| find_major(roots, &system, wanted.name, major));
        match library {
            Some(library) => found.libraries.push(library),
            None => found.missing.push(wanted.name),
        }
    }
    found
}

/// `lib<name>.so.<major>` in `roots`; `system`: the loader's directories, canonical.
fn find_major(
    roots: &SearchRoots,
    system: &[PathBuf],
    name: &'static str,
    major: u32,
) -> Option<Library> {
    let file = format!("lib{name}.so.{major}");
    let library = |path: PathBuf, origin: Origin| {
        let target = fs::canonicalize(&path).ok()?;
        target.is_file().then_some(Library {
            name,
            major,
            path,
            target,
            origin,
        })
    };
    let in_dirs = roots.dirs.iter().find_map(|dir| {
        let in_system = fs::canonicalize(dir).is_ok_and(|d| system.contains(&d));
        let origin = if in_system {
            Origin::SystemDir
        } else {
            Origin::Dir
        };
        library(dir.join(&file), origin)
    });
    in_dirs.or_else(|| {
        cache_entries(&roots.linker_cache, &file)
            .into_iter()
            .find_map(|path| library(path, Origin::LinkerCache))
    })
}

/// Makes `dir` (and its parents) hold exactly one link `lib<name>.so` per library of
/// `found`, pointing to its [`Library::target`]: a link already right is left alone, a
/// wrong one replaced (through a rename, so a rank starting meanwhile sees the old link or
/// the new one), one for a library no longer found removed; other files in `dir` are not
/// touched. Directories are made with the process's umask (private under the node's).
///
/// Returns the start of a rank's `LD_LIBRARY_PATH` ([`library_path`] adds the rest):
/// `dir`, made absolute, then the directory of each library found in an
/// [`Origin::Dir`], in [`WANTED`]'s order, without repeats. A directory whose path holds a
/// `:` cannot be an entry: such a library's directory is left out, and such a `dir` is an
/// error ([`io::ErrorKind::InvalidInput`]).
pub fn link_dir(dir: &Path, found: &Found) -> io::Result<String> {
    let dir = std::path::absolute(dir)?;
    let Some(dir_text) = dir.to_str().filter(|d| !d.contains(':')) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: not a valid LD_LIBRARY_PATH entry (not UTF-8, or holds ':')",
                dir.display()
            ),
        ));
    };
    fs::create_dir_all(&dir)?;
    for wanted in &WANTED {
        let link = dir.join(format!("lib{}.so", wanted.name));
        match found.get(wanted.name) {
            Some(library) => ensure_link(&link, &library.target)?,
            None => remove_link(&link)?,
        }
    }
    let mut entries: Vec<&str> = vec![dir_text];
    for library in &found.libraries {
        if library.origin != Origin::Dir {
            continue;
        }
        let Some(parent) = library.target.parent().and_then(Path::to_str) else {
            continue;
        };
        if !parent.contains(':') && !entries.contains(&parent) {
            entries.push(parent);
        }
    }
    Ok(entries.join(":"))
}

/// Makes `link` a symbolic link to `target`, unless it already is one.
fn ensure_link(link: &Path, target: &Path) -> io::Result<()> {
    if fs::read_link(link).is_ok_and(|t| t == target) {
        return Ok(());
    }
    let mut tmp_name = OsString::from(".");
    tmp_name.push(link.file_name().unwrap_or_default());
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = link.with_file_name(tmp_name);
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)?;
    fs::rename(&tmp, link).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// Removes `link` if it is a symbolic link (anything else is left as it is).
fn remove_link(link: &Path) -> io::Result<()> {
    match fs::symlink_metadata(link) {
        Ok(meta) if meta.file_type().is_symlink() => fs::remove_file(link),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// A rank's `LD_LIBRARY_PATH`: `prefix` (from [`link_dir`]) then `rest`, the value it
/// would have had otherwise (the node's inherited one, or its spec's), kept whole and last.
/// An entry of `prefix` already in `rest` is left out (but its first, the link directory),
/// so `rest`'s order stands; no `rest` (or an empty one) gives `prefix` alone.
pub fn library_path(prefix: &str, rest: Option<&str>) -> String {
    let rest = rest.filter(|r| !r.is_empty());
    let theirs: Vec<&str> = rest.map(|r| r.split(':').collect()).unwrap_or_default();
    let mut entries: Vec<&str> = Vec::new();
    for (i, entry) in prefix.split(':').enumerate() {
        if entry.is_empty() || entries.contains(&entry) || (i > 0 && theirs.contains(&entry)) {
            continue;
        }
        entries.push(entry);
    }
    entries.extend(rest);
    entries.join(":")
}

#[cfg(test)]
mod tests;
