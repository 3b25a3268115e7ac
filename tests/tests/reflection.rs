//! gRPC server reflection of the real `bagel-server`, over the wire with
//! tonic-reflection's own clients: both protocol versions (`v1`, and the
//! older `v1alpha` that grpcio-reflection and other tools still ask) list
//! every service the server serves, and can describe each one they list
//! (a listed service that cannot be described is no use to a generic
//! client such as grpcurl or a Python client without generated code).

use bagel_tests::ServerProcess;
use prost::Message as _;
use tonic::transport::Channel;

/// Every service the lease port serves.
const SERVED: [&str; 4] = [
    "bagel.v1.LeaseService",
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// Asks one reflection version (its generated module) for the service
/// list, then for the file of each listed service; returns the list and,
/// per service, the names of the services its file declares.
macro_rules! reflect {
    ($pb:path, $channel:expr) => {{
        use pb::server_reflection_client::ServerReflectionClient;
        use pb::server_reflection_request::MessageRequest;
        use pb::server_reflection_response::MessageResponse;
        use $pb as pb;

        async fn ask(channel: Channel, request: MessageRequest) -> MessageResponse {
            let request = pb::ServerReflectionRequest {
                host: String::new(),
                message_request: Some(request),
            };
            let mut answers = ServerReflectionClient::new(channel)
                .server_reflection_info(tokio_stream::iter([request]))
                .await
                .expect("reflection call")
                .into_inner();
            answers
                .message()
                .await
                .expect("reflection answer")
                .expect("one answer")
                .message_response
                .expect("a response")
        }

        let channel: Channel = $channel;
        let listed: Vec<String> = match ask(channel.clone(), MessageRequest::ListServices(String::new()))
            .await
        {
            MessageResponse::ListServicesResponse(list) => list.service.into_iter().map(|s| s.name).collect(),
            other => panic!("list_services answered {other:?}"),
        };
        let mut described = Vec::new();
        for service in &listed {
            let files = match ask(
                channel.clone(),
                MessageRequest::FileContainingSymbol(service.clone()),
            )
            .await
            {
                MessageResponse::FileDescriptorResponse(files) => files.file_descriptor_proto,
                other => panic!("file_containing_symbol {service} answered {other:?}"),
            };
            let declared: Vec<String> = files
                .iter()
                .map(|bytes| {
                    prost_types::FileDescriptorProto::decode(bytes.as_slice()).expect("a file descriptor")
                })
                .flat_map(|file| {
                    let package = file.package().to_owned();
                    file.service
                        .into_iter()
                        .map(move |s| format!("{package}.{}", s.name()))
                })
                .collect();
            described.push((service.clone(), declared));
        }
        (listed, described)
    }};
}

fn check(version: &str, listed: &[String], described: &[(String, Vec<String>)]) {
    let mut sorted = listed.to_vec();
    sorted.sort();
    assert_eq!(sorted, SERVED, "{version} reflection lists every service served");
    for (service, declared) in described {
        assert!(
            declared.contains(service),
            "{version} reflection describes {service}: its file declares {declared:?}"
        );
    }
}

#[tokio::test]
async fn both_reflection_versions_list_and_describe_every_service_served() {
    let server = ServerProcess::start(&[]).await;
    let channel = Channel::from_shared(server.url.clone())
        .expect("server url")
        .connect()
        .await
        .expect("connect");

    let (listed, described) = reflect!(tonic_reflection::pb::v1, channel.clone());
    check("v1", &listed, &described);
    let (listed, described) = reflect!(tonic_reflection::pb::v1alpha, channel);
    check("v1alpha", &listed, &described);
}
