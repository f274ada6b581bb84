//! TLS with rustls. `sslmode` follows libpq: `disable`, `prefer` and `require` encrypt
//! (when the server offers it) without checking the certificate; `verify-ca` checks it
//! against the root certificates (`sslrootcert`, else the system's); `verify-full`
//! also checks that it names the host. `sslcert`/`sslkey` present a client
//! certificate. tokio-postgres parses only disable/prefer/require, so the verifying
//! modes are carried here and the connection is made in `require` mode with the
//! matching verifier.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::error::{Error, Result};

/// libpq's `sslmode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// No TLS.
    Disable,
    /// TLS when the server offers it, any certificate accepted (libpq's `allow` too).
    /// Default.
    #[default]
    Prefer,
    /// TLS or no connection; any certificate accepted.
    Require,
    /// TLS; the server's certificate must chain to a trusted root (`sslrootcert`, else
    /// the system's); its host name is not checked.
    VerifyCa,
    /// As `VerifyCa`, and the certificate must name the host connected to.
    VerifyFull,
}

impl SslMode {
    /// Parses a libpq `sslmode` value.
    pub fn parse(value: &str) -> Result<SslMode> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(Error::Config(format!(
                "sslmode must be disable, prefer, require, verify-ca or verify-full, got {other:?}"
            )))
            }
        })
    }

    /// The mode tokio-postgres negotiates with.
    pub fn negotiation(self) -> tokio_postgres::config::SslMode {
        match self {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        }
    }
}

/// The TLS part of a configuration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TlsSettings {
    /// `sslmode`.
    pub mode: SslMode,
    /// `sslrootcert`: PEM file of the roots `verify-ca`/`verify-full` trust (`None`: the
    /// system's).
    pub rootcert: Option<PathBuf>,
    /// `sslcert`: PEM client certificate chain (with `key`, or neither).
    pub cert: Option<PathBuf>,
    /// `sslkey`: PEM private key of `cert`.
    pub key: Option<PathBuf>,
}

/// The crypto provider of every TLS connection: *ring*'s. rustls 0.23.48 deprecates it
/// for offering no post-quantum key exchange; its replacement (aws-lc-rs) builds a C
/// library with cmake/nasm on every machine that compiles the gem or the package. Until
/// PostgreSQL clients need post-quantum key exchange, *ring* stays (a decision, kept
/// visible here rather than failing builds that deny warnings).
#[allow(deprecated)]
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_error(what: &str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Config(format!("{what} {}: {e}", path.display()))
}

fn certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let file = File::open(path).map_err(|e| read_error(what, path, e))?;
    let certs = CertificateDer::pem_reader_iter(BufReader::new(file))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| read_error(what, path, e))?;
    if certs.is_empty() {
        return Err(read_error(what, path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

fn roots(settings: &TlsSettings) -> Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    match &settings.rootcert {
        Some(path) => {
            for cert in certificates(path, "sslrootcert")? {
                store
                    .add(cert)
                    .map_err(|e| read_error("sslrootcert", path, e))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = store.add(cert);
            }
            if store.is_empty() {
                return Err(Error::Config(
                    "sslmode verify-ca/verify-full needs sslrootcert: no system root \
                     certificates were found"
                        .into(),
                ));
            }
        }
    }
    Ok(store)
}

/// The connector for `settings`, built once per pool. Errors name the file or the
/// setting at fault (at first use of the pool, never later).
pub fn connector(settings: &TlsSettings) -> Result<MakeRustlsConnect> {
    let provider = provider();
    let verifier: Arc<dyn ServerCertVerifier> = match settings.mode {
        SslMode::Disable | SslMode::Prefer | SslMode::Require => {
            Arc::new(EncryptOnly(provider.clone()))
        }
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let webpki = WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots(settings)?),
                provider.clone(),
            )
            .build()
            .map_err(|e| Error::Config(format!("TLS verifier: {e}")))?;
            if settings.mode == SslMode::VerifyCa {
                Arc::new(IgnoreHostName(webpki))
            } else {
                webpki
            }
        }
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match (&settings.cert, &settings.key) {
        (Some(cert), Some(key)) => {
            let chain = certificates(cert, "sslcert")?;
            let key =
                PrivateKeyDer::from_pem_file(key).map_err(|e| read_error("sslkey", key, e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| Error::Config(format!("sslcert/sslkey: {e}")))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(Error::Config(
                "sslcert and sslkey go together: set both or neither".into(),
            ))
        }
    };
    Ok(MakeRustlsConnect::new(config))
}

/// `disable`/`prefer`/`require`: encrypt, accept any certificate (libpq's behaviour).
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the name is not checked.
#[derive(Debug)]
struct IgnoreHostName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for IgnoreHostName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
