//! The `/v1` handlers. Each reads its body whole (bounded, strict JSON, then the typed request
//! with every problem located), checks it against the session's state, and only then changes
//! anything: a refused request changed nothing.

use crate::Api;
use crate::error::{ApiError, ErrorKind};
use crate::limits::{
    BODY_BYTES_MAX, GRANT_PATTERNS_MAX, SCOPE_BYTES_MAX, STREAM_BYTES_MAX, STREAM_DURATION_MAX,
    STREAM_FEED_BUFFER, STREAM_IDLE_TIMEOUT, STREAM_TURN_ID_BYTES_MAX, TURN_WAIT_MS_DEFAULT,
    TURN_WAIT_MS_MAX, TURNS_OPEN_PER_SESSION_MAX,
};
use crate::model::{
    CreateSession, Outcomes, PutTools, SessionCreated, SessionDeleted, ToolListing, Tools,
    TurnFormat, TurnRequest, TurnResponse, TurnStatus,
};
use crate::session::{ApiSession, Settings};
use crate::turn::{Feed, Finished, Turn};
use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ring0_core::Principal;
use ring0_kernel::RepeatLimits;
use ring0_kernel::policy::ToolPattern;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// Most concurrent calls a session may ask for.
const SESSION_CONCURRENCY_MAX: usize = 64;
/// Bounds of the repeat limits a session may ask for.
const REPEAT_ADVISORY_MIN: u32 = 2;
const REPEAT_LIMIT_MAX: u32 = 100;

/// The principal the listener's gate authenticated; fails closed without one.
pub(crate) fn principal(found: Option<Extension<Principal>>) -> Result<Principal, ApiError> {
    found.map(|Extension(p)| p).ok_or_else(|| {
        ApiError::new(
            ErrorKind::Unauthenticated,
            "the request carries no principal",
        )
    })
}

/// The journal could not be read or written: nothing was changed.
pub(crate) fn journal_unavailable(e: ring0_journal::JournalError) -> ApiError {
    ApiError::new(ErrorKind::Unavailable, format!("the journal: {e}"))
}

/// The body as `T`, or where it is wrong. An empty body is `{}` when `empty_is_object`.
pub(crate) async fn read_json<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    empty_is_object: bool,
) -> Result<T, ApiError> {
    let bytes = axum::body::to_bytes(body, BODY_BYTES_MAX)
        .await
        .map_err(|_| {
            ApiError::new(
                ErrorKind::PayloadTooLarge,
                format!("the body is larger than {BODY_BYTES_MAX} bytes or could not be read"),
            )
        })?;
    let text = if bytes.is_empty() && empty_is_object {
        "{}"
    } else {
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return Err(ApiError::new(
                ErrorKind::UnsupportedMediaType,
                "the body must be application/json",
            ));
        }
        std::str::from_utf8(&bytes)
            .map_err(|_| ApiError::new(ErrorKind::InvalidJson, "the body is not UTF-8"))?
    };
    let value = ring0_core::parse_strict(text)
        .map_err(|e| ApiError::new(ErrorKind::InvalidJson, format!("the body: {e}")))?;
    serde_path_to_error::deserialize(value).map_err(|e| {
        let loc = pointer(e.path());
        let why = e.into_inner().to_string();
        ApiError::invalid(loc, why)
    })
}

/// A serde path as a JSON pointer.
fn pointer(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("/{index}")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                out.push('/');
                out.push_str(&key.replace('~', "~0").replace('/', "~1"));
            }
            Segment::Unknown => {}
        }
    }
    out
}

fn wait_of(wait_ms: Option<u64>) -> Result<Duration, ApiError> {
    match wait_ms {
        None => Ok(Duration::from_millis(TURN_WAIT_MS_DEFAULT)),
        Some(ms) if ms <= TURN_WAIT_MS_MAX => Ok(Duration::from_millis(ms)),
        Some(ms) => Err(ApiError::invalid(
            "/wait_ms",
            format!("{ms} is above {TURN_WAIT_MS_MAX}"),
        )),
    }
}

/// The settings a creation request asks for, checked.
fn settings(
    id: &str,
    request: CreateSession,
    default_concurrency: usize,
) -> Result<Settings, ApiError> {
    let scope = request.scope.unwrap_or_else(|| id.to_string());
    if scope.is_empty() || scope.len() > SCOPE_BYTES_MAX {
        return Err(ApiError::invalid(
            "/scope",
            format!("a scope is 1 to {SCOPE_BYTES_MAX} bytes"),
        ));
    }
    let grants = request.grants.unwrap_or_default();
    let tools = match grants.tools {
        Some(tools) if tools.len() > GRANT_PATTERNS_MAX => {
            return Err(ApiError::invalid(
                "/grants/tools",
                format!("at most {GRANT_PATTERNS_MAX} patterns"),
            ));
        }
        Some(tools) => Some(tools.into_iter().map(ToolPattern).collect()),
        None => None,
    };
    let limits = request.limits.unwrap_or_default();
    let max_concurrent_tools = match limits.max_concurrent_tools {
        None => default_concurrency,
        Some(n) if (1..=SESSION_CONCURRENCY_MAX).contains(&n) => n,
        Some(n) => {
            return Err(ApiError::invalid(
                "/limits/max_concurrent_tools",
                format!("{n} is outside 1..={SESSION_CONCURRENCY_MAX}"),
            ));
        }
    };
    let mut repeat = RepeatLimits::default();
    if let Some(a) = limits.repeat_advisory {
        repeat.advisory = a;
    }
    if let Some(t) = limits.repeat_terminate {
        repeat.terminate = t;
    }
    if repeat.advisory < REPEAT_ADVISORY_MIN
        || repeat.terminate > REPEAT_LIMIT_MAX
        || repeat.advisory >= repeat.terminate
    {
        return Err(ApiError::invalid(
            "/limits",
            format!(
                "repeat limits need {REPEAT_ADVISORY_MIN} <= repeat_advisory < repeat_terminate <= {REPEAT_LIMIT_MAX} (got {} and {})",
                repeat.advisory, repeat.terminate
            ),
        ));
    }
    Ok(Settings {
        format: request.format.unwrap_or(crate::model::TurnFormat::Openai),
        mode: request.mode.unwrap_or_default(),
        scope,
        tools,
        ceiling: grants.ceiling.map(|c| c.core()),
        max_concurrent_tools,
        repeat,
    })
}

/// Creates a session for the calling principal.
#[utoipa::path(post, path = "/v1/sessions", tag = "sessions",
    request_body(content = CreateSession, description = "May be empty: every field has a default"),
    responses(
        (status = 201, body = SessionCreated),
        (status = 400, body = ApiError), (status = 413, body = ApiError),
        (status = 415, body = ApiError), (status = 422, body = ApiError),
        (status = 429, body = ApiError),
    ))]
pub(crate) async fn create_session(
    State(api): State<Api>,
    who: Option<Extension<Principal>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let principal = principal(who)?;
    let request: CreateSession = read_json(&headers, body, true).await?;
    let id = format!("ses_{}", uuid::Uuid::new_v4().simple());
    let settings = settings(&id, request, api.inner.parts.gateway.max_concurrent_tools())?;
    let session = api
        .inner
        .sessions
        .add(ApiSession::new(id, principal, settings))?;
    let s = &session.settings;
    let created = SessionCreated {
        id: session.id.clone(),
        principal: session.principal.id.clone(),
        scope: s.scope.clone(),
        format: s.format,
        mode: s.mode,
    };
    Ok((StatusCode::CREATED, axum::Json(created)).into_response())
}

/// Deletes a session: its open turns are cancelled, its host tools' waiting calls told.
#[utoipa::path(delete, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 200, body = SessionDeleted), (status = 404, body = ApiError)))]
pub(crate) async fn delete_session(
    State(api): State<Api>,
    who: Option<Extension<Principal>>,
    Path(id): Path<String>,
) -> Result<axum::Json<SessionDeleted>, ApiError> {
    let principal = principal(who)?;
    let session = api.inner.sessions.remove(&principal, &id)?;
    let turns_cancelled = session.end();
    Ok(axum::Json(SessionDeleted {
        id,
        turns_cancelled,
    }))
}

/// Registers the session's host tools, replacing any before.
#[utoipa::path(put, path = "/v1/sessions/{id}/tools", tag = "tools",
    params(("id" = String, Path)),
    request_body = PutTools,
    responses(
        (status = 200, body = Tools),
        (status = 400, body = ApiError), (status = 404, body = ApiError),
        (status = 409, body = ApiError), (status = 413, body = ApiError),
        (status = 415, body = ApiError), (status = 422, body = ApiError),
        (status = 429, body = ApiError),
    ))]
pub(crate) async fn put_tools(
    State(api): State<Api>,
    who: Option<Extension<Principal>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<Tools>, ApiError> {
    let principal = principal(who)?;
    let session = api.inner.sessions.get(&principal, &id)?;
    let request: PutTools = read_json(&headers, body, false).await?;
    session
        .set_host_tools(&api.inner.parts, &request.tools)
        .await?;
    list(&api, &session).await.map(axum::Json)
}

/// The tools the session may call: its host tools and ring0's, under its grants.
#[utoipa::path(get, path = "/v1/sessions/{id}/tools", tag = "tools",
    params(("id" = String, Path)),
    responses((status = 200, body = Tools), (status = 404, body = ApiError)))]
pub(crate) async fn get_tools(
    State(api): State<Api>,
    who: Option<Extension<Principal>>,
    Path(id): Path<String>,
) -> Result<axum::Json<Tools>, ApiError> {
    let principal = principal(who)?;
    let session = api.inner.sessions.get(&principal, &id)?;
    list(&api, &session).await.map(axum::Json)
}

async fn list(api: &Api, session: &ApiSession) -> Result<Tools, ApiError> {
    let kernel_session = session.kernel_session(&api.inner.parts).await?;
    let host = session.host_names().await;
    let quarantined = api.inner.parts.gateway.generation().quarantined.clone();
    let tools = kernel_session
        .catalog()
        .into_iter()
        .filter(|spec| !quarantined.contains_key(&spec.name))
        .map(|spec| ToolListing {
            name: spec.name.clone(),
            description: spec.description.clone(),
            input_schema: spec.input_schema.clone(),
            host: host.contains(&spec.name),
        })
        .collect();
    Ok(Tools { tools })
}

/// Mediates one model turn: ring0's tools run now; host tools and approvals come back pending.
#[utoipa::path(post, path = "/v1/sessions/{id}/turns", tag = "turns",
    params(("id" = String, Path)),
    request_body = TurnRequest,
    responses(
        (status = 200, body = TurnResponse),
        (status = 400, body = ApiError), (status = 404, body = ApiError),
        (status = 413, body = ApiError), (status = 415, body = ApiError),
        (status = 422, body = ApiError), (status = 429, body = ApiError),
    ))]
pub(crate) async fn post_turn(
    State(api): State<Api>,
    who: Option<Extension<Principal>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let principal = principal(who)?;
    let session = api.inner.sessions.get(&principal, &id)?;
    let request: TurnRequest = read_json(&headers, body, false).await?;
    let wait = wait_of(request.wait_ms)?;
    let format = request.format.unwrap_or(session.settings.format).provider();
    let round = ring0_core::format::parse_turn(format, &request.message).map_err(|e| {
        ApiError::new(ErrorKind::InvalidTurn, e.to_string()).at(e.path.clone(), e.why.clone())
    })?;
    let kernel_session = session.kernel_session(&api.inner.parts).await?;
    let turn = open_turn(&session, |id| {
        Turn::start(id, kernel_session, format, round, session.events.clone())
    })?;
    let (view, finished) = turn.progress(wait).await;
    Ok(respond(view, finished))
}

/// Starts a turn of `session` under the next turn id, within the bound of open turns.
fn open_turn(
    session: &ApiSession,
    start: impl FnOnce(String) -> Arc<Turn>,
) -> Result<Arc<Turn>, ApiError> {
    let mut turns = session.turns.lock().expect("turns");
    if turns.open() >= TURNS_OPEN_PER_SESSION_MAX {
        return Err(ApiError::limit(format!(
            "{TURNS_OPEN_PER_SESSION_MAX} turns of this session are open; report their outcomes first"
        )));
    }
    turns.trim();
    turns.started += 1;
    let turn_id = format!("turn_{:06}", turns.started);
    let turn = start(turn_id.clone());
    turns.by_id.insert(turn_id, turn.clone());
    Ok(turn)
}

/// How a streamed turn's body frames the provider's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// `text/event-stream`: each event's `data` (OpenAI's `[DONE]` ends the stream).
    Sse,
    /// `application/x-ndjson` (or `application/jsonl`): one event per line.
    Ndjson,
}

fn framing_of(headers: &HeaderMap) -> Result<Framing, ApiError> {
    let media = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase());
    match media.as_deref() {
        Some("text/event-stream") => Ok(Framing::Sse),
        Some("application/x-ndjson" | "application/jsonl") => Ok(Framing::Ndjson),
        _ => Err(ApiError::new(
            ErrorKind::UnsupportedMediaType,
            "a streamed turn's body is text/event-stream or application/x-ndjson",
        )),
    }
}

/// The query of a streamed turn.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct StreamQuery {
    /// The provider format of the events. Default: the session's format.
    pub format: Option<TurnFormat>,
    /// How long to wait, once the stream has ended, for the turn to finish or to need the host,
    /// in milliseconds (at most 300000). Default 60000.
    pub wait_ms: Option<u64>,
    /// The model decision the stream belongs to (e.g. the provider's response id): a retry of
    /// the same decision that re-emits a call already started early does not run it again.
    /// Default: this turn's own id. At most 256 bytes.
    pub turn_id: Option<String>,
    /// The agent loop's step within `turn_id`. Default 0.
    pub iteration: Option<u64>,
}

impl StreamQuery {
    fn parse(query: Option<&str>) -> Result<Self, ApiError> {
        let mut q = Self::default();
        for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            let number = |what: &str| {
                value.parse::<u64>().map_err(|_| {
                    ApiError::invalid(key.to_string(), format!("{value:?} is not {what}"))
                })
            };
            match key.as_ref() {
                "format" => {
                    q.format = Some(
                        serde_json::from_value(Value::String(value.to_string())).map_err(|_| {
                            ApiError::invalid(
                                "format",
                                format!("{value:?} is not openai, responses or anthropic"),
                            )
                        })?,
                    );
                }
                "wait_ms" => q.wait_ms = Some(number("a whole number of milliseconds")?),
                "iteration" => q.iteration = Some(number("a whole number")?),
                "turn_id" if value.is_empty() || value.len() > STREAM_TURN_ID_BYTES_MAX => {
                    return Err(ApiError::invalid(
                        "turn_id",
                        format!("a turn id is 1 to {STREAM_TURN_ID_BYTES_MAX} bytes"),
                    ));
                }
                "turn_id" => q.turn_id = Some(value.to_string()),
                _ => {
                    return Err(ApiError::invalid(
                        "",
                        format!(
                            "unknown query parameter {key:?}; format, wait_ms, turn_id and iteration are taken"
                        ),
                    ));
                }
            }
        }
        Ok(q)
    }
}

/// Mediates one model turn as the provider streams it: each call is decided the moment its
/// block is complete, and a call that may start early (a neutral host tool marked `early`, or
/// a tool so configured) runs while the stream goes on. Answers like a turn once the stream
/// has ended.
#[utoipa::path(post, path = "/v1/sessions/{id}/turns/stream", tag = "turns",
    params(("id" = String, Path), StreamQuery),
    request_body(
        description = "The provider's stream events, as server-sent events or one JSON event per line",
        content(
            (String = "text/event-stream"),
            (String = "application/x-ndjson"),
        ),
    ),
    responses(
        (status = 200, body = TurnResponse),
        (status = 400, body = ApiError), (status = 404, body = ApiError),
        (status = 415, body = ApiError), (status = 422, body = ApiError),
        (status = 429, body = ApiError),
    ))]
pub(crate) async fn post_turn_stream(
    State(api): State<Api>,
    who: Option<Extension<Principal>>,
    Path(id): Path<String>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let principal = principal(who)?;
    let session = api.inner.sessions.get(&principal, &id)?;
    let query = StreamQuery::parse(uri.query())?;
    let framing = framing_of(&headers)?;
    let wait = wait_of(query.wait_ms)?;
    let format = query.format.unwrap_or(session.settings.format).provider();
    let kernel_session = session.kernel_session(&api.inner.parts).await?;
    let (feed, fed) = tokio::sync::mpsc::channel(STREAM_FEED_BUFFER);
    let turn = open_turn(&session, |id| {
        let identity = ring0_kernel::RoundIdentity::new(
            query.turn_id.unwrap_or_else(|| id.clone()),
            query.iteration.unwrap_or(0),
        );
        Turn::start_streaming(
            id,
            kernel_session,
            format,
            identity,
            fed,
            session.events.clone(),
        )
    })?;
    read_stream(framing, body, &feed).await;
    drop(feed);
    let (view, finished) = turn.progress(wait).await;
    Ok(respond(view, finished))
}

/// Reads a streamed turn's body into `feed`, an event at a time, until the stream ends, breaks
/// (unreadable, not JSON, too large, silent too long) or the round stops listening.
async fn read_stream(framing: Framing, body: Body, feed: &tokio::sync::mpsc::Sender<Feed>) {
    use futures::StreamExt;
    let bytes =
        http_body_util::BodyDataStream::new(http_body_util::Limited::new(body, STREAM_BYTES_MAX))
            .map(|chunk| chunk.map_err(std::io::Error::other));
    let mut events: futures::stream::BoxStream<'static, Result<Option<String>, String>> =
        match framing {
            Framing::Sse => sse_stream::SseStream::from_bytes_stream(bytes)
                .map(|event| event.map(|e| e.data).map_err(|e| e.to_string()))
                .boxed(),
            Framing::Ndjson => tokio_util::codec::FramedRead::new(
                tokio_util::io::StreamReader::new(bytes),
                tokio_util::codec::LinesCodec::new_with_max_length(STREAM_BYTES_MAX),
            )
            .map(|line| line.map(Some).map_err(|e| e.to_string()))
            .boxed(),
        };
    let ends = tokio::time::Instant::now() + STREAM_DURATION_MAX;
    let last = loop {
        let idle = tokio::time::Instant::now() + STREAM_IDLE_TIMEOUT;
        let next = match tokio::time::timeout_at(idle.min(ends), events.next()).await {
            Err(_) if idle < ends => {
                break Feed::Broken(format!("no event for {} s", STREAM_IDLE_TIMEOUT.as_secs()));
            }
            Err(_) => {
                break Feed::Broken(format!(
                    "the stream lasted past {} s",
                    STREAM_DURATION_MAX.as_secs()
                ));
            }
            Ok(next) => next,
        };
        let data = match next {
            None => break Feed::End,
            Some(Err(e)) => {
                break Feed::Broken(format!(
                    "the stream could not be read on (at most {STREAM_BYTES_MAX} bytes): {e}"
                ));
            }
            Some(Ok(None)) => continue,
            Some(Ok(Some(data))) => data,
        };
        let data = data.trim();
        if data.is_empty() {
            continue;
        }
        if framing == Framing::Sse && data == "[DONE]" {
            break Feed::End;
        }
        let event = match ring0_core::parse_strict(data) {
            Ok(event) => event,
            Err(e) => break Feed::Broken(format!("an event is not JSON: {e}")),
        };
        if feed.send(Feed::Event(event)).await.is_err() {
            return;
        }
    };
    let _ = feed.send(last).await;
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct WaitQuery {
    /// How long to wait for the turn to finish or to need the host, in milliseconds (at most
    /// 300000). Default 0: say where it stands now.
    #[allow(dead_code)]
    pub wait_ms: Option<u64>,
}

/// `wait_ms` of a query string (the only parameter taken).
fn wait_query(query: Option<&str>) -> Result<u64, ApiError> {
    let mut wait_ms = 0;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("wait_ms", value)) => {
                wait_ms = value.parse().map_err(|_| {
                    ApiError::invalid(
                        "wait_ms",
                        format!("{value:?} is not a whole number of milliseconds"),
                    )
                })?;
            }
            _ => {
                return Err(ApiError::invalid(
                    "",
                    format!("unknown query parameter {pair:?}; only wait_ms is taken"),
                ));
            }
        }
    }
    Ok(wait_ms)
}

/// Where a turn stands (its results once complete), waiting up to `wait_ms` for news.
#[utoipa::path(get, path = "/v1/sessions/{id}/turns/{turn}", tag = "turns",
    params(("id" = String, Path), ("turn" = String, Path), WaitQuery),
    responses(
        (status = 200, body = TurnResponse),
        (status = 400, body = ApiError), (status = 404, body = ApiError),
        (status = 422, body = ApiError),
    ))]
pub(crate) async fn get_turn(
    State(api): State<Api>,
    who: Option<Extension<Principal>>,
    Path((id, turn)): Path<(String, String)>,
    uri: axum::http::Uri,
) -> Result<Response, ApiError> {
    let principal = principal(who)?;
    let session = api.inner.sessions.get(&principal, &id)?;
    let wait = wait_of(Some(wait_query(uri.query())?))?;
    let turn = find_turn(&session, &turn)?;
    let (view, finished) = turn.progress(wait).await;
    Ok(respond(view, finished))
}

fn find_turn(session: &ApiSession, turn: &str) -> Result<Arc<Turn>, ApiError> {
    let turns = session.turns.lock().expect("turns");
    turns
        .by_id
        .get(turn)
        .cloned()
        .ok_or_else(|| ApiError::not_found(format!("no turn {turn:?} in this session")))
}

/// Reports what the host did with pending actions; answers like a turn.
#[utoipa::path(post, path = "/v1/sessions/{id}/turns/{turn}/outcomes", tag = "turns",
    params(("id" = String, Path), ("turn" = String, Path)),
    request_body = Outcomes,
    responses(
        (status = 200, body = TurnResponse),
        (status = 400, body = ApiError), (status = 404, body = ApiError),
        (status = 409, body = ApiError), (status = 413, body = ApiError),
        (status = 415, body = ApiError), (status = 422, body = ApiError),
    ))]
pub(crate) async fn post_outcomes(
    State(api): State<Api>,
    who: Option<Extension<Principal>>,
    Path((id, turn)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let principal = principal(who)?;
    let session = api.inner.sessions.get(&principal, &id)?;
    let turn = find_turn(&session, &turn)?;
    let request: Outcomes = read_json(&headers, body, false).await?;
    let wait = wait_of(request.wait_ms)?;
    if turn.is_finished() && !request.outcomes.is_empty() {
        return Err(ApiError::conflict(
            "the turn is complete: nothing waits for an outcome",
        ));
    }
    turn.board.answer(request.outcomes)?;
    let (view, finished) = turn.progress(wait).await;
    Ok(respond(view, finished))
}

/// The session's events as server-sent events: kernel events and `pending` / `turn_finished`.
#[utoipa::path(get, path = "/v1/sessions/{id}/events", tag = "sessions",
    params(("id" = String, Path)),
    responses(
        (status = 200, description = "An event stream of JSON events", content_type = "text/event-stream"),
        (status = 404, body = ApiError), (status = 429, body = ApiError),
    ))]
pub(crate) async fn events(
    State(api): State<Api>,
    who: Option<Extension<Principal>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let principal = principal(who)?;
    let session = api.inner.sessions.get(&principal, &id)?;
    match session.events.open() {
        Some(stream) => Ok(stream.into_response()),
        None => Err(ApiError::limit(format!(
            "{} event streams are open on this session already",
            crate::limits::EVENT_STREAMS_PER_SESSION_MAX
        ))),
    }
}

/// A turn's response; a complete one reports its results delivered once the body has left.
fn respond(view: TurnResponse, finished: Option<Arc<Finished>>) -> Response {
    let bytes = serde_json::to_vec(&view).expect("a turn response serializes");
    let body = match finished.filter(|_| view.status == TurnStatus::Complete) {
        Some(finished) => Body::new(ring0_mcp::delivery::DeliveringBody::new(
            bytes.into(),
            ring0_mcp::delivery::Delivery::new(move || finished.outcome.delivered()),
        )),
        None => Body::from(bytes),
    };
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

pub(crate) async fn no_route() -> ApiError {
    ApiError::new(ErrorKind::NoRoute, "no such route under /v1")
}

pub(crate) async fn no_method() -> Response {
    let mut r = ApiError::new(
        ErrorKind::MethodNotAllowed,
        "this route does not take that method",
    )
    .into_response();
    *r.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_is_the_only_query_parameter() {
        assert_eq!(wait_query(None).unwrap(), 0);
        assert_eq!(wait_query(Some("wait_ms=250")).unwrap(), 250);
        assert!(wait_query(Some("wait_ms=-1")).is_err());
        assert!(wait_query(Some("other=1")).is_err());
        assert!(wait_of(Some(TURN_WAIT_MS_MAX + 1)).is_err());
    }

    #[test]
    fn a_body_problem_is_located_by_a_json_pointer() {
        let value = serde_json::json!({"tools": [{"name": "x", "effect": "sometimes"}]});
        let e = serde_path_to_error::deserialize::<_, PutTools>(value).unwrap_err();
        assert_eq!(pointer(e.path()), "/tools/0/effect");
    }
}
