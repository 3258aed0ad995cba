//! Who is calling over HTTP: bearer credentials turned into a [`Principal`].
//!
//! Over stdio every request is [`Principal::local`]. Over Streamable HTTP the request's
//! `Authorization: Bearer` credential names it: a static token of `[[auth.tokens]]` (stored as
//! a SHA-256 hash, see [`token`]), a JWT verified against an issuer's key set ([`jwt`]), or
//! the token of `ring0 serve --token-env`, which stands for the local user. Without any
//! credential configured, HTTP is loopback-only and every client is `local`.
//!
//! A request without a valid credential gets `401` with `WWW-Authenticate: Bearer
//! resource_metadata="…"`, pointing at this server's RFC 9728 protected-resource metadata
//! ([`Authenticator::metadata`]), which names the resource and its authorization servers.
//!
//! ```toml
//! [auth]
//! resource = "https://ring0.example.com/mcp"
//! authorization_servers = ["https://id.example.com"]
//!
//! [[auth.tokens]]
//! name = "ci"
//! sha256 = "…"            # ring0 token add ci --group automation
//! groups = ["automation"]
//!
//! [auth.jwt]
//! issuer = "https://id.example.com"
//! jwks_url = "https://id.example.com/.well-known/jwks.json"
//! groups_claim = "groups"
//! ```

pub mod jwt;
mod provider;
pub mod token;

use ring0_core::Principal;
use serde::Deserialize;
use serde_json::{Value, json};
use std::path::Path;

/// The RFC 9728 well-known path of protected-resource metadata.
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";
/// Longest `Authorization` header value read, in bytes.
pub const AUTHORIZATION_BYTES_MAX: usize = 16 * 1024;

/// `[auth]`: who may call `ring0 serve --http`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// This server's resource identifier (RFC 8707, RFC 9728): the URL clients reach the MCP
    /// endpoint at. The default audience of JWTs. Default `http://ADDR/mcp` of the bound address.
    #[serde(default)]
    pub resource: Option<String>,
    /// Authorization servers named in the protected-resource metadata. Default none.
    #[serde(default)]
    pub authorization_servers: Vec<String>,
    /// `[[auth.tokens]]`: static bearer tokens.
    #[serde(default)]
    pub tokens: Vec<token::TokenEntry>,
    /// `[auth.jwt]`: JWTs of one issuer.
    #[serde(default)]
    pub jwt: Option<jwt::JwtConfig>,
}

impl AuthConfig {
    /// Whether any credential is configured.
    pub fn has_credentials(&self) -> bool {
        !self.tokens.is_empty() || self.jwt.is_some()
    }

    /// Checks the section (everything but reading the key set); `base` resolves relative paths.
    pub fn validate(&self, base: &Path) -> Result<(), String> {
        token::validate(&self.tokens)?;
        if let Some(r) = &self.resource {
            check_resource(r).map_err(|why| format!("auth.resource: {why}"))?;
        }
        for (i, s) in self.authorization_servers.iter().enumerate() {
            let parsed = reqwest::Url::parse(s)
                .map_err(|e| format!("auth.authorization_servers[{i}]: {s:?}: {e}"))?;
            if !matches!(parsed.scheme(), "https" | "http") {
                return Err(format!(
                    "auth.authorization_servers[{i}]: {s:?} is not an http(s) URL"
                ));
            }
        }
        if let Some(j) = &self.jwt {
            j.source(base)?;
        }
        Ok(())
    }
}

/// A resource identifier is an absolute http(s) URL without a fragment (RFC 8707 §2).
fn check_resource(resource: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(resource).map_err(|e| format!("{resource:?}: {e}"))?;
    if !matches!(parsed.scheme(), "https" | "http") || parsed.host_str().is_none() {
        return Err(format!("{resource:?} is not an absolute http(s) URL"));
    }
    if parsed.fragment().is_some() {
        return Err(format!("{resource:?} has a fragment"));
    }
    Ok(())
}

/// Why a request is not authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unauthenticated {
    /// No `Authorization: Bearer` credential at all.
    Missing,
    /// A credential that is not valid, and why (said to the client; names no secret).
    Invalid(String),
}

/// Checks credentials and describes the protected resource.
pub struct Authenticator {
    resource: String,
    authorization_servers: Vec<String>,
    tokens: token::StaticTokens,
    jwt: Option<jwt::JwtIssuer>,
}

impl Authenticator {
    /// From the `[auth]` section (reading a JWT key set once), the token of `--token-env` (the
    /// local user's), and the resource to assume when the section names none. `base` resolves
    /// relative paths.
    pub async fn new(
        config: &AuthConfig,
        env_token: Option<String>,
        base: &Path,
        default_resource: &str,
    ) -> Result<Self, String> {
        config.validate(base)?;
        let resource = config
            .resource
            .clone()
            .unwrap_or_else(|| default_resource.to_string());
        let extra = env_token
            .into_iter()
            .map(|t| (t, Principal::local()))
            .collect();
        let tokens = token::StaticTokens::new(&config.tokens, extra);
        let jwt = match &config.jwt {
            Some(j) => Some(jwt::JwtIssuer::new(j.clone(), base, &resource).await?),
            None => None,
        };
        Ok(Self {
            resource,
            authorization_servers: config.authorization_servers.clone(),
            tokens,
            jwt,
        })
    }

    /// The resource identifier.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// Problems the JWT key set reported since last asked (keys skipped, failed reads).
    pub fn take_problems(&self) -> Vec<String> {
        self.jwt
            .as_ref()
            .map(jwt::JwtIssuer::take_problems)
            .unwrap_or_default()
    }

    /// The principal of a request's `Authorization` header value.
    pub async fn authenticate(
        &self,
        authorization: Option<&[u8]>,
    ) -> Result<Principal, Unauthenticated> {
        let Some(value) = authorization else {
            return Err(Unauthenticated::Missing);
        };
        if value.len() > AUTHORIZATION_BYTES_MAX {
            return Err(Unauthenticated::Invalid(format!(
                "the Authorization header is longer than {AUTHORIZATION_BYTES_MAX} bytes"
            )));
        }
        let value = std::str::from_utf8(value)
            .map_err(|_| Unauthenticated::Invalid("the Authorization header is not text".into()))?;
        let credential = match value.split_once(' ') {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim(),
            _ => return Err(Unauthenticated::Missing),
        };
        if credential.is_empty() {
            return Err(Unauthenticated::Missing);
        }
        if let Some(principal) = self.tokens.lookup(credential) {
            return Ok(principal);
        }
        match &self.jwt {
            Some(verifier) if credential.matches('.').count() == 2 => verifier
                .verify(credential)
                .await
                .map_err(|e| Unauthenticated::Invalid(e.0)),
            _ => Err(Unauthenticated::Invalid("unknown bearer token".into())),
        }
    }

    /// The URL of the protected-resource metadata (RFC 9728 §3.1: the well-known path inserted
    /// between the resource's host and its path).
    pub fn metadata_url(&self) -> String {
        match reqwest::Url::parse(&self.resource) {
            Ok(url) => {
                let path = url.path().trim_end_matches('/');
                let origin = url.origin().ascii_serialization();
                format!("{origin}{METADATA_PATH}{path}")
            }
            Err(_) => METADATA_PATH.to_string(),
        }
    }

    /// The protected-resource metadata document (RFC 9728 §2).
    pub fn metadata(&self) -> Value {
        json!({
            "resource": self.resource,
            "authorization_servers": self.authorization_servers,
            "bearer_methods_supported": ["header"],
            "resource_signing_alg_values_supported": ["RS256", "ES256", "EdDSA"],
            "resource_name": "ring0",
        })
    }

    /// The `WWW-Authenticate` value of a 401 (RFC 6750 §3, RFC 9728 §5.1).
    pub fn challenge(&self, why: &Unauthenticated) -> String {
        let mut out = format!("Bearer resource_metadata=\"{}\"", self.metadata_url());
        if let Unauthenticated::Invalid(description) = why {
            let safe: String = description
                .chars()
                .map(|c| {
                    if c == '"' || c == '\\' || !(' '..='~').contains(&c) {
                        '\''
                    } else {
                        c
                    }
                })
                .collect();
            out.push_str(&format!(
                ", error=\"invalid_token\", error_description=\"{safe}\""
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests;
