//! Prompts, resources, completion and the logging level: relayed to the upstreams that offer them.
//!
//! These have no effect on the world, so they are not kernel rounds: prompt names are exposed
//! like tool names (`alias__name`, or the server's own name without a namespace), resource URIs
//! as the servers give them, and each request is routed to the upstream that listed the name or
//! URI (templates match by their literal prefix and suffix).
//!
//! Nothing passes unmediated ([`crate::mediate`]): prompts are listed from the upstream's pinned
//! listing (a quarantined prompt is neither listed nor served), and prompt texts, resources,
//! listings and completions are cleaned and bounded before they are decoded into rmcp's model.
//!
//! A session reaches only the upstreams its grants open: those with at least one tool in its
//! catalog (see `GatewayServer::reachable`). The prompts and resources of any other upstream
//! are neither listed nor served to it — relaying is not a way around the grants.

use crate::mediate::{self, Mediated};
use crate::pin::PinVerdict;
use crate::rpc::RpcError;
use crate::upstream::Upstream;
use rmcp::model::ErrorData;
use serde_json::{Value, json};
use std::sync::Arc;

fn has(up: &Upstream, capability: &str) -> bool {
    up.capabilities()
        .get(capability)
        .is_some_and(|c| !c.is_null())
}

fn to_error(e: RpcError) -> ErrorData {
    match e {
        RpcError::Remote {
            code,
            message,
            data,
        } => ErrorData::new(rmcp::model::ErrorCode(code as i32), message, data),
        other => ErrorData::internal_error(other.to_string(), None),
    }
}

/// Which capabilities the downstream server declares: those some reachable upstream offers.
pub fn capabilities(reach: &[Arc<Upstream>]) -> Value {
    let mut caps = json!({"tools": {"listChanged": true}});
    for up in reach {
        let c = up.capabilities();
        if c.get("prompts").is_some_and(|v| !v.is_null()) {
            caps["prompts"] = json!({"listChanged": false});
        }
        if let Some(r) = c.get("resources").filter(|v| !v.is_null()) {
            let subscribe = r.get("subscribe").and_then(Value::as_bool).unwrap_or(false)
                || caps
                    .pointer("/resources/subscribe")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
            caps["resources"] = json!({"subscribe": subscribe, "listChanged": false});
        }
        if c.get("completions").is_some_and(|v| !v.is_null()) {
            caps["completions"] = json!({});
        }
        if c.get("logging").is_some_and(|v| !v.is_null()) {
            caps["logging"] = json!({});
        }
    }
    caps
}

/// Every item of every page of a list method, from every reachable upstream with the
/// capability.
async fn list_all(
    reach: &[Arc<Upstream>],
    capability: &str,
    method: &str,
    key: &str,
) -> Result<Vec<(Arc<Upstream>, Value)>, ErrorData> {
    let mut out = Vec::new();
    for up in reach {
        if !has(up, capability) {
            continue;
        }
        let mut cursor: Option<Value> = None;
        for _ in 0..crate::limits::LIST_PAGES_MAX {
            let params = cursor.as_ref().map(|c| json!({"cursor": c}));
            let page = up.passthrough(method, params).await.map_err(to_error)?;
            for item in page
                .get(key)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
            {
                out.push((Arc::clone(up), item));
            }
            match page.get("nextCursor") {
                Some(c) if !c.is_null() => cursor = Some(c.clone()),
                _ => break,
            }
        }
    }
    Ok(out)
}

/// The prompts of every reachable upstream's pinned listing, cleaned; quarantined ones left out.
pub async fn list_prompts(reach: &[Arc<Upstream>]) -> Result<Value, ErrorData> {
    let mut prompts = Vec::new();
    for up in reach {
        let Some(listing) = up.listing() else {
            continue;
        };
        prompts.extend(
            listing
                .prompts
                .iter()
                .filter(|p| !matches!(p.verdict, PinVerdict::Quarantined(_)))
                .map(|p| p.clean.clone()),
        );
    }
    Ok(json!({"prompts": prompts}))
}

/// The upstream and own name of an exposed prompt; a quarantined prompt is refused with why.
async fn prompt_owner(
    reach: &[Arc<Upstream>],
    exposed: &str,
) -> Result<(Arc<Upstream>, String), ErrorData> {
    for up in reach {
        let Some(listing) = up.listing() else {
            continue;
        };
        if let Some(p) = listing.prompts.iter().find(|p| p.exposed == exposed) {
            if let PinVerdict::Quarantined(why) = &p.verdict {
                return Err(ErrorData::invalid_params(
                    format!(
                        "prompt {exposed:?} is quarantined: {why}. A person must approve it with `ring0 approve-tool {exposed}`"
                    ),
                    None,
                ));
            }
            return Ok((Arc::clone(up), p.name.clone()));
        }
    }
    Err(ErrorData::invalid_params(
        format!("unknown prompt {exposed:?}"),
        None,
    ))
}

/// The mediated message, with what mediation did said in ring0's log and recorded in the audit
/// log.
fn noted(up: &Upstream, what: &str, (value, report): (Value, Mediated)) -> Value {
    if let Some(summary) = report.summary() {
        up.note(&format!("{what}: {summary}"));
        let rule = if report.cut > 0 {
            "mediate:cut"
        } else {
            "mediate:cleaned"
        };
        up.audit_mediation(what, rule, ring0_policy::AuditDecision::Allowed, &summary);
    }
    value
}

pub async fn get_prompt(
    reach: &[Arc<Upstream>],
    name: &str,
    arguments: Option<Value>,
) -> Result<Value, ErrorData> {
    let (up, own) = prompt_owner(reach, name).await?;
    let mut params = json!({"name": own});
    if let Some(a) = arguments {
        params["arguments"] = a;
    }
    let raw = up
        .passthrough("prompts/get", Some(params))
        .await
        .map_err(to_error)?;
    Ok(noted(&up, &format!("prompt {name}"), mediate::prompt(&raw)))
}

pub async fn list_resources(
    reach: &[Arc<Upstream>],
    method: &str,
    key: &str,
) -> Result<Value, ErrorData> {
    let items: Vec<Value> = list_all(reach, "resources", method, key)
        .await?
        .into_iter()
        .map(|(up, v)| noted(&up, method, mediate::listing_item(&v)))
        .collect();
    Ok(json!({key: items}))
}

fn template_matches(template: &str, uri: &str) -> bool {
    let Some(open) = template.find('{') else {
        return template == uri;
    };
    let close = template.rfind('}').unwrap_or(open);
    let (prefix, suffix) = (&template[..open], &template[close + 1..]);
    uri.len() >= prefix.len() + suffix.len() && uri.starts_with(prefix) && uri.ends_with(suffix)
}

/// The reachable upstream that owns a resource URI.
async fn resource_owner(reach: &[Arc<Upstream>], uri: &str) -> Result<Arc<Upstream>, ErrorData> {
    for (up, r) in list_all(reach, "resources", "resources/list", "resources").await? {
        if r.get("uri").and_then(Value::as_str) == Some(uri) {
            return Ok(up);
        }
    }
    for (up, t) in list_all(
        reach,
        "resources",
        "resources/templates/list",
        "resourceTemplates",
    )
    .await?
    {
        if t.get("uriTemplate")
            .and_then(Value::as_str)
            .is_some_and(|tpl| template_matches(tpl, uri))
        {
            return Ok(up);
        }
    }
    let with: Vec<&Arc<Upstream>> = reach.iter().filter(|u| has(u, "resources")).collect();
    match with.as_slice() {
        [only] => Ok(Arc::clone(only)),
        _ => Err(ErrorData::resource_not_found(
            format!("no upstream lists the resource {uri}"),
            None,
        )),
    }
}

/// A resource request to the upstream that serves `uri`. A `resources/read` text cut for size
/// is kept whole in the upstream's spill store, sealed for `reader`'s session.
pub async fn resource_request(
    reach: &[Arc<Upstream>],
    method: &str,
    uri: &str,
    reader: SpillReader<'_>,
) -> Result<Value, ErrorData> {
    let up = resource_owner(reach, uri).await?;
    let raw = up
        .passthrough(method, Some(json!({"uri": uri})))
        .await
        .map_err(to_error)?;
    Ok(match method {
        "resources/read" => noted(
            &up,
            &format!("resource {uri}"),
            mediate::resource(
                &raw,
                up.spill().map(|store| mediate::Keep {
                    store,
                    owner: reader.owner,
                    reader: reader.can_page,
                }),
            ),
        ),
        _ => raw,
    })
}

/// The session a resource is read for: its spill owner, and whether it may call `read_spill`.
#[derive(Clone, Copy)]
pub struct SpillReader<'a> {
    pub owner: &'a str,
    pub can_page: bool,
}

pub async fn complete(reach: &[Arc<Upstream>], mut params: Value) -> Result<Value, ErrorData> {
    let kind = params
        .pointer("/ref/type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let up = if kind == "ref/prompt" {
        let name = params
            .pointer("/ref/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let (up, own) = prompt_owner(reach, &name).await?;
        params["ref"]["name"] = Value::String(own);
        up
    } else {
        let uri = params
            .pointer("/ref/uri")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        resource_owner(reach, &uri).await?
    };
    let raw = up
        .passthrough("completion/complete", Some(params))
        .await
        .map_err(to_error)?;
    Ok(noted(&up, "completion", mediate::completion(&raw)))
}

pub async fn set_level(reach: &[Arc<Upstream>], level: Value) -> Result<(), ErrorData> {
    for up in reach {
        if has(up, "logging") {
            up.passthrough("logging/setLevel", Some(json!({"level": level})))
                .await
                .map_err(to_error)?;
        }
    }
    Ok(())
}
