//! TLS and mutual TLS on the server (issue 13), with certificates made at
//! test time: the client certificate's subject is the lease owner (and
//! the per-owner quota keys on it); a certificate from another CA, an
//! expired one, none at all, and plaintext are refused. A raw tonic client
//! is used, not the bagel client library.

use std::net::{IpAddr, Ipv4Addr};

use bagel_client::Micros;
use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::ServerProcess;
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
