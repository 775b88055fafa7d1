//! `egress-proxy requests`, `approve` and `deny`: one call each to the admin API, with
//! `observe`'s way of reaching it (`--admin URL`, `--token-file F` or
//! `EGRESS_PROXY_ADMIN_TOKEN`, `--cacert`/`--cert`/`--key` for `https://`). The token is sent
//! only in the request's `Authorization` header and never printed.

use std::io::{Read, Write};
use std::path::Path;

use serde_json::Value;

use super::observe_client::{client, reach, AdminTls, ObserveError};
use crate::control::error::{invalid, ControlError};

/// One admin call: `method path` with an optional JSON body; the status and the body.
pub fn call(
    admin: &str,
    token_file: Option<&Path>,
    tls: &AdminTls,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, String), ObserveError> {
    let (token, secure, authority) = reach(admin, token_file)?;
    let payload = body.map(Value::to_string).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: {authority}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{payload}",
        token.trim(),
        payload.len()
    );
    let stream =
        std::net::TcpStream::connect(authority).map_err(|source| ObserveError::Connect {
            authority: authority.to_string(),
            source,
        })?;
    let answer = match secure {
        false => exchange(stream, &request)?,
        true => {
            let conn = client(tls, authority)?;
            exchange(rustls::StreamOwned::new(conn, stream), &request)?
        }
    };
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_string()))
}

fn exchange<S: Read + Write>(mut stream: S, request: &str) -> Result<String, ObserveError> {
    stream.write_all(request.as_bytes())?;
    let mut out = Vec::new();
    // A TLS peer that closes without close_notify still sent its whole answer (HTTP/1.0).
    if let Err(e) = stream.read_to_end(&mut out) {
        if out.is_empty() {
            return Err(ObserveError::Io(e));
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// `3s`, `10m`, `2h`, `1d` or plain seconds.
pub fn parse_duration(text: &str) -> Result<u64, ControlError> {
    let t = text.trim();
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = digits
        .parse()
        .map_err(|_| invalid(format!("`{text}` is not a duration like 3s, 10m, 2h or 1d")))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => return Err(invalid(format!("`{text}`: the unit must be s, m, h or d"))),
    };
    if secs == 0 {
        return Err(invalid("a grant's duration must be at least 1s"));
    }
    Ok(secs)
}

/// One line per request for a person.
pub fn human(list: &Value) -> String {
    let mut out = String::new();
    for r in list["requests"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{}  {:<8}  {}  {}:{}  {}{}\n",
            r["id"].as_str().unwrap_or("?"),
            r["state"].as_str().unwrap_or("?"),
            r["sandbox"].as_str().unwrap_or("?"),
            r["host"].as_str().unwrap_or("?"),
            r["port"],
            super::shown::for_person(r["reason"].as_str().unwrap_or("")),
            r["expires"]
                .as_str()
                .map(|e| format!("  (until {e})"))
                .unwrap_or_default(),
        ));
    }
    if out.is_empty() {
        out.push_str("no requests\n");
    }
    out
}

/// A grant list (`GET /v1/grants`) for a person: one line per grant — id (what `revoke`
/// takes), sandbox, host:port, its scope, kind, end, approver, and `spent` for a used `once`.
pub fn human_grants(list: &Value) -> String {
    let mut out = String::new();
    for g in list["grants"].as_array().into_iter().flatten() {
        let words = |k: &str| {
            let v: Vec<&str> = g[k]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            v.join(",")
        };
        let scope = match (words("methods"), words("paths")) {
            (m, p) if m.is_empty() && p.is_empty() => String::new(),
            (m, p) => format!(
                "  [{} {}]",
                if m.is_empty() { "*" } else { &m },
                if p.is_empty() { "*" } else { &p }
            ),
        };
        out.push_str(&format!(
            "{}  {}  {}:{}{scope}  {}  {}  by {}{}\n",
            g["id"].as_str().unwrap_or("?"),
            g["sandbox"].as_str().unwrap_or("?"),
            g["host"].as_str().unwrap_or("?"),
            g["port"],
            g["kind"].as_str().unwrap_or("?"),
            g["expires"]
                .as_str()
                .map(|e| format!("until {e}"))
                .unwrap_or_else(|| "no end".into()),
            g["approver"].as_str().unwrap_or("?"),
            if g["used"] == true { "  spent" } else { "" },
        ));
    }
    if out.is_empty() {
        out.push_str("no grants\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_people_write_them() {
        assert_eq!(parse_duration("3s").ok(), Some(3));
        assert_eq!(parse_duration("10m").ok(), Some(600));
        assert_eq!(parse_duration("2h").ok(), Some(7200));
        assert_eq!(parse_duration("45").ok(), Some(45));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5w").is_err());
        assert!(parse_duration("ten").is_err());
    }
}
