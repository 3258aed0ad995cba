//! JWT bearer tokens: verified against a JSON Web Key Set, mapped to a [`Principal`].
//!
//! A token is accepted only when all of this holds: its header names RS256, ES256 or EdDSA
//! (`alg: none` does not even parse; HMAC and every other algorithm are refused) and the key of
//! its `kid` in the configured key set, whose own algorithm must be the same; the signature
//! verifies; `iss` is the configured issuer; `aud` names this server's resource (RFC 8707: a
//! token minted for another resource is refused); `exp` has not passed and `nbf` has (both
//! within [`JWT_LEEWAY_SECS`]); and the configured claims give a principal id (and groups).
//! The verified claims become the principal's claims; the token itself is never kept.
//!
//! The key set comes from a file or a URL (https, or http to a loopback address). It is cached
//! and read again when a token names a `kid` the cache lacks (at most once per
//! [`JWKS_REFRESH_INTERVAL_MIN`], so a flood of made-up `kid`s cannot make ring0 hammer the
//! issuer) and when it is older than [`JWKS_CACHE_TTL`].

use super::provider::{self, ALGORITHMS};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use ring0_core::Principal;
use ring0_core::principal::{PRINCIPAL_GROUPS_MAX, PRINCIPAL_ID_BYTES_MAX};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Clock skew tolerated on `exp` and `nbf`, in seconds.
pub const JWT_LEEWAY_SECS: u64 = 30;
/// Shortest time between two reads of the key set triggered by unknown `kid`s.
pub const JWKS_REFRESH_INTERVAL_MIN: Duration = Duration::from_secs(30);
/// A cached key set older than this is read again before it is used.
pub const JWKS_CACHE_TTL: Duration = Duration::from_secs(600);
/// Largest key set document read, in bytes.
pub const JWKS_BYTES_MAX: usize = 256 * 1024;
/// Most keys of a key set kept.
pub const JWKS_KEYS_MAX: usize = 64;
/// Longest wait for a key set URL to answer.
pub const JWKS_FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// `[auth.jwt]`: how JWTs are verified and mapped to principals.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// The issuer every token must name in `iss`. Required.
    pub issuer: String,
    /// Accepted `aud` values. Default: this server's resource (`[auth] resource`).
    #[serde(default)]
    pub audience: Option<Vec<String>>,
    /// A key set file (JWKS JSON), relative to the configuration file's directory.
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    /// A key set URL: https, or http to a loopback address.
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// The claim holding the principal id. Default `"sub"`.
    #[serde(default = "principal_claim_default")]
    pub principal_claim: String,
    /// The claim holding the principal's groups (an array of strings, or one string of
    /// space-separated names). Default none.
    #[serde(default)]
    pub groups_claim: Option<String>,
}

fn principal_claim_default() -> String {
    "sub".into()
}

/// Where the key set is read from.
#[derive(Debug, Clone)]
pub enum JwksSource {
    File(PathBuf),
    Url(String),
}

impl JwtConfig {
    /// Checks the section; `base` resolves a relative `jwks_file`.
    pub fn source(&self, base: &std::path::Path) -> Result<JwksSource, String> {
        if self.issuer.trim().is_empty() {
            return Err("auth.jwt.issuer: is empty".into());
        }
        if self.principal_claim.trim().is_empty() {
            return Err("auth.jwt.principal_claim: is empty".into());
        }
        if let Some(aud) = &self.audience
            && (aud.is_empty() || aud.iter().any(|a| a.trim().is_empty()))
        {
            return Err("auth.jwt.audience: give at least one non-empty audience".into());
        }
        match (&self.jwks_file, &self.jwks_url) {
            (Some(f), None) => Ok(JwksSource::File(base.join(f))),
            (None, Some(url)) => {
                check_jwks_url(url).map_err(|why| format!("auth.jwt.jwks_url: {why}"))?;
                Ok(JwksSource::Url(url.clone()))
            }
            (Some(_), Some(_)) => {
                Err("auth.jwt: give either `jwks_file` or `jwks_url`, not both".into())
            }
            (None, None) => Err("auth.jwt: give `jwks_file` or `jwks_url`".into()),
        }
    }
}

/// A key set URL must be https, or http to a loopback address (where nobody can tamper with it
/// on the way).
pub fn check_jwks_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url:?}: {e}"))?;
    match parsed.scheme() {
        "https" => Ok(()),
        "http" => {
            let host = parsed.host_str().unwrap_or_default();
            let ip = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>();
            if host.eq_ignore_ascii_case("localhost") || ip.is_ok_and(|ip| ip.is_loopback()) {
                Ok(())
            } else {
                Err(format!(
                    "{url:?}: http is accepted for loopback addresses only"
                ))
            }
        }
        other => Err(format!("{url:?}: the scheme {other:?} is not https")),
    }
}

/// One usable key: its algorithm and the key.
struct Key {
    algorithm: Algorithm,
    key: DecodingKey,
}

/// The usable keys of a key set.
#[derive(Default)]
struct KeySet {
    /// By `kid`.
    named: HashMap<String, Key>,
    /// Keys without a `kid` (used only when the set has exactly one key).
    unnamed: Vec<Key>,
}

impl KeySet {
    fn is_empty(&self) -> bool {
        self.named.is_empty() && self.unnamed.is_empty()
    }
}

struct Cache {
    keys: KeySet,
    read_at: Instant,
    /// When an unknown `kid` last made ring0 read the set again.
    refreshed_at: Option<Instant>,
}

/// Why a token was refused (said in `error_description`; it names no secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// Verifies JWTs against one issuer's key set.
pub struct JwtIssuer {
    config: JwtConfig,
    audience: Vec<String>,
    source: JwksSource,
    http: Option<reqwest::Client>,
    cache: tokio::sync::Mutex<Cache>,
    /// Serializes key set reads; the cache lock is not held across I/O.
    reading: tokio::sync::Mutex<()>,
    problems: Mutex<Vec<String>>,
}

impl JwtIssuer {
    /// Reads the key set once (failing if it cannot be read or holds no usable key).
    /// `resource` is the default audience.
    pub async fn new(
        config: JwtConfig,
        base: &std::path::Path,
        resource: &str,
    ) -> Result<Self, String> {
        provider::install()?;
        let source = config.source(base)?;
        let audience = config
            .audience
            .clone()
            .unwrap_or_else(|| vec![resource.to_string()]);
        let http = match &source {
            JwksSource::Url(_) => Some(jwks_client()?),
            JwksSource::File(_) => None,
        };
        let verifier = Self {
            config,
            audience,
            source,
            http,
            cache: tokio::sync::Mutex::new(Cache {
                keys: KeySet::default(),
                read_at: Instant::now(),
                refreshed_at: None,
            }),
            reading: tokio::sync::Mutex::new(()),
            problems: Mutex::new(Vec::new()),
        };
        let keys = verifier.read().await?;
        if keys.is_empty() {
            return Err(format!(
                "auth.jwt: the key set {} holds no RS256, ES256 or EdDSA signing key",
                verifier.describe_source()
            ));
        }
        *verifier.cache.lock().await = Cache {
            keys,
            read_at: Instant::now(),
            refreshed_at: None,
        };
        Ok(verifier)
    }

    /// The accepted audiences.
    pub fn audience(&self) -> &[String] {
        &self.audience
    }

    /// What reading the key set reported (keys skipped and why), drained.
    pub fn take_problems(&self) -> Vec<String> {
        std::mem::take(&mut *self.problems.lock().expect("problems"))
    }

    fn describe_source(&self) -> String {
        match &self.source {
            JwksSource::File(p) => p.display().to_string(),
            JwksSource::Url(u) => u.clone(),
        }
    }

    /// Verifies `token`; the principal it names, or why not.
    pub async fn verify(&self, token: &str) -> Result<Principal, Refused> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| Refused(format!("malformed token: {e}")))?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(Refused(format!(
                "the algorithm {:?} is not accepted (RS256, ES256, EdDSA)",
                header.alg
            )));
        }
        let (algorithm, key) = self.key_for(header.kid.as_deref()).await?;
        if algorithm != header.alg {
            return Err(Refused(format!(
                "the token's algorithm {:?} is not its key's ({algorithm:?})",
                header.alg
            )));
        }
        let mut validation = Validation::new(algorithm);
        validation.leeway = JWT_LEEWAY_SECS;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.validate_aud = true;
        validation.set_issuer(&[self.config.issuer.as_str()]);
        validation.set_audience(&self.audience);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key, &validation)
            .map_err(|e| Refused(refusal(&e)))?;
        self.principal(data.claims)
    }

    /// The principal the verified `claims` name.
    fn principal(&self, claims: Map<String, Value>) -> Result<Principal, Refused> {
        let claim = &self.config.principal_claim;
        let id = match claims.get(claim) {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            _ => {
                return Err(Refused(format!(
                    "the token has no string claim {claim:?} to name its principal"
                )));
            }
        };
        if id.len() > PRINCIPAL_ID_BYTES_MAX {
            return Err(Refused(format!(
                "the principal id is longer than {PRINCIPAL_ID_BYTES_MAX} bytes"
            )));
        }
        if id == Principal::LOCAL_ID {
            return Err(Refused(format!(
                "the principal id {:?} is reserved for the local user",
                Principal::LOCAL_ID
            )));
        }
        let groups = match &self.config.groups_claim {
            None => Vec::new(),
            Some(name) => match claims.get(name) {
                None => Vec::new(),
                Some(Value::String(s)) => s.split_whitespace().map(str::to_string).collect(),
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|v| v.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| Refused(format!("the claim {name:?} holds a non-string")))?,
                Some(_) => {
                    return Err(Refused(format!(
                        "the claim {name:?} is neither a string nor an array of strings"
                    )));
                }
            },
        };
        if groups.len() > PRINCIPAL_GROUPS_MAX {
            return Err(Refused(format!(
                "the token names more than {PRINCIPAL_GROUPS_MAX} groups"
            )));
        }
        let mut principal = Principal::new(id).with_groups(groups);
        principal.claims = claims;
        Ok(principal)
    }

    /// The key for `kid`, reading the key set again if it is stale or lacks `kid` (bounded).
    async fn key_for(&self, kid: Option<&str>) -> Result<(Algorithm, DecodingKey), Refused> {
        {
            let cache = self.cache.lock().await;
            if cache.read_at.elapsed() < JWKS_CACHE_TTL
                && let Some(found) = pick(&cache, kid)
            {
                return Ok(found);
            }
        }
        let _reading = self.reading.lock().await;
        {
            let mut cache = self.cache.lock().await;
            // Another request may have read the set meanwhile.
            let fresh = cache.read_at.elapsed() < JWKS_CACHE_TTL;
            if fresh && let Some(found) = pick(&cache, kid) {
                return Ok(found);
            }
            // At most one read per interval, whether for an unknown `kid` or a stale set (an
            // issuer that is down is not asked again on every request).
            if cache
                .refreshed_at
                .is_some_and(|t| t.elapsed() < JWKS_REFRESH_INTERVAL_MIN)
            {
                return pick(&cache, kid).ok_or_else(|| unknown_key(kid));
            }
            cache.refreshed_at = Some(Instant::now());
        }
        match self.read().await {
            Ok(keys) => {
                let mut cache = self.cache.lock().await;
                cache.keys = keys;
                cache.read_at = Instant::now();
                pick(&cache, kid).ok_or_else(|| unknown_key(kid))
            }
            Err(why) => {
                self.problems
                    .lock()
                    .expect("problems")
                    .push(format!("reading the key set: {why}"));
                // The keys already known stay in use until a read succeeds.
                let cache = self.cache.lock().await;
                pick(&cache, kid).ok_or_else(|| unknown_key(kid))
            }
        }
    }

    /// Reads and parses the key set.
    async fn read(&self) -> Result<KeySet, String> {
        let text = match (&self.source, &self.http) {
            (JwksSource::File(path), _) => read_file_bounded(path)?,
            (JwksSource::Url(url), Some(http)) => fetch_bounded(http, url).await?,
            (JwksSource::Url(_), None) => return Err("no HTTP client".into()),
        };
        let (keys, skipped) = parse_key_set(&text)?;
        if !skipped.is_empty() {
            self.problems.lock().expect("problems").extend(skipped);
        }
        Ok(keys)
    }
}

fn unknown_key(kid: Option<&str>) -> Refused {
    match kid {
        Some(k) => Refused(format!("no key {k:?} in the issuer's key set")),
        None => Refused("the token names no key (`kid`) and the key set has several".into()),
    }
}

fn pick(cache: &Cache, kid: Option<&str>) -> Option<(Algorithm, DecodingKey)> {
    let set = &cache.keys;
    let key = match kid {
        Some(k) => set.named.get(k)?,
        None if set.named.len() + set.unnamed.len() == 1 => {
            set.named.values().chain(set.unnamed.iter()).next()?
        }
        None => return None,
    };
    Some((key.algorithm, key.key.clone()))
}

/// Why `jsonwebtoken` refused a token, in words a client can act on.
fn refusal(e: &jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind as K;
    match e.kind() {
        K::InvalidSignature => "the signature does not verify".into(),
        K::ExpiredSignature => "the token has expired".into(),
        K::ImmatureSignature => "the token is not valid yet (nbf)".into(),
        K::InvalidIssuer => "the token's issuer is not the configured one".into(),
        K::InvalidAudience => "the token is for another resource (aud)".into(),
        K::MissingRequiredClaim(c) => format!("the token lacks the claim {c:?}"),
        K::InvalidAlgorithm => "the token's algorithm is not accepted".into(),
        other => format!("invalid token: {other:?}"),
    }
}

/// The algorithm a key is for: its `alg` if given, else what its type implies. `None` for keys
/// ring0 does not accept (encryption keys, HMAC secrets, other curves and algorithms).
fn key_algorithm(jwk: &Jwk) -> Result<Algorithm, String> {
    if let Some(use_) = &jwk.common.public_key_use
        && *use_ != PublicKeyUse::Signature
    {
        return Err("not a signing key (`use`)".into());
    }
    let implied = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            Algorithm::EdDSA
        }
        _ => return Err("a key type or curve ring0 does not accept".into()),
    };
    match jwk.common.key_algorithm {
        None => Ok(implied),
        Some(KeyAlgorithm::RS256) if implied == Algorithm::RS256 => Ok(implied),
        Some(KeyAlgorithm::ES256) if implied == Algorithm::ES256 => Ok(implied),
        Some(KeyAlgorithm::EdDSA) if implied == Algorithm::EdDSA => Ok(implied),
        Some(other) => Err(format!("the algorithm {other:?} is not accepted")),
    }
}

/// Parses a key set: the usable keys by `kid`, those without one, and what was skipped.
fn parse_key_set(text: &str) -> Result<(KeySet, Vec<String>), String> {
    #[derive(Deserialize)]
    struct Set {
        keys: Vec<Value>,
    }
    let set: Set = serde_json::from_str(text).map_err(|e| format!("not a JWK set: {e}"))?;
    if set.keys.len() > JWKS_KEYS_MAX {
        return Err(format!("more than {JWKS_KEYS_MAX} keys"));
    }
    let mut keys = HashMap::new();
    let mut unnamed = Vec::new();
    let mut skipped = Vec::new();
    let mut ambiguous = std::collections::BTreeSet::new();
    for (i, raw) in set.keys.into_iter().enumerate() {
        let parsed = serde_json::from_value::<Jwk>(raw)
            .map_err(|e| e.to_string())
            .and_then(|jwk| {
                let algorithm = key_algorithm(&jwk)?;
                let key = DecodingKey::from_jwk(&jwk).map_err(|e| e.to_string())?;
                Ok((jwk.common.key_id.clone(), Key { algorithm, key }))
            });
        match parsed {
            Ok((Some(kid), _)) if ambiguous.contains(&kid) => {
                skipped.push(format!("key {i}: the kid {kid:?} is used more than once"));
            }
            Ok((Some(kid), key)) => {
                if keys.insert(kid.clone(), key).is_some() {
                    ambiguous.insert(kid.clone());
                    // Two keys under one id: neither can be told apart, so neither is used.
                    keys.remove(&kid);
                    skipped.push(format!("key {i}: the kid {kid:?} is used twice"));
                }
            }
            Ok((None, key)) => unnamed.push(key),
            Err(why) => skipped.push(format!("key {i} skipped: {why}")),
        }
    }
    Ok((
        KeySet {
            named: keys,
            unnamed,
        },
        skipped,
    ))
}

fn read_file_bounded(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut text = String::new();
    file.take(JWKS_BYTES_MAX as u64 + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if text.len() > JWKS_BYTES_MAX {
        return Err(format!(
            "{}: larger than {JWKS_BYTES_MAX} bytes",
            path.display()
        ));
    }
    Ok(text)
}

fn jwks_client() -> Result<reqwest::Client, String> {
    // Installing twice is harmless: the first provider stays.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(JWKS_FETCH_TIMEOUT)
        .build()
        .map_err(|e| format!("building the HTTP client: {e}"))
}

async fn fetch_bounded(http: &reqwest::Client, url: &str) -> Result<String, String> {
    use futures::StreamExt;
    let response = http
        .get(url)
        .header("accept", "application/json")
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    if !response.status().is_success() {
        return Err(format!("{url}: HTTP {}", response.status()));
    }
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| format!("{url}: {e}"))?;
        if body.len() + chunk.len() > JWKS_BYTES_MAX {
            return Err(format!("{url}: larger than {JWKS_BYTES_MAX} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    String::from_utf8(body).map_err(|_| format!("{url}: not UTF-8"))
}
