//! API sessions: who owns each, its settings, its host tools and the kernel session its turns
//! run in.
//!
//! A session's kernel is built from the gateway's current generation (built-in and upstream
//! tools, the one journal, quarantine and the principal's grants) plus the session's host
//! tools; it is built again when the host tools change or the gateway's catalog does (checked
//! at each turn). The session's own grants only narrow the principal's ([`Narrowed`]).
//! Sessions are bounded per principal and in all, and a session unused for
//! [`SESSION_IDLE_TIMEOUT`] with no open turn is deleted.

use crate::error::ApiError;
use crate::events::EventStream;
use crate::limits::{
    HOST_TOOLS_PER_SESSION_MAX, SESSION_IDLE_TIMEOUT, SESSIONS_MAX, SESSIONS_PER_PRINCIPAL_MAX,
    TURNS_KEPT_PER_SESSION_MAX,
};
use crate::model::{ExecutionMode, HostTool, TurnFormat};
use crate::turn::Turn;
use async_trait::async_trait;
use ring0_core::{Authority, Principal, ToolSpec};
use ring0_kernel::policy::ToolPattern;
use ring0_kernel::{
    AuthAdmission, AuthDecision, AuthRequest, Authorizer, Kernel, RepeatLimits, SessionConfig,
    SessionInfo, Tool,
};
use ring0_mcp::gateway::Generation;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What every session's kernel is built from.
#[derive(Clone)]
pub(crate) struct KernelParts {
    pub gateway: ring0_mcp::Gateway,
    pub spill: Option<Arc<ring0_shape::SpillStore>>,
    pub observer: Option<Arc<dyn ring0_kernel::EventObserver>>,
}

/// The session's narrowing of its principal's grants: a call must pass both.
pub(crate) struct Narrowed {
    pub inner: Arc<dyn Authorizer>,
    pub tools: Option<Vec<ToolPattern>>,
    pub ceiling: Option<Authority>,
}

impl Narrowed {
    fn refusal(&self, spec: &ToolSpec) -> Option<AuthDecision> {
        if let Some(tools) = &self.tools
            && !tools.iter().any(|p| p.matches(&spec.name))
        {
            return Some(AuthDecision::Deny {
                rule: "session:tools".into(),
                reason: format!("this session's grants do not name tool {:?}", spec.name),
            });
        }
        match self.ceiling {
            Some(ceiling) if spec.authority > ceiling => Some(AuthDecision::Deny {
                rule: "session:ceiling".into(),
                reason: format!(
                    "tool {:?} needs authority {} and this session's ceiling is {ceiling}",
                    spec.name, spec.authority
                ),
            }),
            _ => None,
        }
    }
}

#[async_trait]
impl Authorizer for Narrowed {
    async fn authorize(&self, request: &AuthRequest<'_>) -> AuthDecision {
        match self.refusal(request.spec) {
            Some(refused) => refused,
            None => self.inner.authorize(request).await,
        }
    }

    async fn admit(&self, request: &AuthRequest<'_>) -> AuthAdmission {
        match self.refusal(request.spec) {
            Some(refused) => AuthAdmission::Decided(refused),
            None => self.inner.admit(request).await,
        }
    }

    async fn hold(&self, request: &AuthRequest<'_>) -> AuthDecision {
        match self.refusal(request.spec) {
            Some(refused) => refused,
            None => self.inner.hold(request).await,
        }
    }

    async fn recheck(&self, request: &AuthRequest<'_>) -> AuthDecision {
        match self.refusal(request.spec) {
            Some(refused) => refused,
            None => self.inner.recheck(request).await,
        }
    }

    fn visible(&self, session: &SessionInfo, spec: &ToolSpec) -> bool {
        self.refusal(spec).is_none() && self.inner.visible(session, spec)
    }
}

/// A session's settings, fixed at creation.
pub(crate) struct Settings {
    pub format: TurnFormat,
    pub mode: ExecutionMode,
    pub scope: String,
    pub tools: Option<Vec<ToolPattern>>,
    pub ceiling: Option<Authority>,
    pub max_concurrent_tools: usize,
    pub repeat: RepeatLimits,
}

/// The host tools and the kernel session built with them.
#[derive(Default)]
struct Built {
    host: Vec<(ToolSpec, Arc<dyn Tool>)>,
    /// The generation the kernel session was built on, and the session.
    current: Option<(u64, Arc<ring0_kernel::Session>)>,
}

/// The turns of a session: open ones, and the last finished ones for re-reading.
#[derive(Default)]
pub(crate) struct Turns {
    pub by_id: BTreeMap<String, Arc<Turn>>,
    pub started: u64,
}

impl Turns {
    pub(crate) fn open(&self) -> usize {
        self.by_id.values().filter(|t| !t.is_finished()).count()
    }

    /// Forgets the oldest finished turns beyond the bound.
    pub(crate) fn trim(&mut self) {
        let finished: Vec<String> = self
            .by_id
            .iter()
            .filter(|(_, t)| t.is_finished())
            .map(|(id, _)| id.clone())
            .collect();
        let excess = finished.len().saturating_sub(TURNS_KEPT_PER_SESSION_MAX);
        // Ids are zero-padded counters: the smallest is the oldest.
        for id in finished.into_iter().take(excess) {
            self.by_id.remove(&id);
        }
    }
}

/// One API session.
pub(crate) struct ApiSession {
    pub id: String,
    pub principal: Principal,
    pub settings: Settings,
    pub events: EventStream,
    built: tokio::sync::Mutex<Built>,
    pub turns: Mutex<Turns>,
    last_used: Mutex<Instant>,
}

impl ApiSession {
    pub(crate) fn new(id: String, principal: Principal, settings: Settings) -> Self {
        Self {
            id,
            principal,
            settings,
            events: EventStream::default(),
            built: Default::default(),
            turns: Mutex::default(),
            last_used: Mutex::new(Instant::now()),
        }
    }

    fn touch(&self) {
        *self.last_used.lock().expect("last used") = Instant::now();
    }

    fn idle(&self) -> bool {
        self.last_used.lock().expect("last used").elapsed() > SESSION_IDLE_TIMEOUT
            && self.turns.lock().expect("turns").open() == 0
    }

    /// Ends the session: open turns' waiting calls are told, the round cancelled. Returns
    /// how many turns were still open.
    pub(crate) fn end(&self) -> usize {
        let turns = self.turns.lock().expect("turns");
        let open: Vec<&Arc<Turn>> = turns.by_id.values().filter(|t| !t.is_finished()).collect();
        for turn in &open {
            turn.board.close();
        }
        if let Ok(built) = self.built.try_lock()
            && let Some((_, session)) = &built.current
        {
            session.cancel();
        }
        open.len()
    }

    /// The kernel session of the gateway's current generation, built anew when that changed.
    pub(crate) async fn kernel_session(
        &self,
        parts: &KernelParts,
    ) -> Result<Arc<ring0_kernel::Session>, ApiError> {
        let generation = parts.gateway.generation();
        let mut built = self.built.lock().await;
        if let Some((number, session)) = &built.current
            && *number == generation.number
        {
            return Ok(session.clone());
        }
        let kernel =
            build_kernel(parts, &generation, &built.host, &self.events).map_err(|(i, why)| {
                ApiError::invalid(format!("/tools/{i}"), format!("host tool refused: {why}"))
            })?;
        let session = Arc::new(self.open(&kernel, &generation));
        built.current = Some((generation.number, session.clone()));
        Ok(session)
    }

    /// Replaces the host tools (checked whole first: a refused set changes nothing).
    pub(crate) async fn set_host_tools(
        &self,
        parts: &KernelParts,
        defs: &[HostTool],
    ) -> Result<(), ApiError> {
        if defs.len() > HOST_TOOLS_PER_SESSION_MAX {
            return Err(ApiError::limit(format!(
                "{} host tools; a session holds at most {HOST_TOOLS_PER_SESSION_MAX}",
                defs.len()
            ))
            .at("/tools", "too many tools"));
        }
        let generation = parts.gateway.generation();
        let mut host = Vec::with_capacity(defs.len());
        let mut names = std::collections::BTreeSet::new();
        for (i, def) in defs.iter().enumerate() {
            let loc = format!("/tools/{i}");
            check_name(def, &loc, &generation)?;
            if !names.insert(def.name.clone()) {
                return Err(ApiError::invalid(
                    format!("{loc}/name"),
                    format!("tool {:?} is defined twice", def.name),
                ));
            }
            host.push(crate::host::host_tool(def, &loc)?);
        }
        let kernel =
            build_kernel(parts, &generation, &host, &self.events).map_err(|(i, why)| {
                ApiError::invalid(format!("/tools/{i}"), format!("host tool refused: {why}"))
            })?;
        let mut built = self.built.lock().await;
        if self.turns.lock().expect("turns").open() > 0 {
            return Err(ApiError::conflict(
                "a turn of this session is still open; report its outcomes before changing tools",
            ));
        }
        let session = Arc::new(self.open(&kernel, &generation));
        built.host = host;
        if let Some((_, old)) = built.current.replace((generation.number, session)) {
            old.cancel();
        }
        Ok(())
    }

    /// Names of the session's host tools.
    pub(crate) async fn host_names(&self) -> std::collections::BTreeSet<String> {
        let built = self.built.lock().await;
        built.host.iter().map(|(s, _)| s.name.clone()).collect()
    }

    fn open(&self, kernel: &Kernel, generation: &Generation) -> ring0_kernel::Session {
        let s = &self.settings;
        let authorizer = Arc::new(Narrowed {
            inner: generation.gate.clone(),
            tools: s.tools.clone(),
            ceiling: s.ceiling,
        });
        let mode = s.mode.scheduling();
        kernel.open_session(
            SessionConfig::new(&s.scope)
                .principal(self.principal.clone())
                .session_id(&self.id)
                .authorizer(authorizer)
                .mode(mode)
                .max_concurrent_tools(s.max_concurrent_tools)
                .repeat_limits(s.repeat),
        )
    }
}

/// A host tool's name must be the host's own: not a tool ring0 already serves (built-in or
/// upstream), and never of the form of an upstream's (`alias__tool`), so that no host tool
/// passes for an upstream's under a grant written for it.
fn check_name(def: &HostTool, loc: &str, generation: &Generation) -> Result<(), ApiError> {
    if def.name.contains(ring0_mcp::names::SEPARATOR) {
        return Err(ApiError::invalid(
            format!("{loc}/name"),
            format!(
                "{:?} contains {:?}, which names upstream tools",
                def.name,
                ring0_mcp::names::SEPARATOR
            ),
        ));
    }
    let reserved = [
        ring0_kernel::catalog::SEARCH_TOOL,
        ring0_kernel::catalog::LOAD_TOOL,
    ];
    if generation.kernel.registry().get(&def.name).is_some() || reserved.contains(&&*def.name) {
        return Err(ApiError::conflict(format!(
            "tool {:?} is already served by ring0; name the host tool otherwise",
            def.name
        ))
        .at(format!("{loc}/name"), "name taken"));
    }
    Ok(())
}

/// The generation's tools (quarantined ones unlisted, as there) and the host tools, over the
/// one journal; or the host tool the kernel refused, by position.
fn build_kernel(
    parts: &KernelParts,
    generation: &Generation,
    host: &[(ToolSpec, Arc<dyn Tool>)],
    events: &EventStream,
) -> Result<Kernel, (usize, ring0_kernel::RegistrationError)> {
    let mut builder = Kernel::builder()
        .journal(parts.gateway.journal().clone())
        .authorizer(generation.gate.clone());
    if let Some(spill) = &parts.spill {
        builder = builder.spill_store(spill.clone());
    }
    builder = builder.observer(Arc::new(crate::events::SessionObserver {
        stream: events.clone(),
        also: parts.observer.clone(),
    }));
    for (i, (spec, tool)) in host.iter().enumerate() {
        builder = builder
            .tool(spec.clone(), tool.clone())
            .map_err(|refused| (i, refused.error))?;
    }
    let meta = [
        ring0_kernel::catalog::SEARCH_TOOL,
        ring0_kernel::catalog::LOAD_TOOL,
    ];
    for t in generation.kernel.registry().iter() {
        if meta.contains(&t.spec.name.as_str()) || host.iter().any(|(s, _)| s.name == t.spec.name) {
            continue;
        }
        builder = match builder.tool_in(&t.connection, &t.callable, t.spec.clone(), t.tool.clone())
        {
            Ok(b) => b,
            Err(refused) => refused.into_builder(),
        };
    }
    for name in generation.quarantined.keys() {
        builder = builder.unlisted(name);
    }
    Ok(builder.build())
}

/// Every API session, bounded per principal and in all.
#[derive(Default)]
pub(crate) struct Sessions {
    map: Mutex<HashMap<String, Arc<ApiSession>>>,
}

impl Sessions {
    /// Adds a session, or refuses it at a bound (after deleting idle sessions).
    pub(crate) fn add(&self, session: ApiSession) -> Result<Arc<ApiSession>, ApiError> {
        let mut map = self.map.lock().expect("sessions");
        let idle: Vec<String> = map
            .iter()
            .filter(|(_, s)| s.idle())
            .map(|(id, _)| id.clone())
            .collect();
        for id in idle {
            if let Some(s) = map.remove(&id) {
                s.end();
            }
        }
        let owned = map
            .values()
            .filter(|s| s.principal.id == session.principal.id)
            .count();
        if owned >= SESSIONS_PER_PRINCIPAL_MAX {
            return Err(ApiError::limit(format!(
                "principal {:?} holds {owned} sessions, the most it may; delete one first",
                session.principal.id
            )));
        }
        if map.len() >= SESSIONS_MAX {
            return Err(ApiError::limit(format!(
                "{SESSIONS_MAX} sessions are open, the most ring0 holds"
            )));
        }
        let session = Arc::new(session);
        map.insert(session.id.clone(), session.clone());
        Ok(session)
    }

    /// The principal's session `id`; another principal's is not found, as one that never was.
    pub(crate) fn get(&self, principal: &Principal, id: &str) -> Result<Arc<ApiSession>, ApiError> {
        let map = self.map.lock().expect("sessions");
        match map.get(id) {
            Some(s) if s.principal.id == principal.id => {
                s.touch();
                Ok(s.clone())
            }
            _ => Err(ApiError::not_found(format!("no session {id:?}"))),
        }
    }

    pub(crate) fn remove(
        &self,
        principal: &Principal,
        id: &str,
    ) -> Result<Arc<ApiSession>, ApiError> {
        let mut map = self.map.lock().expect("sessions");
        match map.get(id) {
            Some(s) if s.principal.id == principal.id => Ok(map.remove(id).expect("present")),
            _ => Err(ApiError::not_found(format!("no session {id:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_sessions_grants_refuse_what_they_do_not_name_or_exceed() {
        let narrowed = Narrowed {
            inner: Arc::new(ring0_kernel::GrantTable::allow(&["*"], Authority::A3)),
            tools: Some(vec![ToolPattern("read_*".into())]),
            ceiling: Some(Authority::A0),
        };
        let read = ToolSpec::read("read_file", "", json!({"type": "object"}));
        let list = ToolSpec::read("list_dir", "", json!({"type": "object"}));
        let write = ToolSpec::new("read_and_burn", "", json!({"type": "object"}));
        let session = SessionInfo::detached("s");
        assert!(narrowed.visible(&session, &read));
        assert!(!narrowed.visible(&session, &list));
        assert!(matches!(
            narrowed.refusal(&write),
            Some(AuthDecision::Deny { rule, .. }) if rule == "session:ceiling"
        ));
    }

    #[test]
    fn narrowing_never_widens_the_principals_grants() {
        let narrowed = Narrowed {
            inner: Arc::new(ring0_kernel::GrantTable::allow(
                &["read_file"],
                Authority::A0,
            )),
            tools: Some(vec![ToolPattern("*".into())]),
            ceiling: None,
        };
        let shell = ToolSpec::new("shell", "", json!({"type": "object"}));
        assert!(!narrowed.visible(&SessionInfo::detached("s"), &shell));
    }
}
