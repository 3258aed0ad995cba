//! Ingest from a stream: provider stream events become tool calls the moment each call's block is
//! complete.
//!
//! Supported event shapes (each provider's documented streaming form, one JSON event at a time):
//! - OpenAI Chat Completions chunks: `choices[0].delta.tool_calls[i]` with `index`, `id`,
//!   `function.name` and `function.arguments` fragments. Calls stream one after another, so a
//!   new `index` completes the previous call; `finish_reason` completes the last.
//! - OpenAI Responses events: `response.output_item.added` (a `function_call` item),
//!   `response.function_call_arguments.delta` / `.done`, `response.output_item.done`.
//! - Anthropic Messages events: `content_block_start` with a `tool_use` block,
//!   `content_block_delta` with `input_json_delta`, `content_block_stop`.
//!
//! A call still open when the stream ends without the provider's end signal (or when the host
//! calls [`StreamAssembler::abort`]) becomes an [`Assembled::Aborted`]: nothing partial is ever
//! dispatched.

use ring0_core::limits::{ARGUMENT_BYTES_MAX, CALLS_PER_ROUND_MAX};
use ring0_core::{ProposedArguments, ProposedCall, ProviderFormat};
use serde_json::Value;
use std::collections::BTreeMap;

/// What the assembler produces.
#[derive(Debug, Clone, PartialEq)]
pub enum Assembled {
    /// A call whose block is complete, with its original position in the stream.
    Complete(ProposedCall),
    /// A call that will never be complete.
    Aborted {
        index: usize,
        call_id: String,
        tool: String,
        why: String,
    },
}

/// An event the assembler cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{format} stream event: {why}")]
pub struct StreamError {
    pub format: ProviderFormat,
    pub why: String,
}

#[derive(Debug)]
struct Pending {
    index: usize,
    call_id: String,
    tool: String,
    args: String,
    /// Arguments grew past the limit; the call is aborted when it completes.
    overflow: bool,
}

/// Assembles one streamed model turn.
#[derive(Debug)]
pub struct StreamAssembler {
    format: ProviderFormat,
    /// Open calls by the provider's stream key (chat index, response item id, block index).
    open: BTreeMap<String, Pending>,
    /// Stream keys already emitted (Responses sends both `.done` and `output_item.done`).
    closed: std::collections::HashSet<String>,
    next_index: usize,
    ended: bool,
    text: String,
}

impl StreamAssembler {
    pub fn new(format: ProviderFormat) -> Self {
        Self {
            format,
            open: BTreeMap::new(),
            closed: Default::default(),
            next_index: 0,
            ended: false,
            text: String::new(),
        }
    }

    /// The provider signalled the end of the turn.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Text the model streamed besides its calls.
    pub fn text(&self) -> &str {
        &self.text
    }

    fn err(&self, why: impl Into<String>) -> StreamError {
        StreamError {
            format: self.format,
            why: why.into(),
        }
    }

    fn open_call(
        &mut self,
        key: String,
        call_id: String,
        tool: String,
        args: &str,
    ) -> Result<(), StreamError> {
        if self.open.contains_key(&key) || self.closed.contains(&key) {
            return Ok(());
        }
        if self.next_index >= CALLS_PER_ROUND_MAX {
            return Err(self.err(format!("more than {CALLS_PER_ROUND_MAX} calls in one turn")));
        }
        let index = self.next_index;
        self.next_index += 1;
        let mut p = Pending {
            index,
            call_id,
            tool,
            args: String::new(),
            overflow: false,
        };
        append(&mut p, args);
        self.open.insert(key, p);
        Ok(())
    }

    fn close(&mut self, key: &str, full_args: Option<&str>) -> Option<Assembled> {
        let mut p = self.open.remove(key)?;
        self.closed.insert(key.to_string());
        if let Some(full) = full_args {
            p.args.clear();
            p.overflow = false;
            append(&mut p, full);
        }
        Some(complete(self.format, p))
    }

    /// Feeds one event; returns the calls it completed, in stream order.
    pub fn push(&mut self, event: &Value) -> Result<Vec<Assembled>, StreamError> {
        match self.format {
            ProviderFormat::OpenAiChat => self.push_chat(event),
            ProviderFormat::OpenAiResponses => self.push_responses(event),
            ProviderFormat::Anthropic => self.push_anthropic(event),
            ProviderFormat::Mcp => Err(self.err("MCP has no streamed tool calls")),
        }
    }

    /// The stream is over. Calls the provider completed were already emitted; calls still open
    /// are complete only if the provider signalled its end, otherwise they are aborted.
    pub fn finish(&mut self) -> Vec<Assembled> {
        if self.ended {
            let keys: Vec<String> = self.open.keys().cloned().collect();
            let mut out: Vec<Assembled> = keys.iter().filter_map(|k| self.close(k, None)).collect();
            out.sort_by_key(index_of);
            out
        } else {
            self.abort("the stream ended before the call was complete")
        }
    }

    /// The stream broke: every open call is aborted.
    pub fn abort(&mut self, why: &str) -> Vec<Assembled> {
        let mut out: Vec<Assembled> = std::mem::take(&mut self.open)
            .into_values()
            .map(|p| Assembled::Aborted {
                index: p.index,
                call_id: p.call_id,
                tool: p.tool,
                why: why.to_string(),
            })
            .collect();
        out.sort_by_key(index_of);
        out
    }

    fn push_chat(&mut self, event: &Value) -> Result<Vec<Assembled>, StreamError> {
        let mut out = Vec::new();
        if event.as_str() == Some("[DONE]") {
            self.ended = true;
            return Ok(self.finish());
        }
        let Some(choice) = event.get("choices").and_then(|c| c.get(0)) else {
            return Ok(out);
        };
        if let Some(text) = choice.pointer("/delta/content").and_then(Value::as_str) {
            self.text.push_str(text);
        }
        for tc in choice
            .pointer("/delta/tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let i = tc
                .get("index")
                .and_then(Value::as_u64)
                .ok_or_else(|| self.err("tool_calls delta without an index"))?;
            let key = i.to_string();
            if !self.open.contains_key(&key) && !self.closed.contains(&key) {
                // A new call starts: the calls before it are complete.
                let earlier: Vec<String> = self.open.keys().cloned().collect();
                for k in earlier {
                    out.extend(self.close(&k, None));
                }
                let id = tc
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                if id.is_empty() {
                    return Err(self.err(format!("tool call {i} starts without an id")));
                }
                let name = tc
                    .pointer("/function/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                self.open_call(key.clone(), id, name.to_string(), "")?;
            }
            if let Some(p) = self.open.get_mut(&key) {
                if let Some(frag) = tc.pointer("/function/arguments").and_then(Value::as_str) {
                    append(p, frag);
                }
                if p.tool.is_empty()
                    && let Some(name) = tc.pointer("/function/name").and_then(Value::as_str)
                {
                    p.tool = name.to_string();
                }
            }
        }
        if choice.get("finish_reason").is_some_and(|f| !f.is_null()) {
            self.ended = true;
            out.extend(self.finish());
        }
        out.sort_by_key(index_of);
        Ok(out)
    }

    fn push_responses(&mut self, event: &Value) -> Result<Vec<Assembled>, StreamError> {
        let kind = event
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match kind {
            "response.output_item.added" => {
                self.responses_item_added(event)?;
                Ok(Vec::new())
            }
            "response.function_call_arguments.delta" => {
                if let (Some(key), Some(delta)) = (
                    responses_item_key(event),
                    event.get("delta").and_then(Value::as_str),
                ) && let Some(p) = self.open.get_mut(&key)
                {
                    append(p, delta);
                }
                Ok(Vec::new())
            }
            "response.function_call_arguments.done" => {
                let key = responses_item_key(event)
                    .ok_or_else(|| self.err("arguments.done without item_id"))?;
                let full = event.get("arguments").and_then(Value::as_str);
                Ok(self.close(&key, full).into_iter().collect())
            }
            "response.output_item.done" => self.responses_item_done(event),
            "response.completed" => {
                self.ended = true;
                Ok(self.finish())
            }
            "response.failed" | "response.incomplete" | "error" => {
                Ok(self.abort("the provider ended the response before the call was complete"))
            }
            "response.output_text.delta" => {
                if let Some(d) = event.get("delta").and_then(Value::as_str) {
                    self.text.push_str(d);
                }
                Ok(Vec::new())
            }
            _ => Ok(Vec::new()),
        }
    }

    /// `response.output_item.added`: a `function_call` item opens a call, with whatever
    /// arguments it already carries.
    fn responses_item_added(&mut self, event: &Value) -> Result<(), StreamError> {
        let item = event.get("item").cloned().unwrap_or(Value::Null);
        if item.get("type").and_then(Value::as_str) != Some("function_call") {
            return Ok(());
        }
        let key = responses_item_key(event)
            .ok_or_else(|| self.err("function_call item without an id"))?;
        let call_id = item
            .get("call_id")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if call_id.is_empty() {
            return Err(self.err("function_call item without a call_id"));
        }
        let name = item.get("name").and_then(Value::as_str).unwrap_or_default();
        let args = item
            .get("arguments")
            .and_then(Value::as_str)
            .unwrap_or_default();
        self.open_call(key, call_id.to_string(), name.to_string(), args)
    }

    /// `response.output_item.done`: completes a `function_call` item not already completed by
    /// its `arguments.done` (opening it first if its `added` event never came).
    fn responses_item_done(&mut self, event: &Value) -> Result<Vec<Assembled>, StreamError> {
        let item = event.get("item").cloned().unwrap_or(Value::Null);
        if item.get("type").and_then(Value::as_str) != Some("function_call") {
            return Ok(Vec::new());
        }
        let key = responses_item_key(event)
            .ok_or_else(|| self.err("function_call item without an id"))?;
        if self.closed.contains(&key) {
            return Ok(Vec::new());
        }
        if !self.open.contains_key(&key) {
            let call_id = item
                .get("call_id")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let name = item.get("name").and_then(Value::as_str).unwrap_or_default();
            self.open_call(key.clone(), call_id.to_string(), name.to_string(), "")?;
        }
        let full = item.get("arguments").and_then(Value::as_str);
        Ok(self.close(&key, full).into_iter().collect())
    }

    fn push_anthropic(&mut self, event: &Value) -> Result<Vec<Assembled>, StreamError> {
        let kind = event
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let block_key = || {
            event
                .get("index")
                .and_then(Value::as_u64)
                .map(|i| i.to_string())
        };
        match kind {
            "content_block_start" => {
                let block = event.get("content_block").cloned().unwrap_or(Value::Null);
                if block.get("type").and_then(Value::as_str) == Some("tool_use") {
                    let key = block_key()
                        .ok_or_else(|| self.err("content_block_start without an index"))?;
                    let id = block.get("id").and_then(Value::as_str).unwrap_or_default();
                    if id.is_empty() {
                        return Err(self.err("tool_use block without an id"));
                    }
                    let name = block
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    self.open_call(key, id.to_string(), name.to_string(), "")?;
                }
                Ok(Vec::new())
            }
            "content_block_delta" => {
                let delta = event.get("delta").cloned().unwrap_or(Value::Null);
                match delta.get("type").and_then(Value::as_str) {
                    Some("input_json_delta") => {
                        if let (Some(key), Some(part)) = (
                            block_key(),
                            delta.get("partial_json").and_then(Value::as_str),
                        ) && let Some(p) = self.open.get_mut(&key)
                        {
                            append(p, part);
                        }
                    }
                    Some("text_delta") => {
                        if let Some(t) = delta.get("text").and_then(Value::as_str) {
                            self.text.push_str(t);
                        }
                    }
                    _ => {}
                }
                Ok(Vec::new())
            }
            "content_block_stop" => {
                let Some(key) = block_key() else {
                    return Ok(Vec::new());
                };
                Ok(self.close(&key, None).into_iter().collect())
            }
            "message_stop" => {
                self.ended = true;
                Ok(self.finish())
            }
            "error" => Ok(self.abort("the provider reported an error mid-stream")),
            _ => Ok(Vec::new()),
        }
    }
}

/// The stream key of a Responses event's item.
fn responses_item_key(event: &Value) -> Option<String> {
    event
        .get("item_id")
        .or_else(|| event.pointer("/item/id"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn index_of(a: &Assembled) -> usize {
    match a {
        Assembled::Complete(c) => c.index,
        Assembled::Aborted { index, .. } => *index,
    }
}

fn append(p: &mut Pending, fragment: &str) {
    if p.overflow {
        return;
    }
    if p.args.len() + fragment.len() > ARGUMENT_BYTES_MAX {
        p.overflow = true;
        p.args.clear();
        return;
    }
    p.args.push_str(fragment);
}

fn complete(format: ProviderFormat, p: Pending) -> Assembled {
    if p.overflow {
        return Assembled::Aborted {
            index: p.index,
            call_id: p.call_id,
            tool: p.tool,
            why: format!("arguments exceed {ARGUMENT_BYTES_MAX} bytes"),
        };
    }
    // Anthropic sends no input deltas for a call without arguments.
    let args = if format == ProviderFormat::Anthropic && p.args.trim().is_empty() {
        "{}".to_string()
    } else {
        p.args
    };
    Assembled::Complete(ProposedCall {
        index: p.index,
        call_id: p.call_id,
        tool: p.tool,
        arguments: ProposedArguments::Text(args),
        idempotency_key: None,
    })
}
