//! Sessionful HTTP sessions every replica can serve.
//!
//! With a shared (PostgreSQL) journal, the sessions of the 2025-06-18 / 2025-11-25 protocol are
//! recorded in it ([`ring0_journal::Deployment`]): who opened each and the client's
//! `initialize` parameters (its protocol version, capabilities and client information). A
//! request naming a session this replica does not hold — it was opened on another, or before
//! this one restarted — is served after rmcp replays the handshake from that record into a new
//! local session ([`SharedSessions`] is rmcp's `SessionStore`); the HTTP gate reads the record
//! on every request, so a session deleted on one replica, or idle past
//! `[http] session_idle_timeout_s`, is refused by all, and a session answers only the principal
//! that opened it. The records are bounded per principal (`sessions_per_principal_max`) and in
//! all (`ring0_journal::deployment::SHARED_SESSIONS_MAX`).

use crate::log::Log;
use ring0_journal::{Deployment, SharedSession};
use rmcp::transport::streamable_http_server::session::{
    SessionState, SessionStore, SessionStoreError,
};
use std::sync::Arc;

/// rmcp's session store over the shared journal.
pub struct SharedSessions {
    deployment: Arc<dyn Deployment>,
    per_principal_max: usize,
    idle_ms: u64,
    log: Log,
}

impl SharedSessions {
    pub fn new(deployment: Arc<dyn Deployment>, config: &super::DoorConfig, log: Log) -> Arc<Self> {
        Arc::new(Self {
            deployment,
            per_principal_max: config.sessions_per_principal_max,
            idle_ms: config.session_idle_timeout().as_millis() as u64,
            log,
        })
    }

    /// The live record of session `id`, its use recorded (the gate's check of every request).
    pub async fn find(&self, id: &str) -> Result<Option<SharedSession>, String> {
        self.deployment
            .session_get(id, self.idle_ms)
            .await
            .map_err(|e| e.to_string())
    }
}

#[async_trait::async_trait]
impl SessionStore for SharedSessions {
    async fn load(&self, session_id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        let Some(record) = self.find(session_id).await? else {
            return Ok(None);
        };
        // The gate let only the opener's requests through; a restore never serves another.
        if crate::http::caller().as_deref() != Some(record.principal.as_str()) {
            return Ok(None);
        }
        Ok(Some(serde_json::from_str(&record.state)?))
    }

    async fn store(&self, session_id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let principal = crate::http::caller()
            .ok_or("a session was stored without an authenticated principal")?;
        let record = SharedSession {
            id: session_id.to_string(),
            principal,
            state: serde_json::to_string(state)?,
        };
        let stored = self
            .deployment
            .session_put(&record, self.per_principal_max, self.idle_ms)
            .await;
        if let Err(e) = &stored {
            self.log.line(&format!(
                "HTTP session of principal {} is not shared with the other replicas: {e}",
                record.principal
            ));
        }
        Ok(stored?)
    }

    async fn delete(&self, session_id: &str) -> Result<(), SessionStoreError> {
        Ok(self.deployment.session_delete(session_id).await?)
    }
}
