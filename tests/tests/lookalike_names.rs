//! Issue 38, item 6: names and owners that look like others. One policy
//! (`bagel_proto::names`): control, default-ignorable (invisible),
//! non-ASCII space and combining diacritical characters are refused in
//! names and owners, whoever sends them and however (a request's owner, a
//! client certificate's subject), naming the code point; the status page
//! escapes whatever it shows.

use std::net::{IpAddr, Ipv4Addr};

use bagel_client::Micros;
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

/// Each would pass for a plain name: (name, its refused code point).
const LOOKALIKES: &[(&str, &str)] = &[
    ("a\u{AD}b", "U+00AD (a soft hyphen"),
    ("ab\u{E0041}", "U+E0041 (a tag character"),
    ("a\u{3164}b", "U+3164 (a Hangul filler"),
    ("e\u{301}", "U+0301 (a combining diacritical mark"),
    ("a\u{A0}b", "U+00A0 (a space other than U+0020"),
    ("a\u{FE0F}", "U+FE0F (a variation selector"),
    ("a\u{2064}b", "U+2064 (a default-ignorable character"),
];

fn acquire(names: &[&str], owner: &str) -> pb::AcquireRequest {
    pb::AcquireRequest {
        names: names.iter().map(|n| (*n).to_owned()).collect(),
        deadline_us: Micros::now().as_micros() + 9 * SEC,
        owner: owner.to_owned(),
        mode: pb::Mode::Full.into(),
        ..Default::default()
    }
}

/// The message of a refusal with `code`, checked not to carry the
/// refused character raw.
fn refused(r: Result<tonic::Response<pb::AcquireResponse>, tonic::Status>, code: Code, raw: char) -> String {
    let status = r.expect_err("accepted");
    assert_eq!(status.code(), code, "{status:?}");
    let m = status.message().to_owned();
    assert!(!m.contains(raw), "U+{:04X} echoed raw: {m}", u32::from(raw));
    m
}

fn odd_char(s: &str) -> char {
    s.chars().find(|c| !c.is_ascii()).unwrap()
}

#[tokio::test]
async fn lookalike_names_and_owners_are_refused_naming_the_code_point() {
    let server = ServerProcess::start_ready(&[]).await;
    let mut c = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    for &(name, why) in LOOKALIKES {
        let m = refused(
            c.acquire(acquire(&["fine", name], "ops")).await,
            Code::InvalidArgument,
            odd_char(name),
        );
        assert!(m.starts_with("names: [1] ") && m.contains(why), "{name:?}: {m}");
        let m = refused(
            c.acquire(acquire(&["fine"], name)).await,
            Code::InvalidArgument,
            odd_char(name),
        );
        assert!(m.starts_with("owner: ") && m.contains(why), "owner {name:?}: {m}");
        // The CLI refuses it before sending anything.
        let out = server.cli(&["acquire", name, "--ttl", "5s"]);
        assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(why),
            "{name:?}: {}",
            describe_output(&out)
        );
    }
    // What the look-alikes imitate, and scripts that need their own marks,
    // are names.
    for name in [
        "ab",
        "a b",
        "\u{E9}",
        "\u{939}\u{93F}\u{928}\u{94D}\u{926}\u{940}",
    ] {
        let r = c.acquire(acquire(&[name], "ops")).await;
        assert!(r.is_ok(), "{name:?}: {r:?}");
    }
    // "fine" was never taken by a refused request.
    c.acquire(acquire(&["fine"], "ops")).await.unwrap();
}

/// A certificate authority made for the test (as in tls.rs).
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new() -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "bagel test CA");
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

    /// A leaf certificate with this CN, and its key, as PEM.
    fn leaf(&self, cn: &str, server: bool) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// A TLS client of `server` showing `identity`, once the server answers.
async fn client(
    server: &ServerProcess,
    ca: &str,
    identity: &(String, String),
) -> LeaseServiceClient<Channel> {
    loop {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .domain_name("localhost")
            .identity(Identity::from_pem(&identity.0, &identity.1));
        let channel = Channel::from_shared(format!("https://{}", server.addr))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await;
        if let Ok(channel) = channel {
            let mut c = LeaseServiceClient::new(channel);
            if c.server_info(pb::ServerInfoRequest {}).await.is_ok() {
                return c;
            }
        }
        tokio::task::yield_now().await;
    }
}

/// Before: a certificate whose CN held U+202E became a lease's owner,
/// shown reversed wherever owners are shown.
#[tokio::test]
async fn a_certificate_subject_that_breaks_the_owner_rule_owns_nothing() {
    let ca = Ca::new();
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let (cert, key) = ca.leaf("lease-server", true);
    let args = [
        "--unsafe-skip-restart-wait",
        "--tls-cert",
        &write("server.pem", &cert),
        "--tls-key",
        &write("server.key", &key),
        "--client-ca",
        &write("ca.pem", &ca.pem),
    ];
    let server = ServerProcess::spawn(&args).await;
    for (cn, why) in [
        (
            "worker-\u{202E}1-rekrow",
            "U+202E (a bidirectional override) at character 10",
        ),
        (
            "wor\u{AD}ker-1",
            "U+00AD (a soft hyphen (invisible)) at character 6",
        ),
    ] {
        let mut c = client(&server, &ca.pem, &ca.leaf(cn, false)).await;
        let m = refused(
            c.acquire(acquire(&["taken"], "ops")).await,
            Code::InvalidArgument,
            odd_char(cn),
        );
        assert!(
            m.starts_with("owner: client certificate \"CN=wor")
                && m.contains("cannot own leases")
                && m.contains(why),
            "{cn:?}: {m}"
        );
    }
    // A certificate with a plain subject still owns what it takes, and
    // "taken" was never granted to the refused ones.
    let mut c = client(&server, &ca.pem, &ca.leaf("worker-1", false)).await;
    let grant = c.acquire(acquire(&["taken"], "ops")).await.unwrap().into_inner();
    assert!(grant.grant.is_some());
}

/// Before: the page's search echoed the query with U+202E raw (in the
/// search box and in "no name starting with …").
#[tokio::test]
async fn the_status_page_escapes_what_it_shows() {
    let server = ServerProcess::start_ready(&["--http", "127.0.0.1:0"]).await;
    for (query, shown) in [
        ("a%E2%80%AEb", "a\\u{202e}b"),
        ("x%C2%ADy", "x\\u{ad}y"),
        ("%3Cb%3E", "&lt;b&gt;"),
    ] {
        let url = format!("{}/?holder={query}", server.http_url());
        let response = reqwest::get(&url)
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        assert_eq!(response.status().as_u16(), 200);
        let body = response.text().await.unwrap();
        assert!(body.contains(shown), "{query}: {shown:?} not in the page");
        for raw in ['\u{202E}', '\u{AD}'] {
            assert!(
                !body.contains(raw),
                "{query}: the page holds U+{:04X} raw",
                u32::from(raw)
            );
        }
        assert!(!body.contains("<b>"), "{query}: markup unescaped");
    }
}

/// Issue 52: a name (or owner) not in Unicode normalization form C is
/// refused, naming the code points that differ and the NFC form to send.
/// Before: `か` + U+3099 and `が`, U+212B (ANGSTROM SIGN) and `Å` were two
/// leases that look the same.
#[tokio::test]
async fn names_not_in_nfc_are_refused_naming_their_nfc_form() {
    let server = ServerProcess::start_ready(&[]).await;
    let mut c = LeaseServiceClient::connect(server.url.clone()).await.unwrap();
    // (not NFC, its NFC form, the code points that differ and what they are in NFC)
    let cases = [
        (
            "\u{304B}\u{3099}",
            "\u{304C}",
            "U+304B U+3099 at character 0 is U+304C in NFC",
        ),
        ("\u{212B}", "\u{C5}", "U+212B at character 0 is U+00C5 in NFC"),
        (
            "x/\u{212A}elvin",
            "x/Kelvin",
            "U+212A at character 2 is U+004B in NFC",
        ),
    ];
    for (name, nfc, why) in cases {
        // The NFC form is a name, held by one owner...
        c.acquire(acquire(&[nfc], "ops")).await.unwrap();
        // ...and its canonical equivalent is refused, not a second lease.
        let status = c.acquire(acquire(&["fine", name], "ops")).await.expect_err(name);
        assert_eq!(status.code(), Code::InvalidArgument, "{name:?}: {status:?}");
        let m = status.message();
        assert!(
            m.starts_with("names: [1] ")
                && m.contains("is not in Unicode normalization form C")
                && m.contains(why)
                && m.contains(&format!("{nfc:?}")),
            "{name:?}: {m}"
        );
        let status = c.acquire(acquire(&["fine"], name)).await.expect_err(name);
        assert_eq!(status.code(), Code::InvalidArgument, "owner {name:?}: {status:?}");
        assert!(
            status.message().starts_with("owner: ") && status.message().contains(why),
            "owner {name:?}: {}",
            status.message()
        );
    }
    // "fine" was never taken by a refused request.
    c.acquire(acquire(&["fine"], "ops")).await.unwrap();
}
