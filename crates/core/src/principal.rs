//! Who is calling: the principal a request acts for.
//!
//! Every request ring0 mediates has a principal. Over stdio (and over HTTP when no credential is
//! configured) it is [`Principal::local`], the operating-system user who started ring0. Over HTTP
//! with credentials it is the one the credential names: a static token's configured id and
//! groups, or a JWT's mapped claims. Policy decisions, remembered approvals, rate buckets and the
//! audit trail are all keyed by it, so nothing one principal did or was allowed reaches another.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Longest principal id, in bytes.
pub const PRINCIPAL_ID_BYTES_MAX: usize = 256;
/// Most groups one principal carries.
pub const PRINCIPAL_GROUPS_MAX: usize = 64;

/// The principal of a request: an id, the groups it belongs to, and the credential's claims
/// (empty for `local` and static tokens).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    /// Stable id (`local`, a token's configured principal, a JWT's mapped subject).
    pub id: String,
    /// Groups, as configured for a token or mapped from a JWT claim.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// The verified claims of a JWT; empty otherwise. Never holds the token itself.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub claims: Map<String, Value>,
}

impl Principal {
    /// The id of the local principal.
    pub const LOCAL_ID: &'static str = "local";

    /// The local principal: the OS user who runs ring0 (stdio, or HTTP with no credentials).
    pub fn local() -> Self {
        Self::new(Self::LOCAL_ID)
    }

    /// A principal with an id and no groups or claims.
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            groups: Vec::new(),
            claims: Map::new(),
        }
    }

    /// Adds groups.
    pub fn with_groups(mut self, groups: impl IntoIterator<Item = String>) -> Self {
        self.groups.extend(groups);
        self
    }

    /// Whether this is the local principal.
    pub fn is_local(&self) -> bool {
        self.id == Self::LOCAL_ID
    }
}

impl Default for Principal {
    fn default() -> Self {
        Self::local()
    }
}
