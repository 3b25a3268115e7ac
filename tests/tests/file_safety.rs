//! Issue 38, item 5: every file bagel writes is created exclusively,
//! never through a link, in a directory of its user that no one else can
//! write to (created 0700, else refused, naming it); without `HOME` the
//! state directory is one per user, not a shared name in `/tmp`.
//!
//! The tests run as root, and root ignores file modes: nothing here
//! relies on a permission error. Ownership is set with chown (root can),
//! modes and links are checked as such.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use bagel_tests::{ServerProcess, describe_output};

/// A uid no test process runs as.
const STRANGER: u32 = 4242;

/// `bagel --server URL ARGS` with `envs` set and `unset` removed.
fn bagel(server: &ServerProcess, args: &[&str], envs: &[(&str, &Path)], unset: &[&str]) -> Output {
    let mut cmd = Command::new(bagel_tests::bin("bagel"));
    cmd.args(["--server", &server.url]).args(args);
    for k in unset {
        cmd.env_remove(k);
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null()).output().expect("bagel")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

/// The uid this test (and the `bagel` it starts) runs as.
fn my_uid(dir: &Path) -> u32 {
    std::fs::metadata(dir).unwrap().uid()
}

/// The name is free: nobody took it (or it was released).
fn free(server: &ServerProcess, name: &str) {
    let out = server.cli(&["acquire", name, "--ttl", "5s"]);
    assert!(out.status.success(), "{name} is held: {}", describe_output(&out));
}

#[tokio::test]
async fn a_link_planted_at_the_lease_files_temporary_name_is_not_followed() {
    let server = ServerProcess::start_ready(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    // The lease file goes in directories bagel creates: 0700.
    let lease_file = dir.path().join("new/sub/lease.json");
    std::fs::create_dir_all(lease_file.parent().unwrap()).unwrap();
    std::fs::set_permissions(
        lease_file.parent().unwrap(),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    std::os::unix::fs::symlink(&victim, dir.path().join("new/sub/lease.json.tmp")).unwrap();
    let state = dir.path().join("state");
    let out = bagel(
        &server,
        &[
            "run",
            "--name",
            "planted",
            "--lease-file",
            lease_file.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "grep -q holder_secret \"$BAGEL_LEASE_FILE\"",
        ],
        &[("BAGEL_STATE_DIR", &state)],
        &[],
    );
    assert!(out.status.success(), "{}", describe_output(&out));
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "precious\n",
        "the lease file was written through the planted link"
    );
    let meta = std::fs::symlink_metadata(&lease_file).unwrap();
    assert!(
        meta.file_type().is_file(),
        "the lease file is a {:?}",
        meta.file_type()
    );
    assert_eq!(mode(&lease_file), 0o600);
    assert!(
        std::fs::read_to_string(&lease_file)
            .unwrap()
            .contains("\"token\"")
    );
    assert!(
        std::fs::symlink_metadata(dir.path().join("new/sub/lease.json.tmp")).is_err(),
        "the temporary name is left behind"
    );
    // A lease file in a directory bagel creates: 0700 up from it.
    let fresh = dir.path().join("made/by/bagel/lease.json");
    let out = bagel(
        &server,
        &[
            "run",
            "--name",
            "fresh",
            "--lease-file",
            fresh.to_str().unwrap(),
            "--",
            "true",
        ],
        &[("BAGEL_STATE_DIR", &state)],
        &[],
    );
    assert!(out.status.success(), "{}", describe_output(&out));
    for d in ["made", "made/by", "made/by/bagel"] {
        assert_eq!(mode(&dir.path().join(d)), 0o700, "{d}");
    }
    assert_eq!(mode(&state), 0o700);
}

/// Before: with HOME and XDG_STATE_HOME unset the state directory was
/// `$TMPDIR/bagel-state`, owned by whoever made it first; a `run` link
/// in it sent the lease file (token, holder key) to another user's
/// directory.
#[tokio::test]
async fn without_home_the_state_directory_is_this_users_own() {
    let server = ServerProcess::start_ready(&[]).await;
    let tmp = tempfile::tempdir().unwrap();
    let uid = my_uid(tmp.path());
    // Another user's shared state directory, and in it a link to theirs.
    let shared = tmp.path().join("bagel-state");
    let theirs = tmp.path().join("theirs");
    for d in [&shared, &theirs] {
        std::fs::create_dir(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::os::unix::fs::chown(d, Some(STRANGER), Some(STRANGER)).unwrap();
    }
    std::os::unix::fs::symlink(&theirs, shared.join("run")).unwrap();
    let seen = tmp.path().join("seen");
    let out = bagel(
        &server,
        &[
            "run",
            "--name",
            "homeless",
            "--",
            "sh",
            "-c",
            "echo \"$BAGEL_LEASE_FILE\" > \"$SEEN\"",
        ],
        &[("TMPDIR", tmp.path()), ("SEEN", &seen)],
        &["HOME", "XDG_STATE_HOME", "BAGEL_STATE_DIR"],
    );
    assert!(out.status.success(), "{}", describe_output(&out));
    let own = tmp.path().join(format!("bagel-{uid}"));
    let used = std::fs::read_to_string(&seen).unwrap();
    assert!(
        used.starts_with(&format!("{}/run/", own.display())),
        "the lease file was {used:?}, not in {}",
        own.display()
    );
    assert_eq!(
        std::fs::read_dir(&theirs).unwrap().count(),
        0,
        "the lease file went into another user's directory"
    );
    assert_eq!(mode(&own), 0o700);
    assert_eq!(mode(&own.join("run")), 0o700);
}

#[tokio::test]
async fn a_state_directory_of_another_user_is_refused_naming_it_before_any_lease() {
    let server = ServerProcess::start_ready(&[]).await;
    let tmp = tempfile::tempdir().unwrap();
    let uid = my_uid(tmp.path());
    // Made first by someone else, under the per-user name.
    let own = tmp.path().join(format!("bagel-{uid}"));
    std::fs::create_dir(&own).unwrap();
    std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&own, Some(STRANGER), Some(STRANGER)).unwrap();
    let ran = tmp.path().join("ran");
    let out = bagel(
        &server,
        &["run", "--name", "squatted", "--", "sh", "-c", "touch \"$RAN\""],
        &[("TMPDIR", tmp.path()), ("RAN", &ran)],
        &["HOME", "XDG_STATE_HOME", "BAGEL_STATE_DIR"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    let want = format!(
        "refusing the state directory {}: it is owned by uid {STRANGER}, not by this user (uid {uid})",
        own.display()
    );
    assert!(stderr(&out).contains(&want), "{}", describe_output(&out));
    assert!(!ran.exists(), "the command ran");
    assert_eq!(std::fs::read_dir(&own).unwrap().count(), 0, "bagel wrote into it");
    free(&server, "squatted");
}

#[tokio::test]
async fn a_state_directory_that_is_a_link_or_open_to_others_is_refused_naming_it() {
    let server = ServerProcess::start_ready(&[]).await;
    let tmp = tempfile::tempdir().unwrap();
    let real = tmp.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    // A state directory of ours whose `run` is a link (to a directory of
    // ours, so only the link itself is wrong).
    let ours = tmp.path().join("ours");
    std::fs::create_dir(&ours).unwrap();
    std::fs::set_permissions(&ours, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&real, ours.join("run")).unwrap();
    let cases = [
        (
            &link,
            format!(
                "refusing the state directory {}: it is a symbolic link",
                link.display()
            ),
        ),
        (
            &open,
            format!(
                "refusing the state directory {}: its mode 0777 lets others write to it",
                open.display()
            ),
        ),
        (
            &ours,
            format!(
                "refusing the state directory {}: it is a symbolic link",
                ours.join("run").display()
            ),
        ),
    ];
    for (state, want) in cases {
        let out = bagel(
            &server,
            &["run", "--name", "refused", "--", "true"],
            &[("BAGEL_STATE_DIR", state)],
            &[],
        );
        assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
        assert!(
            stderr(&out).contains(&want),
            "want {want:?}: {}",
            describe_output(&out)
        );
    }
    assert_eq!(
        std::fs::read_dir(&real).unwrap().count(),
        0,
        "bagel wrote through a link"
    );
    assert_eq!(std::fs::read_dir(&open).unwrap().count(), 0);
    // The lease file's own directory is checked the same way.
    let theirs = tmp.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(STRANGER), Some(STRANGER)).unwrap();
    let file = theirs.join("lease.json");
    let out = bagel(
        &server,
        &[
            "run",
            "--name",
            "refused",
            "--lease-file",
            file.to_str().unwrap(),
            "--",
            "true",
        ],
        &[("BAGEL_STATE_DIR", &tmp.path().join("state"))],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    let want = format!(
        "refusing the lease file's directory {}: it is owned by uid {STRANGER}",
        theirs.display()
    );
    assert!(
        stderr(&out).contains(&want),
        "want {want:?}: {}",
        describe_output(&out)
    );
    assert!(!file.exists());
    free(&server, "refused");
}

/// The server's granted-until mark, beside its key: a link planted at the
/// mark's temporary name is removed, never written through.
#[tokio::test]
async fn the_servers_mark_is_not_written_through_a_planted_link() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("server.key");
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let tmp_name = dir.path().join("server.key.granted-until.tmp");
    std::os::unix::fs::symlink(&victim, &tmp_name).unwrap();
    let server = ServerProcess::start_ready(&["--key", key.to_str().unwrap()]).await;
    // A grant is answered only once the mark covering it is on disk.
    let out = server.cli(&["acquire", "marked", "--ttl", "5s"]);
    assert!(out.status.success(), "{}", describe_output(&out));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    let mark = dir.path().join("server.key.granted-until");
    assert!(std::fs::symlink_metadata(&mark).unwrap().file_type().is_file());
    assert_eq!(mode(&mark), 0o600);
}
