//! Assembling a kernel from a loaded configuration: the built-in tools, the journal (SQLite in
//! the state directory, or the PostgreSQL database `[journal] url` names) and the session's
//! policy. `ring0 call`, `ring0 turn` and `ring0 serve` (and any other front end)
//! share it.

use crate::load::Loaded;
use crate::schema::ConfigError;
use ring0_journal::{Journal, PostgresJournal, PostgresOptions, SqliteJournal};
use ring0_kernel::{Authorizer, Kernel, SessionConfig};
use ring0_policy::{Approver, JsonlAudit, Policy, PolicyBuilder, RateLimit};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The session's authorizer and a kernel with the built-in tools and the SQLite journal.
pub struct Built {
    /// The kernel: the built-in tools, the SQLite journal and the policy as its authorizer.
    pub kernel: Kernel,
    /// The policy, as the authorizer every session of this kernel is opened with.
    pub authorizer: Arc<dyn Authorizer>,
    /// The policy behind `authorizer` (its state is keyed by principal and session, so every
    /// session of a front end shares it).
    pub policy: Policy,
    /// `[limits] max_concurrent_tools`.
    pub max_concurrent_tools: usize,
    /// Ends a client session's background jobs (a front end that knows when sessions end).
    pub jobs: ring0_tools::JobSessions,
    /// Set when the journal is shared with other replicas (PostgreSQL).
    pub journal_shared: Option<SharedJournal>,
    /// The audit log every decision goes to (the egress of stdio upstreams too).
    pub audit: Arc<dyn ring0_policy::AuditSink>,
    /// The state directory's manifest, recorded again when the kernel is dropped.
    _state: crate::state::Manifest,
}

impl Built {
    /// A session configuration with this configuration's authorizer and limits.
    pub fn session_config(&self, scope: &str) -> SessionConfig {
        SessionConfig::new(scope)
            .authorizer(self.authorizer.clone())
            .max_concurrent_tools(self.max_concurrent_tools)
    }
}

/// The cursor-signing key under the state directory, created (private) on first use so cursors
/// stay valid across processes.
fn cursor_key(state_dir: &Path) -> Result<Vec<u8>, String> {
    let path = state_dir.join("cursor.key");
    ring0_shape::keyfile::load_or_create(&path)
        .map(Vec::from)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// A journal several replicas share: what a front end needs to run recovery while it serves,
/// and what the replicas share besides records (sessions, keys, jobs, endpoints).
#[derive(Clone)]
pub struct SharedJournal {
    /// The database, as messages name it (never a password).
    pub name: String,
    /// Each replica's lease: a stopped replica's calls are recovered after this.
    pub lease_ms: u64,
    /// What this replica shares with the others (see [`ring0_journal::deployment`]).
    pub deployment: Arc<dyn ring0_journal::Deployment>,
}

impl std::fmt::Debug for SharedJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedJournal")
            .field("name", &self.name)
            .field("lease_ms", &self.lease_ms)
            .field("replica", &self.deployment.replica())
            .finish()
    }
}

/// What a configuration provides before a kernel is built: the built-in tools, the session's
/// policy and the journal. A front end that builds its own kernel (an MCP gateway adding
/// upstream tools) takes these; [`build_kernel`] assembles them into a kernel.
pub struct Parts {
    /// The built-in tools, configured from `[paths]`, `[limits]` and `[shell]`.
    pub tools: Vec<ring0_tools::ToolEntry>,
    /// Ends a client session's background jobs.
    pub jobs: ring0_tools::JobSessions,
    /// The policy from `[[grants]]`, `[limits]`, `[approval]` and `[audit]`.
    pub policy: Policy,
    /// The journal: SQLite at `journal.db` in the state directory, or the PostgreSQL database
    /// `[journal] url` names.
    pub journal: Arc<dyn Journal>,
    /// Whether the journal is shared with other replicas (PostgreSQL): their records whose
    /// lease lapses are this process's to recover while it runs, not only at start.
    pub journal_shared: Option<SharedJournal>,
    /// The audit log (`[audit] path`): the policy's decisions and every egress decision.
    pub audit: Arc<dyn ring0_policy::AuditSink>,
    /// `[limits] max_concurrent_tools`.
    pub max_concurrent_tools: usize,
    /// The spill store (`spill/` in the state directory): output the kernel cuts is kept there.
    pub spill: Arc<ring0_shape::SpillStore>,
    /// The state directory's manifest (recorded again on drop: the audit log's length at exit).
    pub state: crate::state::Manifest,
}

/// The built-in tools (configured from `[paths]`, `[limits]`, `[shell]`), the policy (from
/// `[[grants]]`, `[limits]`, `[approval]`, `[audit]`) and the SQLite journal at
/// `state_dir/journal.db`. `approver` decides held calls (the terminal's approvals directory for
/// the CLI; an MCP client's elicitation for a server).
pub fn build_parts(loaded: &Loaded, approver: Arc<dyn Approver>) -> Result<Parts, ConfigError> {
    build_parts_tapped(loaded, approver, None)
}

/// The audit log, and behind it a tap that sees each decision once the log recorded it (an
/// operations host's metrics). A decision the log refuses never reaches the tap: the policy
/// denies it.
struct TappedAudit {
    log: Arc<dyn ring0_policy::AuditSink>,
    tap: Arc<dyn ring0_policy::AuditSink>,
}

impl ring0_policy::AuditSink for TappedAudit {
    fn record(&self, entry: &ring0_policy::AuditEntry) -> Result<(), String> {
        self.log.record(entry)?;
        // The tap counts; what it says cannot undo a recorded decision.
        let _ = self.tap.record(entry);
        Ok(())
    }
}

/// [`build_parts`], with `audit_tap` told every decision the audit log recorded.
pub fn build_parts_tapped(
    loaded: &Loaded,
    approver: Arc<dyn Approver>,
    audit_tap: Option<Arc<dyn ring0_policy::AuditSink>>,
) -> Result<Parts, ConfigError> {
    let config = &loaded.config;
    let err = |key: &str, why: String| ConfigError {
        file: loaded.source.clone(),
        key: key.to_string(),
        why,
    };
    crate::state::prepare(&loaded.state_dir).map_err(|why| err("workspace.state_dir", why))?;
    if loaded.legacy_state {
        tracing::warn!(
            "{}",
            crate::state::legacy_warning(&loaded.state_dir, &loaded.workspace)
        );
    }
    let audit_path = loaded.state_dir.join(&config.audit.path);
    let postgres = config.journal.url.as_deref();
    // With a shared journal the state directory keeps a marker naming the database in the
    // journal's place, so the manifest still ties the directory to its journal (and its audit
    // log to both).
    let journal_path = match postgres {
        Some(_) => loaded.state_dir.join(crate::state::POSTGRES_MARKER_FILE),
        None => loaded.state_dir.join(crate::state::JOURNAL_FILE),
    };
    let mut manifest = crate::state::Manifest::check(&loaded.state_dir, &journal_path, &audit_path)
        .map_err(|why| err("workspace.state_dir", why))?;
    let mut tools_config = tools_config(
        loaded,
        cursor_key(&loaded.state_dir).map_err(|why| err("workspace.state_dir", why))?,
    );
    tools_config.shell.sandbox = config
        .sandbox
        .for_tool("shell", &loaded.config_dir)
        .map_err(|(key, why)| err(&key, why))?;
    let audit: Arc<dyn ring0_policy::AuditSink> = Arc::new(
        JsonlAudit::open(&audit_path)
            .map_err(|e| err("audit.path", format!("{}: {e}", audit_path.display())))?,
    );
    tools_config.shell.egress_proxy = Some(crate::egress::shell_egress(audit.clone()));
    let audit: Arc<dyn ring0_policy::AuditSink> = match audit_tap {
        Some(tap) => Arc::new(TappedAudit { log: audit, tap }),
        None => audit,
    };
    crate::sandbox::announce(config);
    let shell_sandbox = tools_config
        .shell
        .bind_sandbox(&loaded.workspace, Vec::new());
    // Fail closed at start: a kernel that cannot confine refuses here, naming the feature.
    shell_sandbox
        .check()
        .map_err(|e| err("sandbox", e.to_string()))?;
    let (journal, journal_shared) = match postgres {
        Some(url) => {
            let (journal, shared) =
                open_postgres(loaded, url).map_err(|why| err("journal.url", why))?;
            crate::state::write_postgres_marker(&journal_path, &shared.name)
                .map_err(|why| err("workspace.state_dir", why))?;
            (journal, Some(shared))
        }
        None => {
            crate::state::create_journal_files(&journal_path)
                .map_err(|why| err("workspace.state_dir", why))?;
            let journal = SqliteJournal::open(&journal_path).map_err(|e| {
                err(
                    "workspace.state_dir",
                    format!("journal {}: {e}", journal_path.display()),
                )
            })?;
            (Arc::new(journal) as Arc<dyn Journal>, None)
        }
    };
    let mut policy = policy_builder(loaded)?;
    // Replicas of a shared journal keep rate buckets and remembered approvals in it.
    if let Some(state) = journal.shared_state() {
        policy = policy.shared_state(state);
    }
    let policy = policy
        .approver(approver)
        .approval_timeout(Duration::from_secs(config.approval.timeout_secs))
        .audit(audit.clone())
        .audit_args(config.audit.include_args)
        .sandboxed_tools(shell_sandbox.is_on().then_some("shell"))
        .build();
    grant_profiles(loaded, &mut tools_config.shell, &policy)?;
    let (tools, jobs) = ring0_tools::builtin_tools_with_jobs(&tools_config)
        .map_err(|e| err("paths", e.to_string()))?;
    if let Some(shared) = &journal_shared {
        // The other replicas answer about this one's background jobs from their records.
        jobs.share(shared.deployment.clone());
    }
    let spill = ring0_shape::SpillStore::open(loaded.state_dir.join("spill"))
        .map_err(|e| err("workspace.state_dir", format!("spill store: {e}")))?;
    manifest
        .record()
        .map_err(|why| err("workspace.state_dir", why))?;
    Ok(Parts {
        tools,
        jobs,
        policy,
        journal,
        journal_shared,
        audit,
        max_concurrent_tools: config.limits.max_concurrent_tools,
        spill: Arc::new(spill),
        state: manifest,
    })
}

/// Opens the PostgreSQL journal `[journal]` describes, with the password from `password_env`.
fn open_postgres(loaded: &Loaded, url: &str) -> Result<(Arc<dyn Journal>, SharedJournal), String> {
    let section = &loaded.config.journal;
    let password = match &section.password_env {
        Some(var) => Some(
            std::env::var(var)
                .map_err(|_| format!("journal.password_env names {var}, which is not set"))?,
        ),
        None => None,
    };
    let options = PostgresOptions {
        pool_connections: section.pool_connections,
        lease_ms: section.lease_ms,
        password,
        ..PostgresOptions::default()
    };
    let journal = PostgresJournal::open(url, options).map_err(|e| e.to_string())?;
    let shared = SharedJournal {
        name: journal.name().to_string(),
        lease_ms: journal.lease_ms(),
        deployment: journal.deployment(),
    };
    Ok((Arc::new(journal), shared))
}

/// The sandbox profiles grants name for `shell`, and how a call finds its grant's: by asking the
/// policy which grant decides the principal's `shell` calls (the same grant that decides them).
fn grant_profiles(
    loaded: &Loaded,
    shell: &mut ring0_tools::ShellConfig,
    policy: &Policy,
) -> Result<(), ConfigError> {
    shell.profiles = loaded
        .config
        .sandbox
        .grant_profiles(&loaded.config.grants, &loaded.config_dir)
        .map_err(|(key, why)| ConfigError {
            file: loaded.source.clone(),
            key,
            why,
        })?;
    let policy = policy.clone();
    shell.profile_for = Some(ring0_tools::ProfileFor(Arc::new(
        move |principal: &ring0_core::Principal| {
            policy
                .grant_for(ring0_tools::SHELL_STRING_ARG.0, principal)
                .map(|g| ring0_tools::GrantProfiles {
                    sandbox: g.sandbox.clone(),
                    wider: g.sandbox_wider.clone(),
                })
                .unwrap_or_default()
        },
    )));
    Ok(())
}

/// The built-in tools' configuration from `[paths]`, `[limits]` and `[shell]`.
fn tools_config(loaded: &Loaded, cursor_key: Vec<u8>) -> ring0_tools::ToolsConfig {
    let config = &loaded.config;
    let mut tools_config =
        ring0_tools::ToolsConfig::new(&loaded.workspace, &loaded.state_dir, cursor_key);
    tools_config.protected = loaded.protected();
    tools_config.read_roots = config.paths.read.clone();
    tools_config.write_roots = config.paths.write.clone();
    tools_config.read_text_bytes_max = config.limits.read_text_bytes;
    tools_config.search_workers = config.limits.search_workers;
    tools_config.shell.authority = config.shell.authority;
    tools_config.shell.allow_command_string = config.grants.iter().any(|g| g.shell);
    if let Some(env) = &config.shell.env_allow {
        tools_config.shell.env_allow = env.clone();
    }
    tools_config
}

/// The policy's grants and limits from `[[grants]]` and `[limits]`; the caller adds who
/// approves and where decisions are recorded.
fn policy_builder(loaded: &Loaded) -> Result<PolicyBuilder, ConfigError> {
    let config = &loaded.config;
    let err = |key: &str, why: String| ConfigError {
        file: loaded.source.clone(),
        key: key.to_string(),
        why,
    };
    let mut policy = Policy::builder()
        .sandboxed_tools(ring0_tools::SANDBOXED_TOOLS.iter().copied())
        .shell_arg(
            ring0_tools::SHELL_STRING_ARG.0,
            ring0_tools::SHELL_STRING_ARG.1,
        )
        // The same tool's explicit argv: an inline script there is a command string too.
        .argv_arg(ring0_tools::SHELL_STRING_ARG.0, "argv")
        // The wider sandbox profile a call may ask for: refused unless its grant offers it,
        // held for a person when it does.
        .profile_arg(
            ring0_tools::SHELL_STRING_ARG.0,
            ring0_tools::SANDBOX_PROFILE_ARG,
        );
    for (i, g) in config.grants.iter().enumerate() {
        let grant = config.grant(i, g).map_err(|(key, why)| err(&key, why))?;
        policy = policy
            .grant(grant)
            .map_err(|why| err(&format!("grants[{i}]"), why))?;
    }
    if let Some(rate) = &config.limits.session_rate {
        policy = policy.session_rate(
            RateLimit::parse(rate).map_err(|e| err("limits.session_rate", e.to_string()))?,
        );
    }
    if let Some(rate) = &config.limits.principal_rate {
        policy = policy.principal_rate(
            RateLimit::parse(rate).map_err(|e| err("limits.principal_rate", e.to_string()))?,
        );
    }
    Ok(policy)
}

/// The built-in catalog and the policy of a configuration, built without touching the state
/// directory (no journal, audit log or key is created): what `ring0 config check` reports.
pub struct Checked {
    /// The built-in tools' specs. `read_spill` is among them only when the state directory
    /// already exists (its spill store lives there).
    pub catalog: Vec<ring0_core::ToolSpec>,
    /// The same built-in tools, runnable: a front end that lists the catalog with upstreams
    /// (`ring0 tools`) builds its kernels from them. Nothing in them has touched the state
    /// directory, and nothing runs until called.
    pub tools: Vec<ring0_tools::ToolEntry>,
    /// The policy the grants and limits make (no approver, no audit log).
    pub policy: Policy,
    /// What the configuration does to the catalog.
    pub report: crate::report::CatalogReport,
}

/// Builds the built-in catalog and the policy of `loaded` without side effects on its state.
pub fn check(loaded: &Loaded) -> Result<Checked, ConfigError> {
    // Cursors are never signed here; the key only has to be well formed.
    let mut tools_config = tools_config(loaded, vec![0; 32]);
    if !tools_config.spill_dir.as_ref().is_some_and(|d| d.is_dir()) {
        tools_config.spill_dir = None;
    }
    // Nothing is written: no checkpoint store either.
    tools_config.checkpoint_dir = None;
    tools_config.shell.sandbox = loaded
        .config
        .sandbox
        .for_tool("shell", &loaded.config_dir)
        .map_err(|(key, why)| ConfigError {
            file: loaded.source.clone(),
            key,
            why,
        })?;
    // The profiles grants name must resolve (their paths exist) here too.
    loaded
        .config
        .sandbox
        .grant_profiles(&loaded.config.grants, &loaded.config_dir)
        .map_err(|(key, why)| ConfigError {
            file: loaded.source.clone(),
            key,
            why,
        })?;
    let shell_contained = tools_config.shell.sandbox.is_some();
    let tools = ring0_tools::builtin_tools(&tools_config).map_err(|e| ConfigError {
        file: loaded.source.clone(),
        key: "paths".into(),
        why: e.to_string(),
    })?;
    let policy = policy_builder(loaded)?
        .sandboxed_tools(shell_contained.then_some("shell"))
        .build();
    let catalog: Vec<ring0_core::ToolSpec> = tools.iter().map(|(spec, _)| spec.clone()).collect();
    let report = crate::report::CatalogReport::new(&loaded.config, &policy, &catalog);
    Ok(Checked {
        catalog,
        tools,
        policy,
        report,
    })
}

/// Builds the kernel (built-in tools, SQLite journal) and the session's authorizer from a loaded
/// configuration; see [`build_parts`].
pub fn build_kernel(loaded: &Loaded, approver: Arc<dyn Approver>) -> Result<Built, ConfigError> {
    build_kernel_tapped(loaded, approver, None)
}

/// [`build_kernel`], with `audit_tap` told every decision the audit log recorded (see
/// [`build_parts_tapped`]).
pub fn build_kernel_tapped(
    loaded: &Loaded,
    approver: Arc<dyn Approver>,
    audit_tap: Option<Arc<dyn ring0_policy::AuditSink>>,
) -> Result<Built, ConfigError> {
    let parts = build_parts_tapped(loaded, approver, audit_tap)?;
    let mut builder = Kernel::builder()
        .journal(parts.journal)
        .spill_store(parts.spill);
    for (spec, tool) in parts.tools {
        builder = builder.tool(spec, tool).map_err(|e| ConfigError {
            file: loaded.source.clone(),
            key: "(tools)".into(),
            why: e.to_string(),
        })?;
    }
    let authorizer: Arc<dyn Authorizer> = Arc::new(parts.policy.clone());
    Ok(Built {
        kernel: builder.authorizer(authorizer.clone()).build(),
        authorizer,
        policy: parts.policy,
        max_concurrent_tools: parts.max_concurrent_tools,
        jobs: parts.jobs,
        journal_shared: parts.journal_shared,
        audit: parts.audit,
        _state: parts.state,
    })
}
