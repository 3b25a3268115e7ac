//! Issue 38, item 3: `List` pages are read from the shards' name orders,
//! a bounded number at once (`--list-pages`), off the threads that serve
//! renewals. Over a real `bagel-server`: many clients paging through
//! thousands of names at once with one page at a time allowed all get
//! every name, in order, none refused; and names come and go while they
//! page without a name listed twice or a held one missed.

use bagel_proto::pb;
use bagel_proto::pb::lease_service_client::LeaseServiceClient;
use bagel_tests::ServerProcess;
use tonic::transport::Channel;

const SEC: u64 = 1_000_000;
const N: usize = 5_000;

fn name(i: usize) -> String {
    format!("page/{i:05}")
}

async fn raw(server: &ServerProcess) -> LeaseServiceClient<Channel> {
    LeaseServiceClient::connect(server.url.clone()).await.unwrap()
}

async fn acquire(c: &mut LeaseServiceClient<Channel>, names: Vec<String>) -> pb::LeaseGrant {
    let req = pb::AcquireRequest {
        names,
        owner: "pages".into(),
        mode: pb::Mode::Full.into(),
        ttl_us: 60 * SEC,
        ..Default::default()
    };
    c.acquire(req).await.unwrap().into_inner().grant.unwrap()
}

/// Every name under `prefix`, paging `page_size` at a time.
async fn page_through(c: &mut LeaseServiceClient<Channel>, prefix: &str, page_size: u32) -> Vec<String> {
    let (mut names, mut token) = (Vec::new(), String::new());
    loop {
        let req = pb::ListRequest {
            prefix: prefix.into(),
            page_size,
            page_token: token,
        };
        let page = c.list(req).await.unwrap().into_inner();
        assert!(page.names.len() <= page_size as usize);
        names.extend(page.names.into_iter().map(|n| n.name));
        if page.next_page_token.is_empty() {
            return names;
        }
        token = page.next_page_token;
    }
}

/// With one page read at a time, 16 clients paging at once wait their
/// turn: each gets all the names, in order; none is refused.
#[tokio::test]
async fn clients_paging_at_once_wait_their_turn_and_get_every_name() {
    let server = ServerProcess::start_ready(&["--max-ttl", "2m", "--list-pages", "1"]).await;
    let mut c = raw(&server).await;
    for first in (0..N).step_by(64) {
        acquire(&mut c, (first..N.min(first + 64)).map(name).collect()).await;
    }
    let expected: Vec<String> = (0..N).map(name).collect();
    let mut readers = Vec::new();
    for r in 0..16u32 {
        let mut c = raw(&server).await;
        readers.push(tokio::spawn(async move {
            page_through(&mut c, "page/", 50 + r * 20).await
        }));
    }
    for r in readers {
        assert_eq!(r.await.unwrap(), expected);
    }
    // A prefix matching nothing, and one past every name.
    assert!(page_through(&mut c, "pag/", 100).await.is_empty());
    assert!(page_through(&mut c, "page/9", 100).await.is_empty());
}

/// Names released and granted while a client pages: it lists none twice,
/// in order, and every name held the whole time.
#[tokio::test]
async fn names_coming_and_going_while_paging_are_never_listed_twice() {
    let server = ServerProcess::start_ready(&["--max-ttl", "2m"]).await;
    let mut c = raw(&server).await;
    // Even names stay held; odd ones churn.
    for i in (0..1000).step_by(2) {
        acquire(&mut c, vec![name(i)]).await;
    }
    let mut churn = raw(&server).await;
    let (mut token, mut listed) = (String::new(), Vec::<String>::new());
    let mut i = 1;
    loop {
        // Between pages, an odd name is granted and released.
        let g = acquire(&mut churn, vec![name(i)]).await;
        let rel = pb::ReleaseRequest {
            lease_id: g.lease_id,
            token: g.token,
            ..Default::default()
        };
        churn.release(rel).await.unwrap();
        i = ((i + 98) % 1000) | 1;
        let req = pb::ListRequest {
            prefix: "page/".into(),
            page_size: 37,
            page_token: token,
        };
        let page = c.list(req).await.unwrap().into_inner();
        listed.extend(page.names.into_iter().map(|n| n.name));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert!(listed.windows(2).all(|w| w[0] < w[1]), "in order, none twice");
    for i in (0..1000).step_by(2) {
        assert!(
            listed.binary_search(&name(i)).is_ok(),
            "{} held throughout",
            name(i)
        );
    }
}
