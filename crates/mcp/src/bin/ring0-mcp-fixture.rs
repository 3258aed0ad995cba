//! A reference MCP server for ring0's conformance runs, interoperability tests and gateway
//! benchmark; not part of ring0 itself.
//!
//! It implements what the official conformance suite's server scenarios ask for (the `test_*`
//! tools, the `test://` resources and templates, the `test_*` prompts, completion, logging,
//! subscriptions) plus an `echo` tool for the benchmark, on rmcp, over stdio or Streamable HTTP:
//!
//! ```text
//! ring0-mcp-fixture                      # stdio
//! ring0-mcp-fixture --http 127.0.0.1:0   # prints "listening on http://ADDR/mcp" to stderr
//!                                        # (and answers POST /echo with its body)
//! ```

// The protocol's logging is deprecated for 2026-07-28 but still part of the sessionful era the
// conformance suite checks.
#![allow(deprecated)]

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CompleteRequestParams, CompleteResult, CustomRequest,
    ErrorData, GetPromptRequestParams, GetPromptResponse, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ServerConfig, ServerRequest,
    SetLevelRequestParams, SubscribeRequestParams, UnsubscribeRequestParams,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::time::Duration;

/// A 1×1 red PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
/// A minimal WAV header with no samples.
const WAV: &str = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQAAAAA=";

fn typed<T: DeserializeOwned>(v: Value) -> Result<T, ErrorData> {
    serde_json::from_value(v).map_err(|e| ErrorData::internal_error(e.to_string(), None))
}

fn text(s: &str) -> Value {
    json!({"content": [{"type": "text", "text": s}]})
}

#[derive(Clone, Default)]
struct Fixture;

fn tools() -> Value {
    let none = json!({"type": "object", "properties": {}});
    json!([
        {"name": "echo", "description": "Echoes its text.", "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}, "annotations": {"readOnlyHint": true}},
        {"name": "test_simple_text", "description": "Simple text.", "inputSchema": none},
        {"name": "test_image_content", "description": "An image.", "inputSchema": none},
        {"name": "test_audio_content", "description": "Audio.", "inputSchema": none},
        {"name": "test_embedded_resource", "description": "An embedded resource.", "inputSchema": none},
        {"name": "test_multiple_content_types", "description": "Mixed content.", "inputSchema": none},
        {"name": "test_tool_with_logging", "description": "Logs while running.", "inputSchema": none},
        {"name": "test_tool_with_progress", "description": "Reports progress.", "inputSchema": none},
        {"name": "test_error_handling", "description": "Always fails.", "inputSchema": none},
        {"name": "test_reconnection", "description": "Answers on its response stream (an rmcp handler cannot close it mid-call).", "inputSchema": none},
        {"name": "test_sampling", "description": "Asks the client's model.", "inputSchema": {"type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]}},
        {"name": "test_elicitation", "description": "Asks the user.", "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}},
        {"name": "test_elicitation_sep1034_defaults", "description": "Elicitation with defaults.", "inputSchema": none},
        {"name": "test_elicitation_sep1330_enums", "description": "Elicitation with enums.", "inputSchema": none},
        {"name": "json_schema_2020_12_tool", "description": "Tool with JSON Schema 2020-12 features",
         "inputSchema": {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
            "$defs": {"address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
            "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
            "additionalProperties": false}},
    ])
}

async fn ask(
    context: &RequestContext<RoleServer>,
    method: &str,
    params: Value,
) -> Result<Value, ErrorData> {
    let r = context
        .peer
        .send_request(ServerRequest::CustomRequest(CustomRequest::new(
            method,
            Some(params),
        )))
        .await
        .map_err(|e| ErrorData::internal_error(format!("{method}: {e}"), None))?;
    serde_json::to_value(r).map_err(|e| ErrorData::internal_error(e.to_string(), None))
}

async fn call(
    name: &str,
    args: &Value,
    context: &RequestContext<RoleServer>,
) -> Result<Value, ErrorData> {
    Ok(match name {
        "echo" => text(args.get("text").and_then(Value::as_str).unwrap_or("")),
        "test_simple_text" => text("This is a simple text response for testing."),
        "test_image_content" => {
            json!({"content": [{"type": "image", "data": PNG, "mimeType": "image/png"}]})
        }
        "test_audio_content" => {
            json!({"content": [{"type": "audio", "data": WAV, "mimeType": "audio/wav"}]})
        }
        "test_embedded_resource" => {
            json!({"content": [{"type": "resource", "resource": {"uri": "test://embedded-resource", "mimeType": "text/plain", "text": "This is an embedded resource content."}}]})
        }
        "test_multiple_content_types" => json!({"content": [
            {"type": "text", "text": "Multiple content types test:"},
            {"type": "image", "data": PNG, "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "test://mixed-content-resource", "mimeType": "application/json", "text": "{\"test\":\"data\",\"value\":123}"}}]}),
        "test_tool_with_logging" => {
            for (i, m) in [
                "Tool execution started",
                "Tool processing data",
                "Tool execution completed",
            ]
            .iter()
            .enumerate()
            {
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let p = typed(json!({"level": "info", "data": m}))?;
                let _ = context.peer.notify_logging_message(p).await;
            }
            text("Tool with logging executed successfully")
        }
        "test_tool_with_progress" => {
            let token = context.meta.get_progress_token();
            for (i, p) in [0, 50, 100].iter().enumerate() {
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                if let Some(t) = &token {
                    let param = typed(json!({"progressToken": t, "progress": p, "total": 100}))?;
                    let _ = context.peer.notify_progress(param).await;
                }
            }
            text("Tool with progress executed successfully")
        }
        "test_reconnection" => text("Reconnection test completed"),
        "test_error_handling" => {
            json!({"isError": true, "content": [{"type": "text", "text": "This tool intentionally returns an error for testing"}]})
        }
        "test_sampling" => {
            let prompt = args.get("prompt").and_then(Value::as_str).unwrap_or("");
            let r = ask(context, "sampling/createMessage", json!({"messages": [{"role": "user", "content": {"type": "text", "text": prompt}}], "maxTokens": 100})).await?;
            let answer = r
                .pointer("/content/text")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            text(&format!("LLM response: {answer}"))
        }
        "test_elicitation" => {
            let message = args.get("message").and_then(Value::as_str).unwrap_or("");
            let r = ask(context, "elicitation/create", json!({"message": message, "requestedSchema": {"type": "object",
                "properties": {"username": {"type": "string", "description": "User's response"}, "email": {"type": "string", "description": "User's email address"}},
                "required": ["username", "email"]}})).await?;
            text(&format!("User response: {r}"))
        }
        "test_elicitation_sep1034_defaults" => {
            let r = ask(context, "elicitation/create", json!({"message": "Please review and update the form fields with defaults", "requestedSchema": {"type": "object", "properties": {
                "name": {"type": "string", "description": "User name", "default": "John Doe"},
                "age": {"type": "integer", "description": "User age", "default": 30},
                "score": {"type": "number", "description": "User score", "default": 95.5},
                "status": {"type": "string", "description": "User status", "enum": ["active", "inactive", "pending"], "default": "active"},
                "verified": {"type": "boolean", "description": "Verification status", "default": true}}}})).await?;
            text(&format!(
                "Elicitation completed: action={}, content={}",
                r["action"].as_str().unwrap_or(""),
                r.get("content").cloned().unwrap_or(json!({}))
            ))
        }
        "test_elicitation_sep1330_enums" => {
            let r = ask(context, "elicitation/create", json!({"message": "Please select options from the enum fields", "requestedSchema": {"type": "object", "properties": {
                "untitledSingle": {"type": "string", "description": "Select one option", "enum": ["option1", "option2", "option3"]},
                "titledSingle": {"type": "string", "description": "Select one option with titles", "oneOf": [{"const": "value1", "title": "First Option"}, {"const": "value2", "title": "Second Option"}, {"const": "value3", "title": "Third Option"}]},
                "legacyEnum": {"type": "string", "description": "Select one option (legacy)", "enum": ["opt1", "opt2", "opt3"], "enumNames": ["Option One", "Option Two", "Option Three"]},
                "untitledMulti": {"type": "array", "description": "Select multiple options", "minItems": 1, "maxItems": 3, "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
                "titledMulti": {"type": "array", "description": "Select multiple options with titles", "minItems": 1, "maxItems": 3, "items": {"anyOf": [{"const": "value1", "title": "First Choice"}, {"const": "value2", "title": "Second Choice"}, {"const": "value3", "title": "Third Choice"}]}}}}})).await?;
            text(&format!(
                "Elicitation completed: action={}, content={}",
                r["action"].as_str().unwrap_or(""),
                r.get("content").cloned().unwrap_or(json!({}))
            ))
        }
        "json_schema_2020_12_tool" => text("ok"),
        other => {
            return Err(ErrorData::invalid_params(
                format!("unknown tool {other}"),
                None,
            ));
        }
    })
}

impl ServerHandler for Fixture {
    fn get_info(&self) -> ServerConfig {
        serde_json::from_value(json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {"listChanged": true}, "resources": {"subscribe": true, "listChanged": true},
                             "prompts": {"listChanged": true}, "logging": {}, "completions": {}},
            "serverInfo": {"name": "ring0-mcp-fixture", "version": "1.0.0"},
        }))
        .expect("server config")
    }

    async fn list_tools(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        typed(json!({"tools": tools()}))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.map(Value::Object).unwrap_or(json!({}));
        let v = call(&request.name, &args, &context).await?;
        Ok(CallToolResponse::Complete(typed(v)?))
    }

    async fn list_resources(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        typed(json!({"resources": [
            {"uri": "test://static-text", "name": "static-text", "description": "A static text resource", "mimeType": "text/plain"},
            {"uri": "test://static-binary", "name": "static-binary", "description": "A static binary resource", "mimeType": "image/png"},
            {"uri": "test://watched-resource", "name": "watched-resource", "description": "A resource to subscribe to", "mimeType": "text/plain"}]}))
    }

    async fn list_resource_templates(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        typed(
            json!({"resourceTemplates": [{"uriTemplate": "test://template/{id}/data", "name": "template", "description": "A templated resource", "mimeType": "application/json"}]}),
        )
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let uri = request.uri.as_str();
        let v = if uri == "test://static-text" {
            json!({"contents": [{"uri": uri, "mimeType": "text/plain", "text": "This is the content of the static text resource."}]})
        } else if uri == "test://static-binary" {
            json!({"contents": [{"uri": uri, "mimeType": "image/png", "blob": PNG}]})
        } else if uri == "test://watched-resource" {
            json!({"contents": [{"uri": uri, "mimeType": "text/plain", "text": "Watched resource content."}]})
        } else if let Some(id) = uri
            .strip_prefix("test://template/")
            .and_then(|r| r.strip_suffix("/data"))
        {
            json!({"contents": [{"uri": uri, "mimeType": "application/json",
                "text": json!({"id": id, "templateTest": true, "data": format!("Data for ID: {id}")}).to_string()}]})
        } else {
            return Err(ErrorData::resource_not_found(
                format!("no resource {uri}"),
                None,
            ));
        };
        Ok(ReadResourceResponse::Complete(typed(v)?))
    }

    async fn subscribe(
        &self,
        _r: SubscribeRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Ok(())
    }

    async fn unsubscribe(
        &self,
        _r: UnsubscribeRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Ok(())
    }

    async fn list_prompts(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        typed(json!({"prompts": [
            {"name": "test_simple_prompt", "description": "A simple prompt"},
            {"name": "test_prompt_with_arguments", "description": "A prompt with arguments", "arguments": [
                {"name": "arg1", "description": "First test argument", "required": true},
                {"name": "arg2", "description": "Second test argument", "required": true}]},
            {"name": "test_prompt_with_embedded_resource", "description": "A prompt with an embedded resource", "arguments": [
                {"name": "resourceUri", "description": "URI of the resource to embed", "required": true}]},
            {"name": "test_prompt_with_image", "description": "A prompt with an image"}]}))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let args = request.arguments.map(Value::Object).unwrap_or(json!({}));
        let arg = |k: &str| {
            args.get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let v = match request.name.as_str() {
            "test_simple_prompt" => {
                json!({"messages": [{"role": "user", "content": {"type": "text", "text": "This is a simple prompt for testing."}}]})
            }
            "test_prompt_with_arguments" => {
                json!({"messages": [{"role": "user", "content": {"type": "text",
                "text": format!("Prompt with arguments: arg1='{}', arg2='{}'", arg("arg1"), arg("arg2"))}}]})
            }
            "test_prompt_with_embedded_resource" => json!({"messages": [
                {"role": "user", "content": {"type": "resource", "resource": {"uri": arg("resourceUri"), "mimeType": "text/plain", "text": "Embedded resource content for testing."}}},
                {"role": "user", "content": {"type": "text", "text": "Please process the embedded resource above."}}]}),
            "test_prompt_with_image" => json!({"messages": [
                {"role": "user", "content": {"type": "image", "data": PNG, "mimeType": "image/png"}},
                {"role": "user", "content": {"type": "text", "text": "Please analyze the image above."}}]}),
            other => {
                return Err(ErrorData::invalid_params(
                    format!("unknown prompt {other}"),
                    None,
                ));
            }
        };
        Ok(GetPromptResponse::Complete(typed(v)?))
    }

    async fn complete(
        &self,
        _r: CompleteRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        typed(
            json!({"completion": {"values": ["paris", "park", "party"], "total": 3, "hasMore": false}}),
        )
    }

    async fn set_level(
        &self,
        _r: SetLevelRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Ok(())
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let http = args
        .iter()
        .position(|a| a == "--http")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        match http {
            None => {
                use rmcp::ServiceExt;
                let running = Fixture
                    .serve(rmcp::transport::stdio())
                    .await
                    .expect("stdio");
                let _ = running.waiting().await;
            }
            Some(addr) => {
                use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
                use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
                let service = StreamableHttpService::new(
                    || Ok(Fixture),
                    std::sync::Arc::new(LocalSessionManager::default()),
                    StreamableHttpServerConfig::default(),
                );
                let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
                eprintln!(
                    "listening on http://{}/mcp",
                    listener.local_addr().expect("addr")
                );
                // `/echo` answers a POST with its body: no MCP at all, so the benchmark can
                // measure what one HTTP exchange costs on this machine.
                let app = axum::Router::new().route_service("/mcp", service).route(
                    "/echo",
                    axum::routing::post(|body: axum::body::Bytes| async move {
                        (
                            [(axum::http::header::CONTENT_TYPE, "application/json")],
                            body,
                        )
                    }),
                );
                use axum::serve::ListenerExt;
                let listener = listener.tap_io(|tcp| {
                    let _ = tcp.set_nodelay(true);
                });
                axum::serve(listener, app).await.expect("serve");
            }
        }
    });
}
