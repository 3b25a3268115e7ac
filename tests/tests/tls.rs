//! TLS and mutual TLS (issue 13), with certificates made at test time:
//! the client certificate's subject is the lease owner (and the per-owner
//! quota keys on it); a certificate from another CA, an expired one, none
//! at all, and plaintext are refused. The server's side is tested with a
//! raw tonic client; then the `bagel` CLI (`--ca`, `--cert`, `--cert-key`)
//! and the client library's `TlsConfig` (one server, and a cluster).

use std::net::{IpAddr, Ipv4Addr};

use bagel_client::{ClientOptions, Cluster, Micros, ServerSpec, TlsConfig};
use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::{ServerProcess, describe_output};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use tonic::Code;
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

    /// A leaf certificate and its key, as PEM.
    fn leaf(&self, cn: &str, server: bool, expired: bool) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params.distinguished_name.push(DnType::CommonName, cn);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "bagel tests");
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// The server's files, in a temporary directory.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        Files {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn write(&self, name: &str, text: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    }
}

/// A TLS client of `server`, trusting `ca`, showing `identity` if any.
async fn client(
    server: &ServerProcess,
    ca: &str,
    identity: Option<&(String, String)>,
) -> Result<LeaseServiceClient<Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let channel = Channel::from_shared(format!("https://{}", server.addr))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(LeaseServiceClient::new(channel))
}

/// Calls ServerInfo until the server answers (it answers as soon as it
/// listens; this only covers the start-up).
async fn ready(
    server: &ServerProcess,
    ca: &str,
    identity: Option<&(String, String)>,
) -> LeaseServiceClient<Channel> {
    loop {
        if let Ok(mut c) = client(server, ca, identity).await
            && c.server_info(pb::ServerInfoRequest {}).await.is_ok()
        {
            return c;
        }
        tokio::task::yield_now().await;
    }
}

fn acquire(name: &str, owner: &str) -> pb::AcquireRequest {
    pb::AcquireRequest {
        names: vec![name.to_owned()],
        deadline_us: Micros::now().as_micros() + 9 * SEC,
        owner: owner.to_owned(),
        mode: pb::Mode::Full.into(),
        wait_us: 0,
        ..Default::default()
    }
}

/// Whether a call with this client fails (handshake refused, connection
/// closed): it must never reach the lease service.
async fn refused(server: &ServerProcess, ca: &str, identity: Option<&(String, String)>) -> bool {
    match client(server, ca, identity).await {
        Err(_) => true,
        Ok(mut c) => c.acquire(acquire("never", "x")).await.is_err(),
    }
}

#[tokio::test]
async fn mutual_tls_makes_the_certificate_subject_the_owner_and_refuses_the_rest() {
    let ca = Ca::new("bagel test CA");
    let other_ca = Ca::new("someone else's CA");
    let files = Files::new();
    let (cert, key) = ca.leaf("lease-server", true, false);
    let args = [
        "--unsafe-skip-restart-wait",
        "--tls-cert",
        &files.write("server.pem", &cert),
        "--tls-key",
        &files.write("server.key", &key),
        "--client-ca",
        &files.write("ca.pem", &ca.pem),
        "--max-held-names-per-owner",
        "2",
    ];
    let server = ServerProcess::spawn(&args).await;
    let worker = ca.leaf("worker-1", false, false);
    let mut c = ready(&server, &ca.pem, Some(&worker)).await;
    let info = c
        .server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(info.tls && info.client_auth);

    // Whatever the request says, the owner is the certificate's subject.
    let grant = c
        .acquire(acquire("a", "pretends-to-be-someone"))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    let mut keys = bagel_proto::KeyRing::new();
    keys.insert_bytes(&info.keys[0].ed25519).unwrap();
    let body = bagel_proto::verify_witness(grant.witness.as_ref().unwrap(), &keys).unwrap();
    assert!(
        body.owner.contains("CN=worker-1") && body.owner.contains("O=bagel tests"),
        "{:?}",
        body.owner
    );
    let described = c
        .describe(pb::DescribeRequest {
            names: vec!["a".into()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(described.names[0].holder.as_ref().unwrap().owner, body.owner);

    // The per-owner quota keys on the subject: changing the owner field
    // does not dodge it.
    c.acquire(acquire("b", "another-name")).await.unwrap();
    let over = c.acquire(acquire("c", "yet-another")).await.unwrap_err();
    assert_eq!(over.code(), Code::ResourceExhausted, "{over:?}");
    assert!(over.message().contains("CN=worker-1"), "{over:?}");
    assert!(over.message().contains("--max-held-names-per-owner"), "{over:?}");

    // Refused: a certificate from another CA, an expired one, none, and
    // plaintext.
    let stranger = other_ca.leaf("worker-2", false, false);
    assert!(
        refused(&server, &ca.pem, Some(&stranger)).await,
        "wrong CA accepted"
    );
    let expired = ca.leaf("worker-3", false, true);
    assert!(
        refused(&server, &ca.pem, Some(&expired)).await,
        "expired certificate accepted"
    );
    assert!(
        refused(&server, &ca.pem, None).await,
        "no client certificate accepted"
    );
    let plain = Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await;
    if let Ok(channel) = plain {
        let r = LeaseServiceClient::new(channel)
            .acquire(acquire("never", "x"))
            .await;
        assert!(r.is_err(), "plaintext against TLS answered: {r:?}");
    }
    // And the good client still works after all that.
    let mut c = client(&server, &ca.pem, Some(&worker)).await.unwrap();
    c.server_info(pb::ServerInfoRequest {}).await.unwrap();
}

#[tokio::test]
async fn tls_without_client_certificates_keeps_the_requested_owner() {
    let ca = Ca::new("bagel test CA");
    let files = Files::new();
    let (cert, key) = ca.leaf("lease-server", true, false);
    let args = [
        "--unsafe-skip-restart-wait",
        "--tls-cert",
        &files.write("server.pem", &cert),
        "--tls-key",
        &files.write("server.key", &key),
    ];
    let server = ServerProcess::spawn(&args).await;
    let mut c = ready(&server, &ca.pem, None).await;
    let info = c
        .server_info(pb::ServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(info.tls && !info.client_auth);
    c.acquire(acquire("a", "alice")).await.unwrap();
    let d = c
        .describe(pb::DescribeRequest {
            names: vec!["a".into()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(d.names[0].holder.as_ref().unwrap().owner, "alice");
    // A client that does not trust the server's CA refuses it.
    let other_ca = Ca::new("someone else's CA");
    assert!(refused(&server, &other_ca.pem, None).await);
    // Plaintext is refused.
    if let Ok(channel) = Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
    {
        assert!(
            LeaseServiceClient::new(channel)
                .acquire(acquire("p", "x"))
                .await
                .is_err()
        );
    }
}

// --- The `bagel` CLI and the client library over TLS -----------------

/// `bagel --server https://… --ca …` plus `args`.
fn cli_tls(server: &ServerProcess, tls: &[&str], args: &[&str]) -> std::process::Output {
    let url = format!("https://{}", server.addr);
    let mut all = vec!["--server", url.as_str()];
    all.extend_from_slice(tls);
    all.extend_from_slice(args);
    bagel_tests::cli_no_server(&all)
}

fn json_of(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", describe_output(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe_output(out)))
}

#[tokio::test]
async fn the_cli_and_the_library_take_leases_over_tls_trusting_the_given_ca() {
    let ca = Ca::new("bagel test CA");
    let files = Files::new();
    let (cert, key) = ca.leaf("lease-server", true, false);
    let args = [
        "--unsafe-skip-restart-wait",
        "--tls-cert",
        &files.write("server.pem", &cert),
        "--tls-key",
        &files.write("server.key", &key),
    ];
    let server = ServerProcess::spawn(&args).await;
    ready(&server, &ca.pem, None).await;
    let ca_file = files.write("ca.pem", &ca.pem);

    let lease = json_of(&cli_tls(
        &server,
        &["--ca", &ca_file],
        &["acquire", "tls-a", "--owner", "alice", "--ttl", "5s", "--json"],
    ));
    let described = json_of(&cli_tls(
        &server,
        &["--ca", &ca_file],
        &["describe", "tls-a", "--json"],
    ));
    assert_eq!(described[0]["holder"]["lease_id"], lease["lease_id"]);
    assert_eq!(described[0]["holder"]["owner"], "alice");
    // BAGEL_CA works as --ca does; the lease file's release over TLS.
    let lease_file = files.write("lease.json", &lease.to_string());
    let out = std::process::Command::new(bagel_tests::bin("bagel"))
        .args(["--server", &format!("https://{}", server.addr)])
        .args(["release", "--lease", &lease_file, "--json"])
        .env("BAGEL_CA", &ca_file)
        .output()
        .unwrap();
    json_of(&out);

    // A CA that did not sign the server's certificate: refused, saying so.
    let other = files.write("other.pem", &Ca::new("someone else's CA").pem);
    let out = cli_tls(&server, &["--ca", &other], &["describe", "tls-a"]);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid peer certificate"),
        "{}",
        describe_output(&out)
    );
    // https without a CA, and a CA with plain http: refused before connecting.
    let out = cli_tls(&server, &[], &["describe", "tls-a"]);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--ca"),
        "{}",
        describe_output(&out)
    );
    let out = bagel_tests::cli_no_server(&[
        "--server",
        &format!("http://{}", server.addr),
        "--ca",
        &ca_file,
        "describe",
        "x",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("https://"),
        "{}",
        describe_output(&out)
    );
    // A file that holds no certificate.
    let junk = files.write("junk.pem", "not a certificate");
    let out = cli_tls(&server, &["--ca", &junk], &["describe", "x"]);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no PEM certificate") && err.contains(&junk),
        "{}",
        describe_output(&out)
    );

    // The library: a cluster of two TLS servers, one TlsConfig.
    let second = ServerProcess::spawn(&args).await;
    ready(&second, &ca.pem, None).await;
    let options = ClientOptions::default().with_tls(TlsConfig::new(ca.pem.clone()));
    let specs: Vec<ServerSpec> = [&server, &second]
        .iter()
        .map(|s| format!("https://{}", s.addr).parse().unwrap())
        .collect();
    let cluster = Cluster::connect_with(&specs, &options).await.unwrap();
    let names: Vec<String> = (0..8).map(|i| format!("spread-{i}")).collect();
    let lease = cluster.acquire(names.clone()).send().await.unwrap();
    assert_eq!(lease.names().len(), 8);
    lease.release(None).await.unwrap();
    // Without TLS configured, an https server is refused with a clear error.
    let err = bagel_client::Client::connect(format!("https://{}", server.addr))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no TLS configuration"), "{err}");
}

#[tokio::test]
async fn with_mutual_tls_the_cli_gets_a_lease_owned_by_its_certificate_subject() {
    let ca = Ca::new("bagel test CA");
    let files = Files::new();
    let (cert, key) = ca.leaf("lease-server", true, false);
    let ca_file = files.write("ca.pem", &ca.pem);
    let args = [
        "--unsafe-skip-restart-wait",
        "--tls-cert",
        &files.write("server.pem", &cert),
        "--tls-key",
        &files.write("server.key", &key),
        "--client-ca",
        &ca_file,
    ];
    let server = ServerProcess::spawn(&args).await;
    let (worker_cert, worker_key) = ca.leaf("worker-7", false, false);
    ready(&server, &ca.pem, Some(&(worker_cert.clone(), worker_key.clone()))).await;
    let cert_file = files.write("worker.pem", &worker_cert);
    let key_file = files.write("worker.key", &worker_key);
    let identity = [
        "--ca",
        ca_file.as_str(),
        "--cert",
        &cert_file,
        "--cert-key",
        &key_file,
    ];

    let lease = json_of(&cli_tls(
        &server,
        &identity,
        &[
            "acquire", "mtls-a", "--owner", "pretends", "--ttl", "5s", "--json",
        ],
    ));
    let described = json_of(&cli_tls(&server, &identity, &["describe", "mtls-a", "--json"]));
    let owner = described[0]["holder"]["owner"].as_str().unwrap().to_owned();
    assert!(
        owner.contains("CN=worker-7") && owner.contains("O=bagel tests"),
        "{owner:?}"
    );
    assert_eq!(described[0]["holder"]["lease_id"], lease["lease_id"]);
    // The witness names the same owner, and verifies.
    let out = std::process::Command::new(bagel_tests::bin("bagel"))
        .args(["--server", &format!("https://{}", server.addr)])
        .args(identity)
        .arg("verify-witness")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write as _;
            c.stdin.take().unwrap().write_all(lease.to_string().as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(out.status.success(), "{}", describe_output(&out));

    // Without a client certificate: refused, and the error says why.
    let out = cli_tls(&server, &["--ca", &ca_file], &["describe", "mtls-a"]);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("client certificates") && err.contains("none is presented"),
        "{}",
        describe_output(&out)
    );
    // A certificate from another CA: refused too.
    let stranger = Ca::new("someone else's CA").leaf("worker-8", false, false);
    let out = cli_tls(
        &server,
        &[
            "--ca",
            &ca_file,
            "--cert",
            &files.write("stranger.pem", &stranger.0),
            "--cert-key",
            &files.write("stranger.key", &stranger.1),
        ],
        &["describe", "mtls-a"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not trust"),
        "{}",
        describe_output(&out)
    );
    // --cert without --cert-key is a usage error (EX_USAGE, never 2: that
    // is "held").
    let out = cli_tls(
        &server,
        &["--ca", &ca_file, "--cert", &cert_file],
        &["describe", "x"],
    );
    assert_eq!(out.status.code(), Some(64), "{}", describe_output(&out));
}

/// Issue 24, item 7: under mutual TLS a lease is bound to the certificate
/// it was granted to. Another certificate of the same CA that learns the
/// token (a log, a core dump) can neither renew, upgrade nor release it.
#[tokio::test]
async fn under_mutual_tls_only_the_granted_certificate_renews_upgrades_or_releases() {
    let ca = Ca::new("bagel test CA");
    let files = Files::new();
    let (cert, key) = ca.leaf("lease-server", true, false);
    let args = [
        "--unsafe-skip-restart-wait",
        "--tls-cert",
        &files.write("server.pem", &cert),
        "--tls-key",
        &files.write("server.key", &key),
        "--client-ca",
        &files.write("ca.pem", &ca.pem),
    ];
    let server = ServerProcess::spawn(&args).await;
    let worker = ca.leaf("worker-1", false, false);
    let thief = ca.leaf("worker-2", false, false);
    let mut owner = ready(&server, &ca.pem, Some(&worker)).await;
    let mut other = ready(&server, &ca.pem, Some(&thief)).await;
    let mut tentative = acquire("bound", "x");
    tentative.mode = pb::Mode::Tentative.into();
    let grant = owner
        .acquire(tentative)
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();
    let (lease_id, token) = (grant.lease_id.clone(), grant.token.clone());

    let renew = pb::RenewRequest {
        lease_id: lease_id.clone(),
        token: token.clone(),
        deadline_us: Micros::now().as_micros() + 9 * SEC,
        ttl_us: 0,
        metadata: None,
    };
    let upgrade = pb::UpgradeRequest {
        lease_id: lease_id.clone(),
        token: token.clone(),
    };
    let release = pb::ReleaseRequest {
        lease_id: lease_id.clone(),
        token: token.clone(),
        ..Default::default()
    };
    let refusals = [
        other.renew(renew.clone()).await.map(drop),
        other.upgrade(upgrade.clone()).await.map(drop),
        other.release(release.clone()).await.map(drop),
    ];
    for refused in refusals {
        let status = refused.expect_err("another certificate used the lease");
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        assert!(status.message().contains("CN=worker-1"), "{status:?}");
        assert!(status.message().contains("CN=worker-2"), "{status:?}");
    }
    // In a batch too.
    let batch = other
        .batch(pb::BatchRequest {
            lean: false,
            ops: vec![pb::BatchOp {
                op: Some(pb::batch_op::Op::Release(release.clone())),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    match &batch.results[0].result {
        Some(pb::batch_result::Result::Error(e)) => {
            assert!(e.message.contains("CN=worker-2"), "{e:?}")
        }
        other => panic!("a batch release by another certificate: {other:?}"),
    }
    // The lease is untouched, and its own certificate uses it.
    owner.renew(renew).await.unwrap();
    owner.upgrade(upgrade).await.unwrap();
    owner.release(release).await.unwrap();
}

/// Issue 24, item 7: a client certificate marked CA:TRUE under
/// `--client-ca` could sign leaves for any subject (the handshake follows
/// the chain the client sends) and so be anyone. Client certificates must
/// be issued directly by a `--client-ca` certificate: such a chain is
/// refused, naming the certificate that is not one; a CA certificate used
/// as a client certificate itself is refused at the handshake.
#[tokio::test]
async fn a_client_certificate_that_is_a_ca_cannot_vouch_for_others() {
    let ca = Ca::new("bagel test CA");
    let files = Files::new();
    let (cert, key) = ca.leaf("lease-server", true, false);
    let args = [
        "--unsafe-skip-restart-wait",
        "--tls-cert",
        &files.write("server.pem", &cert),
        "--tls-key",
        &files.write("server.key", &key),
        "--client-ca",
        &files.write("ca.pem", &ca.pem),
    ];
    let server = ServerProcess::spawn(&args).await;
    let worker = ca.leaf("worker-1", false, false);
    let mut honest = ready(&server, &ca.pem, Some(&worker)).await;
    honest.acquire(acquire("mine", "x")).await.unwrap();

    // A client certificate of the CA, itself a CA.
    let rogue_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, "rogue");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let rogue_cert = params.signed_by(&rogue_key, &ca.issuer).unwrap();
    let rogue = Ca {
        pem: rogue_cert.pem(),
        issuer: Issuer::new(params, rogue_key),
    };
    // It signs a leaf claiming worker-1's subject, sent with itself as
    // the chain.
    let (forged, forged_key) = rogue.leaf("worker-1", false, false);
    let chain = (format!("{forged}{}", rogue.pem), forged_key);
    let mut c = ready(&server, &ca.pem, Some(&chain)).await;
    let refused = c.acquire(acquire("theirs", "x")).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("CN=rogue"), "{refused:?}");
    assert!(refused.message().contains("--client-ca"), "{refused:?}");
    let described = honest
        .describe(pb::DescribeRequest {
            names: vec!["theirs".into()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(described.names[0].holder, None);
}

/// Issue 24, item 7: plaintext to a TLS port answered `operation was
/// canceled: connection closed`; the CLI now says what is wrong.
#[tokio::test]
async fn plaintext_to_a_tls_server_says_it_speaks_tls() {
    let ca = Ca::new("bagel test CA");
    let files = Files::new();
    let (cert, key) = ca.leaf("lease-server", true, false);
    let args = [
        "--unsafe-skip-restart-wait",
        "--tls-cert",
        &files.write("server.pem", &cert),
        "--tls-key",
        &files.write("server.key", &key),
    ];
    let server = ServerProcess::spawn(&args).await;
    ready(&server, &ca.pem, None).await;
    let out = server.cli(&["server-info"]);
    let text = describe_output(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("speaks TLS: use https:// and --ca"), "{text}");
}

/// The certificate mistakes people make get a hint naming the mistake and
/// the fix, not only rustls's words: a CA certificate serving as the
/// server's (what `openssl req -x509` makes by default), a host missing
/// from the subjectAltName, a `--ca` that did not issue it.
#[tokio::test]
async fn certificate_mistakes_are_named_with_their_fix() {
    let ca = Ca::new("bagel test CA");
    let files = Files::new();
    // The CA's own certificate as the server's.
    let ca_key = files.write("ca.key", &ca.issuer.key().serialize_pem());
    let ca_pem = files.write("ca.pem", &ca.pem);
    let server = ServerProcess::spawn(&[
        "--unsafe-skip-restart-wait",
        "--tls-cert",
        &ca_pem,
        "--tls-key",
        &ca_key,
    ])
    .await;
    let out = cli_tls(&server, &["--ca", &ca_pem], &["server-info"]);
    let text = describe_output(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("the server's certificate is a CA certificate (CA:TRUE"),
        "{text}"
    );
    drop(server);

    // A leaf for another host; and a CA that did not issue it.
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["other.example".to_owned()]).unwrap();
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    let server = ServerProcess::spawn(&[
        "--unsafe-skip-restart-wait",
        "--tls-cert",
        &files.write("other.pem", &cert.pem()),
        "--tls-key",
        &files.write("other.key", &key.serialize_pem()),
    ])
    .await;
    let out = cli_tls(&server, &["--ca", &ca_pem], &["server-info"]);
    let text = describe_output(&out);
    assert!(
        text.contains("does not list the host of this URL in its subjectAltName"),
        "{text}"
    );
    let stranger = files.write("stranger.pem", &Ca::new("another CA").pem);
    let out = cli_tls(&server, &["--ca", &stranger], &["server-info"]);
    let text = describe_output(&out);
    assert!(text.contains("not issued by the --ca given"), "{text}");
}
