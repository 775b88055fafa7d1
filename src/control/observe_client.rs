//! `egress-proxy observe`: the client side of `GET /v1/observe` — one HTTP/1.0 request to the
//! admin listener (so the body simply runs until the connection closes), each record printed
//! as it arrives, as JSON or as one human line ([`super::observe::human_line`]). The token is
//! read from a file or the environment and sent only in the request's `Authorization` header.

use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::Path;

/// Why following the decisions failed.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    #[error("cannot read {path}: {source}")]
    TokenFile {
        path: String,
        source: std::io::Error,
    },
    #[error("no admin token: --token-file FILE or EGRESS_PROXY_ADMIN_TOKEN")]
    NoToken,
    #[error("--admin must be http://HOST:PORT (the admin listener), not {0}")]
    Admin(String),
    #[error("cannot connect to the admin listener {authority}: {source}")]
    Connect {
        authority: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The admin listener answered something else than 200: its status line and body.
    #[error("{0}")]
    Refused(String),
}

/// Follow the decisions at `admin` (`http://HOST:PORT`) with the admin token from
/// `token_file` (else `EGRESS_PROXY_ADMIN_TOKEN`), filtered by `filters`, printing each
/// record until the stream ends or stdout's reader goes away.
pub fn follow(
    admin: &str,
    token_file: Option<&Path>,
    filters: &[(&str, Option<String>)],
    json: bool,
) -> Result<(), ObserveError> {
    let token = match token_file {
        Some(f) => std::fs::read_to_string(f).map_err(|source| ObserveError::TokenFile {
            path: f.display().to_string(),
            source,
        })?,
        None => std::env::var("EGRESS_PROXY_ADMIN_TOKEN").map_err(|_| ObserveError::NoToken)?,
    };
    let token = token.trim();
    let authority = admin
        .strip_prefix("http://")
        .map(|a| a.trim_end_matches('/'))
        .filter(|a| !a.is_empty() && !a.contains('/'))
        .ok_or_else(|| ObserveError::Admin(admin.to_string()))?;
    let query: Vec<String> = filters
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", query_escape(v))))
        .collect();
    let mut stream =
        std::net::TcpStream::connect(authority).map_err(|source| ObserveError::Connect {
            authority: authority.to_string(),
            source,
        })?;
    let request = format!(
        "GET /v1/observe?{} HTTP/1.0\r\nHost: {authority}\r\nAuthorization: Bearer {token}\r\n\r\n",
        query.join("&")
    );
    stream.write_all(request.as_bytes())?;
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
        return Err(ObserveError::Refused(format!(
            "{} {}",
            status.trim_end(),
            body.trim_end()
        )));
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
            writeln!(out, "{line}")
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
