//! `scripts/cuda-libs.sh`, the shell twin of `collective::cuda_libs` that
//! `scripts/bench-gpu.sh` sources, under `set -euo pipefail`: a linker cache longer than a
//! pipe's 64 KiB no longer ends the script with status 141 (SIGPIPE from an early-closed
//! pipe), and CUDA 13's libraries in a toolkit's `targets/*/lib` and NCCL's `libnccl.so.2`
//! from the cache are linked by the names cudarc loads.

use std::path::Path;
use std::process::Command;

#[test]
fn a_long_linker_cache_and_cuda_13_are_found_under_pipefail() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // A fake `ldconfig -p`: 2 000 entries (over 64 KiB), NCCL among the last.
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let nccl_dir = root.join("sys");
    std::fs::create_dir_all(&nccl_dir).unwrap();
    std::fs::write(nccl_dir.join("libnccl.so.2"), "").unwrap();
    let mut cache = String::from("2001 libs found in cache `/etc/ld.so.cache'\n");
    for i in 0..2000 {
        cache += &format!(
            "\tlibfiller{i}.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libfiller{i}.so.1\n"
        );
    }
    cache += &format!(
        "\tlibnccl.so.2 (libc6,x86-64) => {}\n",
        nccl_dir.join("libnccl.so.2").display()
    );
    assert!(cache.len() > 64 * 1024);
    std::fs::write(root.join("cache.txt"), &cache).unwrap();
    let ldconfig = bin.join("ldconfig");
    std::fs::write(
        &ldconfig,
        format!("#!/bin/sh\ncat {}\n", root.join("cache.txt").display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ldconfig, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A CUDA 13 toolkit with its libraries under targets/x86_64-linux/lib.
    let lib = root.join("cuda-13.0/targets/x86_64-linux/lib");
    std::fs::create_dir_all(&lib).unwrap();
    for f in ["libcublas.so.13", "libcublasLt.so.13", "libnvrtc.so.13"] {
        std::fs::write(lib.join(f), "").unwrap();
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/cuda-libs.sh");
    let links = root.join("links");
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -euo pipefail; . {}; cuda_libs_env {}; echo \"LIBS=$LD_LIBRARY_PATH\"",
            script.display(),
            links.display()
        ))
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("CUDA_HOME", root.join("cuda-13.0"))
        .env("PYTHON", "/nonexistent/python3")
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "status {:?}: {stderr}", out.status);
    let target = |name: &str| std::fs::read_link(links.join(name)).unwrap();
    assert_eq!(target("libcublas.so"), lib.join("libcublas.so.13"));
    assert_eq!(target("libnvrtc.so"), lib.join("libnvrtc.so.13"));
    assert_eq!(target("libnccl.so"), nccl_dir.join("libnccl.so.2"));
    assert!(
        stdout.contains(&format!("LIBS={}:", links.display())),
        "the links come first: {stdout}"
    );
}
