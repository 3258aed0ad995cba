//! Sessionful HTTP sessions, bounded per principal and closed when idle.
//!
//! rmcp's [`LocalSessionManager`] keeps a session until its client deletes it; a client that
//! never does (or a flood of `initialize`s) would hold memory for ever. [`DoorSessions`] wraps
//! it: each session is counted against the principal that opened it (at most
//! `sessions_per_principal_max`; one more closes that principal's least recently used session,
//! whose client then gets 404 and initializes again, as the protocol has it), and a session with
//! no request and no open stream for `session_idle_timeout_s` is closed, releasing its worker
//! and the ring0 session it served.

use super::DoorConfig;
use crate::limits::SESSION_SWEEP_INTERVAL;
use crate::log::Log;
use futures::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::common::server_side_http::{ServerSseMessage, SessionId};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::{RestoreOutcome, SessionManager};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// What is known of one open session.
struct Entry {
    principal: String,
    last_used: Instant,
    /// Response streams open now: a session streaming to its client is not idle.
    streams: usize,
}

#[derive(Default)]
struct Table {
    entries: HashMap<SessionId, Entry>,
}

impl Table {
    fn touch(&mut self, id: &SessionId) {
        if let Some(e) = self.entries.get_mut(id) {
            e.last_used = Instant::now();
        }
    }

    /// The least recently used session of `principal` when it holds `max` or more.
    fn over_cap(&self, principal: &str, max: usize) -> Option<SessionId> {
        let mine = self
            .entries
            .iter()
            .filter(|(_, e)| e.principal == principal);
        if mine.clone().count() < max {
            return None;
        }
        mine.min_by_key(|(_, e)| e.last_used)
            .map(|(id, _)| id.clone())
    }

    fn idle(&self, timeout: Duration) -> Vec<SessionId> {
        self.entries
            .iter()
            .filter(|(_, e)| e.streams == 0 && e.last_used.elapsed() >= timeout)
            .map(|(id, _)| id.clone())
            .collect()
    }
}

/// rmcp's session manager under a per-principal cap and idle expiry.
pub struct DoorSessions {
    inner: LocalSessionManager,
    table: Arc<Mutex<Table>>,
    per_principal_max: usize,
    log: Log,
}

impl DoorSessions {
    /// The manager, and its sweeper of idle sessions (a task that ends with `shutdown` or when
    /// the manager is dropped).
    pub fn start(config: &DoorConfig, log: Log, shutdown: CancellationToken) -> Arc<Self> {
        let mut inner = LocalSessionManager::default();
        // Expiry is this manager's: rmcp's own keep-alive would close a session whose client
        // holds a quiet stream open, and leave its entry in rmcp's map either way.
        inner.session_config.keep_alive = None;
        let this = Arc::new(Self {
            inner,
            table: Arc::new(Mutex::new(Table::default())),
            per_principal_max: config.sessions_per_principal_max,
            log,
        });
        let idle = config.session_idle_timeout();
        let weak = Arc::downgrade(&this);
        tokio::spawn(sweep(weak, idle, shutdown));
        this
    }

    /// Sessions open now.
    pub fn len(&self) -> usize {
        self.table.lock().expect("sessions").entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    async fn close(&self, id: &SessionId, why: &str) {
        let removed = self.table.lock().expect("sessions").entries.remove(id);
        if let Some(entry) = removed {
            self.log.line(&format!(
                "HTTP session of principal {} closed: {why}",
                entry.principal
            ));
        }
        let _ = self.inner.close_session(id).await;
    }

    fn touch(&self, id: &SessionId) {
        self.table.lock().expect("sessions").touch(id);
    }

    /// Counts a response stream of session `id` until the stream is dropped.
    fn hold<S: Stream + Send + Sync + 'static>(
        &self,
        id: &SessionId,
        stream: S,
    ) -> impl Stream<Item = S::Item> + Send + Sync + 'static {
        if let Some(e) = self.table.lock().expect("sessions").entries.get_mut(id) {
            e.streams += 1;
        }
        let guard = StreamGuard {
            table: Arc::downgrade(&self.table),
            id: id.clone(),
        };
        futures::StreamExt::map(stream, move |item| {
            let _ = &guard;
            item
        })
    }
}

struct StreamGuard {
    table: Weak<Mutex<Table>>,
    id: SessionId,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if let Some(table) = self.table.upgrade()
            && let Some(e) = table.lock().expect("sessions").entries.get_mut(&self.id)
        {
            e.streams = e.streams.saturating_sub(1);
            e.last_used = Instant::now();
        }
    }
}

async fn sweep(sessions: Weak<DoorSessions>, idle: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(SESSION_SWEEP_INTERVAL.min(idle));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        let Some(sessions) = sessions.upgrade() else {
            return;
        };
        let expired = sessions.table.lock().expect("sessions").idle(idle);
        for id in expired {
            sessions
                .close(&id, &format!("idle for {}s", idle.as_secs()))
                .await;
        }
    }
}

impl SessionManager for DoorSessions {
    type Error = LocalSessionManagerError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        // The gate in front of the service names the principal of every request it passes.
        let principal = crate::http::caller().unwrap_or_default();
        let victim = self
            .table
            .lock()
            .expect("sessions")
            .over_cap(&principal, self.per_principal_max);
        if let Some(victim) = victim {
            self.close(
                &victim,
                &format!(
                    "the principal opened more than {} sessions; its least recently used one made room",
                    self.per_principal_max
                ),
            )
            .await;
        }
        let (id, transport) = self.inner.create_session().await?;
        self.table.lock().expect("sessions").entries.insert(
            id.clone(),
            Entry {
                principal,
                last_used: Instant::now(),
                streams: 0,
            },
        );
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.touch(id);
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.table.lock().expect("sessions").entries.remove(id);
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.touch(id);
        let stream = self.inner.create_stream(id, message).await?;
        Ok(self.hold(id, stream))
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.touch(id);
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.touch(id);
        let stream = self.inner.create_standalone_stream(id).await?;
        Ok(self.hold(id, stream))
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        // A session another replica opened (or this one before it restarted), restored from
        // the shared record for the principal the gate checked against it.
        let outcome = self.inner.restore_session(id.clone()).await?;
        if matches!(outcome, RestoreOutcome::Restored(_)) {
            let principal = crate::http::caller().unwrap_or_default();
            let victim = self
                .table
                .lock()
                .expect("sessions")
                .over_cap(&principal, self.per_principal_max);
            if let Some(victim) = victim {
                self.close(
                    &victim,
                    "the principal holds too many sessions on this replica",
                )
                .await;
            }
            self.table.lock().expect("sessions").entries.insert(
                id,
                Entry {
                    principal,
                    last_used: Instant::now(),
                    streams: 0,
                },
            );
        }
        Ok(outcome)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.touch(id);
        let stream = self.inner.resume(id, last_event_id).await?;
        Ok(self.hold(id, stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(principal: &str, ago: Duration) -> Entry {
        Entry {
            principal: principal.into(),
            last_used: Instant::now() - ago,
            streams: 0,
        }
    }

    #[test]
    fn the_least_recently_used_session_of_the_principal_at_its_cap_makes_room() {
        let mut t = Table::default();
        t.entries
            .insert(Arc::from("a1"), entry("alice", Duration::from_secs(5)));
        t.entries
            .insert(Arc::from("a2"), entry("alice", Duration::from_secs(9)));
        t.entries
            .insert(Arc::from("b1"), entry("bob", Duration::from_secs(60)));
        assert_eq!(t.over_cap("alice", 3), None);
        assert_eq!(t.over_cap("alice", 2).as_deref(), Some("a2"));
        assert_eq!(t.over_cap("bob", 2), None);
    }

    #[test]
    fn a_session_with_an_open_stream_is_not_idle() {
        let mut t = Table::default();
        t.entries
            .insert(Arc::from("s"), entry("alice", Duration::from_secs(60)));
        t.entries.insert(
            Arc::from("busy"),
            Entry {
                streams: 1,
                ..entry("alice", Duration::from_secs(60))
            },
        );
        assert_eq!(t.idle(Duration::from_secs(30)), vec![Arc::<str>::from("s")]);
    }
}
