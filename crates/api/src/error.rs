//! The error envelope every `/v1` refusal is answered with: the shape of a call's rejection
//! (`status`, `message`, located `errors`, `advice`), so a host reads a refused request the way
//! it reads a refused call. A refused request changed nothing.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// Why a request was refused; decides the HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// No such session, turn, pending action, intent or held call for this principal (404).
    NotFound,
    /// The body is not JSON ring0 accepts: malformed, a repeated key, an integer beyond ±2^53
    /// (400).
    InvalidJson,
    /// The body is JSON but not what the endpoint takes; `errors` locates each problem (422).
    ValidationError,
    /// The model's message cannot be read in its format (422; `errors[0].loc` is where).
    InvalidTurn,
    /// The body is larger than the API accepts (413).
    PayloadTooLarge,
    /// The body is not of the media type the route takes: `application/json`, or a streamed
    /// turn's `text/event-stream` / `application/x-ndjson` (415).
    UnsupportedMediaType,
    /// A bound was reached: sessions, open turns, event streams (429).
    LimitExceeded,
    /// The request conflicts with the session's state: a tool name taken, tools changed while
    /// a turn is open, an action already answered (409).
    Conflict,
    /// No route here (404).
    NoRoute,
    /// The route does not take this method (405).
    MethodNotAllowed,
    /// The request carries no principal (401): never reached behind the listener's gate.
    Unauthenticated,
    /// The principal may not do this (403): deciding a held call takes the operator role.
    Forbidden,
    /// The journal could not be read or written (503); nothing was changed.
    Unavailable,
}

impl ErrorKind {
    fn http(self) -> StatusCode {
        match self {
            Self::NotFound | Self::NoRoute => StatusCode::NOT_FOUND,
            Self::InvalidJson => StatusCode::BAD_REQUEST,
            Self::ValidationError | Self::InvalidTurn => StatusCode::UNPROCESSABLE_ENTITY,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::LimitExceeded => StatusCode::TOO_MANY_REQUESTS,
            Self::Conflict => StatusCode::CONFLICT,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn advice(self) -> &'static str {
        match self {
            Self::NotFound => {
                "use an id returned to your principal (a session's from POST /v1/sessions)"
            }
            Self::InvalidJson => "send one well-formed JSON document without repeated keys",
            Self::ValidationError => "correct the fields named in errors and send it again",
            Self::InvalidTurn => {
                "send the model's message or output items as the provider returned them"
            }
            Self::PayloadTooLarge => "send a smaller body",
            Self::UnsupportedMediaType => "send the body as application/json",
            Self::LimitExceeded => "finish or delete what is open, then try again",
            Self::Conflict => "read the session's state and send a request that fits it",
            Self::NoRoute | Self::MethodNotAllowed => {
                "see /v1/openapi.json for the routes and their methods"
            }
            Self::Unauthenticated => "send a bearer credential",
            Self::Forbidden => "ask a principal with the operator role",
            Self::Unavailable => "try again once the journal is back",
        }
    }
}

/// One problem with one part of a request, located by a JSON pointer into the body.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct FieldProblem {
    /// JSON pointer into the request body (`""` is the whole body; for a turn, into `message`
    /// as the provider format names it, e.g. `$.tool_calls[0].id`).
    pub loc: String,
    /// What is wrong there.
    pub message: String,
}

/// The body of every refused request.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ApiError {
    /// Why, in one word; decides the HTTP status.
    pub status: ErrorKind,
    /// What was refused, bounded.
    pub message: String,
    /// Each problem and where it is, when the request's content is at fault.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldProblem>,
    /// What to do about it.
    pub advice: String,
}

impl ApiError {
    /// A refusal of `status`, its message cut to the rejection text bound.
    pub fn new(status: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            status,
            message: ring0_core::limits::clip_with_length(
                &message.into(),
                ring0_core::limits::REJECTION_TEXT_BYTES_MAX,
            )
            .into_owned(),
            errors: Vec::new(),
            advice: status.advice().to_string(),
        }
    }

    /// Names where the problem is.
    pub fn at(mut self, loc: impl Into<String>, message: impl Into<String>) -> Self {
        self.errors.push(FieldProblem {
            loc: loc.into(),
            message: message.into(),
        });
        self
    }

    /// Nothing of that name for this principal.
    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, what)
    }

    /// One located problem with the request's content.
    pub fn invalid(loc: impl Into<String>, message: impl Into<String>) -> Self {
        let message = message.into();
        Self::new(ErrorKind::ValidationError, message.clone()).at(loc, message)
    }

    /// The request does not fit the session's state.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, message)
    }

    /// A bound was reached.
    pub fn limit(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::LimitExceeded, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status.http(), axum::Json(self)).into_response()
    }
}
