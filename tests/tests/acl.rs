//! The access policy (issue 43): `bagel-server --acl FILE` over real TLS,
//! with identities from client certificates (mutual TLS) and from bearer
//! tokens. An identity is refused outside its prefixes on every RPC
//! (Batch and Session operations included); List and Watch answer only
//! what it may read and refuse a prefix it may not; a reload takes effect
//! for new calls and leaves held leases held; a file that does not parse
//! is kept out; tokens appear in no log line or answer; per-owner quotas
//! key on the identity.

use std::io::BufRead as _;
use std::net::{IpAddr, Ipv4Addr};

use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::{ServerOptions, ServerProcess};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, SanType,
};
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const SEC: u64 = 1_000_000;

/// A certificate authority made for the test.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf certificate (CN `cn`, O `org`) and its key, as PEM.
    fn leaf(&self, cn: &str, org: &str, server: bool) -> (String, String) {
        self.leaf_named(
            &[(DnType::CommonName, cn), (DnType::OrganizationName, org)],
            &[],
            server,
        )
    }

    /// A leaf certificate whose subject is `subject` (empty: none at all)
    /// with the URI SANs `uris`, and its key, as PEM.
    fn leaf_named(&self, subject: &[(DnType, &str)], uris: &[&str], server: bool) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        for uri in uris {
            params
                .subject_alt_names
                .push(SanType::URI((*uri).try_into().unwrap()));
        }
        params.distinguished_name = DistinguishedName::new();
        for (attr, value) in subject {
            params.distinguished_name.push(attr.clone(), *value);
        }
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// Adds `authorization: Bearer <token>` to every call, when it has one.
#[derive(Clone)]
struct Token(Option<String>);

impl tonic::service::Interceptor for Token {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(t) = &self.0 {
            req.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        Ok(req)
    }
}

type Client = LeaseServiceClient<InterceptedService<Channel, Token>>;

/// A server over TLS (mutual, with `client_ca`) under the policy `policy`,
/// and the directory holding its files.
struct Setup {
    ca: Ca,
    dir: tempfile::TempDir,
    server: ServerProcess,
}

impl Setup {
    async fn start(policy: &str, mutual: bool, extra: &[&str], options: ServerOptions) -> Setup {
        let ca = Ca::new("bagel acl test CA");
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.to_str().unwrap().to_owned()
        };
        let (cert, key) = ca.leaf("lease-server", "bagel tests", true);
        let cert = write("server.pem", &cert);
        let key = write("server.key", &key);
        let ca_file = write("ca.pem", &ca.pem);
        let acl = write("acl.toml", policy);
        let mut args = vec![
            "--unsafe-skip-restart-wait",
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--acl",
            &acl,
        ];
        if mutual {
            args.extend(["--client-ca", &ca_file]);
        }
        args.extend_from_slice(extra);
        let server = ServerProcess::spawn_with(&args, options).await;
        Setup { ca, dir, server }
    }

    /// Replaces the policy file at once (written beside it, then renamed
    /// over it, as docs/security.md tells operators to).
    fn rewrite(&self, policy: &str) {
        let tmp = self.dir.path().join("acl.toml.new");
        std::fs::write(&tmp, policy).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("acl.toml")).unwrap();
    }

    /// A client showing the certificate of `cn` in `org` (mutual TLS) or
    /// the bearer `token`; it retries until the server answers ServerInfo
    /// (the start-up only).
    async fn client(&self, cert_of: Option<(&str, &str)>, token: Option<&str>) -> Client {
        let identity = cert_of.map(|(cn, org)| self.ca.leaf(cn, org, false));
        self.client_with(identity, token).await
    }

    /// A client showing `identity` (certificate and key, PEM), if any.
    async fn client_with(&self, identity: Option<(String, String)>, token: Option<&str>) -> Client {
        loop {
            let mut tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&self.ca.pem))
                .domain_name("localhost");
            if let Some((cert, key)) = &identity {
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            let channel = Channel::from_shared(format!("https://{}", self.server.addr))
                .unwrap()
                .tls_config(tls)
                .unwrap()
                .connect()
                .await;
            if let Ok(channel) = channel {
                let mut c = LeaseServiceClient::with_interceptor(channel, Token(token.map(str::to_owned)));
                if c.server_info(pb::ServerInfoRequest {}).await.is_ok() {
                    return c;
                }
            }
            tokio::task::yield_now().await;
        }
    }
}

fn acquire(names: &[&str]) -> pb::AcquireRequest {
    pb::AcquireRequest {
        names: names.iter().map(|n| (*n).to_owned()).collect(),
        ttl_us: 9 * SEC,
        owner: "whoever".into(),
        mode: pb::Mode::Full.into(),
        ..Default::default()
    }
}

/// Asserts a PERMISSION_DENIED that names the identity, the permission
/// and the name or prefix, and says it is the policy's refusal in its
/// details (a client tells it from a lease that is not the caller's by
/// them, not by the words).
#[track_caller]
fn assert_denied(status: &tonic::Status, identity: &str, permission: &str, name: &str) {
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let m = status.message();
    for needle in [identity, permission, &format!("{name:?}")] {
        assert!(m.contains(needle), "{m:?} lacks {needle:?}");
    }
    let (reason, meta) = bagel_proto::details::error_info_of(status.details()).expect("an ErrorInfo");
    assert_eq!(reason, bagel_proto::details::REASON_PERMISSION_DENIED);
    assert_eq!(meta["permission"], permission, "{meta:?}");
}

fn op_error(r: &pb::BatchResult) -> &pb::OpError {
    match r.result.as_ref().unwrap() {
        pb::batch_result::Result::Error(e) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

async fn holder(c: &mut Client, name: &str) -> Option<pb::Holder> {
    let d = c
        .describe(pb::DescribeRequest {
            names: vec![name.to_owned()],
        })
        .await
        .unwrap()
        .into_inner();
    d.names[0].holder.clone()
}

const TEAMS: &str = r#"
# Team A's machines: everything under team-a/, and read of shared/.
[[grant]]
subject = { CN = "team-a-*", O = "bagel tests" }
prefixes = ["team-a/"]
permissions = ["lease", "read"]

[[grant]]
subject = { CN = "team-a-*" }
prefixes = ["shared/"]
permissions = ["read"]

[[grant]]
subject = { CN = "team-b-*" }
prefixes = ["team-b/", "shared/"]
permissions = ["lease", "read"]
"#;

#[tokio::test]
async fn an_identity_is_refused_outside_its_prefixes_on_every_rpc() {
    let s = Setup::start(TEAMS, true, &[], ServerOptions::default()).await;
    let mut a = s.client(Some(("team-a-1", "bagel tests")), None).await;
    let mut b = s.client(Some(("team-b-1", "bagel tests")), None).await;

    // ServerInfo says who the caller is and what it may do.
    let info = a
        .server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let access = info.access.unwrap();
    assert_eq!(access.policy_version, 1);
    let me = access.identity.clone();
    assert!(me.contains("CN=team-a-1"), "{me:?}");
    let grants: Vec<(String, Vec<String>)> = access
        .grants
        .iter()
        .map(|g| (g.prefix.clone(), g.permissions.clone()))
        .collect();
    assert_eq!(
        grants,
        vec![
            ("shared/".to_owned(), vec!["read".to_owned()]),
            ("team-a/".to_owned(), vec!["lease".to_owned(), "read".to_owned()]),
        ]
    );

    // Acquire: inside its prefix, yes; elsewhere, and where it may only
    // read, no. A multi-name acquire needs every name, and takes none.
    a.acquire(acquire(&["team-a/1"])).await.unwrap();
    let e = a.acquire(acquire(&["team-b/1"])).await.unwrap_err();
    assert_denied(&e, &me, "lease", "team-b/1");
    let e = a.acquire(acquire(&["shared/1"])).await.unwrap_err();
    assert_denied(&e, &me, "lease", "shared/1");
    let e = a.acquire(acquire(&["team-a/2", "team-b/2"])).await.unwrap_err();
    assert_denied(&e, &me, "lease", "team-b/2");
    assert_eq!(holder(&mut a, "team-a/2").await, None);

    // Reads: describe, history, list, watch (by prefix and by names).
    let held_b = b
        .acquire(acquire(&["team-b/held"]))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    let e = a
        .describe(pb::DescribeRequest {
            names: vec!["team-a/1".into(), "team-b/held".into()],
        })
        .await
        .unwrap_err();
    assert_denied(&e, &me, "read", "team-b/held");
    assert!(
        !e.message().contains("CN=team-b-1"),
        "a refusal says nothing of the holder: {e:?}"
    );
    let e = a
        .history(pb::HistoryRequest {
            name: "team-b/held".into(),
        })
        .await
        .unwrap_err();
    assert_denied(&e, &me, "read", "team-b/held");
    let e = a
        .list(pb::ListRequest {
            prefix: "team-b/".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_denied(&e, &me, "read", "team-b/");
    let e = a
        .watch(pb::WatchRequest {
            prefix: "team-b/".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_denied(&e, &me, "read", "team-b/");
    let e = a
        .watch(pb::WatchRequest {
            names: vec!["team-b/held".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_denied(&e, &me, "read", "team-b/held");

    // Renew, upgrade, release of a lease on names it may not lease (with
    // mutual TLS the owner check refuses it first: the lease is another
    // certificate's).
    let renew = pb::RenewRequest {
        lease_id: held_b.lease_id.clone(),
        token: held_b.token.clone(),
        ttl_us: 9 * SEC,
        ..Default::default()
    };
    assert_eq!(
        a.renew(renew.clone()).await.unwrap_err().code(),
        Code::PermissionDenied
    );

    // Batch: each operation on its own.
    let batch = pb::BatchRequest {
        lean: false,
        ops: vec![
            pb::BatchOp {
                op: Some(pb::batch_op::Op::Acquire(acquire(&["team-a/3"]))),
            },
            pb::BatchOp {
                op: Some(pb::batch_op::Op::Acquire(acquire(&["team-b/3"]))),
            },
            pb::BatchOp {
                op: Some(pb::batch_op::Op::Renew(renew.clone())),
            },
        ],
    };
    let results = a.batch(batch.clone()).await.unwrap().into_inner().results;
    assert!(matches!(
        results[0].result,
        Some(pb::batch_result::Result::Grant(_))
    ));
    let e = op_error(&results[1]);
    assert_eq!(e.code, Code::PermissionDenied as i32);
    assert!(
        e.message.contains("\"team-b/3\"") && e.message.contains("lease"),
        "{e:?}"
    );
    assert_eq!(op_error(&results[2]).code, Code::PermissionDenied as i32);

    // Session: the same operations on a stream.
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::BatchRequest>(1);
    let mut answers = a
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut in_session = batch;
    in_session.ops[0] = pb::BatchOp {
        op: Some(pb::batch_op::Op::Acquire(acquire(&["team-a/4"]))),
    };
    tx.send(in_session).await.unwrap();
    let results = answers.message().await.unwrap().unwrap().results;
    assert!(matches!(
        results[0].result,
        Some(pb::batch_result::Result::Grant(_))
    ));
    assert_eq!(op_error(&results[1]).code, Code::PermissionDenied as i32);
    assert_eq!(op_error(&results[2]).code, Code::PermissionDenied as i32);
    drop(tx);

    // Team B renews its own lease: the policy lets it.
    b.renew(renew).await.unwrap();
    // What it may read of shared/, it reads; it is still no holder there.
    a.describe(pb::DescribeRequest {
        names: vec!["shared/x".into()],
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn list_and_watch_answer_only_what_the_caller_may_read() {
    let s = Setup::start(TEAMS, true, &[], ServerOptions::default()).await;
    let mut a = s.client(Some(("team-a-1", "bagel tests")), None).await;
    let mut b = s.client(Some(("team-b-1", "bagel tests")), None).await;
    b.acquire(acquire(&["team-b/1"])).await.unwrap();
    b.acquire(acquire(&["shared/1"])).await.unwrap();
    a.acquire(acquire(&["team-a/1"])).await.unwrap();

    let listed = |r: pb::ListResponse| r.names.into_iter().map(|n| n.name).collect::<Vec<_>>();
    // All names: only those under its prefixes.
    let all = a.list(pb::ListRequest::default()).await.unwrap().into_inner();
    assert_eq!(listed(all), ["shared/1", "team-a/1"]);
    let all_b = b.list(pb::ListRequest::default()).await.unwrap().into_inner();
    assert_eq!(listed(all_b), ["shared/1", "team-b/1"]);
    // A prefix inside its grant: all of it.
    let own = a
        .list(pb::ListRequest {
            prefix: "team-a/".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed(own), ["team-a/1"]);
    // Pages of one name page past the names it may not see.
    let mut token = String::new();
    let mut seen = Vec::new();
    loop {
        let page = a
            .list(pb::ListRequest {
                page_size: 1,
                page_token: token,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        seen.extend(page.names.iter().map(|n| n.name.clone()));
        if page.next_page_token.is_empty() {
            break;
        }
        // A page token is a name it may read, never one of team B's.
        assert!(
            ["shared/", "team-a/"]
                .iter()
                .any(|p| page.next_page_token.starts_with(p)),
            "{:?}",
            page.next_page_token
        );
        token = page.next_page_token;
    }
    assert_eq!(seen, ["shared/1", "team-a/1"]);

    // A watch of every name sees team A's event and not team B's, which
    // happened first.
    let mut events = a.watch(pb::WatchRequest::default()).await.unwrap().into_inner();
    b.acquire(acquire(&["team-b/2"])).await.unwrap();
    a.acquire(acquire(&["team-a/2"])).await.unwrap();
    let first = loop {
        let e = events.message().await.unwrap().unwrap();
        if e.kind() != pb::WatchEventKind::Progress {
            break e;
        }
    };
    assert_eq!(first.name, "team-a/2");
}

const TOKEN_V1: &str = r#"
[[token]]
identity = "ci"
sha256 = "HASH"

[[grant]]
identity = "ci"
prefixes = ["jobs/"]
permissions = ["lease", "read"]
"#;

/// Version 2: the CI may only read jobs/ now, and lease deploys/.
const TOKEN_V2: &str = r#"
[[token]]
identity = "ci"
sha256 = "HASH"

[[grant]]
identity = "ci"
prefixes = ["jobs/"]
permissions = ["read"]

[[grant]]
identity = "ci"
prefixes = ["deploys/"]
permissions = ["lease"]
"#;

const SECRET: &str = "tok-3b6d0c2f9e-never-shown";

fn with_hash(policy: &str) -> String {
    policy.replace(
        "HASH",
        &bagel_proto::hex::encode(&bagel_proto::acl::hash_token(SECRET)),
    )
}

async fn policy_version(c: &mut Client) -> u64 {
    let info = c
        .server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    info.access.unwrap().policy_version
}

#[tokio::test]
async fn a_reload_applies_to_new_calls_and_leaves_held_leases_held() {
    let s = Setup::start(&with_hash(TOKEN_V1), false, &[], ServerOptions::default()).await;
    let mut ci = s.client(None, Some(SECRET)).await;
    let grant = ci
        .acquire(acquire(&["jobs/1"]))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    assert_eq!(policy_version(&mut ci).await, 1);

    s.rewrite(&with_hash(TOKEN_V2));
    // The server polls the file; wait for the version it reports to move.
    while policy_version(&mut ci).await == 1 {
        tokio::task::yield_now().await;
    }
    assert_eq!(policy_version(&mut ci).await, 2);

    // The lease is still held; new leases and renewals of it are refused.
    let held = holder(&mut ci, "jobs/1").await.expect("still held");
    assert_eq!(held.lease_id, grant.lease_id);
    assert_eq!(held.owner, "ci", "with a token, the owner is its identity");
    let e = ci.acquire(acquire(&["jobs/2"])).await.unwrap_err();
    assert_denied(&e, "ci", "lease", "jobs/2");
    let e = ci
        .renew(pb::RenewRequest {
            lease_id: grant.lease_id.clone(),
            token: grant.token.clone(),
            ttl_us: 9 * SEC,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_denied(&e, "ci", "lease", "jobs/1");
    ci.acquire(acquire(&["deploys/1"])).await.unwrap();
}

#[tokio::test]
async fn a_policy_that_does_not_parse_is_kept_out_and_tokens_are_never_shown() {
    let options = ServerOptions {
        rust_log: "info,bagel_server::refusal=debug".into(),
        capture_stderr: true,
        ..ServerOptions::default()
    };
    let mut s = Setup::start(&with_hash(TOKEN_V1), false, &["--http", "127.0.0.1:0"], options).await;
    let stderr = s.server.take_stderr().unwrap();
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut log = Vec::new();
    // The start says a policy is in effect.
    loop {
        let line = lines.recv().await.expect("server log");
        log.push(line.clone());
        if line.contains("access policy in effect") {
            break;
        }
    }
    let mut ci = s.client(None, Some(SECRET)).await;

    // An unknown token, a malformed authorization, none: refused, and
    // the answer never quotes what was sent.
    let wrong = "tok-wrong-9f1e77a0c3-never-shown";
    for token in [Some(wrong), None] {
        let mut c = s.client(None, token).await;
        let e = c.acquire(acquire(&["jobs/1"])).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        assert!(!e.message().contains(wrong), "{e:?}");
        let info = c
            .server_info(pb::ServerInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        let access = info.access.unwrap();
        assert_eq!(access.identity, "");
        assert!(!access.identity_problem.is_empty());
        assert!(!access.identity_problem.contains(wrong));
    }
    let e = ci.acquire(acquire(&["other/1"])).await.unwrap_err();
    assert_denied(&e, "ci", "lease", "other/1");
    assert!(!e.message().contains(SECRET));

    // A file with an unknown permission on line 9: the log says so, the
    // server keeps version 1, and version 1's grants still apply.
    s.rewrite(&with_hash(TOKEN_V1).replace("[\"lease\", \"read\"]", "[\"lease\", \"write\"]"));
    let why = loop {
        let line = lines.recv().await.expect("server log");
        log.push(line.clone());
        if line.contains("access policy not reloaded") {
            break line;
        }
    };
    assert!(why.contains("line 9") && why.contains("write"), "{why}");
    assert_eq!(policy_version(&mut ci).await, 1);
    ci.acquire(acquire(&["jobs/1"])).await.unwrap();

    // The refusals are counted by identity and permission, and the
    // reload that kept the old policy; no token is in the metrics.
    let metrics = reqwest::get(format!("{}/metrics", s.server.http_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "bagel_acl_refusals_total{identity=\"ci\",permission=\"lease\"} 1",
        // The wrong token's acquire and its two ServerInfo calls (a
        // ServerInfo tests a token as any call does).
        "bagel_acl_unauthenticated_total{reason=\"unknown_token\"} 3",
        "bagel_acl_unauthenticated_total{reason=\"no_identity\"} 1",
        "bagel_acl_reload_failures_total 1",
        "bagel_acl_policy_version 1",
    ] {
        assert!(metrics.contains(line), "no {line:?} in {metrics}");
    }
    assert!(!metrics.contains(SECRET) && !metrics.contains(wrong));
    // Nothing logged holds a token.
    s.server.kill();
    while let Some(line) = lines.recv().await {
        log.push(line);
    }
    let log = log.join("\n");
    assert!(log.contains("refused"), "the refusal log is on: {log}");
    for secret in [SECRET, wrong] {
        assert!(!log.contains(secret), "the log holds a token: {log}");
    }
}

#[tokio::test]
async fn per_identity_quotas_key_on_the_tokens_identity() {
    let s = Setup::start(
        &with_hash(TOKEN_V1),
        false,
        &["--max-held-names-per-owner", "1"],
        ServerOptions::default(),
    )
    .await;
    let mut ci = s.client(None, Some(SECRET)).await;
    let mut first = acquire(&["jobs/1"]);
    first.owner = "alice".into();
    ci.acquire(first).await.unwrap();
    // Another owner field changes nothing: the owner is the identity.
    let mut second = acquire(&["jobs/2"]);
    second.owner = "bob".into();
    let e = ci.acquire(second).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert_eq!(holder(&mut ci, "jobs/1").await.unwrap().owner, "ci");
}

/// `bagel acl check` answers offline with the server's rules (exit 0
/// allowed, 1 denied, the grant and line named; a bad file names its
/// line), `bagel acl hash-token` makes a token's stored hash, and
/// `bagel server-info` shows the caller its identity and permissions.
#[tokio::test]
async fn the_cli_checks_a_policy_offline_and_shows_the_callers_permissions() {
    let s = Setup::start(TEAMS, true, &[], ServerOptions::default()).await;
    let acl = s.dir.path().join("acl.toml");
    let acl = acl.to_str().unwrap();
    let check = |identity: &str, name: &str| {
        bagel_tests::cli_no_server(&[
            "acl",
            "check",
            "--acl",
            acl,
            "--identity",
            identity,
            "--name",
            name,
        ])
    };
    let out = check("CN=team-b-9,O=anyone", "team-b/jobs/1");
    assert!(out.status.success(), "{}", bagel_tests::describe_output(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("lease \"team-b/jobs/1\": allowed") && text.contains("grant 3 (line 13)"),
        "{text}"
    );
    let out = check("CN=team-a-1,O=bagel tests", "shared/x");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        bagel_tests::describe_output(&out)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("lease \"shared/x\": denied") && text.contains("read \"shared/x\": allowed"),
        "{text}"
    );
    let bad = s.dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[grant]]\nidentity = \"x\"\nprefixes = [\"a/\"]\npermissions = [\"own\"]\n",
    )
    .unwrap();
    let out = bagel_tests::cli_no_server(&[
        "acl",
        "check",
        "--acl",
        bad.to_str().unwrap(),
        "--identity",
        "x",
        "--name",
        "a/1",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("line 4"),
        "{}",
        bagel_tests::describe_output(&out)
    );

    let hash_token = |stdin: &str| {
        let mut hash = std::process::Command::new(bagel_tests::bin("bagel"))
            .args(["acl", "hash-token"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut hash.stdin.take().unwrap(), stdin.as_bytes()).unwrap();
        hash.wait_with_output().unwrap()
    };
    let sent = bagel_proto::hex::encode(&bagel_proto::acl::hash_token(SECRET));
    // Spaces around it are trimmed, as the client trims the token it
    // sends: the hash is of what a client sends.
    for stdin in [format!("{SECRET}\n"), format!("  {SECRET} \n")] {
        let out = hash_token(&stdin);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), sent, "{stdin:?}");
    }
    // A token no client can send (a space inside, not ASCII) gets no hash.
    for stdin in ["two words\n", "tok\u{e9}n\n"] {
        let out = hash_token(stdin);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}",
            bagel_tests::describe_output(&out)
        );
        assert!(out.stdout.is_empty(), "{}", bagel_tests::describe_output(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("no client can send this token"),
            "{}",
            bagel_tests::describe_output(&out)
        );
    }

    let (cert, key) = s.ca.leaf("team-a-2", "bagel tests", false);
    let write = |name: &str, text: &str| {
        let path = s.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let (ca, cert, key) = (
        write("ca.pem", &s.ca.pem),
        write("a2.pem", &cert),
        write("a2.key", &key),
    );
    let url = format!("https://{}", s.server.addr);
    let cli = |json: bool| {
        let mut args = vec![
            "--server",
            &url,
            "--ca",
            &ca,
            "--cert",
            &cert,
            "--cert-key",
            &key,
            "server-info",
        ];
        if json {
            args.push("--json");
        }
        bagel_tests::cli_no_server(&args)
    };
    let out = cli(false);
    assert!(out.status.success(), "{}", bagel_tests::describe_output(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("you: ") && text.contains("CN=team-a-2"), "{text}");
    assert!(
        text.contains("may lease and read names under \"team-a/\""),
        "{text}"
    );
    let out = cli(true);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["access"]["policy_version"], 1);
    assert_eq!(json["access"]["grants"][0]["prefix"], "shared/");
}

/// The CLI (and so the client library) sends a bearer token from
/// `--token-file`: the server knows it by its identity, and nothing the
/// CLI prints holds the token.
#[tokio::test]
async fn the_cli_sends_a_bearer_token_from_a_file() {
    let s = Setup::start(&with_hash(TOKEN_V1), false, &[], ServerOptions::default()).await;
    s.client(None, Some(SECRET)).await;
    let write = |name: &str, text: &str| {
        let path = s.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let ca = write("ca.pem", &s.ca.pem);
    let token = write("ci.token", &format!("{SECRET}\n"));
    let url = format!("https://{}", s.server.addr);
    let cli = |args: &[&str]| {
        let mut all = vec!["--server", &url, "--ca", &ca, "--token-file", &token];
        all.extend_from_slice(args);
        bagel_tests::cli_no_server(&all)
    };
    let out = cli(&["server-info"]);
    assert!(out.status.success(), "{}", bagel_tests::describe_output(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("you: ci") && text.contains("may lease and read names under \"jobs/\""),
        "{text}"
    );
    let out = cli(&["acquire", "jobs/cli", "--ttl", "5s"]);
    assert!(out.status.success(), "{}", bagel_tests::describe_output(&out));
    let out = cli(&["acquire", "other/cli", "--ttl", "5s"]);
    assert!(!out.status.success());
    let said = bagel_tests::describe_output(&out);
    assert!(
        said.contains("permission denied") && said.contains("\"other/cli\""),
        "{said}"
    );
    assert!(!said.contains(SECRET), "{said}");
}

/// A server started with a policy and its log, line by line.
async fn logged_setup() -> (Setup, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let options = ServerOptions {
        rust_log: "info".into(),
        capture_stderr: true,
        ..ServerOptions::default()
    };
    let mut s = Setup::start(&with_hash(TOKEN_V1), false, &[], options).await;
    let stderr = s.server.take_stderr().unwrap();
    let (lines_tx, lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    (s, lines)
}

/// The first line of the log that contains `what`.
async fn logged(lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>, what: &str) -> String {
    // A guard against a server that never says it, not a timing.
    tokio::time::timeout(std::time::Duration::from_secs(60), async {
        loop {
            let line = lines.recv().await.expect("server log");
            if line.contains(what) {
                return line;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the server did not log {what:?} within 60 s"))
}

/// A policy put in place with the old file's length and modified time
/// (`touch -r` before renaming it over, as `cp -p` or `rsync -t` would
/// do) is still seen and reloaded: the poll looks at the file's identity
/// and changed time too.
#[tokio::test]
async fn a_policy_with_the_old_length_and_modified_time_is_reloaded() {
    let (s, mut lines) = logged_setup().await;
    let mut ci = s.client(None, Some(SECRET)).await;
    ci.acquire(acquire(&["jobs/1"])).await.unwrap();

    let path = s.dir.path().join("acl.toml");
    let new = s.dir.path().join("acl.toml.new");
    let text = with_hash(TOKEN_V1).replace("jobs/", "jabs/");
    assert_eq!(text.len(), std::fs::metadata(&path).unwrap().len() as usize);
    std::fs::write(&new, text).unwrap();
    let touched = std::process::Command::new("touch")
        .arg("-r")
        .arg(&path)
        .arg(&new)
        .status()
        .unwrap();
    assert!(touched.success());
    std::fs::rename(&new, &path).unwrap();

    let reloaded = logged(&mut lines, "access policy reloaded").await;
    assert!(reloaded.contains("the file changed"), "{reloaded}");
    assert_eq!(policy_version(&mut ci).await, 2);
    let e = ci.acquire(acquire(&["jobs/2"])).await.unwrap_err();
    assert_denied(&e, "ci", "lease", "jobs/2");
    ci.acquire(acquire(&["jabs/1"])).await.unwrap();
}

/// SIGHUP reads the policy again; when nothing changed the log says so
/// (an operator's `kill -HUP` is answered), and the version stays.
#[tokio::test]
async fn sighup_reads_the_policy_again() {
    let (s, mut lines) = logged_setup().await;
    let mut ci = s.client(None, Some(SECRET)).await;
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &s.server.pid().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    let said = logged(&mut lines, "access policy read again on SIGHUP").await;
    assert!(said.contains("unchanged"), "{said}");
    assert_eq!(policy_version(&mut ci).await, 1);
}

/// `bagel audit --acl FILE` names the writes made under a lease the
/// policy does not allow its owner (here a server run without one, so
/// owners are what clients said): once per lease and name, exit 1.
#[tokio::test]
async fn the_audit_flags_writes_under_leases_the_policy_did_not_allow() {
    use bagel_bags::{self as bag, BagConfig, Writer};
    use bagel_client::{LeaseOptions, TimeOptions, TimeSource};
    use bagel_proto::clock::{AssumedExact, Clock, SystemClock};
    use std::sync::Arc;
    use std::time::Duration;

    let server = ServerProcess::start_ready(&[]).await;
    let client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let store_url = format!("file://{}", dir.path().display());
    let log = bagel_tests::unique("acl-audit");
    let cfg = BagConfig::default().with_grace(Duration::from_millis(200));
    let no_renew = LeaseOptions::default()
        .with_auto_renew(false)
        .with_safety_margin(Duration::from_millis(50));
    for (owner, name) in [("writer-a", "team-a/orders"), ("rogue", "team-b/orders")] {
        let lease = client
            .acquire([name])
            .owner(owner)
            .options(no_renew.clone())
            .send()
            .await
            .unwrap();
        let store = bag::open_store(&store_url, &cfg).await.unwrap();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let time = TimeSource::lease_server(client.clone(), TimeOptions::default());
        let writer = Writer::new(
            store,
            &log,
            owner,
            lease.rights(),
            clock,
            Arc::new(time),
            cfg.clone(),
        )
        .unwrap();
        for i in 0..2 {
            writer
                .write(bytes::Bytes::from(format!("{owner}-{i}")))
                .await
                .unwrap();
        }
        lease
            .release(Some(writer.watermark(bagel_client::Micros::ZERO)))
            .await
            .unwrap();
    }
    let store = bag::open_store(&store_url, &cfg).await.unwrap();
    let until = bagel_client::Micros::now().saturating_add(Duration::from_secs(1));
    bag::close_through(store.as_ref(), &log, until, &cfg, &AssumedExact(SystemClock))
        .await
        .unwrap();

    let policy = dir.path().join("acl.toml");
    std::fs::write(
        &policy,
        "[[grant]]\nidentity = \"writer-a\"\nprefixes = [\"team-a/\"]\npermissions = [\"lease\"]\n\n\
         [[grant]]\nidentity = \"rogue\"\nprefixes = [\"team-b/\"]\npermissions = [\"read\"]\n",
    )
    .unwrap();
    let audit = |acl: bool| {
        let mut args = vec![
            "audit",
            "--store",
            &store_url,
            "--log",
            &log,
            "--grace",
            "200ms",
            "--key",
            &server.public_key_hex,
            "--json",
        ];
        if acl {
            args.extend(["--acl", policy.to_str().unwrap()]);
        }
        server.cli(&args)
    };
    let clean = audit(false);
    assert!(clean.status.success(), "{}", bagel_tests::describe_output(&clean));
    let out = audit(true);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        bagel_tests::describe_output(&out)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let flagged = json["not_granted"].as_array().unwrap();
    assert_eq!(flagged.len(), 1, "{json}");
    assert_eq!(flagged[0]["owner"], "rogue");
    assert_eq!(flagged[0]["name"], "team-b/orders");
}

/// Two identities by token: `holder` may always lease jobs/; `ci` may
/// lease jobs/ in version 1 and only read it in version 2.
fn two_tokens(ci_may_lease: bool) -> String {
    let hash = |t: &str| bagel_proto::hex::encode(&bagel_proto::acl::hash_token(t));
    let ci = if ci_may_lease {
        r#"["lease", "read"]"#
    } else {
        r#"["read"]"#
    };
    format!(
        r#"
[[token]]
identity = "holder"
sha256 = "{}"

[[token]]
identity = "ci"
sha256 = "{}"

[[token]]
identity = "other"
sha256 = "{}"

[[grant]]
identity = "holder"
prefixes = ["jobs/"]
permissions = ["lease", "read"]

[[grant]]
identity = "ci"
prefixes = ["jobs/"]
permissions = {ci}

[[grant]]
identity = "other"
prefixes = ["other/"]
permissions = ["lease", "read"]
"#,
        hash(HOLDER_TOKEN),
        hash(SECRET),
        hash(OTHER_TOKEN)
    )
}

const HOLDER_TOKEN: &str = "tok-holder-5a1e";
const OTHER_TOKEN: &str = "tok-other-77c2";

/// Issue 51, hole 5: permission is judged at the grant. An acquire that
/// queued while the policy allowed it is refused when its turn comes
/// after a reload revoked the grant, not granted on the old policy.
#[tokio::test]
async fn a_waiting_acquire_is_judged_by_the_policy_in_force_at_its_grant() {
    let s = Setup::start(&two_tokens(true), false, &[], ServerOptions::default()).await;
    let mut holding = s.client(None, Some(HOLDER_TOKEN)).await;
    let mut ci = s.client(None, Some(SECRET)).await;
    let mut observer = s.client(None, Some(HOLDER_TOKEN)).await;
    let held = holding
        .acquire(acquire(&["jobs/1"]))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    let waiting = tokio::spawn(async move {
        let mut req = acquire(&["jobs/1"]);
        req.wait_us = 8 * SEC;
        ci.acquire(req).await
    });
    // Queued (the server counts it), then the policy changes.
    loop {
        let info = observer
            .server_info(pb::ServerInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        if info.load.unwrap().waiters == 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    s.rewrite(&two_tokens(false));
    while policy_version(&mut observer).await == 1 {
        tokio::task::yield_now().await;
    }
    // The holder lets go: the waiter's turn comes under version 2.
    holding
        .release(pb::ReleaseRequest {
            lease_id: held.lease_id.clone(),
            token: held.token.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let e = waiting
        .await
        .unwrap()
        .expect_err("granted under a revoked policy");
    assert_denied(&e, "ci", "lease", "jobs/1");
    assert_eq!(holder(&mut observer, "jobs/1").await, None);
}

/// Issue 51, hole 5: a caller that may not see a lease learns nothing of
/// it from a renewal of its id (not its owner, not its names), whatever
/// token it sends: the permission check comes first.
#[tokio::test]
async fn a_renewal_of_anothers_lease_says_nothing_of_it() {
    let s = Setup::start(&two_tokens(true), false, &[], ServerOptions::default()).await;
    let mut holding = s.client(None, Some(HOLDER_TOKEN)).await;
    let mut other = s.client(None, Some(OTHER_TOKEN)).await;
    let held = holding
        .acquire(acquire(&["jobs/secret-plan"]))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    for token in [held.token.clone(), "0".repeat(held.token.len())] {
        let e = other
            .renew(pb::RenewRequest {
                lease_id: held.lease_id.clone(),
                token,
                ttl_us: 9 * SEC,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        let m = e.message();
        assert!(!m.contains("secret-plan") && !m.contains("holder"), "{m:?}");
        assert!(m.contains(&held.lease_id), "{m:?}");
    }
    // The holder's own refusal still names its name.
    let e = holding
        .renew(pb::RenewRequest {
            lease_id: held.lease_id.clone(),
            token: "0".repeat(held.token.len()),
            ttl_us: 9 * SEC,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
}

/// Issue 52: a policy file anyone may write, reached through a symbolic
/// link, or granting nothing (deny-all) is taken, but said loudly: in the
/// server's log at start and at every reload, and by `bagel acl check`.
/// Before: all three were taken without a word.
#[tokio::test]
async fn a_writable_linked_or_empty_policy_is_taken_with_a_warning() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("policy.toml");
    let link = dir.path().join("acl.toml");
    // Written beside the file, given its mode, then renamed over it.
    let put = |text: &str, mode: u32| {
        let tmp = dir.path().join("policy.toml.new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).unwrap();
        std::fs::rename(&tmp, &real).unwrap();
    };
    put("# nobody yet\n", 0o666);
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let acl = link.to_str().unwrap();
    const WRITABLE: &str = "world-writable (mode 0666)";
    const LINKED: &str = "is a symbolic link";
    const DENY_ALL: &str = "grants nothing";

    // The CLI says the same, on stderr, and answers as before.
    let out = bagel_tests::cli_no_server(&[
        "acl",
        "check",
        "--acl",
        acl,
        "--identity",
        "ci",
        "--name",
        "jobs/1",
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        bagel_tests::describe_output(&out)
    );
    let said = String::from_utf8_lossy(&out.stderr);
    for warning in [WRITABLE, LINKED, DENY_ALL] {
        assert!(
            said.contains(warning),
            "no {warning:?}: {}",
            bagel_tests::describe_output(&out)
        );
    }
    assert!(String::from_utf8_lossy(&out.stdout).contains("lease \"jobs/1\": denied"));
    let out = bagel_tests::cli_no_server(&["--json", "acl", "check", "--acl", acl, "--identity", "ci"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", bagel_tests::describe_output(&out)));
    let warnings = json["warnings"].as_array().expect("warnings").clone();
    assert_eq!(warnings.len(), 3, "{json}");

    let options = ServerOptions {
        rust_log: "info".into(),
        capture_stderr: true,
        ..ServerOptions::default()
    };
    let mut server = ServerProcess::spawn_with(&["--unsafe-skip-restart-wait", "--acl", acl], options).await;
    let stderr = server.take_stderr().unwrap();
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    // What the log said up to the line that contains `until`.
    let mut said_until = async |until: &str| {
        let mut said = Vec::new();
        // A guard against a server that never says it, not a timing.
        tokio::time::timeout(std::time::Duration::from_secs(60), async {
            loop {
                let line = lines.recv().await.expect("server log");
                let done = line.contains(until);
                said.push(line);
                if done {
                    return;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no {until:?} within 60 s: {said:#?}"));
        said.join("\n")
    };
    let said = said_until("access policy in effect").await;
    for warning in [WRITABLE, LINKED, DENY_ALL] {
        assert!(said.contains(warning), "no {warning:?} at start: {said}");
    }
    assert!(said.contains(" WARN "), "{said}");

    // A policy that grants something, still world-writable and linked:
    // the reload says those two, and no longer deny-all.
    put(
        "[[grant]]\nidentity = \"ci\"\nprefixes = [\"jobs/\"]\npermissions = [\"lease\"]\n",
        0o646,
    );
    let said = said_until("access policy reloaded").await;
    assert!(said.contains("world-writable (mode 0646)"), "{said}");
    assert!(said.contains(LINKED) && !said.contains(DENY_ALL), "{said}");
}

/// A certificate with an empty subject (as SPIFFE issues them) goes by its
/// one URI SAN; one with neither a subject nor exactly one URI SAN names
/// nobody and is refused, rather than every such certificate sharing the
/// identity "".
#[tokio::test]
async fn an_empty_subject_goes_by_its_uri_san_or_is_refused() {
    const SPIFFE: &str = "spiffe://example.org/ns/team-b/sa/worker";
    let policy = format!(
        "[[grant]]\nidentity = \"{SPIFFE}\"\nprefixes = [\"team-b/\"]\npermissions = [\"lease\", \"read\"]\n"
    );
    let s = Setup::start(&policy, true, &[], ServerOptions::default()).await;

    let spiffe = s.ca.leaf_named(&[], &[SPIFFE], false);
    let mut worker = s.client_with(Some(spiffe), None).await;
    let info = worker
        .server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.access.unwrap().identity, SPIFFE);
    worker.acquire(acquire(&["team-b/1"])).await.unwrap();
    let held = holder(&mut worker, "team-b/1").await.expect("held");
    assert_eq!(held.owner, SPIFFE, "the URI is the owner");

    for uris in [&[][..], &[SPIFFE, "spiffe://example.org/ns/team-b/sa/other"][..]] {
        let nobody = s.ca.leaf_named(&[], uris, false);
        let mut c = s.client_with(Some(nobody), None).await;
        let info = c
            .server_info(pb::ServerInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        let access = info.access.unwrap();
        assert_eq!(access.identity, "", "{uris:?}");
        assert!(
            access.identity_problem.contains("names nobody"),
            "{uris:?}: {access:?}"
        );
        let e = c.acquire(acquire(&["team-b/2"])).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{uris:?}: {e:?}");
        assert!(e.message().contains("names nobody"), "{e:?}");
    }
}

/// A bearer-token caller that may lease the name, renewing a lease granted
/// to another identity, is told the lease is another identity's, in words
/// that fit a token (it has no certificate).
#[tokio::test]
async fn a_token_caller_is_told_the_lease_is_another_identitys() {
    let s = Setup::start(&two_tokens(true), false, &[], ServerOptions::default()).await;
    let mut holding = s.client(None, Some(HOLDER_TOKEN)).await;
    let mut ci = s.client(None, Some(SECRET)).await;
    let held = holding
        .acquire(acquire(&["jobs/7"]))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    let e = ci
        .renew(pb::RenewRequest {
            lease_id: held.lease_id.clone(),
            token: held.token.clone(),
            ttl_us: 9 * SEC,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let m = e.message();
    assert!(m.contains("this caller is \"ci\""), "{m:?}");
    assert!(
        !m.contains("certificate is"),
        "a token caller has no certificate: {m:?}"
    );
}

/// Token guesses are counted (ServerInfo's too) and slowed: past 20
/// unknown tokens from one address within 10 s, that address's tokens are
/// not looked at for the rest of the window, the right one included, so
/// a guesser learns nothing from a right guess; the log says so once.
#[tokio::test]
async fn token_guesses_are_counted_and_refused_past_a_budget() {
    let options = ServerOptions {
        rust_log: "info".into(),
        capture_stderr: true,
        ..ServerOptions::default()
    };
    let mut s = Setup::start(&with_hash(TOKEN_V1), false, &["--http", "127.0.0.1:0"], options).await;
    let stderr = s.server.take_stderr().unwrap();
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut ci = s.client(None, Some(SECRET)).await;
    ci.acquire(acquire(&["jobs/1"])).await.unwrap();

    // Twenty guesses by ServerInfo alone: each answered, each counted.
    let mut guesser = s.client(None, None).await;
    for n in 0..20 {
        let mut req = tonic::Request::new(pb::ServerInfoRequest {});
        req.metadata_mut()
            .insert("authorization", format!("Bearer guess-{n}").parse().unwrap());
        let info = guesser.server_info(req).await.unwrap().into_inner();
        let access = info.access.unwrap();
        assert_eq!(access.identity, "");
        assert!(
            access
                .identity_problem
                .contains("not one the access policy knows"),
            "{access:?}"
        );
    }
    let warned = logged(&mut lines, "bearer tokens refused from this address").await;
    assert!(warned.contains("127.0.0.1"), "{warned}");

    // Now even the right token from that address is not looked at.
    let e = ci.acquire(acquire(&["jobs/2"])).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message()
            .contains("127.0.0.1 sent 20 tokens the access policy does not know"),
        "{e:?}"
    );
    let retry = bagel_proto::details::retry_delay_of(e.details()).expect("a RetryInfo");
    assert!(retry <= std::time::Duration::from_secs(10), "{retry:?}");
    let info = ci
        .server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(info.access.unwrap().identity_problem.contains("not checked"));

    let metrics = reqwest::get(format!("{}/metrics", s.server.http_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "bagel_acl_unauthenticated_total{reason=\"unknown_token\"} 20",
        "bagel_acl_unauthenticated_total{reason=\"too_many_failures\"} 2",
    ] {
        assert!(metrics.contains(line), "no {line:?} in {metrics}");
    }
}
