//! JWT verification with keys made in the test: what is accepted, and each way a token is
//! refused.

use super::*;
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{self as sig, KeyPair};
use serde_json::json;

const ISSUER: &str = "https://id.test";
const RESOURCE: &str = "http://127.0.0.1:8808/mcp";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A signing key of the test and its public JWK.
enum TestKey {
    Es256(sig::EcdsaKeyPair),
    Ed(sig::Ed25519KeyPair),
    Rs256(sig::RsaKeyPair),
}

impl TestKey {
    fn es256() -> Self {
        let rng = SystemRandom::new();
        let alg = &sig::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = sig::EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        Self::Es256(sig::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap())
    }

    fn ed25519() -> Self {
        let pkcs8 = sig::Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        Self::Ed(sig::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap())
    }

    /// An RSA key from `openssl` (ring does not generate RSA keys); `None` without openssl.
    fn rs256() -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let pem = dir.path().join("k.pem");
        let der = dir.path().join("k.der");
        let ok = std::process::Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
            ])
            .arg(&pem)
            .output()
            .ok()?
            .status
            .success()
            && std::process::Command::new("openssl")
                .args(["pkcs8", "-topk8", "-nocrypt", "-outform", "DER", "-in"])
                .arg(&pem)
                .arg("-out")
                .arg(&der)
                .output()
                .ok()?
                .status
                .success();
        if !ok {
            return None;
        }
        let bytes = std::fs::read(&der).ok()?;
        Some(Self::Rs256(sig::RsaKeyPair::from_pkcs8(&bytes).ok()?))
    }

    fn alg(&self) -> &'static str {
        match self {
            Self::Es256(_) => "ES256",
            Self::Ed(_) => "EdDSA",
            Self::Rs256(_) => "RS256",
        }
    }

    fn jwk(&self, kid: &str) -> Value {
        match self {
            Self::Es256(k) => {
                let point = k.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig",
                       "x": b64(&point[1..33]), "y": b64(&point[33..65])})
            }
            Self::Ed(k) => {
                json!({"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": b64(k.public_key().as_ref())})
            }
            Self::Rs256(k) => {
                let c: sig::RsaPublicKeyComponents<Vec<u8>> = k.public().into();
                json!({"kty": "RSA", "kid": kid, "alg": "RS256", "n": b64(&c.n), "e": b64(&c.e)})
            }
        }
    }

    fn sign(&self, message: &[u8]) -> Vec<u8> {
        let rng = SystemRandom::new();
        match self {
            Self::Es256(k) => k.sign(&rng, message).unwrap().as_ref().to_vec(),
            Self::Ed(k) => k.sign(message).as_ref().to_vec(),
            Self::Rs256(k) => {
                let mut out = vec![0; k.public().modulus_len()];
                k.sign(&sig::RSA_PKCS1_SHA256, &rng, message, &mut out)
                    .unwrap();
                out
            }
        }
    }

    /// A signed token with `header` fields over the defaults (`alg`, `kid`).
    fn token(&self, kid: &str, header: Value, claims: &Value) -> String {
        let mut h = json!({"alg": self.alg(), "typ": "JWT", "kid": kid});
        for (k, v) in header.as_object().unwrap() {
            h[k] = v.clone();
        }
        let message = format!(
            "{}.{}",
            b64(h.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        format!("{message}.{}", b64(&self.sign(message.as_bytes())))
    }
}

fn claims() -> Value {
    json!({"iss": ISSUER, "aud": RESOURCE, "sub": "alice", "exp": now() + 300,
           "groups": ["eng", "oncall"], "email": "alice@example.test"})
}

struct Fixture {
    _dir: tempfile::TempDir,
    jwks: PathBuf,
    auth: Authenticator,
}

async fn fixture(keys: &[(&TestKey, &str)], extra: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    let set: Vec<Value> = keys.iter().map(|(k, kid)| k.jwk(kid)).collect();
    std::fs::write(&jwks, json!({"keys": set}).to_string()).unwrap();
    let text = format!(
        "[jwt]\nissuer = {ISSUER:?}\njwks_file = \"jwks.json\"\ngroups_claim = \"groups\"\n{extra}"
    );
    let config: AuthConfig = toml::from_str(&text).unwrap();
    let auth = Authenticator::new(&config, None, dir.path(), RESOURCE)
        .await
        .unwrap();
    Fixture {
        _dir: dir,
        jwks,
        auth,
    }
}

use std::path::PathBuf;

async fn check(auth: &Authenticator, token: &str) -> Result<Principal, Unauthenticated> {
    auth.authenticate(Some(format!("Bearer {token}").as_bytes()))
        .await
}

fn refused(result: Result<Principal, Unauthenticated>, needle: &str) {
    match result {
        Err(Unauthenticated::Invalid(why)) => assert!(why.contains(needle), "{why}"),
        other => panic!("expected a refusal mentioning {needle:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn a_valid_token_of_each_algorithm_names_its_principal_groups_and_claims() {
    let es = TestKey::es256();
    let ed = TestKey::ed25519();
    let rs = TestKey::rs256();
    let mut keys = vec![(&es, "es"), (&ed, "ed")];
    if let Some(rs) = &rs {
        keys.push((rs, "rs"));
    } else {
        eprintln!("openssl is missing: RS256 is not exercised");
    }
    let f = fixture(&keys, "").await;
    for (key, kid) in &keys {
        let p = check(&f.auth, &key.token(kid, json!({}), &claims()))
            .await
            .unwrap_or_else(|e| panic!("{}: {e:?}", key.alg()));
        assert_eq!(p.id, "alice");
        assert_eq!(p.groups, vec!["eng".to_string(), "oncall".to_string()]);
        assert_eq!(p.claims["email"], "alice@example.test");
        assert_eq!(p.claims["iss"], ISSUER);
    }
}

#[tokio::test]
async fn a_token_for_another_resource_is_refused() {
    let k = TestKey::es256();
    let f = fixture(&[(&k, "k")], "").await;
    let mut c = claims();
    c["aud"] = json!("https://other.test/mcp");
    refused(
        check(&f.auth, &k.token("k", json!({}), &c)).await,
        "another resource",
    );
    c.as_object_mut().unwrap().remove("aud");
    refused(check(&f.auth, &k.token("k", json!({}), &c)).await, "aud");
}

#[tokio::test]
async fn a_token_of_another_issuer_is_refused() {
    let k = TestKey::es256();
    let f = fixture(&[(&k, "k")], "").await;
    let mut c = claims();
    c["iss"] = json!("https://evil.test");
    refused(check(&f.auth, &k.token("k", json!({}), &c)).await, "issuer");
}

#[tokio::test]
async fn expiry_and_not_before_are_enforced_beyond_the_leeway() {
    let k = TestKey::ed25519();
    let f = fixture(&[(&k, "k")], "").await;
    let leeway = jwt::JWT_LEEWAY_SECS as i64;
    let mut c = claims();
    c["exp"] = json!(now() - leeway - 5);
    refused(
        check(&f.auth, &k.token("k", json!({}), &c)).await,
        "expired",
    );
    c["exp"] = json!(now() - leeway / 2);
    assert!(
        check(&f.auth, &k.token("k", json!({}), &c)).await.is_ok(),
        "within the leeway"
    );
    let mut c = claims();
    c["nbf"] = json!(now() + leeway + 60);
    refused(
        check(&f.auth, &k.token("k", json!({}), &c)).await,
        "not valid yet",
    );
    let mut c = claims();
    c.as_object_mut().unwrap().remove("exp");
    refused(check(&f.auth, &k.token("k", json!({}), &c)).await, "exp");
}

#[tokio::test]
async fn a_bad_signature_and_a_key_of_another_party_are_refused() {
    let k = TestKey::es256();
    let f = fixture(&[(&k, "k")], "").await;
    let token = k.token("k", json!({}), &claims());
    let (message, signature) = token.rsplit_once('.').unwrap();
    let mut raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(signature)
        .unwrap();
    raw[0] ^= 1;
    refused(
        check(&f.auth, &format!("{message}.{}", b64(&raw))).await,
        "signature",
    );
    let stranger = TestKey::es256();
    refused(
        check(&f.auth, &stranger.token("k", json!({}), &claims())).await,
        "signature",
    );
}

#[tokio::test]
async fn alg_none_and_hmac_are_refused() {
    let k = TestKey::es256();
    let f = fixture(&[(&k, "k")], "").await;
    let header = b64(json!({"alg": "none", "kid": "k"}).to_string().as_bytes());
    let body = b64(claims().to_string().as_bytes());
    refused(
        check(&f.auth, &format!("{header}.{body}.")).await,
        "malformed",
    );
    // HS256 with the public key's bytes as the secret: the classic key-confusion attack.
    let header = b64(json!({"alg": "HS256", "kid": "k"}).to_string().as_bytes());
    let message = format!("{header}.{body}");
    let secret = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, k.jwk("k").to_string().as_bytes());
    let tag = ring::hmac::sign(&secret, message.as_bytes());
    refused(
        check(&f.auth, &format!("{message}.{}", b64(tag.as_ref()))).await,
        "not accepted",
    );
}

#[tokio::test]
async fn a_token_whose_algorithm_is_not_its_keys_is_refused() {
    let es = TestKey::es256();
    let ed = TestKey::ed25519();
    let f = fixture(&[(&es, "es")], "").await;
    // Signed by an EdDSA key but naming the ES256 key's id.
    refused(
        check(&f.auth, &ed.token("es", json!({}), &claims())).await,
        "algorithm",
    );
}

#[tokio::test]
async fn an_unknown_kid_is_refused_and_a_rotated_key_is_picked_up() {
    let old = TestKey::es256();
    let new = TestKey::ed25519();
    let f = fixture(&[(&old, "old")], "").await;
    let token = new.token("new", json!({}), &claims());
    refused(check(&f.auth, &token).await, "no key \"new\"");
    // The issuer rotates: the key set now holds the new key. The refresh after the first
    // unknown kid counts against the bounded rate, so the next read waits for the interval;
    // a fresh verifier (a restart, or the interval passing) sees it.
    std::fs::write(
        &f.jwks,
        json!({"keys": [old.jwk("old"), new.jwk("new")]}).to_string(),
    )
    .unwrap();
    refused(check(&f.auth, &token).await, "no key");
    let text = format!("[jwt]\nissuer = {ISSUER:?}\njwks_file = {:?}\n", f.jwks);
    let config: AuthConfig = toml::from_str(&text).unwrap();
    let again = Authenticator::new(&config, None, std::path::Path::new("/"), RESOURCE)
        .await
        .unwrap();
    assert_eq!(check(&again, &token).await.unwrap().id, "alice");
}

#[tokio::test]
async fn an_unknown_kid_rereads_the_key_set_once_it_is_allowed() {
    let old = TestKey::es256();
    let new = TestKey::ed25519();
    let f = fixture(&[(&old, "old")], "").await;
    std::fs::write(
        &f.jwks,
        json!({"keys": [old.jwk("old"), new.jwk("new")]}).to_string(),
    )
    .unwrap();
    // The first unknown kid since start reads the set again and finds the key.
    let token = new.token("new", json!({}), &claims());
    assert_eq!(check(&f.auth, &token).await.unwrap().id, "alice");
}

#[tokio::test]
async fn principal_and_group_claims_are_mapped_as_configured() {
    let k = TestKey::es256();
    let f = fixture(&[(&k, "k")], "principal_claim = \"email\"\n").await;
    let p = check(&f.auth, &k.token("k", json!({}), &claims()))
        .await
        .unwrap();
    assert_eq!(p.id, "alice@example.test");
    let mut c = claims();
    c["groups"] = json!("eng  ops");
    let p = check(&f.auth, &k.token("k", json!({}), &c)).await.unwrap();
    assert_eq!(p.groups, vec!["eng".to_string(), "ops".to_string()]);
    c["groups"] = json!([1, 2]);
    refused(
        check(&f.auth, &k.token("k", json!({}), &c)).await,
        "non-string",
    );
    let mut c = claims();
    c["email"] = json!("local");
    refused(
        check(&f.auth, &k.token("k", json!({}), &c)).await,
        "reserved",
    );
}

#[tokio::test]
async fn an_explicit_audience_replaces_the_resource() {
    let k = TestKey::es256();
    let f = fixture(&[(&k, "k")], "audience = [\"api://ring0\"]\n").await;
    let mut c = claims();
    refused(
        check(&f.auth, &k.token("k", json!({}), &c)).await,
        "another resource",
    );
    c["aud"] = json!(["api://ring0", "x"]);
    assert!(check(&f.auth, &k.token("k", json!({}), &c)).await.is_ok());
}

#[tokio::test]
async fn missing_and_malformed_credentials_are_told_apart() {
    let k = TestKey::es256();
    let f = fixture(&[(&k, "k")], "").await;
    assert_eq!(
        f.auth.authenticate(None).await,
        Err(Unauthenticated::Missing)
    );
    assert_eq!(
        f.auth.authenticate(Some(b"Basic dTpw")).await,
        Err(Unauthenticated::Missing)
    );
    refused(check(&f.auth, "not-a-token").await, "unknown bearer token");
    let huge = "a".repeat(AUTHORIZATION_BYTES_MAX + 1);
    refused(check(&f.auth, &huge).await, "longer than");
}

#[tokio::test]
async fn static_tokens_and_the_local_token_name_their_principals() {
    let config: AuthConfig = toml::from_str(&format!(
        "[[tokens]]\nname = \"ci\"\nsha256 = {:?}\ngroups = [\"automation\"]\n",
        token::hash_hex("ci-token")
    ))
    .unwrap();
    let auth = Authenticator::new(
        &config,
        Some("env-token".into()),
        std::path::Path::new("/"),
        RESOURCE,
    )
    .await
    .unwrap();
    let p = check(&auth, "ci-token").await.unwrap();
    assert_eq!((p.id.as_str(), p.groups.len()), ("ci", 1));
    assert!(check(&auth, "env-token").await.unwrap().is_local());
    refused(check(&auth, "other").await, "unknown bearer token");
}

#[tokio::test]
async fn the_challenge_points_at_the_metadata_and_says_invalid_token_only_for_a_bad_one() {
    let auth = Authenticator::new(
        &AuthConfig::default(),
        Some("t".into()),
        std::path::Path::new("/"),
        "https://ring0.test/mcp",
    )
    .await
    .unwrap();
    assert_eq!(
        auth.metadata_url(),
        "https://ring0.test/.well-known/oauth-protected-resource/mcp"
    );
    let missing = auth.challenge(&Unauthenticated::Missing);
    assert_eq!(
        missing,
        "Bearer resource_metadata=\"https://ring0.test/.well-known/oauth-protected-resource/mcp\""
    );
    let invalid = auth.challenge(&Unauthenticated::Invalid("bad \"quote\"\n".into()));
    assert!(invalid.contains("error=\"invalid_token\""), "{invalid}");
    assert!(
        !invalid.contains("\"quote\""),
        "quotes are escaped: {invalid}"
    );
    assert_eq!(auth.metadata()["resource"], "https://ring0.test/mcp");
}

#[test]
fn key_set_urls_must_be_https_or_loopback() {
    assert!(jwt::check_jwks_url("https://id.test/jwks").is_ok());
    assert!(jwt::check_jwks_url("http://127.0.0.1:9/jwks").is_ok());
    assert!(jwt::check_jwks_url("http://[::1]:9/jwks").is_ok());
    assert!(jwt::check_jwks_url("http://localhost/jwks").is_ok());
    assert!(jwt::check_jwks_url("http://id.test/jwks").is_err());
    assert!(jwt::check_jwks_url("file:///etc/jwks").is_err());
}

/// Serves `body` as the answer to every request on a loopback port; returns the URL.
async fn serve_once_per_request(body: String) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = tcp.read(&mut buf).await;
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tcp.write_all(response.as_bytes()).await;
            });
        }
    });
    format!("http://{addr}/jwks")
}

#[tokio::test]
async fn a_key_set_url_on_loopback_is_fetched_and_used() {
    let k = TestKey::ed25519();
    let url = serve_once_per_request(json!({"keys": [k.jwk("k")]}).to_string()).await;
    let text = format!("[jwt]\nissuer = {ISSUER:?}\njwks_url = {url:?}\n");
    let config: AuthConfig = toml::from_str(&text).unwrap();
    let auth = Authenticator::new(&config, None, std::path::Path::new("/"), RESOURCE)
        .await
        .unwrap();
    let p = check(&auth, &k.token("k", json!({}), &claims()))
        .await
        .unwrap();
    assert_eq!(p.id, "alice");
}

#[tokio::test]
async fn a_key_set_without_a_usable_key_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("jwks.json"),
        json!({"keys": [{"kty": "oct", "kid": "h", "k": "c2VjcmV0"}]}).to_string(),
    )
    .unwrap();
    let text = format!("[jwt]\nissuer = {ISSUER:?}\njwks_file = \"jwks.json\"\n");
    let config: AuthConfig = toml::from_str(&text).unwrap();
    let e = Authenticator::new(&config, None, dir.path(), RESOURCE)
        .await
        .err()
        .expect("an HMAC secret is no signing key ring0 accepts");
    assert!(
        e.contains("holds no RS256, ES256 or EdDSA signing key"),
        "{e}"
    );
}
