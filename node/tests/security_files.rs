//! Real-process test of the node's file handling under `dataset add` and `dataset get --to`
//! (issue 22): a path that is a symbolic link is refused (`/etc/shadow` added through a link
//! once became a world-readable copy), a copy never gets wider permission bits than its
//! source, and `get --to` never writes through a link planted at the directory, at a
//! directory below it or at a file's place. Waits poll with deadlines.

mod common;

use std::{
    os::unix::fs::{symlink, PermissionsExt},
    path::Path,
    process::Output,
    time::Duration,
};

use common::mode;
use common::{fails, ok};
use ringleader::cli::local::LocalCluster;

const FORM_WAIT: Duration = Duration::from_secs(60);

fn cli(c: &LocalCluster, args: &[&str]) -> Output {
    c.cli(0).args(args).output().expect("running the CLI")
}

#[test]
fn add_refuses_links_keeps_modes_and_get_to_never_writes_through_a_link() {
    let root = tempfile::Builder::new()
        .prefix("rl-secfiles-")
        .tempdir()
        .unwrap();
    let c = common::formed_cluster(&root.path().join("nodes"), "f", 1, &[], FORM_WAIT);
    let work = root.path().join("work");
    std::fs::create_dir_all(work.join("src/sub")).unwrap();

    // Phase 1: a private file added through a link is refused, naming the link.
    let secret = work.join("secret");
    std::fs::write(&secret, b"root:$6$not-really:19000:0:99999:7:::\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = work.join("looks-harmless");
    symlink(&secret, &link).unwrap();
    let err = fails(cli(
        &c,
        &["dataset", "add", "linked", link.to_str().unwrap()],
    ));
    assert!(
        err.contains("looks-harmless") && err.contains("symlink"),
        "{err}"
    );
    // A link below a directory, even one pointing inside it, is refused too.
    std::fs::write(work.join("src/a.txt"), b"alpha").unwrap();
    std::fs::write(work.join("src/sub/b.txt"), b"beta").unwrap();
    symlink(work.join("src/a.txt"), work.join("src/sub/inner")).unwrap();
    let src = work.join("src");
    let err = fails(cli(&c, &["dataset", "add", "tree", src.to_str().unwrap()]));
    assert!(
        err.contains("sub/inner") && err.contains("symlink"),
        "{err}"
    );
    std::fs::remove_file(work.join("src/sub/inner")).unwrap();

    // Phase 2: named directly, the private file's stored copy is no wider than 0600.
    ok(cli(
        &c,
        &["dataset", "add", "private", secret.to_str().unwrap()],
    ));
    let store = c.nodes[0].dir.join("datasets");
    let copies: Vec<_> = walk(&store)
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "secret"))
        .collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert_eq!(mode(&copies[0]) & !0o600, 0, "{:o}", mode(&copies[0]));

    // Phase 3: `get --to` refuses a link at the directory, below it, and at a file's place,
    // and what they point to is left as it was.
    std::fs::set_permissions(
        work.join("src/a.txt"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    ok(cli(&c, &["dataset", "add", "tree", src.to_str().unwrap()]));
    let outside = work.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("b.txt"), b"victim").unwrap();
    let planted = [
        ("to-link", None, outside.clone()),
        ("to-sub", Some("sub"), outside.clone()),
        ("to-file", Some("sub/b.txt"), outside.join("b.txt")),
    ];
    for (dir, below, target) in planted {
        let to = work.join(dir);
        let at = match below {
            None => to.clone(),
            Some(below) => {
                std::fs::create_dir_all(to.join(below).parent().unwrap()).unwrap();
                to.join(below)
            }
        };
        symlink(&target, &at).unwrap();
        let err = fails(cli(
            &c,
            &["dataset", "get", "tree", "--to", to.to_str().unwrap()],
        ));
        assert!(
            err.contains(at.to_str().unwrap()) && err.contains("symlink"),
            "{dir}: {err}"
        );
        assert_eq!(std::fs::read(outside.join("b.txt")).unwrap(), b"victim");
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            1,
            "{dir}: nothing written outside"
        );
    }

    // Phase 4: a plain directory gets the files.
    let to = work.join("to-plain");
    ok(cli(
        &c,
        &["dataset", "get", "tree", "--to", to.to_str().unwrap()],
    ));
    assert_eq!(std::fs::read(to.join("sub/b.txt")).unwrap(), b"beta");
    assert_eq!(std::fs::read(to.join("a.txt")).unwrap(), b"alpha");
    assert_eq!(mode(&to.join("a.txt")) & 0o077, 0, "written private");
}

/// Every file below `dir`, not following links.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let kind = e.file_type().unwrap();
            if kind.is_dir() {
                dirs.push(e.path());
            } else if kind.is_file() {
                out.push(e.path());
            }
        }
    }
    out
}
