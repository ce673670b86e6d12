//! TLS at the proxy's own listener (`CUSTOM_ROUTER_TLS_CERT_FILE` and
//! `CUSTOM_ROUTER_TLS_KEY_FILE`).
//!
//! With both variables set, the listener speaks TLS only, offering ALPN
//! `h2` and `http/1.1`: the client's choice picks the HTTP version of the
//! whole connection (no ALPN: HTTP/1.1). The certificate chain and key are
//! read at startup (a file that cannot be read, holds no PEM certificate
//! or key, or a key that does not match the certificate stops startup,
//! naming the variable and the reason).
//!
//! Reload: a task checks both files' modification times and sizes every
//! `CUSTOM_ROUTER_TLS_POLL_INTERVAL` (2 s). When either changed, the pair
//! is read again and, if it is usable, swapped in: handshakes from then on
//! present it (connections already open keep theirs). A pair that is not
//! usable (a half-written file, a key that does not match yet) is logged
//! and the previous pair stays in use; the next change is tried again, so
//! a certificate and key replaced one after the other end up loaded. The
//! certified key lives behind an [`ArcSwap`], read by a rustls
//! [`ResolvesServerCert`] at each handshake: one atomic load.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;

use crate::settings::TlsFiles;

/// The variable naming the certificate chain.
pub(crate) const CERT_VAR: &str = "CUSTOM_ROUTER_TLS_CERT_FILE";
/// The variable naming the private key.
pub(crate) const KEY_VAR: &str = "CUSTOM_ROUTER_TLS_KEY_FILE";

/// Why a certificate and key cannot be used: the variable at fault and
/// the reason (never the key's bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PairError {
    /// [`CERT_VAR`] or [`KEY_VAR`].
    pub(crate) var: &'static str,
    /// What is wrong, with the file's path.
    pub(crate) reason: String,
}

/// The listener's TLS: the acceptor and the certified key it presents.
#[derive(Clone)]
pub(crate) struct ListenerTls {
    /// Accepts handshakes with the current pair.
    pub(crate) acceptor: TlsAcceptor,
    resolver: Arc<CurrentPair>,
}

impl ListenerTls {
    /// Reads `files` and builds the acceptor; the stamp is for [`watch`].
    pub(crate) fn load(files: &TlsFiles) -> Result<(Self, Stamp), PairError> {
        let stamp = Stamp::of(files);
        let pair = read_pair(files)?;
        let resolver = Arc::new(CurrentPair(ArcSwap::new(pair)));
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| PairError {
            var: CERT_VAR,
            reason: format!("TLS set-up: {e}"),
        })?
        .with_no_client_auth()
        .with_cert_resolver(Arc::clone(&resolver) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok((
            Self {
                acceptor: TlsAcceptor::from(Arc::new(config)),
                resolver,
            },
            stamp,
        ))
    }
}

impl ListenerTls {
    /// A client config for this proxy's own calls to its listener (the
    /// parked tasks' runs): it trusts exactly the certificate the listener
    /// presents now, whatever names it holds.
    pub(crate) fn loopback_client(&self) -> Result<rustls::ClientConfig, rustls::Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = Arc::new(OwnCertificate {
            current: Arc::clone(&self.resolver),
            algorithms: provider.signature_verification_algorithms,
        });
        Ok(rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth())
    }
}

/// Trusts the one certificate the listener presents now (see
/// [`ListenerTls::loopback_client`]); signatures are checked as usual.
#[derive(Debug)]
struct OwnCertificate {
    current: Arc<CurrentPair>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl rustls::client::danger::ServerCertVerifier for OwnCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        match self.current.0.load().end_entity_cert() {
            Ok(own) if own == end_entity => {
                Ok(rustls::client::danger::ServerCertVerified::assertion())
            }
            _ => Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The pair handshakes present now.
#[derive(Debug)]
struct CurrentPair(ArcSwap<CertifiedKey>);

impl ResolvesServerCert for CurrentPair {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}

/// What the watcher compares: each file's modification time and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stamp([Option<(SystemTime, u64)>; 2]);

impl Stamp {
    fn of(files: &TlsFiles) -> Self {
        let one = |p: &Path| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())))
        };
        Self([one(&files.cert), one(&files.key)])
    }
}

/// Reads and checks a certificate chain and its key.
pub(crate) fn read_pair(files: &TlsFiles) -> Result<Arc<CertifiedKey>, PairError> {
    let cert_err = |reason: String| PairError {
        var: CERT_VAR,
        reason: format!("{}: {reason}", files.cert.display()),
    };
    let key_err = |reason: String| PairError {
        var: KEY_VAR,
        reason: format!("{}: {reason}", files.key.display()),
    };
    let pem = std::fs::read(&files.cert).map_err(|e| cert_err(format!("cannot read it: {e}")))?;
    let chain = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| cert_err(format!("not PEM: {e}")))?;
    if chain.is_empty() {
        return Err(cert_err("no PEM certificate in it".into()));
    }
    let pem = std::fs::read(&files.key).map_err(|e| key_err(format!("cannot read it: {e}")))?;
    let key = rustls_pemfile::private_key(&mut pem.as_slice())
        // The parser's message never quotes the key.
        .map_err(|e| key_err(format!("not PEM: {e}")))?
        .ok_or_else(|| key_err("no PEM private key in it".into()))?;
    let signing = rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| key_err(format!("not a usable private key: {e}")))?;
    let pair = CertifiedKey::new(chain, signing);
    match pair.keys_match() {
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => Err(
            key_err(format!("does not match the certificate in {CERT_VAR}")),
        ),
        // Ok, or a key whose public half cannot be told: used as given.
        _ => Ok(Arc::new(pair)),
    }
}

/// Checks the files every `interval` and swaps in a changed, usable pair
/// (see the module docs).
pub(crate) async fn watch(files: TlsFiles, tls: ListenerTls, interval: Duration, mut seen: Stamp) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let now = Stamp::of(&files);
        if now == seen {
            continue;
        }
        seen = now;
        match read_pair(&files) {
            Ok(pair) => {
                tls.resolver.0.store(pair);
                tracing::info!(
                    cert = %files.cert.display(),
                    "listener certificate reloaded; new handshakes present it"
                );
            }
            Err(e) => tracing::warn!(
                var = e.var,
                reason = %e.reason,
                "listener certificate or key changed but cannot be used; the previous pair is kept"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair_files(dir: &Path, name: &str) -> TlsFiles {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let files = TlsFiles {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        };
        std::fs::write(&files.cert, ck.cert.pem()).unwrap();
        std::fs::write(&files.key, ck.signing_key.serialize_pem()).unwrap();
        files
    }

    /// Issue 30, item 11: each unusable file is named with its reason;
    /// a key of another certificate is refused.
    #[test]
    fn an_unusable_pair_names_the_variable_and_the_reason() {
        let dir = std::env::temp_dir().join(format!("router-listener-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = pair_files(&dir, "a");
        let b = pair_files(&dir, "b");
        assert!(read_pair(&a).is_ok());
        let missing = TlsFiles {
            cert: dir.join("missing.crt"),
            ..a.clone()
        };
        let e = read_pair(&missing).unwrap_err();
        assert_eq!(e.var, CERT_VAR);
        assert!(e.reason.contains("cannot read it"), "{e:?}");
        // Swapped: no certificate in the key file.
        let swapped = TlsFiles {
            cert: a.key.clone(),
            key: a.cert.clone(),
        };
        let e = read_pair(&swapped).unwrap_err();
        assert_eq!(e.var, CERT_VAR);
        assert!(e.reason.contains("no PEM certificate"), "{e:?}");
        let no_key = TlsFiles {
            cert: a.cert.clone(),
            key: a.cert.clone(),
        };
        let e = read_pair(&no_key).unwrap_err();
        assert_eq!(e.var, KEY_VAR);
        assert!(e.reason.contains("no PEM private key"), "{e:?}");
        let mismatched = TlsFiles {
            cert: a.cert.clone(),
            key: b.key.clone(),
        };
        let e = read_pair(&mismatched).unwrap_err();
        assert_eq!(e.var, KEY_VAR);
        assert!(e.reason.contains("does not match"), "{e:?}");
        // The key's bytes are never part of the reason.
        let key_text = std::fs::read_to_string(&b.key).unwrap();
        let body_line = key_text.lines().nth(1).unwrap_or_default();
        assert!(!e.reason.contains(body_line));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
