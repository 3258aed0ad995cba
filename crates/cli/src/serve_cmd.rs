//! `ring0 serve [--http ADDR] [--config FILE]`: the MCP server and gateway.
//!
//! The configuration is the one every front end shares (`ring0.toml`, or the embedded defaults:
//! the built-in tools on the current directory, reads and sandboxed writes granted, shell and
//! anything A3 held for a person's approval), plus its `[[upstreams]]`: MCP servers whose tools
//! are served next to the built-in ones. The journal is `journal.db` in the state directory
//! (outside the workspace by default, see `crate::state`), shaped-away output goes under its
//! `spill/`. Where it serves, the workspace, the state directory, the journal and the grants in
//! effect are printed to stderr at start; stdout carries the stdio transport and nothing else.
//!
//! Over HTTP, `[auth]` in the config (static tokens, JWTs; see `docs/config.md`) and
//! `--token-env` name who may call and as which principal; without any credential, only loopback
//! addresses are served and every client is the local user.
//!
//! Calls held for approval are asked over MCP (elicitation) and offered at the same time to
//! `ring0 approve` / `ring0 deny` in another terminal (the first answer decides), or, when the
//! client cannot be asked, answered with a confirmation code printed here for the person.
//!
//! Operations: over HTTP, `/healthz`, `/readyz` and `/metrics` (behind the same credentials as
//! `/mcp`) are served beside `/mcp`; `--metrics-addr` serves them on a loopback address of
//! their own, for a stdio deployment (see `ring0_ops`).
//!
//! `ring0 journal resolve | compensate` settle the journal this process holds through its
//! control channel (`ring0_ops::control`).
//!
//! `ring0 approve-tool NAME` (see `crate::approve_cmd`) approves a quarantined upstream tool (its
//! new definition's pin is written to `ring0.lock`; a running server picks it up within a second).

use crate::{LogLevel, LogOptions};
use clap::Args;
use ring0_config::{Config, Loaded, build_kernel_tapped};
use ring0_mcp::approval::{Approvals, McpApprover};
use ring0_mcp::http::{HttpOptions, MCP_PATH};
use ring0_mcp::{Gateway, GatewayOptions, GatewayServer, Log, Severity};
use ring0_ops::held::{HeldWatcher, Watched};
use ring0_ops::telemetry::Telemetry;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long `serve` waits for the catalog to include the upstreams that are up.
const CATALOG_REBUILD_WAIT: Duration = Duration::from_secs(2);
/// How long the runtime's tasks are given to end once serving stopped, before the last spans
/// are exported (`ring0_ops::telemetry::SHUTDOWN_TIMEOUT` bounds that in turn): a task stuck
/// in a blocking read must not keep the process, or its spans, from ending. Ending the tasks
/// closes the journal, which a shared journal does within its own bound (its lease given up):
/// this one is more than twice as long, so a stop never cuts that short.
const RUNTIME_STOP_TIMEOUT: Duration = Duration::from_secs(10);
const _: () = assert!(
    RUNTIME_STOP_TIMEOUT.as_millis() > 2 * ring0_journal::limits::POSTGRES_CLOSE_TIMEOUT_MS as u128
);

#[derive(Args)]
pub struct ServeArgs {
    /// Serve Streamable HTTP at ADDR (e.g. 127.0.0.1:8808) instead of stdio.
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// The TOML config (default: ./ring0.toml if present, else the embedded defaults).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Name of an environment variable holding a bearer token that HTTP clients may send to
    /// act as the local user (principal `local`). `[auth]` in the config adds tokens and JWTs
    /// for other principals.
    #[arg(long, value_name = "VAR")]
    token_env: Option<String>,
    /// Accept this Host (and origin) besides loopback, for a non-loopback --http bind (which
    /// needs credentials: `[auth]` or --token-env).
    #[arg(long, value_name = "HOST")]
    allow_host: Vec<String>,
    /// The user-intent scope of the stdio session (part of every call's identity). By default
    /// each connection gets a fresh scope. Give a fixed scope for a client that re-proposes its
    /// calls after a restart (of ring0 or of itself): a mutating call whose result it never
    /// received is then answered from the journal, or settled, instead of running again. A
    /// client may also name a scope per call in `_meta["io.ring0/scope"]`, or send an
    /// idempotency key, which decides across scopes.
    #[arg(long, value_name = "SCOPE")]
    scope: Option<String>,
    /// Record intents in this PostgreSQL database (postgres://user@host:port/db) instead of
    /// the SQLite journal in the state directory; overrides `[journal] url`. Several `ring0
    /// serve` processes on one database are replicas of one deployment: a call is decided once
    /// across them, and a replica that stops leaves its calls in flight to the others.
    #[arg(long, value_name = "URL")]
    journal: Option<String>,
    /// Serve `/metrics`, `/healthz` and `/readyz` on this loopback address of their own (e.g.
    /// 127.0.0.1:9464), for a stdio deployment. Over --http they are served beside /mcp
    /// anyway.
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<SocketAddr>,
}

/// The generation holding the tools of every upstream that is up. An upstream publishes its
/// listing a moment before the gateway's catalog is rebuilt from it; recovery must see the
/// rebuilt catalog, or it would take the upstream's tools for missing ones.
pub(crate) async fn settled_generation(gw: &Gateway) -> Arc<ring0_mcp::gateway::Generation> {
    let deadline = tokio::time::Instant::now() + CATALOG_REBUILD_WAIT;
    loop {
        let generation = gw.generation();
        let complete = gw.upstreams().iter().all(|up| {
            up.listing().is_none_or(|l| {
                l.tools.is_empty()
                    || generation
                        .tools
                        .values()
                        .any(|t| t.upstream.as_deref() == Some(up.alias()))
            })
        });
        if complete || tokio::time::Instant::now() >= deadline {
            return generation;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A client session's end cancels the background jobs its calls started (except detached
/// ones): over HTTP, a client that deletes its session or goes away leaves nothing running.
fn end_jobs_with_session(jobs: ring0_config::JobSessions) -> ring0_mcp::gateway::SessionEnd {
    Arc::new(move |scope: String| {
        let jobs = jobs.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { jobs.end(&scope).await });
        }
    })
}

/// The directories the workspace grants the tools: an upstream's `roots` stay within them.
fn granted_roots(loaded: &Loaded) -> Vec<PathBuf> {
    let paths = &loaded.config.paths;
    paths.read.iter().chain(&paths.write).cloned().collect()
}

/// ring0's own files, which no upstream's `roots` may contain or lie inside: the same protected
/// paths the built-in tools refuse.
fn protected_paths(loaded: &Loaded) -> Vec<PathBuf> {
    let protected = loaded.protected();
    protected.files.into_iter().chain(protected.dirs).collect()
}

/// Recovery while serving, for a journal other replicas share: every half lease, the calls a
/// replica that stopped renewing its lease left open are taken and settled by the same protocol
/// as at start (probe, same-key re-dispatch, dead letter), with the current catalog's tools;
/// the calls it held for approval are watched here from then on (`watch_held_calls`).
async fn recover_lapsed_leases(gw: Gateway, lease_ms: u64, log: Log, watched: Watched) {
    let mut pass = tokio::time::interval(Duration::from_millis((lease_ms / 2).max(1)));
    pass.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    pass.tick().await;
    loop {
        pass.tick().await;
        match gw.generation().kernel.recover().await {
            Ok(report) => {
                let settled = report.in_flight + report.resumed + report.cancelled;
                if settled > 0 {
                    log.line(&format!(
                        "recovered {settled} intent(s) another replica left open: {} in flight \
                         reconciled, {} resumed, {} cancelled",
                        report.in_flight, report.resumed, report.cancelled
                    ));
                }
            }
            Err(e) => log.line(&format!("recovering lapsed leases: {e}")),
        }
        watch_held_calls(&gw, &log, &watched).await;
    }
}

/// Watches the calls held by a process (or replica) that stopped, whose intents this one holds
/// now, until each is decided, then releases or refuses it.
async fn watch_held_calls(gw: &Gateway, log: &Log, watched: &Watched) {
    let held = HeldWatcher::adopt(gw.journal().as_ref(), log, watched).await;
    if !held.is_empty() {
        tokio::spawn(held.watch(gw.clone(), log.clone()));
    }
}

/// The webhook approval channel `[approval] webhook_url` configures: its links are served on
/// the `--http` listener, so it needs one.
fn webhook(
    loaded: &Loaded,
    args: &ServeArgs,
    journal: Arc<dyn ring0_journal::Journal>,
    log: &Log,
) -> Result<Option<Arc<ring0_ops::webhook::Webhook>>, String> {
    let Some(url) = &loaded.config.approval.webhook_url else {
        return Ok(None);
    };
    if args.http.is_none() {
        return Err(
            "[approval] webhook_url needs `ring0 serve --http ADDR`: its approve and deny links \
             are served there"
                .into(),
        );
    }
    let key = ring0_ops::webhook::signing_key(&loaded.state_dir, ring0_ops::webhook::KEY_FILE)?;
    let hook = ring0_ops::webhook::Webhook::new(
        url.clone(),
        loaded.config.approval.webhook_link_base.clone(),
        key,
        journal,
        log.clone(),
    )?;
    Ok(Some(Arc::new(hook)))
}

/// The operations routes, with the webhook's links on the open side when configured (their
/// signature is their credential).
fn operation_routes(
    operations: &Arc<ring0_ops::Operations>,
    webhook: Option<&Arc<ring0_ops::webhook::Webhook>>,
    console: &Arc<ring0_ops::console::Console>,
) -> ring0_mcp::door::operations::OperationsRoutes {
    let mut routes = operations.routes();
    if let Some(webhook) = webhook {
        routes.open = routes.open.merge(webhook.routes());
    }
    // The console authenticates each request itself, with the listener's authenticator: a
    // bearer credential, or a browser's session cookie from its sign-in form.
    routes.self_authenticated = Some(console.door());
    routes
}

/// The principals with the operator role, as `[console]` names them.
fn operators(loaded: &Loaded) -> ring0_ops::console::Operators {
    ring0_ops::console::Operators {
        ids: loaded.config.console.operators.clone(),
        groups: loaded.config.console.operator_groups.clone(),
    }
}

/// The web console for the operators `[console]` names, with the server's background jobs.
fn console(
    loaded: &Loaded,
    gateway: &Gateway,
    jobs: &ring0_config::JobSessions,
    log: &Log,
) -> Result<Arc<ring0_ops::console::Console>, String> {
    let key = ring0_ops::webhook::signing_key(&loaded.state_dir, ring0_ops::console::KEY_FILE)?;
    let operators = operators(loaded);
    Ok(Arc::new(
        ring0_ops::console::Console::new(
            gateway.clone(),
            operators,
            key,
            log.clone(),
            loaded.workspace.clone(),
            loaded.state_dir.clone(),
        )
        .with_jobs(jobs.clone()),
    ))
}

/// Waits for `SIGINT` or `SIGTERM` (what a service manager or an orchestrator sends to drain a
/// replica): either stops the server cleanly, so a shared journal's lease is given up as it
/// exits and the calls it still held are recovered at once by the other replicas.
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// After serving stopped (stdin closed, SIGTERM, SIGINT): the runtime's tasks are ended, their
/// spans with them, within [`RUNTIME_STOP_TIMEOUT`]; then every span ended so far is exported
/// before the process exits, within the telemetry's own bound.
fn stop_then_export(runtime: tokio::runtime::Runtime, telemetry: Telemetry) {
    runtime.shutdown_timeout(RUNTIME_STOP_TIMEOUT);
    telemetry.shutdown();
}

/// Serves MCP over stdio until the client closes stdin or the process is asked to stop
/// (`SIGTERM`, `SIGINT`): either ends serving normally, so what is still queued (spans, the
/// journal's writes) is finished before the process exits.
async fn serve_stdio_until_stopped(server: GatewayServer, log: &Log) -> Result<(), String> {
    tokio::select! {
        served = ring0_mcp::serve_stdio(server) => served,
        () = stop_signal() => {
            log.info("stopping: asked to stop by a signal");
            Ok(())
        }
    }
}

/// The gateway's log as `tracing` events of target `ring0`, at the level each line's severity
/// says: the subscriber writes them in the format asked for.
fn gateway_log() -> Log {
    Log::leveled(|severity, line| match severity {
        Severity::Debug => tracing::debug!(target: "ring0", "{line}"),
        Severity::Info => tracing::info!(target: "ring0", "{line}"),
        Severity::Attention => tracing::warn!(target: "ring0", "{line}"),
    })
}

pub fn run(args: ServeArgs, state_dir: Option<&Path>, log: LogOptions) -> Result<String, String> {
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    // What loading says goes to stderr in the log's format; traces start once the file said
    // where they go.
    let mut loaded = Telemetry::scoped(log.format(), log.level(), || {
        Config::load(args.config.as_deref(), &cwd, state_dir)
    })
    .map_err(|e| e.to_string())?;
    let telemetry = Telemetry::install(
        log.format(),
        log.level(),
        Some(&crate::traces_config(&loaded)?),
    )?;
    if telemetry.exports_traces() {
        tracing::info!(target: "ring0", "traces: exported over OTLP/HTTP");
    }
    if let Some(url) = &args.journal {
        loaded.config.journal.url = Some(url.clone());
        loaded
            .config
            .journal
            .check()
            .map_err(|(key, why)| format!("--journal ({key}): {why}"))?;
    }
    let token = match &args.token_env {
        Some(var) => Some(
            std::env::var(var)
                .map_err(|_| format!("--token-env {var}: the variable is not set"))?,
        ),
        None => None,
    };
    if let Some(addr) = args.http
        && !addr.ip().is_loopback()
    {
        if token.is_none() && !loaded.config.auth.has_credentials() {
            return Err(format!(
                "--http {addr} is not a loopback address: serving beyond this machine needs \
                 credentials ([auth] tokens or jwt in the config, or --token-env)"
            ));
        }
        if args.allow_host.is_empty() {
            return Err(format!(
                "--http {addr} is not a loopback address: name the hosts clients will use with --allow-host"
            ));
        }
    }
    if args.scope.is_some() && args.http.is_some() {
        return Err(
            "--scope applies to the stdio session; over HTTP a sessionful session has its own \
             scope, stateless requests share their principal's, and a client may name one in \
             _meta[\"io.ring0/scope\"]"
                .into(),
        );
    }
    // One client over stdio: a single-threaded runtime keeps a call's hops between tasks (the
    // transport, the kernel round, the upstream connection) on one thread, without waking a
    // second worker for each; over HTTP, clients are served by two workers.
    let runtime = match args.http {
        None => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Some(_) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build(),
    }
    .map_err(|e| format!("starting the runtime: {e}"))?;
    let served = runtime.block_on(serve(args, loaded, token, log.level));
    stop_then_export(runtime, telemetry);
    served.map(|()| String::new())
}

/// Serves until stdin closes (stdio), or SIGINT or SIGTERM (either transport).
async fn serve(
    args: ServeArgs,
    loaded: Loaded,
    token: Option<String>,
    log_level: LogLevel,
) -> Result<(), String> {
    let log = gateway_log();
    // The policy engine holds calls for approval itself; the session does not gate A3 again.
    let approvals = Approvals::new(log.clone(), false);
    let metrics = Arc::new(ring0_ops::metrics::Metrics::new(Duration::from_secs(
        loaded.config.approval.timeout_secs,
    )));
    // A held call is offered to the client and to `ring0 approve` in another terminal, and
    // recorded in the journal (and offered to the webhook) once the journal is open.
    // A held call of the HTTP agent API is asked of its host instead of an MCP client.
    let channels = ring0_ops::approvals::ClientOrTerminal::new(
        Arc::new(ring0_api::HostApprovals::new(Arc::new(McpApprover::new(
            approvals.clone(),
        )))),
        ring0_policy::DirectoryApprover::new(ring0_config::approvals_dir(&loaded.state_dir)),
        log.clone(),
    );
    let approver = Arc::new(ring0_ops::held::DurableApprover::new(
        Arc::new(channels),
        log.clone(),
    ));
    let built = build_kernel_tapped(&loaded, approver.clone(), Some(metrics.clone()))
        .map_err(|e| e.to_string())?;
    let webhook = webhook(&loaded, &args, built.kernel.journal().clone(), &log)?;
    approver.attach(built.kernel.journal().clone(), webhook.clone());
    let spill = Arc::new(
        ring0_shape::SpillStore::open(loaded.state_dir.join("spill"))
            .map_err(|e| format!("spill store: {e}"))?,
    );
    let gw = start_gateway(&loaded, &built, &log, metrics.clone(), spill.clone())?;
    let api = ring0_api::Api::new(ring0_api::ApiOptions {
        gateway: gw.clone(),
        spill: Some(spill),
        observer: Some(metrics.clone()),
        // Held calls are decided over the API by the console's operators, by the same rule.
        is_operator: Some({
            let operators = operators(&loaded);
            Arc::new(move |p: &ring0_core::Principal| operators.admit(p))
        }),
        jobs: Some({
            let jobs = built.jobs.clone();
            Arc::new(move |scope: String, max: usize| {
                let jobs = jobs.clone();
                Box::pin(async move { jobs.of_scope(&scope, max).await })
            })
        }),
    });
    let operations = Arc::new(ring0_ops::Operations::new(metrics, gw.clone()));
    let shutdown = CancellationToken::new();
    if let Some(metrics_addr) = args.metrics_addr {
        serve_operations_on(metrics_addr, &operations, &log, &shutdown).await?;
    }
    // Each upstream is waited for at most its own `start_timeout_ms`, all at once.
    let down = gw.wait_for_start().await;
    for alias in &down {
        log.line(&format!(
            "upstream {alias} is not up yet; serving without it for now"
        ));
    }
    let generation = settled_generation(&gw).await;
    // Settle what an earlier process left open before serving anything new, with every
    // tool the upstreams listed: an upstream tool's intent is settled by its own
    // settlement (same-key re-dispatch, probe). An intent whose tool is missing (its
    // upstream is not up) goes to DEAD_LETTER for a person rather than being guessed at.
    crate::call_cmd::recover(&generation.kernel).await?;
    // Calls held before a restart wait for their decision; recovery leaves their intents.
    let watched = Watched::default();
    watch_held_calls(&gw, &log, &watched).await;
    if let Some(shared) = &built.journal_shared {
        tokio::spawn(recover_lapsed_leases(
            gw.clone(),
            shared.lease_ms,
            log.clone(),
            watched,
        ));
    }
    // Jobs an earlier process left are settled now, not at the first job call.
    if let Err(why) = built.jobs.settle_leftovers().await {
        log.line(&format!("background jobs are unavailable: {why}"));
    }
    // `ring0 journal resolve | compensate` reach the journal this process holds through the
    // state directory's control channel.
    tokio::spawn(ring0_ops::control::serve(
        loaded.state_dir.clone(),
        gw.clone(),
        log.clone(),
        shutdown.clone(),
    ));
    announce(&log, &loaded, &built, &generation, args.http, log_level);
    let routes = operation_routes(
        &operations,
        webhook.as_ref(),
        &console(&loaded, &gw, &built.jobs, &log)?,
    );
    let transport = Transport {
        approvals,
        routes,
        api,
        webhook,
        shutdown,
        deployment: built.journal_shared.as_ref().map(|s| s.deployment.clone()),
    };
    serve_transport(args, loaded, token, gw, transport, log).await
}

/// The gateway over the built kernel's tools and journal, with every configured upstream
/// starting, its calls counted by `metrics`.
fn start_gateway(
    loaded: &Loaded,
    built: &ring0_config::Built,
    log: &Log,
    metrics: Arc<ring0_ops::metrics::Metrics>,
    spill: Arc<ring0_shape::SpillStore>,
) -> Result<Gateway, String> {
    let builtins = built
        .kernel
        .registry()
        .iter()
        .map(|t| (t.spec.clone(), t.tool.clone()))
        .collect();
    Gateway::start(GatewayOptions {
        audit: Some(built.audit.clone()),
        builtins,
        upstreams: loaded.config.upstreams.clone(),
        journal: built.kernel.journal().clone(),
        authorizer: built.authorizer.clone(),
        workspace: loaded.workspace.clone(),
        state_dir: loaded.state_dir.clone(),
        spill: Some(spill),
        log: log.clone(),
        max_concurrent_tools: built.max_concurrent_tools,
        granted_roots: granted_roots(loaded),
        protected_paths: protected_paths(loaded),
        session_end: Some(end_jobs_with_session(built.jobs.clone())),
        catalog: loaded.config.catalog.kernel_config(),
        upstream_sandboxes: ring0_config::sandbox::upstream_sandboxes(loaded, built.audit.clone())
            .map_err(|e| e.to_string())?,
        observer: Some(metrics),
    })
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` of their own (a stdio deployment),
/// bound before anything else is served so that a bad address is refused at start.
async fn serve_operations_on(
    addr: SocketAddr,
    operations: &Arc<ring0_ops::Operations>,
    log: &Log,
    shutdown: &CancellationToken,
) -> Result<(), String> {
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let served = operations
        .clone()
        .serve(addr, log.clone(), shutdown.clone(), move |bound| {
            let _ = bound_tx.send(bound);
        });
    let failed = tokio::spawn(served);
    match bound_rx.await {
        Ok(bound) => {
            log.line(&format!("metrics on http://{bound}/metrics"));
            Ok(())
        }
        Err(_) => Err(match failed.await {
            Ok(Err(why)) => why,
            _ => "the metrics address could not be served".to_string(),
        }),
    }
}

/// What `serve` says at start: where it serves, the workspace, configuration, state, journal
/// and grants (info), every tool with the grant that decides it (debug), and every tool not
/// listed or grant matching nothing (always).
fn announce(
    log: &Log,
    loaded: &Loaded,
    built: &ring0_config::Built,
    generation: &ring0_mcp::gateway::Generation,
    http: Option<SocketAddr>,
    log_level: LogLevel,
) {
    let where_ = match http {
        Some(addr) => format!("http://{addr}{MCP_PATH}"),
        None => "stdio".to_string(),
    };
    let info = |line: &str| log.info(line);
    info(&format!("serving MCP on {where_}"));
    if let Some(addr) = http {
        info(&format!(
            "agent API on http://{addr}{} (OpenAPI at {})",
            ring0_api::API_PREFIX,
            ring0_api::OPENAPI_PATH
        ));
    }
    info(&format!("workspace: {}", loaded.workspace.display()));
    info(&format!("config: {}", loaded.source));
    info(&format!("state: {}", loaded.state_dir.display()));
    info(&format!(
        "journal: {}",
        match &built.journal_shared {
            Some(shared) => format!("{} (shared, lease {} ms)", shared.name, shared.lease_ms),
            None => loaded
                .state_dir
                .join(ring0_config::state::JOURNAL_FILE)
                .display()
                .to_string(),
        }
    ));
    info(&format!(
        "grants: {}",
        ring0_config::report::describe_grants(&loaded.config).join("; ")
    ));
    announce_catalog(log, loaded, built, generation, log_level);
}

/// The catalog at start: how many tools are listed, each with its grant (debug), the index,
/// and every tool not listed or grant matching nothing (always).
fn announce_catalog(
    log: &Log,
    loaded: &Loaded,
    built: &ring0_config::Built,
    generation: &ring0_mcp::gateway::Generation,
    log_level: LogLevel,
) {
    let info = |line: &str| log.info(line);
    let upstream_names: Vec<String> = loaded
        .config
        .upstreams
        .iter()
        .map(|u| u.alias.clone())
        .collect();
    let catalog: Vec<ring0_core::ToolSpec> = generation
        .kernel
        .registry()
        .iter()
        .map(|t| t.spec.clone())
        .filter(|s| !generation.quarantined.contains_key(&s.name))
        // The meta-tools of search mode are granted to every session by the catalog.
        .filter(|s| generation.kernel.catalog().spec(&s.name).is_some())
        .collect();
    let visible = generation
        .kernel
        .open_session(
            ring0_kernel::SessionConfig::new("startup").authorizer(generation.gate.clone()),
        )
        .catalog()
        .iter()
        .filter(|s| !generation.quarantined.contains_key(&s.name))
        .count();
    info(&format!(
        "tools: {visible} listed under the grants ({} quarantined){}",
        generation.quarantined.len(),
        if upstream_names.is_empty() {
            String::new()
        } else {
            format!("; upstreams: {}", upstream_names.join(", "))
        }
    ));
    if log_level >= LogLevel::Debug {
        for spec in &catalog {
            log.debug(&format!(
                "tool {} {} {:?}{}",
                spec.name,
                spec.authority,
                spec.effect,
                ring0_config::report::deciding_grant(&loaded.config, &spec.name)
                    .map(|g| format!(", grant {}", g.name))
                    .unwrap_or_default()
            ));
        }
    }
    let index = generation.kernel.catalog();
    info(&format!(
        "catalog: {} tools indexed; {}",
        index.len(),
        index.reason()
    ));
    // A budget overrun is said whatever the log level: it costs every turn.
    for line in index.over_budget() {
        log.line(&format!("over budget: {line}"));
    }
    // Every tool is either listed or said here why not; a grant that names nothing is named.
    let report = ring0_config::report::CatalogReport::new(&loaded.config, &built.policy, &catalog);
    for line in report.lines() {
        log.line(&line);
    }
}

/// What the transports serve beside the gateway.
struct Transport {
    approvals: Arc<Approvals>,
    /// The operations routes, the console's and the webhook's links among them.
    routes: ring0_mcp::door::operations::OperationsRoutes,
    /// The HTTP agent API under `/v1`.
    api: ring0_api::Api,
    webhook: Option<Arc<ring0_ops::webhook::Webhook>>,
    shutdown: CancellationToken,
    /// What this replica shares with the others on a PostgreSQL journal.
    deployment: Option<Arc<dyn ring0_journal::Deployment>>,
}

/// Serves MCP over stdio until stdin closes, or over HTTP; either until SIGINT or SIGTERM.
async fn serve_transport(
    args: ServeArgs,
    loaded: Loaded,
    token: Option<String>,
    gw: Gateway,
    transport: Transport,
    log: Log,
) -> Result<(), String> {
    let Transport {
        approvals,
        routes,
        api,
        webhook,
        shutdown,
        deployment,
    } = transport;
    match args.http {
        None => {
            let server = match &args.scope {
                Some(scope) => GatewayServer::new(gw, approvals, scope.clone()),
                None => GatewayServer::new_session(gw, approvals),
            };
            serve_stdio_until_stopped(server, &log).await
        }
        Some(addr) => {
            let stop = shutdown.clone();
            tokio::spawn(async move {
                stop_signal().await;
                stop.cancel();
            });
            let options = HttpOptions {
                addr,
                auth: loaded.config.auth.clone(),
                local_token: token,
                config_dir: loaded.config_dir.clone(),
                extra_hosts: args.allow_host.clone(),
                extra_origins: args
                    .allow_host
                    .iter()
                    .map(|h| format!("http://{h}:*"))
                    .collect(),
                door: loaded.config.http.clone(),
                operations: Some(routes),
                mounted: Some({
                    let routes = api.routes();
                    ring0_mcp::http::Mounted {
                        gated: routes.gated,
                        open: routes.open,
                        streams_body: Some(ring0_api::streams_body),
                    }
                }),
                deployment,
            };
            let log2 = log.clone();
            ring0_mcp::http::serve_http(
                gw,
                approvals,
                options,
                log.clone(),
                shutdown,
                move |bound| {
                    if let Some(webhook) = &webhook {
                        webhook.listening_on(bound);
                    }
                    if bound != addr {
                        log2.line(&format!("listening on http://{bound}{MCP_PATH}"));
                    }
                },
            )
            .await
        }
    }
}
