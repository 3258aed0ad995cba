//! Where ring0's `tracing` spans and events go: log lines on stderr, and traces over OTLP.
//!
//! The kernel and the gateway only emit `tracing` spans (the stages of a call, the MCP
//! `tools/call`) and events (log lines); this module is the one place that decides what
//! becomes of them, so neither knows an exporter exists:
//! - **log lines**: events of ring0's own crates at or above the level asked for, to stderr,
//!   as `ring0: message` ([`LogFormat::Text`], what a person reads) or one JSON object per line
//!   with `timestamp`, `level`, `target` and `message` ([`LogFormat::Json`], what a log
//!   pipeline reads). Spans never print; of other crates' events only the exporter's warnings
//!   and errors do (a collector that cannot be reached is said, not silently lost).
//! - **traces**, only when configured ([`TracesConfig`]: `[telemetry]` or the standard
//!   `OTEL_EXPORTER_OTLP_*` variables): ring0's spans become OpenTelemetry spans
//!   (`tracing-opentelemetry`), batched (at most [`SPANS_QUEUED_MAX`] waiting; more are
//!   dropped, never waited for) and exported over OTLP/HTTP with protobuf bodies. Events
//!   never reach a span: a log line may quote what a person was shown of a call's arguments
//!   (an approval prompt), and spans carry identities and states only.
//!
//! [`Telemetry::install`] sets the process's subscriber once; [`Telemetry::shutdown`] (or
//! dropping it) exports what is still queued, within [`SHUTDOWN_TIMEOUT`].

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider,
};
use std::collections::HashMap;
use std::fmt;
use std::time::Duration;
use tracing::{Level, Metadata};
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};

/// Spans waiting for export at most; a span finished while the queue is full is dropped (and
/// counted by the SDK), so a collector that is down never holds up a call or grows memory.
pub const SPANS_QUEUED_MAX: usize = 2048;
/// Spans sent in one export request at most.
pub const SPANS_PER_EXPORT_MAX: usize = 512;
/// How long one export request may take before it is abandoned.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`Telemetry::shutdown`] waits for the last spans to be exported.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
/// The `tracing` targets whose spans and events are ring0's (every crate is `ring0_*`, and
/// the gateway's log is `ring0`).
const OWN_TARGET_PREFIX: &str = "ring0";
/// The `tracing` targets of the OpenTelemetry SDK and exporter, whose warnings are logged.
const EXPORTER_TARGET_PREFIX: &str = "opentelemetry";
/// The service name spans are exported under unless `[telemetry] service_name` or
/// `OTEL_SERVICE_NAME` says otherwise.
const SERVICE_NAME_DEFAULT: &str = "ring0";

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// `ring0: message`, one line per event.
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and any other
    /// field of the event.
    Json,
}

/// Where traces go, from `[telemetry]` and the environment.
#[derive(Debug, Clone)]
pub struct TracesConfig {
    /// The OTLP/HTTP traces URL (`http://collector:4318/v1/traces`). `None`: the standard
    /// variables decide (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as is, else
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`), and without them traces are off.
    pub endpoint: Option<String>,
    /// Request headers (name, value), values already read from where the configuration said;
    /// `OTEL_EXPORTER_OTLP_TRACES_HEADERS` / `OTEL_EXPORTER_OTLP_HEADERS` add to them.
    pub headers: Vec<(String, String)>,
    /// `service.name` of the exported spans; `None`: `OTEL_SERVICE_NAME`, else `ring0`.
    pub service_name: Option<String>,
    /// The fraction of new traces sampled, 0.0..=1.0; a trace a client started keeps its own
    /// decision (the `traceparent`'s sampled flag).
    pub sample_ratio: f64,
}

impl Default for TracesConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            headers: Vec::new(),
            service_name: None,
            sample_ratio: 1.0,
        }
    }
}

impl TracesConfig {
    /// Whether traces are exported: an endpoint is configured or named by the standard
    /// variables, and `OTEL_SDK_DISABLED` / `OTEL_TRACES_EXPORTER=none` do not turn them off.
    pub fn is_enabled(&self, env: impl Fn(&str) -> Option<String>) -> bool {
        let set = |name: &str| env(name).is_some_and(|v| !v.trim().is_empty());
        let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim() == "true")
            || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim() == "none");
        let endpoint = self.endpoint.is_some()
            || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            || set("OTEL_EXPORTER_OTLP_ENDPOINT");
        endpoint && !disabled
    }
}

/// The process's subscriber: log lines, and traces when configured.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Installs the process-wide subscriber: log lines at `level` and above in `format`, and
    /// an OTLP exporter when `traces` is enabled. Fails when a subscriber is already set or
    /// the exporter cannot be built (a malformed endpoint), naming why.
    pub fn install(
        format: LogFormat,
        level: Level,
        traces: Option<&TracesConfig>,
    ) -> Result<Self, String> {
        let provider = match traces.filter(|t| t.is_enabled(|k| std::env::var(k).ok())) {
            Some(config) => Some(provider(config)?),
            None => None,
        };
        let spans = provider.as_ref().map(|p| {
            tracing_opentelemetry::layer()
                .with_tracer(p.tracer("ring0"))
                .with_location(false)
                .with_threads(false)
                .with_target(false)
                .with_level(false)
                .with_tracked_inactivity(false)
                .with_filter(filter_fn(|m| m.is_span() && is_own(m)))
        });
        let subscriber = Registry::default()
            .with(spans)
            .with(log_layer(format, level));
        tracing::subscriber::set_global_default(subscriber)
            .map_err(|e| format!("installing the log subscriber: {e}"))?;
        Ok(Self { provider })
    }

    /// Runs `f` with log lines written as [`Telemetry::install`] would, before the process's
    /// subscriber is installed (while the configuration that says where traces go is read).
    pub fn scoped<T>(format: LogFormat, level: Level, f: impl FnOnce() -> T) -> T {
        let subscriber = Registry::default().with(log_layer(format, level));
        tracing::subscriber::with_default(subscriber, f)
    }

    /// Whether spans are exported.
    pub fn exports_traces(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports what is still queued, within [`SHUTDOWN_TIMEOUT`], and stops exporting.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT)
        {
            tracing::warn!(target: "ring0", "exporting the last spans: {e}");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.stop();
    }
}

fn is_own(meta: &Metadata<'_>) -> bool {
    meta.target().starts_with(OWN_TARGET_PREFIX)
}

/// The stderr layer: ring0's own events at `level` and above, and the exporter's warnings and
/// errors (a collector that cannot be reached is said, not silently lost); never spans.
fn log_layer<S>(format: LogFormat, level: Level) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    let wanted = move |m: &Metadata<'_>| {
        let exporter = m.target().starts_with(EXPORTER_TARGET_PREFIX) && *m.level() <= Level::WARN;
        m.is_event() && *m.level() <= level && (is_own(m) || exporter)
    };
    match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .event_format(PlainLine)
            .with_filter(filter_fn(wanted))
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .event_format(JsonLine)
            .with_filter(filter_fn(wanted))
            .boxed(),
    }
}

/// The exporter and its provider for `config`.
fn provider(config: &TracesConfig) -> Result<SdkTracerProvider, String> {
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(export_client()?)
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_timeout(EXPORT_TIMEOUT);
    if let Some(endpoint) = &config.endpoint {
        exporter = exporter.with_endpoint(endpoint.clone());
    }
    if !config.headers.is_empty() {
        let headers: HashMap<String, String> = config.headers.iter().cloned().collect();
        exporter = exporter.with_headers(headers);
    }
    let exporter = exporter
        .build()
        .map_err(|e| format!("[telemetry]: the OTLP exporter cannot be built: {e}"))?;
    let batch = BatchConfigBuilder::default()
        .with_max_queue_size(SPANS_QUEUED_MAX)
        .with_max_export_batch_size(SPANS_PER_EXPORT_MAX)
        .build();
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(batch)
        .build();
    let service_name = config
        .service_name
        .clone()
        .or_else(|| std::env::var("OTEL_SERVICE_NAME").ok())
        .unwrap_or_else(|| SERVICE_NAME_DEFAULT.to_string());
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service_name)
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    let root = if config.sample_ratio >= 1.0 {
        Sampler::AlwaysOn
    } else {
        Sampler::TraceIdRatioBased(config.sample_ratio.max(0.0))
    };
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(Sampler::ParentBased(Box::new(root)))
        .with_resource(resource)
        .build())
}

/// The exporter's HTTP client: rustls with the ring provider, no proxy read from the
/// environment (the collector is named explicitly), every request bounded by
/// [`EXPORT_TIMEOUT`]. Built on a thread of its own: a blocking client owns a runtime, which
/// must not be made (or dropped) inside the caller's.
fn export_client() -> Result<reqwest::blocking::Client, String> {
    // Installing twice is harmless: the first provider stays.
    let _ = rustls::crypto::ring::default_provider().install_default();
    std::thread::spawn(|| {
        reqwest::blocking::Client::builder()
            .no_proxy()
            .timeout(EXPORT_TIMEOUT)
            .build()
    })
    .join()
    .map_err(|_| "building the OTLP exporter's HTTP client panicked".to_string())?
    .map_err(|e| format!("building the OTLP exporter's HTTP client: {e}"))
}

/// `ring0: message`, then any other field as ` name=value`: the line ring0 has always
/// printed.
struct PlainLine;

impl<S, N> FormatEvent<S, N> for PlainLine
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        let fields = EventFields::of(event);
        let mut line = fields.message();
        for (name, value) in fields.rest() {
            line.push_str(&format!(" {name}={value}"));
        }
        writeln!(writer, "ring0: {}", line.trim_start())
    }
}

/// One JSON object: `timestamp` (RFC 3339, UTC), `level`, `target`, `message`, then the
/// event's other fields. Every line has a `message`: an event without one (the exporter's
/// warnings are named, not worded) is given its `name`.
struct JsonLine;

impl<S, N> FormatEvent<S, N> for JsonLine
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        let mut timestamp = String::new();
        tracing_subscriber::fmt::time::FormatTime::format_time(
            &tracing_subscriber::fmt::time::SystemTime,
            &mut Writer::new(&mut timestamp),
        )?;
        let meta = event.metadata();
        let fields = EventFields::of(event);
        let mut object = serde_json::Map::new();
        object.insert("timestamp".into(), timestamp.into());
        object.insert("level".into(), meta.level().as_str().into());
        object.insert("target".into(), meta.target().into());
        object.insert("message".into(), fields.message().into());
        for (name, value) in fields.rest() {
            object
                .entry(name.to_string())
                .or_insert(value.clone().into());
        }
        writeln!(writer, "{}", serde_json::Value::Object(object))
    }
}

/// An event's fields as text, in the order they were recorded.
#[derive(Default)]
struct EventFields(Vec<(&'static str, String)>);

impl EventFields {
    fn of(event: &tracing::Event<'_>) -> Self {
        let mut fields = Self::default();
        event.record(&mut fields);
        fields
    }

    /// The `message`, else the event's `name`, else nothing.
    fn message(&self) -> String {
        let get = |key: &str| {
            self.0
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
        };
        get("message").or_else(|| get("name")).unwrap_or_default()
    }

    /// Every field but `message` (and `name` when it stands for the message).
    fn rest(&self) -> impl Iterator<Item = (&'static str, &String)> {
        let named = !self.0.iter().any(|(k, _)| *k == "message");
        self.0
            .iter()
            .filter(move |(k, _)| *k != "message" && !(named && *k == "name"))
            .map(|(k, v)| (*k, v))
    }
}

impl tracing::field::Visit for EventFields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push((field.name(), value.to_string()));
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        self.0.push((field.name(), format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn traces_are_off_unless_an_endpoint_is_named() {
        let none = TracesConfig::default();
        assert!(!none.is_enabled(env(&[])));
        assert!(none.is_enabled(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")])));
        assert!(none.is_enabled(env(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://c:4318/v1/traces"
        )])));
        assert!(!none.is_enabled(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])));
        let configured = TracesConfig {
            endpoint: Some("http://c:4318/v1/traces".into()),
            ..TracesConfig::default()
        };
        assert!(configured.is_enabled(env(&[])));
        assert!(!configured.is_enabled(env(&[("OTEL_SDK_DISABLED", "true")])));
        assert!(!configured.is_enabled(env(&[("OTEL_TRACES_EXPORTER", "none")])));
    }
}
