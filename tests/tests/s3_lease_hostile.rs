//! Hostile S3 lease objects (issue 24.6): whoever may write the lease
//! prefix writes values no bagel client would, straight to the real S3
//! server, and the real `bagel` CLI on `--lease-store` must answer with a
//! precise error naming the object and the field: never a silent
//! saturation, a name held forever, or one refused for a made-up reason
//! while `describe` calls it free. A garbage key record is skipped with a
//! warning, so readers trusting the store's keys still read.

use std::process::{Command, Output};

use bagel_tests::{Roughtime, bin, describe_output, s3_bucket, s3_lease_url, unique};
use object_store::path::{Path, PathPart};
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};

/// One lease prefix on the test bucket, driven through the CLI.
struct Prefix {
    prefix: String,
    url: String,
    state: tempfile::TempDir,
}

impl Prefix {
    fn new() -> Self {
        let prefix = unique("hostile");
        Prefix {
            url: s3_lease_url(&prefix),
            prefix,
            state: tempfile::tempdir().unwrap(),
        }
    }

    /// `bagel --lease-store <url> <args>` with Roughtime, waiting for it.
    fn bagel(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(bin("bagel"));
        cmd.args(Roughtime::from_env().flags())
            .args(["--lease-store", &self.url, "--clock-margin", "14s"])
            .args(args)
            .env("BAGEL_STATE_DIR", self.state.path())
            .env("RUST_LOG", "warn");
        cmd
    }

    fn object(&self, name: &str) -> Path {
        Path::from(self.prefix.as_str())
            .join("leases")
            .join(PathPart::from(name))
    }

    /// The object the store holds for `name`, as JSON.
    async fn read(&self, name: &str) -> serde_json::Value {
        let got = s3().get(&self.object(name)).await.unwrap();
        serde_json::from_slice(&got.bytes().await.unwrap()).unwrap()
    }

    /// Overwrites `name`'s object with `bytes`, as anyone with write access
    /// to the prefix can.
    async fn write_raw(&self, name: &str, bytes: Vec<u8>) {
        s3().put(&self.object(name), PutPayload::from(bytes))
            .await
            .unwrap();
    }

    async fn write(&self, name: &str, obj: &serde_json::Value) {
        self.write_raw(name, serde_json::to_vec(obj).unwrap()).await;
    }

    /// Acquires `name` (and releases it unless `hold`), returning the
    /// lease JSON.
    fn cycle(&self, name: &str, hold: bool) -> serde_json::Value {
        let out = self.bagel(&["acquire", name, "--ttl", "5s", "--json"]);
        assert!(out.status.success(), "{}", describe_output(&out));
        let lease: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if !hold {
            let id = lease["lease_id"].as_str().unwrap();
            let token = lease["token"].as_str().unwrap();
            let out = self.bagel(&["release", "--lease", id, "--token", token, "--name", name]);
            assert!(out.status.success(), "{}", describe_output(&out));
        }
        lease
    }
}

fn s3() -> std::sync::Arc<dyn ObjectStore> {
    bagel_bags::store::url::s3_from_env(&s3_bucket()).unwrap()
}

/// Asserts `out` failed with exit 1 and a message naming `field` in the
/// object of `name`.
fn refused_naming(out: &Output, p: &Prefix, name: &str, field: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(out));
    assert!(
        err.contains(field),
        "not naming {field}: {}",
        describe_output(out)
    );
    let object = format!("{}/leases/{name}", p.url);
    assert!(
        err.contains(&object),
        "not naming {object}: {}",
        describe_output(out)
    );
}

/// A fencing token of u64::MAX - 1: one more grant gets u64::MAX, the next
/// is refused naming the field (today three grants all got u64::MAX).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_token_at_the_top_is_refused_not_reused() {
    let p = Prefix::new();
    p.cycle("n", false);
    let mut obj = p.read("n").await;
    obj["fencing_token"] = serde_json::json!(u64::MAX - 1);
    p.write("n", &obj).await;
    let lease = p.cycle("n", false);
    assert_eq!(lease["names"][0]["fencing_token"], serde_json::json!(u64::MAX));
    let out = p.bagel(&["acquire", "n", "--ttl", "5s", "--json"]);
    refused_naming(&out, &p, "n", "fencing_token = 18446744073709551615");
}

/// A previous watermark near u64::MAX is refused naming it (today it was
/// handed on as `min_timestamp_us` above the grant's own deadline, and
/// `bagel write` exited 75 forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watermark_beyond_any_deadline_is_refused() {
    let p = Prefix::new();
    p.cycle("n", false);
    let mut obj = p.read("n").await;
    obj["previous"]["watermark_us"] = serde_json::json!(u64::MAX - 7);
    p.write("n", &obj).await;
    let out = p.bagel(&["acquire", "n", "--ttl", "5s", "--json"]);
    refused_naming(&out, &p, "n", "previous.watermark_us");
    // Within the max TTL but past the deadline asked for: still refused,
    // never granted as a lease nothing can be written under.
    let mut obj = p.read("n").await;
    let now = bagel_client::Micros::now().as_micros();
    obj["previous"]["watermark_us"] = serde_json::json!(now + 30_000_000);
    p.write("n", &obj).await;
    let out = p.bagel(&["acquire", "n", "--ttl", "5s", "--json"]);
    refused_naming(&out, &p, "n", "previous.watermark_us");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not below this grant's deadline"),
        "{}",
        describe_output(&out)
    );
}

/// A holder deadline of u64::MAX is named, not obeyed (today the name was
/// held forever: exit 2, "held until" the end of time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_at_the_end_of_time_is_refused() {
    let p = Prefix::new();
    p.cycle("n", true);
    let mut obj = p.read("n").await;
    obj["holder"]["deadline_us"] = serde_json::json!(u64::MAX);
    p.write("n", &obj).await;
    let out = p.bagel(&["acquire", "n", "--ttl", "5s"]);
    refused_naming(&out, &p, "n", "holder.deadline_us");
    let out = p.bagel(&["describe", "n"]);
    refused_naming(&out, &p, "n", "holder.deadline_us");
}

/// `last_granted_at_us` u64::MAX: acquire and describe both name it (today
/// acquire blamed the clock and describe said the name was free).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_time_at_the_end_of_time_is_refused_by_acquire_and_describe() {
    let p = Prefix::new();
    p.cycle("n", false);
    let mut obj = p.read("n").await;
    obj["last_granted_at_us"] = serde_json::json!(u64::MAX);
    p.write("n", &obj).await;
    let out = p.bagel(&["acquire", "n", "--ttl", "5s"]);
    refused_naming(&out, &p, "n", "last_granted_at_us");
    let out = p.bagel(&["describe", "n", "--json"]);
    refused_naming(&out, &p, "n", "last_granted_at_us");
}

/// A lease object over the size limit is refused from its size, naming the
/// limit (today a 300 MB object was read whole; here an honest object
/// padded to 3 MiB, which today parsed and was used).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_lease_object_is_refused_by_its_size() {
    let p = Prefix::new();
    p.cycle("n", false);
    let mut bytes = serde_json::to_vec(&p.read("n").await).unwrap();
    bytes.resize(3 << 20, b' ');
    p.write_raw("n", bytes).await;
    let out = p.bagel(&["acquire", "n", "--ttl", "5s"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    assert!(
        err.contains("3145728 bytes, over the limit of 1048576 bytes") && err.contains("leases/n"),
        "{}",
        describe_output(&out)
    );
}

/// A garbage object under `keys/` is skipped with a warning naming it:
/// `verify-witness` and `read` with `--lease-store` still verify what the
/// store's real keys signed (today every such command failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_key_record_is_skipped_and_reported_not_fatal() {
    let p = Prefix::new();
    let lease = p.cycle("n", true);
    let file = p.state.path().join("lease.json");
    std::fs::write(&file, serde_json::to_vec(&lease).unwrap()).unwrap();
    let file = file.display().to_string();
    let bags_dir = tempfile::tempdir().unwrap();
    let bags = format!("file://{}", bags_dir.path().display());
    let mut write = p.command(&["write", "--store", &bags, "--log", "l", "--lease", &file]);
    write.stdin(std::process::Stdio::piped());
    let mut child = write.stdout(std::process::Stdio::piped()).spawn().unwrap();
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"m1\n").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", describe_output(&out));

    let garbage = Path::from(p.prefix.as_str()).join("keys").join("garbage");
    s3().put(&garbage, PutPayload::from_static(b"\x00not a key"))
        .await
        .unwrap();

    let out = p.bagel(&["verify-witness", &file]);
    assert!(out.status.success(), "{}", describe_output(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("keys/garbage"),
        "the skipped record is reported: {}",
        describe_output(&out)
    );
    let out = p.bagel(&[
        "read",
        "--store",
        &bags,
        "--log",
        "l",
        "--include-open",
        "--no-close",
        "--json",
    ]);
    assert!(out.status.success(), "{}", describe_output(&out));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "message")
        .collect();
    assert_eq!(lines.len(), 1, "{}", describe_output(&out));
    assert_eq!(
        lines[0]["verified"],
        serde_json::json!(true),
        "{}",
        describe_output(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("keys/garbage"),
        "{}",
        describe_output(&out)
    );
}
