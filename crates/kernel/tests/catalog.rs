//! The catalog as a session sees it: listing by mode, search filtered by grants, loading, and
//! the meta-tools called through the pipeline.

use ring0_core::{Authority, Observation, ProviderFormat, ToolSpec};
use ring0_kernel::catalog::{
    CatalogConfig, CatalogMode, LOAD_TOOL, LOADED_TOOLS_MAX, LoadedTools, Ranker, SEARCH_TOOL,
    ToolDocument,
};
use ring0_kernel::{GrantTable, Kernel, KernelBuilder, RoundOptions, SessionConfig, tool_fn};
use serde_json::{Value, json};
use std::sync::Arc;

fn read(name: &str, description: &str, param: &str, param_description: &str) -> ToolSpec {
    ToolSpec::read(
        name,
        description,
        json!({"type": "object",
               "properties": {param: {"type": "string", "description": param_description}}}),
    )
}

/// A small catalog: two built-in-like tools and three of an upstream `wx`.
fn builder() -> KernelBuilder {
    let tools = [
        read("read_file", "Read a text file", "path", "File path"),
        read("list_dir", "List a directory", "path", "Directory path"),
        read(
            "wx__forecast",
            "Weather forecast for a city",
            "city",
            "City name",
        ),
        read(
            "wx__alerts",
            "Severe weather alerts",
            "region",
            "Region code",
        ),
        read(
            "billing__refund",
            "Refund a customer's payment",
            "invoice",
            "Invoice id",
        ),
    ];
    let mut b = Kernel::builder();
    for spec in tools {
        let name = spec.name.clone();
        b = b
            .tool(
                spec,
                tool_fn(move |_ctx, _args| {
                    let name = name.clone();
                    async move { Ok(Observation::text(format!("ran {name}"))) }
                }),
            )
            .unwrap();
    }
    b
}

fn search_config(pinned: &[&str]) -> CatalogConfig {
    CatalogConfig {
        mode: CatalogMode::Search,
        pinned: pinned.iter().map(|s| s.to_string()).collect(),
        ..CatalogConfig::default()
    }
}

/// Grants everything but the billing upstream.
fn grants() -> Arc<GrantTable> {
    Arc::new(GrantTable::allow(
        &["read_file", "list_dir", "wx__*"],
        Authority::A0,
    ))
}

fn names(listing: &[&ToolSpec]) -> Vec<String> {
    listing.iter().map(|s| s.name.clone()).collect()
}

async fn call(session: &ring0_kernel::Session, tool: &str, args: Value) -> Value {
    let turn = json!({"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": tool, "arguments": args.to_string()}}]});
    let out = session
        .handle_turn(ProviderFormat::OpenAiChat, &turn, &RoundOptions::default())
        .await
        .unwrap();
    let content = out.message[0]["content"].as_str().unwrap().to_string();
    let projected: Value = serde_json::from_str(&content).unwrap_or(Value::String(content));
    // A result's projection is its receipt: what the tool returned is its observation.
    match &projected["outcome"]["observation"] {
        Value::Null => projected,
        observation if observation["structured"].is_null() => observation["text"].clone(),
        observation => observation["structured"].clone(),
    }
}

#[test]
fn full_mode_lists_every_visible_tool_by_name_and_has_no_meta_tools() {
    let kernel = builder().authorizer(grants()).build();
    let session = kernel.open_session(SessionConfig::new("s"));
    assert_eq!(kernel.catalog().mode(), CatalogMode::Full);
    assert_eq!(
        names(&session.listing()),
        ["list_dir", "read_file", "wx__alerts", "wx__forecast"]
    );
    assert!(kernel.registry().get(SEARCH_TOOL).is_none());
}

#[test]
fn search_mode_lists_the_pinned_core_in_order_then_the_meta_tools() {
    let kernel = builder()
        .catalog(search_config(&["read_file", "list_dir", "absent_tool"]))
        .authorizer(grants())
        .build();
    let session = kernel.open_session(SessionConfig::new("s"));
    assert_eq!(
        names(&session.listing()),
        ["read_file", "list_dir", SEARCH_TOOL, LOAD_TOOL]
    );
}

#[test]
fn a_pinned_tool_the_grants_refuse_is_not_listed() {
    let kernel = builder()
        .catalog(search_config(&["billing__refund", "read_file"]))
        .authorizer(grants())
        .build();
    let session = kernel.open_session(SessionConfig::new("s"));
    assert_eq!(
        names(&session.listing()),
        ["read_file", SEARCH_TOOL, LOAD_TOOL]
    );
}

#[test]
fn search_finds_a_granted_tool_by_what_it_does_and_never_an_ungranted_one() {
    let kernel = builder()
        .catalog(search_config(&[]))
        .authorizer(grants())
        .build();
    let session = kernel.open_session(SessionConfig::new("s"));
    let hits = session.search_tools("weather forecast in Paris", 5);
    assert_eq!(hits[0].name, "wx__forecast", "{hits:?}");
    assert_eq!(hits[0].description, "Weather forecast for a city");
    assert!(hits.windows(2).all(|w| w[0].score >= w[1].score));
    assert!(
        session
            .search_tools("refund customer payment", 5)
            .is_empty()
    );
}

#[tokio::test]
async fn an_unlisted_tool_is_never_found_listed_or_loaded() {
    let kernel = builder()
        .catalog(search_config(&["wx__alerts"]))
        .unlisted("wx__alerts")
        .authorizer(grants())
        .build();
    let session = kernel.open_session(SessionConfig::new("s"));
    assert!(
        session
            .search_tools("severe weather alerts", 5)
            .iter()
            .all(|h| h.name != "wx__alerts")
    );
    assert!(!names(&session.listing()).contains(&"wx__alerts".to_string()));
    let out = session.load_tools(&["wx__alerts".into()]).await.unwrap();
    assert_eq!(out.not_found, ["wx__alerts"]);
}

#[tokio::test]
async fn loaded_tools_are_listed_after_the_core_in_load_order_and_announced() {
    let kernel = builder()
        .catalog(search_config(&["read_file"]))
        .authorizer(grants())
        .build();
    let loaded = LoadedTools::new();
    let mut changes = loaded.subscribe();
    let session = kernel.open_session(SessionConfig::new("s").loaded_tools(loaded.clone()));
    let out = session
        .load_tools(&["wx__forecast".into(), "billing__refund".into()])
        .await
        .unwrap();
    assert_eq!(
        names(&out.loaded.iter().collect::<Vec<_>>()),
        ["wx__forecast"]
    );
    assert_eq!(out.not_found, ["billing__refund"], "ungranted: not found");
    assert!(changes.has_changed().unwrap());
    changes.mark_unchanged();
    session.load_tools(&["wx__alerts".into()]).await.unwrap();
    // Another kernel session of the same conversation lists what this one loaded.
    let next = kernel.open_session(SessionConfig::new("s").loaded_tools(loaded));
    assert_eq!(
        names(&next.listing()),
        [
            "read_file",
            SEARCH_TOOL,
            LOAD_TOOL,
            "wx__forecast",
            "wx__alerts"
        ]
    );
    // Loading a tool again changes nothing and announces nothing.
    changes.mark_unchanged();
    next.load_tools(&["wx__forecast".into()]).await.unwrap();
    assert!(!changes.has_changed().unwrap());
}

#[tokio::test]
async fn a_session_keeps_at_most_the_loaded_tools_limit() {
    let mut b = Kernel::builder();
    for i in 0..=LOADED_TOOLS_MAX {
        b = b
            .tool(
                read(&format!("t{i}"), "a tool", "x", "x"),
                tool_fn(|_c, _a| async { Ok(Observation::text("")) }),
            )
            .unwrap();
    }
    let kernel = b
        .catalog(search_config(&[]))
        .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A0)))
        .build();
    let session = kernel.open_session(SessionConfig::new("s"));
    for chunk in (0..LOADED_TOOLS_MAX).collect::<Vec<_>>().chunks(16) {
        let names: Vec<String> = chunk.iter().map(|i| format!("t{i}")).collect();
        assert!(
            session
                .load_tools(&names)
                .await
                .unwrap()
                .over_limit
                .is_empty()
        );
    }
    let out = session
        .load_tools(&[format!("t{LOADED_TOOLS_MAX}")])
        .await
        .unwrap();
    assert_eq!(out.over_limit, [format!("t{LOADED_TOOLS_MAX}")]);
}

#[tokio::test]
async fn the_meta_tools_run_through_the_pipeline_without_a_grant_of_their_own() {
    let kernel = builder()
        .catalog(search_config(&["read_file"]))
        .authorizer(grants())
        .build();
    let session = kernel.open_session(SessionConfig::new("s"));
    let found = call(
        &session,
        SEARCH_TOOL,
        json!({"query": "weather alerts", "limit": 2}),
    )
    .await;
    let first = &found["tools"][0];
    assert_eq!(first["name"], "wx__alerts", "{found}");
    assert!(first["score"].as_f64().unwrap() > 0.0);
    let loaded = call(
        &session,
        LOAD_TOOL,
        json!({"names": ["wx__alerts", "nope"]}),
    )
    .await;
    assert_eq!(loaded["loaded"][0]["name"], "wx__alerts", "{loaded}");
    assert_eq!(
        loaded["loaded"][0]["parameters"]["properties"]["region"]["type"],
        "string"
    );
    assert_eq!(loaded["not_found"], json!(["nope"]));
    assert!(names(&session.listing()).contains(&"wx__alerts".to_string()));
}

#[tokio::test]
async fn a_granted_tool_that_was_never_loaded_is_callable_and_an_ungranted_one_is_not() {
    let kernel = builder()
        .catalog(search_config(&[]))
        .authorizer(grants())
        .build();
    let session = kernel.open_session(SessionConfig::new("s"));
    assert_eq!(
        call(&session, "wx__forecast", json!({"city": "Oslo"})).await,
        "ran wx__forecast"
    );
    let refused = call(&session, "billing__refund", json!({"invoice": "1"})).await;
    // A tool the session may not see is unknown to it, as if it did not exist.
    assert_eq!(refused["status"], "unknown_tool", "{refused}");
}

#[tokio::test]
async fn a_search_without_a_query_is_a_validation_error() {
    let kernel = builder()
        .catalog(search_config(&[]))
        .authorizer(grants())
        .build();
    let session = kernel.open_session(SessionConfig::new("s"));
    let out = call(&session, SEARCH_TOOL, json!({"limit": 500})).await;
    assert_eq!(out["status"], "validation_error", "{out}");
}

#[test]
fn auto_mode_searches_above_the_size_budget_and_lists_in_full_below_it() {
    let small = builder()
        .catalog(CatalogConfig {
            mode: CatalogMode::Auto,
            auto_tools_max: 5,
            ..CatalogConfig::default()
        })
        .build();
    assert_eq!(
        small.catalog().mode(),
        CatalogMode::Full,
        "{}",
        small.catalog().reason()
    );
    let large = builder()
        .catalog(CatalogConfig {
            mode: CatalogMode::Auto,
            auto_tools_max: 4,
            ..CatalogConfig::default()
        })
        .build();
    assert_eq!(large.catalog().mode(), CatalogMode::Search);
    assert!(
        large
            .catalog()
            .reason()
            .contains("5 tools > auto_tools_max 4")
    );
}

#[test]
fn auto_mode_searches_above_the_token_budget() {
    let kernel = builder()
        .catalog(CatalogConfig {
            mode: CatalogMode::Auto,
            auto_tokens_max: 10,
            ..CatalogConfig::default()
        })
        .build();
    assert_eq!(
        kernel.catalog().mode(),
        CatalogMode::Search,
        "{}",
        kernel.catalog().reason()
    );
}

#[test]
fn a_host_tool_named_like_a_meta_tool_keeps_the_catalog_in_full_mode() {
    let kernel = builder()
        .tool(
            read(SEARCH_TOOL, "the host's own", "q", "q"),
            tool_fn(|_c, _a| async { Ok(Observation::text("")) }),
        )
        .unwrap()
        .catalog(search_config(&[]))
        .build();
    assert_eq!(kernel.catalog().mode(), CatalogMode::Full);
    assert!(kernel.catalog().reason().contains("search_tools"));
}

/// A ranker that knows only one tool: the seam a semantic ranker plugs into.
struct OnlyAlerts(usize);

impl Ranker for OnlyAlerts {
    fn rank(&self, _query: &str) -> Vec<(usize, f64)> {
        vec![(self.0, 0.9)]
    }
}

#[test]
fn a_host_ranker_replaces_the_lexical_one() {
    let kernel = builder()
        .catalog(search_config(&[]))
        .catalog_ranker(Arc::new(|docs: &[ToolDocument]| {
            let at = docs.iter().position(|d| d.name == "wx__alerts").unwrap();
            Box::new(OnlyAlerts(at)) as Box<dyn Ranker>
        }))
        .authorizer(grants())
        .build();
    let session = kernel.open_session(SessionConfig::new("s"));
    let hits = session.search_tools("read a file", 5);
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].name, "wx__alerts");
}

#[test]
fn a_turn_with_ring0_search_carries_the_listing_in_the_providers_format() {
    use ring0_kernel::catalog::TurnSearch;
    let kernel = builder()
        .catalog(search_config(&["read_file"]))
        .authorizer(grants())
        .build();
    let session = kernel.open_session(SessionConfig::new("s"));
    let turn = session.catalog_for_turn(ProviderFormat::Anthropic, TurnSearch::Ring0);
    let names: Vec<&str> = turn
        .tools
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["read_file", SEARCH_TOOL, LOAD_TOOL]);
    assert_eq!(turn.tools[0]["input_schema"]["type"], "object");
    assert!(turn.schema_tokens > 0);
}

#[tokio::test]
async fn a_turn_with_the_providers_search_defers_everything_but_the_core_and_the_loaded() {
    use ring0_kernel::catalog::{OPENAI_TOOL_SEARCH_TYPE, TurnSearch};
    let kernel = builder()
        .catalog(search_config(&["read_file"]))
        .authorizer(grants())
        .build();
    let session = kernel.open_session(SessionConfig::new("s"));
    session.load_tools(&["wx__alerts".into()]).await.unwrap();
    let turn = session.catalog_for_turn(ProviderFormat::OpenAiResponses, TurnSearch::Provider);
    let by_name = |n: &str| turn.tools.iter().find(|t| t["name"] == n).cloned();
    assert_eq!(by_name("read_file").unwrap().get("defer_loading"), None);
    assert_eq!(by_name("wx__alerts").unwrap().get("defer_loading"), None);
    assert_eq!(by_name("wx__forecast").unwrap()["defer_loading"], true);
    assert_eq!(by_name("list_dir").unwrap()["defer_loading"], true);
    assert!(
        by_name("billing__refund").is_none(),
        "ungranted: never sent"
    );
    assert!(
        by_name(SEARCH_TOOL).is_none(),
        "the provider searches, not ring0"
    );
    assert_eq!(turn.tools.last().unwrap()["type"], OPENAI_TOOL_SEARCH_TYPE);
    // Deferred schemas cost nothing up front, and ring0's meta-tools are not sent.
    let ours = session.catalog_for_turn(ProviderFormat::OpenAiResponses, TurnSearch::Ring0);
    assert!(
        turn.schema_tokens < ours.schema_tokens,
        "{} {}",
        turn.schema_tokens,
        ours.schema_tokens
    );
}

/// Loaded sets as a deployment's database keeps them, for replicas in one process; `down`
/// fails every request, as an unreachable database does.
#[derive(Default)]
struct SharedSets {
    sets: std::sync::Mutex<std::collections::HashMap<(String, String), Vec<String>>>,
    down: std::sync::atomic::AtomicBool,
}

impl SharedSets {
    fn check(&self) -> Result<(), ring0_journal::JournalError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ring0_journal::JournalError::Storage(
                "the database is down".into(),
            ));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl ring0_journal::SharedState for SharedSets {
    async fn rate_take(
        &self,
        _: &str,
        _: u32,
        _: std::time::Duration,
    ) -> Result<ring0_journal::RateTaken, ring0_journal::JournalError> {
        unreachable!("the catalog takes no rate cells")
    }
    async fn approval_remember(
        &self,
        _: &str,
        _: &str,
        _: Option<std::time::Duration>,
    ) -> Result<(), ring0_journal::JournalError> {
        unreachable!("the catalog remembers no approvals")
    }
    async fn approval_remembered(
        &self,
        _: &str,
    ) -> Result<Option<String>, ring0_journal::JournalError> {
        unreachable!("the catalog remembers no approvals")
    }
    async fn pins_publish(
        &self,
        _: &[ring0_journal::shared::PinApproval],
    ) -> Result<(), ring0_journal::JournalError> {
        unreachable!("the catalog publishes no pins")
    }
    async fn pins_since(
        &self,
        _: i64,
    ) -> Result<Vec<(i64, ring0_journal::shared::PinApproval)>, ring0_journal::JournalError> {
        unreachable!("the catalog publishes no pins")
    }
    async fn loaded_add(
        &self,
        principal: &str,
        scope: &str,
        names: &[String],
        names_max: usize,
        mut fits: ring0_journal::shared::LoadedFits,
    ) -> Result<ring0_journal::shared::LoadedAdd, ring0_journal::JournalError> {
        self.check()?;
        let mut sets = self.sets.lock().unwrap();
        let set = sets.entry((principal.into(), scope.into())).or_default();
        let added = ring0_journal::shared::loaded_decide(set, names, names_max, &mut *fits);
        Ok(ring0_journal::shared::LoadedAdd {
            added,
            names: set.clone(),
        })
    }
    async fn loaded_names(
        &self,
        principal: &str,
        scope: &str,
    ) -> Result<Vec<String>, ring0_journal::JournalError> {
        self.check()?;
        let sets = self.sets.lock().unwrap();
        Ok(sets
            .get(&(principal.to_string(), scope.to_string()))
            .cloned()
            .unwrap_or_default())
    }
}

#[tokio::test]
async fn a_load_through_one_replica_is_listed_by_another_sharing_the_set() {
    let state = Arc::new(SharedSets::default());
    let replica = || {
        builder()
            .catalog(search_config(&["read_file"]))
            .authorizer(grants())
            .build()
    };
    let (a, b) = (replica(), replica());
    let on_a = LoadedTools::shared(state.clone(), "local", "conv");
    let on_b = LoadedTools::shared(state.clone(), "local", "conv");
    let (mut changes_a, changes_b) = (on_a.subscribe(), on_b.subscribe());
    let session_a = a.open_session(SessionConfig::new("conv").loaded_tools(on_a));
    let loaded = call(&session_a, LOAD_TOOL, json!({"names": ["wx__alerts"]})).await;
    assert_eq!(loaded["loaded"][0]["name"], "wx__alerts", "{loaded}");
    assert!(
        changes_a.has_changed().unwrap(),
        "announced where it loaded"
    );
    changes_a.mark_unchanged();
    on_b.refresh().await.unwrap();
    let session_b = b.open_session(SessionConfig::new("conv").loaded_tools(on_b.clone()));
    assert_eq!(
        names(&session_b.listing()),
        ["read_file", SEARCH_TOOL, LOAD_TOOL, "wx__alerts"]
    );
    assert!(!changes_b.has_changed().unwrap());
    // A load through B is held by the same set: A lists both once it reads it again.
    session_b
        .load_tools(&["wx__forecast".into()])
        .await
        .unwrap();
    let again = LoadedTools::shared(state, "local", "conv");
    again.refresh().await.unwrap();
    assert_eq!(again.names(), ["wx__alerts", "wx__forecast"]);
}

#[tokio::test]
async fn a_shared_set_that_cannot_be_reached_refuses_the_load_and_lists_only_the_core() {
    let state = Arc::new(SharedSets::default());
    let kernel = builder()
        .catalog(search_config(&["read_file"]))
        .authorizer(grants())
        .build();
    let loaded = LoadedTools::shared(state.clone(), "local", "conv");
    let session = kernel.open_session(SessionConfig::new("conv").loaded_tools(loaded.clone()));
    session.load_tools(&["wx__forecast".into()]).await.unwrap();
    state.down.store(true, std::sync::atomic::Ordering::SeqCst);
    let refused = call(&session, LOAD_TOOL, json!({"names": ["wx__alerts"]})).await;
    let error = &refused["error"];
    assert_eq!(error["kind"], "loaded_tools_unavailable", "{refused}");
    assert_eq!(error["retryable"], true, "{refused}");
    assert!(loaded.refresh().await.is_err());
    assert_eq!(
        names(&session.listing()),
        ["read_file", SEARCH_TOOL, LOAD_TOOL],
        "the core and the meta-tools, nothing kept by this replica alone"
    );
    state.down.store(false, std::sync::atomic::Ordering::SeqCst);
    loaded.refresh().await.unwrap();
    assert_eq!(loaded.names(), ["wx__forecast"]);
}
