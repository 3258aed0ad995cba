//! The allow-list: which hosts and ports a contained process may reach.
//!
//! A rule is `host:port`. The host is an exact name (`crates.io`), a wildcard over subdomains
//! (`*.github.com` matches `api.github.com` and `a.b.github.com`, not `github.com` itself), an
//! IPv4 literal (`10.0.0.5`) or a bracketed IPv6 literal (`[::1]`); the port is a number or `*`.
//! Names compare case-insensitively, without a trailing dot. Nothing is allowed by default.
//!
//! A rule allows a name; the address the name resolves to is judged separately
//! ([`crate::address`]): loopback, private and link-local addresses are reached only through a
//! rule that names them — an IP literal equal to the address, or `localhost` for loopback.
//!
//! In configuration the policy is `network = { allow = ["host:port", ...] }`.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::IpAddr;

/// Most rules one policy holds.
pub const RULES_MAX: usize = 256;
/// Longest host name (RFC 1035).
pub const HOST_BYTES_MAX: usize = 253;
/// Longest label of a host name (RFC 1035).
const LABEL_BYTES_MAX: usize = 63;

/// Why a rule or a request's target could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// No `:port`.
    #[error("{0:?} has no port: write host:port (port a number or *)")]
    NoPort(String),
    /// A port outside 1-65535.
    #[error("{0:?}: port must be 1-65535 or *")]
    BadPort(String),
    /// A host that is no name, wildcard or literal.
    #[error("{0:?}: not a host name, *.suffix wildcard or IP literal")]
    BadHost(String),
    /// More than [`RULES_MAX`] rules.
    #[error("{given} rules exceed the limit of {RULES_MAX}")]
    TooManyRules {
        /// How many were given.
        given: usize,
    },
}

/// The host part of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// One name, lowercase, without a trailing dot.
    Exact(String),
    /// Any name ending in `.suffix` (the suffix is stored without its leading dot).
    Subdomains(String),
    /// One address.
    Ip(IpAddr),
}

/// The port part of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortPattern {
    /// This port.
    Exact(u16),
    /// `*`: every port.
    Any,
}

/// One `host:port` rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AllowRule {
    /// Which hosts.
    pub host: HostPattern,
    /// Which ports.
    pub port: PortPattern,
}

/// A request's destination as the client named it: a host (name or literal) and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The host.
    pub host: Host,
    /// The port.
    pub port: u16,
}

/// A destination host: a validated lowercase name or an IP literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A DNS name.
    Name(String),
    /// An address literal.
    Ip(IpAddr),
}

/// The policy of one sandbox profile's network: the rules, in the order written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressPolicy {
    /// The `host:port` rules; at most [`RULES_MAX`].
    #[serde(default, deserialize_with = "bounded_rules")]
    pub allow: Vec<AllowRule>,
}

fn bounded_rules<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<AllowRule>, D::Error> {
    let rules = Vec::<AllowRule>::deserialize(d)?;
    if rules.len() > RULES_MAX {
        return Err(serde::de::Error::custom(PatternError::TooManyRules {
            given: rules.len(),
        }));
    }
    Ok(rules)
}

/// How a target fared against the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleMatch<'a> {
    /// This rule allows the target.
    Allowed(&'a AllowRule),
    /// Some rule names the host, none its port.
    PortNotAllowed,
    /// No rule names the host.
    HostNotAllowed,
}

impl EgressPolicy {
    /// A policy from `host:port` strings.
    pub fn parse<S: AsRef<str>>(rules: &[S]) -> Result<Self, PatternError> {
        if rules.len() > RULES_MAX {
            return Err(PatternError::TooManyRules { given: rules.len() });
        }
        let allow = rules
            .iter()
            .map(|r| AllowRule::parse(r.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(Self { allow })
    }

    /// The first rule that allows `target`, or why none does.
    pub fn check(&self, target: &Target) -> RuleMatch<'_> {
        let mut host_named = false;
        for rule in &self.allow {
            if rule.host.matches(&target.host) {
                host_named = true;
                if rule.port.matches(target.port) {
                    return RuleMatch::Allowed(rule);
                }
            }
        }
        if host_named {
            RuleMatch::PortNotAllowed
        } else {
            RuleMatch::HostNotAllowed
        }
    }
}

impl AllowRule {
    /// Reads `host:port`.
    pub fn parse(text: &str) -> Result<Self, PatternError> {
        let (host, port) =
            split_host_port(text).ok_or_else(|| PatternError::NoPort(text.into()))?;
        let port = match port {
            "*" => PortPattern::Any,
            p => {
                PortPattern::Exact(parse_port(p).ok_or_else(|| PatternError::BadPort(text.into()))?)
            }
        };
        let host = if let Some(suffix) = host.strip_prefix("*.") {
            let suffix =
                normalize_name(suffix).ok_or_else(|| PatternError::BadHost(text.into()))?;
            HostPattern::Subdomains(suffix)
        } else {
            match parse_host(host).ok_or_else(|| PatternError::BadHost(text.into()))? {
                Host::Name(name) => HostPattern::Exact(name),
                Host::Ip(ip) => HostPattern::Ip(ip),
            }
        };
        Ok(Self { host, port })
    }

    /// Whether this rule names `ip` itself, which is what lets a loopback, private or
    /// link-local address through: the same IP literal, or `localhost` for a loopback address.
    pub fn names_address(&self, ip: IpAddr) -> bool {
        match &self.host {
            HostPattern::Ip(rule) => canonical_ip(*rule) == canonical_ip(ip),
            HostPattern::Exact(name) => name == "localhost" && canonical_ip(ip).is_loopback(),
            HostPattern::Subdomains(_) => false,
        }
    }
}

impl HostPattern {
    fn matches(&self, host: &Host) -> bool {
        match (self, host) {
            (HostPattern::Exact(rule), Host::Name(name)) => rule == name,
            (HostPattern::Subdomains(suffix), Host::Name(name)) => name
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            (HostPattern::Ip(rule), Host::Ip(ip)) => canonical_ip(*rule) == canonical_ip(*ip),
            _ => false,
        }
    }
}

impl PortPattern {
    fn matches(self, port: u16) -> bool {
        match self {
            PortPattern::Any => true,
            PortPattern::Exact(p) => p == port,
        }
    }
}

impl Target {
    /// Reads an authority `host:port` (a CONNECT target).
    pub fn parse_authority(text: &str) -> Option<Self> {
        let (host, port) = split_host_port(text)?;
        Some(Self {
            host: parse_host(host)?,
            port: parse_port(port)?,
        })
    }

    /// Reads an authority whose port may be left out (`default_port` then).
    pub fn parse_authority_or(text: &str, default_port: u16) -> Option<Self> {
        if text.ends_with(']') || !text.contains(':') {
            return Some(Self {
                host: parse_host(text)?,
                port: default_port,
            });
        }
        Self::parse_authority(text)
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl fmt::Display for AllowRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostPattern::Exact(name) => f.write_str(name)?,
            HostPattern::Subdomains(suffix) => write!(f, "*.{suffix}")?,
            HostPattern::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]")?,
            HostPattern::Ip(ip) => write!(f, "{ip}")?,
        }
        match self.port {
            PortPattern::Any => f.write_str(":*"),
            PortPattern::Exact(p) => write!(f, ":{p}"),
        }
    }
}

impl TryFrom<String> for AllowRule {
    type Error = PatternError;
    fn try_from(text: String) -> Result<Self, Self::Error> {
        Self::parse(&text)
    }
}

impl From<AllowRule> for String {
    fn from(rule: AllowRule) -> Self {
        rule.to_string()
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it carries, so `::ffff:10.0.0.1` is judged
/// (and matched) as `10.0.0.1`.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// `host:port` split at the last colon outside brackets.
fn split_host_port(text: &str) -> Option<(&str, &str)> {
    if let Some(rest) = text.strip_prefix('[') {
        let end = rest.find(']')?;
        let port = rest[end + 1..].strip_prefix(':')?;
        return Some((&text[..end + 2], port));
    }
    let (host, port) = text.rsplit_once(':')?;
    if host.contains(':') {
        return None;
    }
    Some((host, port))
}

fn parse_port(text: &str) -> Option<u16> {
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u16>().ok().filter(|p| *p != 0)
}

/// A host: a bracketed IPv6 literal, an IPv4 literal, or a valid name (lowercased).
fn parse_host(text: &str) -> Option<Host> {
    if let Some(inner) = text.strip_prefix('[') {
        let inner = inner.strip_suffix(']')?;
        return inner
            .parse::<std::net::Ipv6Addr>()
            .ok()
            .map(|ip| Host::Ip(IpAddr::V6(ip)));
    }
    if let Ok(ip) = text.parse::<std::net::Ipv4Addr>() {
        return Some(Host::Ip(IpAddr::V4(ip)));
    }
    normalize_name(text).map(Host::Name)
}

/// A DNS name in letters, digits, `-` and `_` labels, lowercased, trailing dot removed; `None`
/// for anything else (so a name never smuggles a port, a path or a second host).
fn normalize_name(text: &str) -> Option<String> {
    let name = text.strip_suffix('.').unwrap_or(text).to_ascii_lowercase();
    if name.is_empty() || name.len() > HOST_BYTES_MAX {
        return None;
    }
    let labels_ok = name.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= LABEL_BYTES_MAX
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    });
    // A name made only of digits and dots would be an IPv4 address in another notation
    // (`127.1`, `2130706433`): refused rather than left to a resolver's reading.
    let numeric = name.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    (labels_ok && !numeric).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(text: &str) -> Target {
        Target::parse_authority(text).unwrap()
    }

    #[test]
    fn rules_read_exact_wildcard_and_literal_hosts() {
        let policy = EgressPolicy::parse(&[
            "crates.io:443",
            "*.github.com:*",
            "[::1]:8080",
            "10.0.0.5:22",
        ])
        .unwrap();
        assert!(matches!(
            policy.check(&target("CRATES.IO.:443")),
            RuleMatch::Allowed(_)
        ));
        assert_eq!(
            policy.check(&target("crates.io:80")),
            RuleMatch::PortNotAllowed
        );
        assert!(matches!(
            policy.check(&target("a.b.github.com:1")),
            RuleMatch::Allowed(_)
        ));
        assert_eq!(
            policy.check(&target("github.com:443")),
            RuleMatch::HostNotAllowed
        );
        assert_eq!(
            policy.check(&target("evilgithub.com:443")),
            RuleMatch::HostNotAllowed
        );
        assert!(matches!(
            policy.check(&target("[::1]:8080")),
            RuleMatch::Allowed(_)
        ));
        assert!(matches!(
            policy.check(&target("10.0.0.5:22")),
            RuleMatch::Allowed(_)
        ));
        assert_eq!(policy.allow[1].to_string(), "*.github.com:*");
    }

    #[test]
    fn malformed_rules_are_refused_with_the_rule() {
        for bad in [
            "crates.io",
            "crates.io:0",
            "crates.io:65536",
            "a b:1",
            "*.:1",
            "::1:80",
            "127.1:80",
            "h:-1",
        ] {
            let err = AllowRule::parse(bad).unwrap_err();
            assert!(err.to_string().contains(bad), "{bad}: {err}");
        }
    }

    #[test]
    fn only_a_rule_naming_the_address_admits_it() {
        let local = AllowRule::parse("localhost:8080").unwrap();
        assert!(local.names_address("127.0.0.1".parse().unwrap()));
        assert!(local.names_address("::1".parse().unwrap()));
        assert!(!local.names_address("10.0.0.1".parse().unwrap()));
        let literal = AllowRule::parse("10.0.0.1:80").unwrap();
        assert!(literal.names_address("::ffff:10.0.0.1".parse().unwrap()));
        assert!(
            !AllowRule::parse("*.corp:80")
                .unwrap()
                .names_address("10.0.0.1".parse().unwrap())
        );
    }

    #[test]
    fn the_config_form_reads_and_refuses_unknown_keys() {
        let policy: EgressPolicy = toml::from_str(r#"allow = ["pypi.org:443"]"#).unwrap();
        assert_eq!(policy.allow.len(), 1);
        assert!(toml::from_str::<EgressPolicy>(r#"allow = ["pypi.org"]"#).is_err());
        assert!(toml::from_str::<EgressPolicy>(r#"deny = []"#).is_err());
    }
}
