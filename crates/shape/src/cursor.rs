//! Signed pagination cursors and page ceilings for structured tools.
//!
//! A structured tool (a search, a listing, a query) never returns an unbounded collection: it
//! returns at most a page ([`clamp_page_size`]) and an opaque `next_cursor`. The cursor carries
//! the tool's own resume state (a payload it chooses, e.g. the last key seen and a query hash), so
//! ring0 keeps no per-query memory and an abandoned exploration leaks nothing.
//!
//! Because the cursor travels through the model, it is authenticated: HMAC-SHA256 under a key
//! private to the supervisor, bound to the session that received it, and expiring. A cursor that
//! was edited, that belongs to another session, or that is too old is refused with a specific
//! [`CursorError`] the model can act on (start the listing again).
//!
//! Wire form, base64url without padding: `version (1) ‖ issued_at (8, BE seconds) ‖ expires_at
//! (8) ‖ session tag (8, SHA-256 of the session id) ‖ payload ‖ HMAC (32)`. The HMAC covers a
//! domain label, the full session id and every preceding byte. The payload is authenticated, not
//! encrypted: do not put secrets in it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

/// Default cursor lifetime.
pub const CURSOR_TTL_DEFAULT: Duration = Duration::from_secs(15 * 60);
/// Longest accepted cursor lifetime.
pub const CURSOR_TTL_MAX: Duration = Duration::from_secs(24 * 60 * 60);
/// Shortest accepted signing key.
pub const CURSOR_KEY_BYTES_MIN: usize = 32;
/// Largest payload a cursor carries.
pub const CURSOR_PAYLOAD_BYTES_MAX: usize = 1024;
/// Clock skew tolerated for a cursor issued "in the future" (another instance's clock).
pub const CURSOR_CLOCK_SKEW: Duration = Duration::from_secs(60);
/// Default page ceiling of a structured tool.
pub const PAGE_SIZE_MAX_DEFAULT: usize = 50;

const VERSION: u8 = 1;
const DOMAIN: &[u8] = b"ring0 cursor v1\0";
const HEADER_BYTES: usize = 1 + 8 + 8 + 8;
const TAG_BYTES: usize = 32;
/// Longest cursor string accepted for decoding.
const CURSOR_CHARS_MAX: usize = (HEADER_BYTES + CURSOR_PAYLOAD_BYTES_MAX + TAG_BYTES) * 4 / 3 + 4;

type HmacSha256 = Hmac<Sha256>;

/// Why a cursor was refused (or could not be made).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CursorError {
    #[error("cursor signing key must be at least {CURSOR_KEY_BYTES_MIN} bytes, got {got}")]
    WeakKey { got: usize },
    #[error("cursor lifetime must be between 1 s and {} s", CURSOR_TTL_MAX.as_secs())]
    BadTtl,
    #[error("cursor payload of {got} bytes exceeds {CURSOR_PAYLOAD_BYTES_MAX}")]
    PayloadTooLarge { got: usize },
    #[error("cursor is not valid: {0}; start the listing again without a cursor")]
    Malformed(&'static str),
    #[error("cursor was issued to another session; start the listing again without a cursor")]
    Foreign,
    #[error("cursor was altered; start the listing again without a cursor")]
    Tampered,
    #[error(
        "cursor expired {ago_secs} s ago (lifetime {ttl_secs} s); start the listing again without a cursor"
    )]
    Expired { ago_secs: u64, ttl_secs: u64 },
    #[error("cursor payload could not be encoded or decoded: {0}")]
    Payload(String),
}

/// Issues and checks cursors under one key.
#[derive(Clone)]
pub struct CursorSigner {
    key: Vec<u8>,
    ttl: Duration,
}

impl std::fmt::Debug for CursorSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CursorSigner")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl CursorSigner {
    /// A signer with `key` (at least [`CURSOR_KEY_BYTES_MIN`] random bytes) and cursor lifetime
    /// `ttl` (1 s to [`CURSOR_TTL_MAX`]).
    pub fn new(key: &[u8], ttl: Duration) -> Result<Self, CursorError> {
        if key.len() < CURSOR_KEY_BYTES_MIN {
            return Err(CursorError::WeakKey { got: key.len() });
        }
        if ttl < Duration::from_secs(1) || ttl > CURSOR_TTL_MAX {
            return Err(CursorError::BadTtl);
        }
        Ok(Self {
            key: key.to_vec(),
            ttl,
        })
    }

    /// A cursor for `session` carrying `payload`, valid from `now` for the signer's lifetime.
    pub fn issue(
        &self,
        session: &str,
        payload: &[u8],
        now: SystemTime,
    ) -> Result<String, CursorError> {
        if payload.len() > CURSOR_PAYLOAD_BYTES_MAX {
            return Err(CursorError::PayloadTooLarge { got: payload.len() });
        }
        let issued = unix_secs(now);
        let expires = issued.saturating_add(self.ttl.as_secs());
        let mut body = Vec::with_capacity(HEADER_BYTES + payload.len() + TAG_BYTES);
        body.push(VERSION);
        body.extend_from_slice(&issued.to_be_bytes());
        body.extend_from_slice(&expires.to_be_bytes());
        body.extend_from_slice(&session_tag(session));
        body.extend_from_slice(payload);
        let tag = self.mac(session, &body).finalize().into_bytes();
        body.extend_from_slice(&tag);
        Ok(URL_SAFE_NO_PAD.encode(body))
    }

    /// The payload of a cursor issued to `session` by this signer and not expired at `now`.
    pub fn verify(
        &self,
        cursor: &str,
        session: &str,
        now: SystemTime,
    ) -> Result<Vec<u8>, CursorError> {
        if cursor.len() > CURSOR_CHARS_MAX {
            return Err(CursorError::Malformed("too long"));
        }
        let raw = URL_SAFE_NO_PAD
            .decode(cursor.trim())
            .map_err(|_| CursorError::Malformed("not base64url"))?;
        if raw.len() < HEADER_BYTES + TAG_BYTES {
            return Err(CursorError::Malformed("too short"));
        }
        if raw[0] != VERSION {
            return Err(CursorError::Malformed("unknown version"));
        }
        let (body, tag) = raw.split_at(raw.len() - TAG_BYTES);
        if body[17..25] != session_tag(session) {
            return Err(CursorError::Foreign);
        }
        self.mac(session, body)
            .verify_slice(tag)
            .map_err(|_| CursorError::Tampered)?;
        let issued = read_u64(&body[1..9]);
        let expires = read_u64(&body[9..17]);
        let now_s = unix_secs(now);
        if issued > now_s.saturating_add(CURSOR_CLOCK_SKEW.as_secs()) {
            // Signed by us, so not forged: a clock far behind another instance's. Refused all the
            // same, since its age cannot be judged.
            return Err(CursorError::Malformed("issued in the future"));
        }
        if now_s >= expires {
            return Err(CursorError::Expired {
                ago_secs: now_s - expires,
                ttl_secs: expires.saturating_sub(issued),
            });
        }
        Ok(body[HEADER_BYTES..].to_vec())
    }

    /// [`Self::issue`] with a serializable payload (JSON).
    pub fn issue_value<T: Serialize>(
        &self,
        session: &str,
        payload: &T,
        now: SystemTime,
    ) -> Result<String, CursorError> {
        let bytes = serde_json::to_vec(payload).map_err(|e| CursorError::Payload(e.to_string()))?;
        self.issue(session, &bytes, now)
    }

    /// [`Self::verify`] with a deserialized payload (JSON).
    pub fn verify_value<T: DeserializeOwned>(
        &self,
        cursor: &str,
        session: &str,
        now: SystemTime,
    ) -> Result<T, CursorError> {
        let bytes = self.verify(cursor, session, now)?;
        serde_json::from_slice(&bytes).map_err(|e| CursorError::Payload(e.to_string()))
    }

    fn mac(&self, session: &str, body: &[u8]) -> HmacSha256 {
        // The key length was checked in `new`; HMAC accepts keys of any length.
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.key)
            .unwrap_or_else(|_| <HmacSha256 as KeyInit>::new(&Default::default()));
        mac.update(DOMAIN);
        mac.update(&(session.len() as u64).to_be_bytes());
        mac.update(session.as_bytes());
        mac.update(body);
        mac
    }
}

/// A page size within the ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageSize {
    /// Records to return.
    pub size: usize,
    /// The request asked for more than the ceiling (say so in the result).
    pub clamped: bool,
}

/// The page size to use for a request: `requested` (the ceiling when absent or zero), never more
/// than `ceiling` (itself at least 1).
pub fn clamp_page_size(requested: Option<usize>, ceiling: usize) -> PageSize {
    let ceiling = ceiling.max(1);
    match requested {
        Some(n) if n > ceiling => PageSize {
            size: ceiling,
            clamped: true,
        },
        Some(n) if n > 0 => PageSize {
            size: n,
            clamped: false,
        },
        _ => PageSize {
            size: ceiling,
            clamped: false,
        },
    }
}

fn session_tag(session: &str) -> [u8; 8] {
    let digest = Sha256::digest(session.as_bytes());
    let mut tag = [0u8; 8];
    tag.copy_from_slice(&digest[..8]);
    tag
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn read_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8; 32] = b"0123456789abcdef0123456789abcdef";

    fn signer() -> CursorSigner {
        CursorSigner::new(KEY, Duration::from_secs(600)).unwrap()
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn a_cursor_round_trips_its_payload_for_its_session() {
        let s = signer();
        let c = s.issue("session-a", b"last=42", at(1_000)).unwrap();
        assert_eq!(s.verify(&c, "session-a", at(1_100)).unwrap(), b"last=42");
    }

    #[test]
    fn an_altered_cursor_is_refused_as_tampered() {
        let s = signer();
        let c = s.issue("session-a", b"last=42", at(1_000)).unwrap();
        let mut raw = URL_SAFE_NO_PAD.decode(&c).unwrap();
        let last_payload_byte = raw.len() - TAG_BYTES - 1;
        raw[last_payload_byte] = b'9';
        let forged = URL_SAFE_NO_PAD.encode(raw);
        assert_eq!(
            s.verify(&forged, "session-a", at(1_100)),
            Err(CursorError::Tampered)
        );
    }

    #[test]
    fn a_cursor_from_another_session_is_refused_as_foreign() {
        let s = signer();
        let c = s.issue("session-a", b"x", at(1_000)).unwrap();
        assert_eq!(
            s.verify(&c, "session-b", at(1_100)),
            Err(CursorError::Foreign)
        );
    }

    #[test]
    fn an_expired_cursor_is_refused_with_its_age() {
        let s = signer();
        let c = s.issue("session-a", b"x", at(1_000)).unwrap();
        assert_eq!(
            s.verify(&c, "session-a", at(1_700)),
            Err(CursorError::Expired {
                ago_secs: 100,
                ttl_secs: 600
            })
        );
    }

    #[test]
    fn a_cursor_signed_with_another_key_is_refused() {
        let other = CursorSigner::new(&[7u8; 32], Duration::from_secs(600)).unwrap();
        let c = other.issue("session-a", b"x", at(1_000)).unwrap();
        assert_eq!(
            signer().verify(&c, "session-a", at(1_100)),
            Err(CursorError::Tampered)
        );
    }

    #[test]
    fn garbage_is_refused_as_malformed() {
        let s = signer();
        assert!(matches!(
            s.verify("not a cursor!", "session-a", at(0)),
            Err(CursorError::Malformed(_))
        ));
        assert!(matches!(
            s.verify("AAAA", "session-a", at(0)),
            Err(CursorError::Malformed(_))
        ));
    }

    #[test]
    fn a_short_key_is_refused() {
        assert_eq!(
            CursorSigner::new(b"short", CURSOR_TTL_DEFAULT).unwrap_err(),
            CursorError::WeakKey { got: 5 }
        );
    }

    #[test]
    fn json_payloads_round_trip() {
        let s = signer();
        let c = s
            .issue_value("s", &serde_json::json!({"after": "k9", "q": "abc"}), at(5))
            .unwrap();
        let v: serde_json::Value = s.verify_value(&c, "s", at(6)).unwrap();
        assert_eq!(v["after"], "k9");
    }

    #[test]
    fn page_size_is_clamped_to_the_ceiling_and_says_so() {
        assert_eq!(
            clamp_page_size(Some(500), PAGE_SIZE_MAX_DEFAULT),
            PageSize {
                size: 50,
                clamped: true
            }
        );
        assert_eq!(
            clamp_page_size(Some(10), 50),
            PageSize {
                size: 10,
                clamped: false
            }
        );
        assert_eq!(clamp_page_size(None, 50).size, 50);
    }
}
