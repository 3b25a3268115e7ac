//! What the server tells without changing anything: Describe and History
//! of names, ServerInfo (what this server is, its limits and load), and
//! SignedNow.

use bagel_proto::pb;

use super::Service;
use crate::error::Error;
use crate::table::{HistoryEvent, Metadata};
use crate::transport::Caller;
use crate::validate;

impl Service {
    pub(crate) fn describe(
        &self,
        req: &pb::DescribeRequest,
        caller: &Caller,
    ) -> Result<pb::DescribeResponse, Error> {
        let names = validate::names("names", &req.names, &self.inner.cfg.limits)?;
        self.permit(caller, bagel_proto::acl::Permission::Read, &names)?;
        let views = self.inner.table.describe(&names, self.now());
        let names = views
            .into_iter()
            .map(|v| pb::NameState {
                name: v.name.to_string(),
                holder: v.holder.map(|h| pb::Holder {
                    lease_id: h.lease.to_string(),
                    owner: v.owner.as_deref().unwrap_or_default().to_owned(),
                    mode: pb::Mode::from(h.mode).into(),
                    deadline_us: h.deadline.as_micros(),
                    fencing_token: v.fencing,
                    granted_at_us: h.lease.granted_at().as_micros(),
                }),
                previous: Some(v.previous.to_pb()),
                fencing_token: v.fencing,
                known: v.known,
                waiters: v.waiters as u32,
            })
            .collect();
        Ok(pb::DescribeResponse { names })
    }

    pub(crate) fn history(
        &self,
        req: &pb::HistoryRequest,
        caller: &Caller,
    ) -> Result<pb::HistoryResponse, Error> {
        let name = validate::name(&req.name, &self.inner.cfg.limits)?;
        self.permit(
            caller,
            bagel_proto::acl::Permission::Read,
            std::slice::from_ref(&name),
        )?;
        let (entries, truncated) = self.inner.table.history(&name);
        let entries = entries
            .into_iter()
            .map(|e| pb::HistoryEntry {
                lease_id: e.lease.to_string(),
                owner: e.owner.to_string(),
                event: history_event(e.event).into(),
                at_us: e.at.as_micros(),
                watermark_us: e.watermark.as_micros(),
                metadata: e.metadata.as_ref().map(metadata_pb),
            })
            .collect();
        Ok(pb::HistoryResponse { entries, truncated })
    }

    /// Never refused: what this server is, its limits and its load.
    pub(crate) fn server_info(&self, caller: &Caller) -> pb::ServerInfoResponse {
        let inner = &*self.inner;
        let cfg = &inner.cfg;
        let tcfg = inner.table.config();
        let now = self.now();
        let signer = &inner.witness.signer;
        pb::ServerInfoResponse {
            server_id: cfg.server_id.clone(),
            epoch_us: inner.witness.epoch.as_micros(),
            keys: vec![pb::PublicKey {
                key_id: signer.key_id().to_owned(),
                ed25519: signer.verifying_key().as_bytes().to_vec(),
            }],
            min_ttl_us: cfg.min_ttl.as_micros() as u64,
            max_ttl_us: cfg.max_ttl.as_micros() as u64,
            max_wait_us: cfg.max_wait.as_micros() as u64,
            ready_at_us: tcfg.ready_at.as_micros(),
            ready: now >= tcfg.ready_at,
            now_us: now.as_micros(),
            clock: Some(inner.time.status()),
            forgotten_floor_us: inner.table.forgotten_floor().as_micros(),
            unsafe_skip_restart_wait: cfg.unsafe_skip_restart_wait,
            max_names_per_request: cfg.limits.max_names_per_request as u32,
            max_name_bytes: cfg.limits.max_name_bytes as u32,
            max_owner_bytes: cfg.limits.max_owner_bytes as u32,
            max_metadata_bytes: cfg.limits.max_metadata_bytes as u32,
            timestamp_tolerance_us: cfg.timestamp_tolerance.as_micros() as u64,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            limits: Some(cfg.limits_pb()),
            tls: cfg.tls.is_some(),
            client_auth: inner.client_auth(),
            granted_until_us: inner.highwater.get().as_micros(),
            load: Some(pb::ServerLoad {
                connections: cfg
                    .limits
                    .max_connections
                    .saturating_sub(inner.conn_slots.available_permits()) as u64,
                sessions: inner.sessions.load(std::sync::atomic::Ordering::Relaxed) as u64,
                held_names: inner.table.held() as u64,
                waiters: inner.table.waiting() as u64,
                inflight_bytes: inner.frames.buffered() as u64,
                sessions_dropped: inner.sessions_dropped.load(std::sync::atomic::Ordering::Relaxed),
                watchers: inner.table.watch_hub().watchers() as u64,
            }),
            access: self.access_info(caller),
            members: inner
                .membership
                .get()
                .iter()
                .flat_map(|m| m.lists())
                .map(|ids| pb::MemberList { ids: ids.clone() })
                .collect(),
        }
    }

    pub(crate) fn signed_now(&self) -> Result<pb::SignedNowResponse, Error> {
        let reading = self.inner.time.signed()?;
        Ok(pb::SignedNowResponse {
            signed_time: Some(reading.signed.clone()),
            time_us: reading.time.as_micros(),
            radius_us: reading.radius_us,
        })
    }
}

fn history_event(e: HistoryEvent) -> pb::HistoryEvent {
    match e {
        HistoryEvent::Renewed => pb::HistoryEvent::Renewed,
        HistoryEvent::Released => pb::HistoryEvent::Released,
    }
}

fn metadata_pb(m: &Metadata) -> pb::Metadata {
    match m {
        Metadata::Data(d) => pb::Metadata {
            data: d.to_vec(),
            wildcard: false,
        },
        Metadata::Wildcard => pb::Metadata {
            data: Vec::new(),
            wildcard: true,
        },
    }
}
