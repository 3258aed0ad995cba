//! The catalog's lint and schema budgets: each rule finds what it names and stays quiet on a
//! definition that does it right; a load over the listing budget is refused; what is over
//! budget is reported when the kernel is built.

use ring0_core::{Authority, Observation, ToolSpec};
use ring0_kernel::catalog::lint::{LintLevel, LintReport, LintRule, lint};
use ring0_kernel::catalog::{
    CatalogConfig, CatalogMode, LoadedTools, SchemaBudgets, schema_tokens,
};
use ring0_kernel::{GrantTable, Kernel, SessionConfig, tool_fn};
use serde_json::{Value, json};
use std::sync::Arc;

fn tool(name: &str, description: &str, properties: Value) -> ToolSpec {
    ToolSpec::read(
        name,
        description,
        json!({"type": "object", "properties": properties}),
    )
}

fn linted(tools: &[ToolSpec]) -> LintReport {
    let refs: Vec<&ToolSpec> = tools.iter().collect();
    lint(&refs, 0, &SchemaBudgets::default())
}

/// The (tool, location) pairs `rule` was found at.
fn found(report: &LintReport, rule: LintRule) -> Vec<(String, String)> {
    report
        .findings
        .iter()
        .filter(|f| f.rule == rule)
        .map(|f| (f.tool.clone(), f.location.clone()))
        .collect()
}

fn at(tool: &str, location: &str) -> (String, String) {
    (tool.to_string(), location.to_string())
}

#[test]
fn a_tool_without_a_description_is_an_error() {
    let report = linted(&[
        tool("quiet", "  ", json!({})),
        tool("said", "Says what it does.", json!({})),
    ]);
    assert_eq!(
        found(&report, LintRule::MissingDescription),
        [at("quiet", "")]
    );
    assert_eq!(report.errors(), 1, "{report:?}");
    assert_eq!(LintRule::MissingDescription.level(), LintLevel::Error);
}

#[test]
fn a_parameter_without_a_description_is_found_at_its_pointer_nested_ones_too() {
    let report = linted(&[tool(
        "t",
        "A tool.",
        json!({
            "path": {"type": "string", "description": "Where."},
            "mode": {"type": "string"},
            "opts": {"type": "object", "description": "Options.",
                     "properties": {"depth": {"type": "integer", "minimum": 0, "maximum": 9}}},
        }),
    )]);
    assert_eq!(
        found(&report, LintRule::ParameterWithoutDescription),
        [
            at("t", "/properties/mode"),
            at("t", "/properties/opts/properties/depth")
        ]
    );
    assert_eq!(report.errors(), 0, "only warnings: {report:?}");
}

#[test]
fn a_string_whose_description_states_a_length_needs_max_length() {
    let report = linted(&[tool(
        "post",
        "Posts a message.",
        json!({
            "text": {"type": "string", "description": "The message, at most 280 characters."},
            "title": {"type": "string", "maxLength": 80,
                      "description": "Title, up to 80 characters."},
            "body": {"type": "string", "description": "Anything you like."},
        }),
    )]);
    assert_eq!(
        found(&report, LintRule::UnboundedString),
        [at("post", "/properties/text")]
    );
    let message = &report.findings[0].message;
    assert!(message.contains("280 characters"), "{message}");
}

#[test]
fn a_number_with_a_stated_range_or_a_count_name_needs_its_bounds() {
    let report = linted(&[tool(
        "find",
        "Finds things.",
        json!({
            "rating": {"type": "number", "description": "Rating between 1 and 5."},
            "limit": {"type": "integer", "description": "How many results."},
            "page_size": {"type": "integer", "maximum": 100, "description": "Page size."},
            "year": {"type": "integer", "description": "The year."},
            "stars": {"type": "integer", "minimum": 1, "maximum": 5,
                      "description": "Stars, from 1 to 5."},
        }),
    )]);
    assert_eq!(
        found(&report, LintRule::UnboundedNumber),
        [
            at("find", "/properties/limit"),
            at("find", "/properties/rating")
        ]
    );
}

#[test]
fn values_listed_in_prose_are_an_enum_in_disguise() {
    let report = linted(&[tool(
        "weather",
        "Current weather.",
        json!({
            "unit": {"type": "string",
                     "description": "Unit of temperature, one of 'celsius' or 'fahrenheit'."},
            "format": {"type": "string", "description": "Output: json | text | xml"},
            "kind": {"type": "string", "enum": ["a", "b"],
                     "description": "Either 'a' or 'b'."},
            "city": {"type": "string", "description": "The city's name, e.g. 'Paris'."},
        }),
    )]);
    assert_eq!(
        found(&report, LintRule::EnumAsProse),
        [
            at("weather", "/properties/format"),
            at("weather", "/properties/unit")
        ]
    );
    let unit = report
        .findings
        .iter()
        .find(|f| f.location == "/properties/unit")
        .unwrap();
    assert!(unit.message.contains("celsius, fahrenheit"), "{unit:?}");
}

#[test]
fn two_tools_saying_the_same_thing_are_near_duplicates_across_an_alias() {
    let report = linted(&[
        tool(
            "read_file",
            "Read the contents of a text file in the workspace.",
            json!({}),
        ),
        tool(
            "fs__read_file",
            "Read the contents of a text file from the workspace.",
            json!({}),
        ),
        tool(
            "write_file",
            "Write a text file in the workspace.",
            json!({}),
        ),
        tool(
            "get_weather",
            "Read the contents of a text file in the workspace.",
            json!({}),
        ),
    ]);
    assert_eq!(
        found(&report, LintRule::NearDuplicate),
        [at("read_file", "")],
        "same name after the alias and same words; other names are not duplicates: {report:?}"
    );
    assert!(report.findings[0].message.contains("fs__read_file"));
}

#[test]
fn a_definition_over_the_tool_budget_is_an_error_naming_both_numbers() {
    let long = "Explains at length. ".repeat(200);
    let spec = tool("verbose", &long, json!({}));
    let tokens = schema_tokens(&spec);
    let budgets = SchemaBudgets {
        tool_tokens_max: 100,
        ..SchemaBudgets::default()
    };
    let report = lint(&[&spec], 0, &budgets);
    let over = found(&report, LintRule::ToolOverBudget);
    assert_eq!(over, [at("verbose", "")]);
    let message = &report.findings[0].message;
    assert!(
        message.contains(&tokens.to_string()) && message.contains("100"),
        "{message}"
    );
    assert_eq!(report.errors(), 1);
}

#[test]
fn a_listing_over_the_catalog_budget_is_an_error() {
    let budgets = SchemaBudgets {
        tool_tokens_max: 100,
        listing_tokens_max: 1_000,
    };
    let report = lint(&[], 1_001, &budgets);
    assert_eq!(found(&report, LintRule::ListingOverBudget), [at("", "")]);
    assert_eq!(lint(&[], 1_000, &budgets).findings, []);
}

#[test]
fn every_rule_has_a_name_and_a_fixed_level() {
    for rule in LintRule::ALL {
        let json = serde_json::to_value(rule).unwrap();
        assert_eq!(json, rule.name(), "the JSON name is the printed name");
    }
    let errors: Vec<&str> = LintRule::ALL
        .iter()
        .filter(|r| r.level() == LintLevel::Error)
        .map(|r| r.name())
        .collect();
    assert_eq!(
        errors,
        [
            "missing_description",
            "tool_over_budget",
            "listing_over_budget"
        ]
    );
}

/// A kernel in search mode over `tools`, everything granted, with `budgets`.
fn search_kernel(tools: Vec<ToolSpec>, budgets: SchemaBudgets) -> Kernel {
    let mut b = Kernel::builder();
    for spec in tools {
        b = b
            .tool(
                spec,
                tool_fn(|_ctx, _args| async { Ok(Observation::text("ok")) }),
            )
            .unwrap();
    }
    b.catalog(CatalogConfig {
        mode: CatalogMode::Search,
        pinned: vec![],
        budgets,
        ..CatalogConfig::default()
    })
    .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A0)))
    .build()
}

#[tokio::test]
async fn a_load_that_would_take_the_listing_over_its_budget_is_refused() {
    let small = tool("small", "A small tool.", json!({}));
    let big = tool("big", &"Many words here. ".repeat(60), json!({}));
    let probe = search_kernel(vec![small.clone(), big.clone()], SchemaBudgets::default());
    let session = probe.open_session(SessionConfig::new("probe"));
    let core = probe.catalog().search_listing_tokens(&[], |_| true);
    let small_tokens = probe.catalog().tool_tokens("small").unwrap();
    assert_eq!(
        session
            .catalog_for_turn(
                ring0_core::ProviderFormat::Mcp,
                ring0_kernel::catalog::TurnSearch::Ring0
            )
            .schema_tokens,
        core,
        "the meta-tools alone"
    );
    // Room for the meta-tools and the small tool, not the big one.
    let budgets = SchemaBudgets {
        tool_tokens_max: 1_000,
        listing_tokens_max: core + small_tokens + 5,
    };
    let kernel = search_kernel(vec![small, big], budgets);
    let loaded = LoadedTools::new();
    let session = kernel.open_session(SessionConfig::new("s").loaded_tools(loaded.clone()));
    let outcome = session
        .load_tools(&["big".into(), "small".into()])
        .await
        .unwrap();
    assert_eq!(outcome.over_budget, ["big"]);
    let names: Vec<&str> = outcome.loaded.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["small"]);
    assert_eq!(loaded.names(), ["small"]);
    assert!(
        kernel
            .catalog()
            .search_listing_tokens(&loaded.names(), |_| true)
            <= budgets.listing_tokens_max
    );
}

#[test]
fn what_is_over_budget_is_reported_when_the_kernel_is_built() {
    let big = tool("big", &"Many words here. ".repeat(60), json!({}));
    let budgets = SchemaBudgets {
        tool_tokens_max: 50,
        listing_tokens_max: 60,
    };
    let mut b = Kernel::builder();
    b = b
        .tool(
            big,
            tool_fn(|_ctx, _args| async { Ok(Observation::text("ok")) }),
        )
        .unwrap();
    let kernel = b
        .catalog(CatalogConfig {
            budgets,
            ..CatalogConfig::default()
        })
        .build();
    let lines = kernel.catalog().over_budget();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].starts_with("tool big costs "), "{lines:?}");
    assert!(lines[1].contains("full listing"), "{lines:?}");
}
