//! `jsonwebtoken`'s cryptography on `ring`: signature verification for RS256, ES256 and EdDSA,
//! nothing else.
//!
//! `jsonwebtoken` parses, checks claims and times, and asks a process-wide provider to verify
//! signatures. This provider verifies with `ring`, the library rustls already uses in this
//! build. It refuses every other algorithm (HMAC among them: a shared secret that a key set
//! could smuggle in as an `oct` key must never verify a token), and it signs nothing: ring0 only
//! verifies tokens other parties issue.

use jsonwebtoken::crypto::{CryptoProvider, JwtSigner, JwtVerifier, KeyUtils};
use jsonwebtoken::errors::{Error, ErrorKind, Result};
use jsonwebtoken::jwk::{EllipticCurve, ThumbprintHash};
use jsonwebtoken::signature;
use jsonwebtoken::{Algorithm, DecodingKey, DecodingKeyKind, EncodingKey};
use ring::signature as ring_sig;

/// The algorithms ring0 accepts in a JWT.
pub const ALGORITHMS: [Algorithm; 3] = [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA];

/// Verifies one algorithm's signatures with one key.
struct RingVerifier {
    algorithm: Algorithm,
    key: DecodingKey,
}

impl signature::Verifier<Vec<u8>> for RingVerifier {
    fn verify(&self, msg: &[u8], sig: &Vec<u8>) -> std::result::Result<(), signature::Error> {
        let refused = |_| signature::Error::new();
        match (self.algorithm, self.key.kind()) {
            (Algorithm::RS256, DecodingKeyKind::RsaModulusExponent { n, e }) => {
                ring_sig::RsaPublicKeyComponents { n, e }
                    .verify(&ring_sig::RSA_PKCS1_2048_8192_SHA256, msg, sig)
                    .map_err(refused)
            }
            (Algorithm::RS256, DecodingKeyKind::SecretOrDer(der)) => {
                ring_sig::UnparsedPublicKey::new(&ring_sig::RSA_PKCS1_2048_8192_SHA256, der)
                    .verify(msg, sig)
                    .map_err(refused)
            }
            (Algorithm::ES256, DecodingKeyKind::SecretOrDer(point)) => {
                ring_sig::UnparsedPublicKey::new(&ring_sig::ECDSA_P256_SHA256_FIXED, point)
                    .verify(msg, sig)
                    .map_err(refused)
            }
            (Algorithm::EdDSA, DecodingKeyKind::SecretOrDer(public)) => {
                ring_sig::UnparsedPublicKey::new(&ring_sig::ED25519, public)
                    .verify(msg, sig)
                    .map_err(refused)
            }
            _ => Err(signature::Error::new()),
        }
    }
}

impl JwtVerifier for RingVerifier {
    fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
}

fn new_verifier(algorithm: &Algorithm, key: &DecodingKey) -> Result<Box<dyn JwtVerifier>> {
    if !ALGORITHMS.contains(algorithm) || key.family() != algorithm.family() {
        return Err(Error::from(ErrorKind::InvalidAlgorithm));
    }
    Ok(Box::new(RingVerifier {
        algorithm: *algorithm,
        key: key.clone(),
    }))
}

fn new_signer(_: &Algorithm, _: &EncodingKey) -> Result<Box<dyn JwtSigner>> {
    Err(Error::from(ErrorKind::InvalidAlgorithm))
}

fn unsupported_components(_: &[u8]) -> Result<(Vec<u8>, Vec<u8>)> {
    Err(Error::from(ErrorKind::InvalidAlgorithm))
}

fn unsupported_ec(_: &[u8], _: Algorithm) -> Result<(EllipticCurve, Vec<u8>, Vec<u8>)> {
    Err(Error::from(ErrorKind::InvalidAlgorithm))
}

fn unsupported_ed(_: &[u8], _: &EllipticCurve) -> Result<Vec<u8>> {
    Err(Error::from(ErrorKind::InvalidAlgorithm))
}

fn digest(data: &[u8], hash: ThumbprintHash) -> Result<Vec<u8>> {
    let algorithm = match hash {
        ThumbprintHash::SHA256 => &ring::digest::SHA256,
        ThumbprintHash::SHA384 => &ring::digest::SHA384,
        ThumbprintHash::SHA512 => &ring::digest::SHA512,
        _ => return Err(Error::from(ErrorKind::InvalidAlgorithm)),
    };
    Ok(ring::digest::digest(algorithm, data).as_ref().to_vec())
}

/// The provider: verification on ring, no signing, no private-key utilities.
static RING_PROVIDER: CryptoProvider = CryptoProvider {
    signer_factory: new_signer,
    verifier_factory: new_verifier,
    key_utils: KeyUtils {
        rsa_pub_components_from_private_key: unsupported_components,
        rsa_pub_components_from_public_key: unsupported_components,
        ec_pub_components_from_private_key: unsupported_ec,
        ed_pub_components_from_private_key: unsupported_ed,
        compute_digest: digest,
    },
};

/// Installs the provider for the process (once; later calls are no-ops). Returns an error when
/// another provider was installed first, since its algorithms are not ring0's.
pub fn install() -> std::result::Result<(), String> {
    let _ = RING_PROVIDER.install_default();
    match CryptoProvider::try_get_default() {
        Some(p) if std::ptr::eq(p, &RING_PROVIDER) => Ok(()),
        _ => Err("another JWT crypto provider is installed in this process".into()),
    }
}
