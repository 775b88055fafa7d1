//! `egress-proxy observe`: the client side of `GET /v1/observe` — one HTTP/1.0 request to the
//! admin listener (so the body simply runs until the connection closes), each record printed
//! as it arrives, as JSON or as one human line ([`super::observe::human_line`]). The token is
//! read from a file or the environment and sent only in the request's `Authorization` header.
//! An `https://` admin listener (`listen.admin_tls`) is verified against the public roots and
//! `--cacert`, with `--cert`/`--key` when it asks for a client certificate.

use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// How to speak TLS to an `https://` admin listener.
#[derive(Debug, Default, Clone)]
pub struct AdminTls {
    /// PEM certificates trusted besides the public roots (the admin listener's CA).
    pub cacert: Option<PathBuf>,
    /// A client certificate and its key (PEM), for a listener with `client_ca_file`.
    pub cert: Option<PathBuf>,
    /// The client key file (with `cert`), for mTLS.
    pub key: Option<PathBuf>,
}

/// Why following the decisions failed.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// The admin token file could not be read.
    #[error("cannot read {path}: {source}")]
    TokenFile {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// No admin token was given.
    #[error("no admin token: --token-file FILE or EGRESS_PROXY_ADMIN_TOKEN")]
    NoToken,
    /// The admin API refused (its words).
    #[error("--admin must be http://HOST:PORT or https://HOST:PORT (the admin listener), not {0}")]
    Admin(String),
    /// The TLS settings could not be used.
    #[error("TLS to the admin listener: {0}")]
    Tls(String),
    /// The admin listener could not be reached.
    #[error("cannot connect to the admin listener {authority}: {source}")]
    Connect {
        /// Where it was looked for.
        authority: String,
        /// Why.
        source: std::io::Error,
    },
    /// The stream broke.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The admin listener answered something else than 200: its status line and body.
    #[error("{status} {body}")]
    Refused {
        /// The status line.
        status: String,
        /// The body.
        body: String,
    },
}

/// Follow the decisions at `admin` (`http://HOST:PORT`) with the admin token from
/// `token_file` (else `EGRESS_PROXY_ADMIN_TOKEN`), filtered by `filters`, printing each
/// record until the stream ends or stdout's reader goes away.
pub fn follow(
    admin: &str,
    token_file: Option<&Path>,
    filters: &[(&str, Option<String>)],
    json: bool,
    tls: &AdminTls,
) -> Result<(), ObserveError> {
    let (token, secure, authority) = reach(admin, token_file)?;
    let token = token.trim();
    let query: Vec<String> = filters
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", query_escape(v))))
        .collect();
    let stream =
        std::net::TcpStream::connect(authority).map_err(|source| ObserveError::Connect {
            authority: authority.to_string(),
            source,
        })?;
    let request = format!(
        "GET /v1/observe?{} HTTP/1.0\r\nHost: {authority}\r\nAuthorization: Bearer {token}\r\n\r\n",
        query.join("&")
    );
    match secure {
        false => exchange(stream, &request, json),
        true => {
            let conn = client(tls, authority)?;
            exchange(rustls::StreamOwned::new(conn, stream), &request, json)
        }
    }
}

/// The admin token (from `token_file`, else `EGRESS_PROXY_ADMIN_TOKEN`), whether `admin` is
/// `https://`, and its `HOST:PORT`.
pub(super) fn reach<'a>(
    admin: &'a str,
    token_file: Option<&Path>,
) -> Result<(String, bool, &'a str), ObserveError> {
    let token = match token_file {
        Some(f) => std::fs::read_to_string(f).map_err(|source| ObserveError::TokenFile {
            path: f.display().to_string(),
            source,
        })?,
        None => std::env::var("EGRESS_PROXY_ADMIN_TOKEN").map_err(|_| ObserveError::NoToken)?,
    };
    let (secure, rest) = match admin.split_once("://") {
        Some(("http", rest)) => (false, rest),
        Some(("https", rest)) => (true, rest),
        _ => return Err(ObserveError::Admin(admin.to_string())),
    };
    let authority = Some(rest.trim_end_matches('/'))
        .filter(|a| !a.is_empty() && !a.contains('/'))
        .ok_or_else(|| ObserveError::Admin(admin.to_string()))?;
    Ok((token, secure, authority))
}

/// A TLS client for the admin listener at `authority` (its certificate must name the host).
pub(super) fn client(
    tls: &AdminTls,
    authority: &str,
) -> Result<rustls::ClientConnection, ObserveError> {
    let bad = |what: &str, e: &dyn std::fmt::Display| ObserveError::Tls(format!("{what}: {e}"));
    let extra = match &tls.cacert {
        Some(f) => std::fs::read(f).map_err(|e| bad(&f.display().to_string(), &e))?,
        None => Vec::new(),
    };
    let roots = crate::egress::roots::public_and((!extra.is_empty()).then_some(&extra[..]))
        .map_err(|e| bad("--cacert", &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("TLS versions", &e))?
        .with_root_certificates(roots);
    let config = match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                .and_then(|i| i.collect())
                .map_err(|e| bad(&cert.display().to_string(), &e))?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| bad(&key.display().to_string(), &e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| bad("--cert/--key", &e))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => return Err(ObserveError::Tls("--cert and --key go together".into())),
    };
    let host = match authority.rsplit_once(':') {
        Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']'),
        None => authority,
    };
    let name = ServerName::try_from(host.to_string()).map_err(|e| bad(host, &e))?;
    rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| bad("TLS", &e))
}

/// Send the request, read the answer's head, then print the records.
fn exchange<S: Read + Write>(mut stream: S, request: &str, json: bool) -> Result<(), ObserveError> {
    stream.write_all(request.as_bytes()).map_err(|e| {
        match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            Some(t) => ObserveError::Tls(t.to_string()),
            None => ObserveError::Io(e),
        }
    })?;
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    let _ = reader.read_line(&mut status);
    // The headers, up to the blank line.
    loop {
        let mut h = String::new();
        match reader.read_line(&mut h) {
            Ok(0) | Err(_) => break,
            Ok(_) if h.trim_end().is_empty() => break,
            Ok(_) => {}
        }
    }
    if status.split_whitespace().nth(1) != Some("200") {
        let mut body = String::new();
        let _ = std::io::Read::read_to_string(&mut reader, &mut body);
        return Err(ObserveError::Refused {
            status: status.trim_end().to_string(),
            body: body.trim_end().to_string(),
        });
    }
    print_records(reader, json);
    Ok(())
}

/// Print each record line until the stream ends (or stdout's reader goes away).
fn print_records(reader: impl BufRead, json: bool) {
    let colour = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let mut out = std::io::stdout().lock();
    for line in reader.lines() {
        let Ok(line) = line else { break };
        let printed = if json {
            writeln!(out, "{}", super::shown::json_for_person(&line))
        } else {
            match serde_json::from_str::<serde_json::Value>(&line) {
                Ok(r) => writeln!(out, "{}", super::observe::human_line(&r, colour)),
                Err(_) => continue,
            }
        };
        if printed.and_then(|()| out.flush()).is_err() {
            // The reader of our output went away.
            return;
        }
    }
    eprintln!("the admin listener closed the stream");
}

/// A query value with everything but unreserved characters percent-encoded.
fn query_escape(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
