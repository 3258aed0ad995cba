//! Secret redaction: credentials in tool output replaced by a typed marker before a model reads
//! them.
//!
//! A tool that prints a private key, a bearer token or the value of an environment variable the
//! host keeps secret hands it to the model, and through the model to whoever reads the
//! conversation. This module finds such text and replaces it with `[redacted:KIND]`:
//! - PEM private-key blocks (`-----BEGIN … PRIVATE KEY-----` to its `END` line; an unterminated
//!   block is redacted to the end of the text) — `private_key`;
//! - JSON Web Tokens — `jwt`;
//! - AWS access key ids — `aws_access_key`; GitHub (`ghp_`, `gho_`, `ghu_`, `ghs_`, `ghr_`,
//!   `github_pat_`) — `github_token`; GitLab (`glpat-`) — `gitlab_token`; Slack (`xox?-`) —
//!   `slack_token`; OpenAI and Anthropic keys (`sk-…`) — `api_key`; Google API keys (`AIza`) —
//!   `google_api_key`; Stripe live keys — `stripe_key`;
//! - the value of an `Authorization:` or `Proxy-Authorization:` header (the name is kept) —
//!   `authorization`;
//! - every occurrence of a value the host marked secret ([`Redactor::new`]) — `secret`.
//!
//! One pass: the formats are one `regex` alternation (its literal prefilter skips text with no
//! candidate), the host's values one Aho-Corasick automaton. A marker never matches a pattern, so
//! redacting twice is redacting once. Like the framing defense, this is defense in depth: it finds
//! the well-known formats, not every secret.

use std::borrow::Cow;
use std::sync::{Arc, LazyLock};

use aho_corasick::{AhoCorasick, MatchKind};
use regex::Regex;

/// Shortest host-marked secret value that is redacted: shorter values (`1`, `true`, `dev`) would
/// redact ordinary words.
pub const SECRET_VALUE_BYTES_MIN: usize = 8;
/// Most host-marked secret values one redactor holds.
pub const SECRET_VALUES_MAX: usize = 1024;
/// Longest host-marked secret value, in bytes.
pub const SECRET_VALUE_BYTES_MAX: usize = 16 * 1024;

/// Every marker starts with this; nothing that starts with it is redacted again.
pub const MARKER_PREFIX: &str = "[redacted:";

/// The formats, as named groups of one alternation. Each is anchored on a literal prefix so the
/// search stays a prefilter scan on ordinary text.
const FORMATS: &str = concat!(
    r"(?P<private_key>-----BEGIN[A-Z0-9 ]{0,40} PRIVATE KEY-----)",
    r"|(?P<jwt>(?-u:\b)eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})",
    r"|(?P<aws_access_key>(?-u:\b)(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?-u:\b))",
    r"|(?P<github_token>(?-u:\b)(?:gh[pousr]_[A-Za-z0-9]{36,251}|github_pat_[A-Za-z0-9_]{22,242})(?-u:\b))",
    r"|(?P<gitlab_token>(?-u:\b)glpat-[A-Za-z0-9_-]{20,255})",
    r"|(?P<slack_token>(?-u:\b)xox[abposre]-[A-Za-z0-9-]{10,255})",
    r"|(?P<api_key>(?-u:\b)sk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,255})",
    r"|(?P<google_api_key>(?-u:\b)AIza[0-9A-Za-z_-]{35})",
    r"|(?P<stripe_key>(?-u:\b)[sr]k_live_[0-9A-Za-z]{16,255})",
    r#"|(?P<authorization>(?i-u:\b(?:proxy-)?authorization)["']?[ \t]*[:=][ \t]*["']?)"#,
);

/// The kinds a format match can name, in the order of [`FORMATS`].
const KINDS: &[&str] = &[
    "private_key",
    "jwt",
    "aws_access_key",
    "github_token",
    "gitlab_token",
    "slack_token",
    "api_key",
    "google_api_key",
    "stripe_key",
    "authorization",
];

static FORMATS_RE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(FORMATS).expect("the secret formats compile"));
static PEM_END: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"-----END[A-Z0-9 ]{0,40} PRIVATE KEY-----").expect("the PEM end compiles")
});
static DEFAULT: LazyLock<Redactor> = LazyLock::new(|| Redactor { values: None });

/// Finds and replaces secrets (cheap to clone). [`Redactor::default`] knows the formats only.
#[derive(Clone, Debug)]
pub struct Redactor {
    values: Option<Arc<AhoCorasick>>,
}

impl Default for Redactor {
    fn default() -> Self {
        DEFAULT.clone()
    }
}

/// A secret value list the redactor cannot hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedactError {
    #[error("{got} secret values given; at most {SECRET_VALUES_MAX} are accepted")]
    TooMany { got: usize },
    #[error("a secret value of {got} bytes exceeds {SECRET_VALUE_BYTES_MAX}")]
    TooLong { got: usize },
    #[error("the secret values cannot be searched: {0}")]
    Build(String),
}

impl Redactor {
    /// Redacts the formats and every occurrence of `values` (values shorter than
    /// [`SECRET_VALUE_BYTES_MIN`] are ignored).
    pub fn new<I, S>(values: I) -> Result<Self, RedactError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut kept: Vec<String> = Vec::new();
        for v in values {
            let v = v.as_ref();
            if v.len() > SECRET_VALUE_BYTES_MAX {
                return Err(RedactError::TooLong { got: v.len() });
            }
            if v.len() >= SECRET_VALUE_BYTES_MIN && !kept.iter().any(|k| k == v) {
                kept.push(v.to_string());
            }
        }
        if kept.len() > SECRET_VALUES_MAX {
            return Err(RedactError::TooMany { got: kept.len() });
        }
        if kept.is_empty() {
            return Ok(Self::default());
        }
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&kept)
            .map_err(|e| RedactError::Build(e.to_string()))?;
        Ok(Self {
            values: Some(Arc::new(automaton)),
        })
    }

    /// `text` with every secret replaced, and how many were. Borrowed when nothing was found.
    pub fn redact<'a>(&self, text: &'a str) -> (Cow<'a, str>, u64) {
        let mut in_private_key = false;
        self.redact_block(text, &mut in_private_key)
    }

    /// [`Redactor::redact`] for one block of a stream: `in_private_key` carries an open PEM block
    /// from one block to the next.
    pub(crate) fn redact_block<'a>(
        &self,
        text: &'a str,
        in_private_key: &mut bool,
    ) -> (Cow<'a, str>, u64) {
        let (formats, n) = redact_formats(text, in_private_key);
        let Some(values) = &self.values else {
            return (formats, n);
        };
        if !values.is_match(formats.as_ref()) {
            return (formats, n);
        }
        let mut out = String::with_capacity(formats.len());
        let mut count = 0;
        values.replace_all_with(formats.as_ref(), &mut out, |_, _, dst| {
            count += 1;
            dst.push_str("[redacted:secret]");
            true
        });
        (Cow::Owned(out), n + count)
    }
}

/// The format pass of [`Redactor::redact_block`].
fn redact_formats<'a>(text: &'a str, in_private_key: &mut bool) -> (Cow<'a, str>, u64) {
    let mut out = String::new();
    let mut copied = 0;
    let mut count = 0;
    let mut at = 0;
    if *in_private_key {
        // The block began earlier: everything up to its end line is key material.
        match PEM_END.find(text) {
            Some(end) => {
                *in_private_key = false;
                copied = end.end();
                at = end.end();
            }
            None => return (Cow::Borrowed(""), 0),
        }
    }
    let re = &*FORMATS_RE;
    while let Some(caps) = re.captures_at(text, at) {
        let whole = caps.get(0).expect("group 0 is the match");
        let kind = KINDS
            .iter()
            .find(|k| caps.name(k).is_some())
            .copied()
            .unwrap_or("secret");
        let (keep_to, resume) = match kind {
            "private_key" => match PEM_END.find_at(text, whole.end()) {
                Some(end) => (whole.start(), end.end()),
                None => {
                    *in_private_key = true;
                    (whole.start(), text.len())
                }
            },
            "authorization" => {
                let value_end = text[whole.end()..]
                    .find(['"', '\'', '\r', '\n'])
                    .map_or(text.len(), |i| whole.end() + i);
                let value = &text[whole.end()..value_end];
                if value.trim().is_empty() || value.starts_with(MARKER_PREFIX) {
                    at = whole.end();
                    continue;
                }
                (whole.end(), value_end)
            }
            _ => (whole.start(), whole.end()),
        };
        out.push_str(&text[copied..keep_to]);
        out.push_str(MARKER_PREFIX);
        out.push_str(kind);
        out.push(']');
        count += 1;
        copied = resume;
        at = resume.max(whole.end());
        if at >= text.len() {
            break;
        }
    }
    if count == 0 && copied == 0 {
        return (Cow::Borrowed(text), 0);
    }
    out.push_str(&text[copied..]);
    (Cow::Owned(out), count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redact(s: &str) -> (String, u64) {
        let (out, n) = Redactor::default().redact(s);
        (out.into_owned(), n)
    }

    #[test]
    fn a_private_key_block_becomes_one_marker() {
        let text = "before\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk=\nAAAA\n-----END OPENSSH PRIVATE KEY-----\nafter\n";
        assert_eq!(
            redact(text),
            ("before\n[redacted:private_key]\nafter\n".into(), 1)
        );
    }

    #[test]
    fn an_unterminated_private_key_is_redacted_to_the_end() {
        let (out, n) = redact("key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nmore");
        assert_eq!((out.as_str(), n), ("key:\n[redacted:private_key]", 1));
    }

    #[test]
    fn a_private_key_split_across_stream_blocks_is_redacted_whole() {
        let r = Redactor::default();
        let mut open = false;
        let (a, _) = r.redact_block("x\n-----BEGIN PRIVATE KEY-----\nAAAA\n", &mut open);
        let (b, _) = r.redact_block("BBBB\n", &mut open);
        let (c, _) = r.redact_block("-----END PRIVATE KEY-----\ny\n", &mut open);
        assert_eq!(format!("{a}{b}{c}"), "x\n[redacted:private_key]\ny\n");
        assert!(!open);
    }

    #[test]
    fn cloud_and_forge_tokens_are_redacted_by_kind() {
        let cases = [
            ("AKIAIOSFODNN7EXAMPLE", "aws_access_key"),
            ("ghp_0123456789abcdefghijABCDEFGHIJ012345", "github_token"),
            (
                "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuv",
                "github_token",
            ),
            ("glpat-abcdefghij0123456789", "gitlab_token"),
            ("xoxb-123456789012-abcdefghijkl", "slack_token"),
            ("sk-proj-abcdefghijklmnopqrstuvwxyz0123", "api_key"),
            ("sk-ant-api03-abcdefghijklmnopqrstuvwxyz", "api_key"),
            ("AIzaSyA1234567890abcdefghijklmnopqrstuv", "google_api_key"),
            (
                "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
                "jwt",
            ),
        ];
        for (secret, kind) in cases {
            let (out, n) = redact(&format!("token={secret} end"));
            assert_eq!(out, format!("token=[redacted:{kind}] end"), "{secret}");
            assert_eq!(n, 1);
        }
    }

    #[test]
    fn an_authorization_header_keeps_its_name_and_loses_its_value() {
        let (out, n) = redact("GET /\nAuthorization: Bearer abc.def\nHost: x\n");
        assert_eq!(
            out,
            "GET /\nAuthorization: [redacted:authorization]\nHost: x\n"
        );
        assert_eq!(n, 1);
        let (json, _) = redact(r#"{"authorization": "Basic dXNlcjpwYXNz"}"#);
        assert_eq!(json, r#"{"authorization": "[redacted:authorization]"}"#);
    }

    #[test]
    fn host_marked_values_are_redacted_wherever_they_appear() {
        let r = Redactor::new(["hunter2-is-long", "short"]).unwrap();
        let (out, n) = r.redact("pw=hunter2-is-long; again hunter2-is-long; short stays");
        assert_eq!(
            out,
            "pw=[redacted:secret]; again [redacted:secret]; short stays"
        );
        assert_eq!(n, 2);
    }

    #[test]
    fn redacting_twice_is_redacting_once() {
        let r = Redactor::new(["s3cr3t-value"]).unwrap();
        let text = "Authorization: token ghp_0123456789abcdefghijABCDEFGHIJ012345 s3cr3t-value\n\
                    -----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----";
        let (once, n) = r.redact(text);
        assert!(n >= 2);
        let (twice, m) = r.redact(&once);
        assert_eq!(twice, once);
        assert_eq!(m, 0);
    }

    #[test]
    fn ordinary_text_is_left_alone_and_borrowed() {
        let text = "skipped 3 tests; the author's key idea; AKIA is a prefix; eyJ alone";
        let (out, n) = Redactor::default().redact(text);
        assert!(matches!(out, Cow::Borrowed(_)));
        assert_eq!(n, 0);
    }

    #[test]
    fn too_many_or_too_long_values_are_refused() {
        let long = "x".repeat(SECRET_VALUE_BYTES_MAX + 1);
        assert_eq!(
            Redactor::new([long]).unwrap_err(),
            RedactError::TooLong {
                got: SECRET_VALUE_BYTES_MAX + 1
            }
        );
    }
}
