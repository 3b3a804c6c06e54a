use super::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

/// A fresh directory under the system's temporary directory, removed when dropped.
struct Tree(PathBuf);

impl Tree {
    fn new() -> Tree {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("cuda-libs-test-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Tree(fs::canonicalize(&dir).unwrap())
    }

    /// `rel` under the tree.
    fn at(&self, rel: &str) -> PathBuf {
        self.0.join(rel.trim_start_matches('/'))
    }

    /// An empty file at `rel` (and its directories); its path.
    fn file(&self, rel: &str) -> PathBuf {
        let path = self.at(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, b"").unwrap();
        path
    }

    /// A link at `rel` to `target` (a name in the same directory, say).
    fn link(&self, rel: &str, target: &str) -> PathBuf {
        let path = self.at(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, &path).unwrap();
        path
    }

    /// The search over this tree with environment `env`, `cache` as the linker cache.
    fn roots(&self, env: &[(&str, String)], cache: &str) -> SearchRoots {
        let env: HashMap<String, OsString> = env
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        SearchRoots::new(&|k| env.get(k).cloned(), &self.0, cache.to_string())
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn text(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn the_newest_major_wins_whatever_the_directory_order() {
    let t = Tree::new();
    // CUDA 12 on LD_LIBRARY_PATH and in an older toolkit; CUDA 13 in its targets/ layout,
    // its libcublas.so.13 a link to the full version, as the toolkit installs it.
    let ld = t
        .file("opt/cuda12/lib/libcublas.so.12")
        .parent()
        .unwrap()
        .to_owned();
    t.file("usr/local/cuda-12.8/lib64/libcublas.so.12");
    t.file("usr/local/cuda-12.8/lib64/libnvrtc.so.12");
    let lib13 = "usr/local/cuda-13.0/targets/x86_64-linux/lib";
    let real = t.file(&format!("{lib13}/libcublas.so.13.0.2.14"));
    t.link(
        &format!("{lib13}/libcublas.so.13"),
        "libcublas.so.13.0.2.14",
    );
    t.file(&format!("{lib13}/libcublasLt.so.13"));
    let found = find(&t.roots(&[("LD_LIBRARY_PATH", text(&ld))], ""));
    let cublas = found.get("cublas").unwrap();
    assert_eq!(cublas.major, 13);
    assert_eq!(cublas.path, t.at(&format!("{lib13}/libcublas.so.13")));
    assert_eq!(cublas.target, real);
    assert_eq!(cublas.origin, Origin::Dir);
    assert_eq!(found.get("cublasLt").unwrap().major, 13);
    // No nvrtc 13 anywhere: the newest toolkit that has 12.
    let nvrtc = found.get("nvrtc").unwrap();
    assert_eq!(
        (nvrtc.major, nvrtc.path.clone()),
        (12, t.at("usr/local/cuda-12.8/lib64/libnvrtc.so.12"))
    );
    assert_eq!(found.missing, ["cuda", "nccl"]);
    assert_eq!(
        found.to_string(),
        format!(
            "cublas={} cublasLt={} nvrtc={}",
            cublas.path.display(),
            t.at(&format!("{lib13}/libcublasLt.so.13")).display(),
            nvrtc.path.display()
        )
    );
}

#[test]
fn the_major_is_the_newest_the_driver_supports() {
    assert_eq!(cuda_major_of_driver(12080), Some(12));
    assert_eq!(cuda_major_of_driver(13000), Some(13));
    assert_eq!(cuda_major_of_driver(0), None);
    assert_eq!(cuda_major_of_driver(-1), None);
    let cublas = WANTED.iter().find(|w| w.name == "cublas").unwrap();
    let nccl = WANTED.iter().find(|w| w.name == "nccl").unwrap();
    let majors = |w: &Wanted, max| w.majors_for(max).collect::<Vec<_>>();
    assert_eq!(majors(cublas, None), [13, 12]);
    assert_eq!(majors(cublas, Some(13)), [13, 12]);
    assert_eq!(majors(cublas, Some(12)), [12]);
    assert_eq!(majors(cublas, Some(11)), Vec::<u32>::new());
    assert_eq!(majors(nccl, Some(12)), [2], "NCCL's own versions");

    // CUDA 13 and 12 files side by side: a 12.x driver gets 12's, a 13 driver 13's.
    let t = Tree::new();
    for file in [
        "libcublas.so.13",
        "libcublas.so.12",
        "libcuda.so.1",
        "libnccl.so.2",
    ] {
        t.file(&format!("ld/{file}"));
    }
    let env = [("LD_LIBRARY_PATH", text(&t.at("ld")))];
    let under = |driver: Option<u32>| {
        let roots = SearchRoots {
            driver_cuda_major: driver,
            ..t.roots(&env, "")
        };
        let found = find(&roots);
        let major = |name| found.get(name).map(|l| l.major);
        (major("cublas"), major("cuda"), major("nccl"))
    };
    assert_eq!(under(None), (Some(13), Some(1), Some(2)));
    assert_eq!(under(Some(13)), (Some(13), Some(1), Some(2)));
    assert_eq!(under(Some(12)), (Some(12), Some(1), Some(2)));
    assert_eq!(under(Some(11)), (None, Some(1), Some(2)));
}

#[test]
fn within_a_major_the_search_order_holds() {
    let t = Tree::new();
    for dir in [
        "ld",
        "home/lib64",
        "usr/local/cuda-12.4/lib64",
        "usr/local/cuda-12.10/lib64",
    ] {
        t.file(&format!("{dir}/libnvrtc.so.12"));
    }
    // Toolkits newest version first (12.10 after 12.4 by name, before it by version).
    let found = find(&t.roots(&[], ""));
    assert_eq!(
        found.get("nvrtc").unwrap().path,
        t.at("usr/local/cuda-12.10/lib64/libnvrtc.so.12")
    );
    // CUDA_HOME before the /usr/local toolkits; LD_LIBRARY_PATH before both.
    let home = [("CUDA_HOME", text(&t.at("home")))];
    let found = find(&t.roots(&home, ""));
    assert_eq!(
        found.get("nvrtc").unwrap().path,
        t.at("home/lib64/libnvrtc.so.12")
    );
    let env = [home[0].clone(), ("LD_LIBRARY_PATH", text(&t.at("ld")))];
    let found = find(&t.roots(&env, ""));
    assert_eq!(found.get("nvrtc").unwrap().path, t.at("ld/libnvrtc.so.12"));
    // A toolkit's directories are searched once, however named.
    std::os::unix::fs::symlink(t.at("home"), t.at("usr/local/cuda")).unwrap();
    let roots = t.roots(&home, "");
    let homes = roots.dirs.iter().filter(|d| d.ends_with("lib64")).count();
    assert_eq!(homes, 3, "{:?}", roots.dirs);
}

#[test]
fn a_virtualenvs_wheels_are_found_from_path() {
    let t = Tree::new();
    t.file("venv/bin/python3");
    let site = "venv/lib/python3.12/site-packages/nvidia";
    let nccl = t.file(&format!("{site}/nccl/lib/libnccl.so.2"));
    let cublas = t.file(&format!("{site}/cu13/lib/libcublas.so.13"));
    t.file(&format!("{site}/cu13/lib/libnvrtc.so.13"));
    let path = format!("/nonexistent:{}", t.at("venv/bin").display());
    let found = find(&t.roots(&[("PATH", path)], ""));
    assert_eq!(found.get("nccl").unwrap().path, nccl);
    assert_eq!(found.get("cublas").unwrap().path, cublas);
    assert_eq!(found.get("nccl").unwrap().origin, Origin::Dir);
    assert_eq!(found.missing, ["cuda", "cublasLt"]);
    // The same through $VIRTUAL_ENV alone, and a system-wide dist-packages.
    let venv = [("VIRTUAL_ENV", text(&t.at("venv")))];
    assert_eq!(find(&t.roots(&venv, "")).get("nccl").unwrap().path, nccl);
    let debian = t.file("usr/lib/python3/dist-packages/nvidia/nccl/lib/libnccl.so.2");
    assert_eq!(find(&t.roots(&[], "")).get("nccl").unwrap().path, debian);
}

#[test]
fn nothing_found_links_nothing_and_adds_only_the_link_dir() {
    let t = Tree::new();
    let found = find(&t.roots(&[("PATH", "/nonexistent".into())], ""));
    assert!(found.libraries.is_empty());
    assert_eq!(found.missing, WANTED.map(|w| w.name));
    assert_eq!(found.to_string(), "none");
    let dir = t.at("data/cuda-libs");
    assert_eq!(link_dir(&dir, &found).unwrap(), text(&dir));
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
}

#[test]
fn the_loaders_own_directories_and_cache_add_no_path_entry() {
    let t = Tree::new();
    let cuda = t.file("usr/lib/x86_64-linux-gnu/libcuda.so.1");
    let cached = t.file("elsewhere/libnccl.so.2");
    let wide = if cfg!(target_pointer_width = "64") {
        "libc6,x86-64"
    } else {
        "libc6"
    };
    let narrow = if cfg!(target_pointer_width = "64") {
        "libc6"
    } else {
        "libc6,x86-64"
    };
    // Another word size's entry first, a stale one, then ours.
    let cache = format!(
        "1234 libs found in cache `/etc/ld.so.cache'\n\
             \tlibnccl.so.2 ({narrow}) => {}\n\
             \tlibnccl.so.2 ({wide}) => /nonexistent/libnccl.so.2\n\
             \tlibnccl.so.2 ({wide}, OS ABI: Linux 3.2.0) => {}\n",
        t.file("narrow/libnccl.so.2").display(),
        cached.display()
    );
    let found = find(&t.roots(&[], &cache));
    assert_eq!(found.get("cuda").unwrap().path, cuda);
    assert_eq!(found.get("cuda").unwrap().origin, Origin::SystemDir);
    let nccl = found.get("nccl").unwrap();
    assert_eq!((&nccl.path, nccl.origin), (&cached, Origin::LinkerCache));
    let dir = t.at("links");
    assert_eq!(link_dir(&dir, &found).unwrap(), text(&dir));
    assert_eq!(fs::read_link(dir.join("libcuda.so")).unwrap(), cuda);
    assert_eq!(fs::read_link(dir.join("libnccl.so")).unwrap(), cached);
    // A file in a searched directory comes before the cache's.
    let searched = t.file("usr/local/cuda/lib64/libnccl.so.2");
    assert_eq!(
        find(&t.roots(&[], &cache)).get("nccl").unwrap().path,
        searched
    );
}

#[test]
fn links_are_made_once_replaced_when_wrong_and_removed_when_gone() {
    let t = Tree::new();
    let lib = "usr/local/cuda/lib64";
    let cublas = t.file(&format!("{lib}/libcublas.so.13"));
    let nvrtc = t.file(&format!("{lib}/libnvrtc.so.13"));
    let nccl = t.file("wheel/nvidia/nccl/lib/libnccl.so.2");
    let env = [("LD_LIBRARY_PATH", text(nccl.parent().unwrap()))];
    let found = find(&t.roots(&env, ""));
    let dir = t.at("data/cuda-libs");
    let other = dir.join("README");
    let prefix = link_dir(&dir, &found).unwrap();
    assert_eq!(
        prefix,
        format!(
            "{}:{}:{}",
            dir.display(),
            t.at(lib).display(),
            t.at("wheel/nvidia/nccl/lib").display()
        )
    );
    fs::write(&other, "kept").unwrap();
    let links = || {
        let mut names: Vec<(String, PathBuf)> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter_map(|p| Some((text(&p), fs::read_link(&p).ok()?)))
            .collect();
        names.sort();
        names
    };
    let first = links();
    assert_eq!(
        first,
        [
            (text(&dir.join("libcublas.so")), cublas.clone()),
            (text(&dir.join("libnccl.so")), nccl.clone()),
            (text(&dir.join("libnvrtc.so")), nvrtc.clone()),
        ]
    );
    // Again: the same links, the same value, nothing left behind.
    assert_eq!(link_dir(&dir, &found).unwrap(), prefix);
    assert_eq!(links(), first);
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 4);
    // A wrong link is replaced; a library no longer found loses its link; a link at a
    // name ringleader does not manage, and other files, stay.
    fs::remove_file(dir.join("libcublas.so")).unwrap();
    std::os::unix::fs::symlink("/nonexistent", dir.join("libcublas.so")).unwrap();
    std::os::unix::fs::symlink("/nonexistent", dir.join("libfoo.so")).unwrap();
    fs::remove_file(&nvrtc).unwrap();
    let found = find(&t.roots(&env, ""));
    assert_eq!(found.missing, ["cuda", "cublasLt", "nvrtc"]);
    link_dir(&dir, &found).unwrap();
    assert_eq!(fs::read_link(dir.join("libcublas.so")).unwrap(), cublas);
    assert!(fs::symlink_metadata(dir.join("libnvrtc.so")).is_err());
    assert!(fs::symlink_metadata(dir.join("libfoo.so")).is_ok());
    assert_eq!(fs::read_to_string(&other).unwrap(), "kept");
}

#[test]
fn a_link_dir_that_cannot_be_an_entry_is_refused() {
    let t = Tree::new();
    let e = link_dir(&t.at("a:b"), &Found::default()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn the_inherited_path_stays_whole_and_last() {
    let prefix = "/d/cuda-libs:/opt/cuda/lib:/wheel/lib";
    assert_eq!(library_path(prefix, None), prefix);
    assert_eq!(library_path(prefix, Some("")), prefix);
    assert_eq!(
        library_path(prefix, Some("/conda/lib:/usr/local/nvidia/lib64")),
        "/d/cuda-libs:/opt/cuda/lib:/wheel/lib:/conda/lib:/usr/local/nvidia/lib64"
    );
    // A found directory already inherited keeps its inherited place; the link
    // directory stays first whatever the rest holds; empty entries of the rest (the
    // current directory, to the loader) are kept as given.
    assert_eq!(
        library_path(prefix, Some("/wheel/lib:/d/cuda-libs::/x")),
        "/d/cuda-libs:/opt/cuda/lib:/wheel/lib:/d/cuda-libs::/x"
    );
    assert_eq!(library_path("/d/cuda-libs", Some("/x")), "/d/cuda-libs:/x");
}

#[test]
fn this_hosts_libraries_are_real_files_of_a_wanted_major() {
    // Whatever the host has (none on most test hosts; run with --nocapture on a GPU
    // host to see what the node would link).
    let found = find(&SearchRoots::of_host());
    eprintln!("cuda libs: {found}; missing: {:?}", found.missing);
    assert_eq!(found.libraries.len() + found.missing.len(), WANTED.len());
    for library in &found.libraries {
        let wanted = WANTED.iter().find(|w| w.name == library.name).unwrap();
        assert!(wanted.majors.contains(&library.major), "{library:?}");
        assert!(library.target.is_file(), "{library:?}");
    }
}

#[test]
fn versions_sort_by_number() {
    assert!(version_key("cuda-12.10") > version_key("cuda-12.8"));
    assert!(version_key("cuda-13.0") > version_key("cuda-12.10"));
    assert!(version_key("python3.12") > version_key("python3.9"));
    assert_eq!(version_key("cuda"), Vec::<u32>::new());
}
