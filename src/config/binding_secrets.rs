//! A binding's secrets, read at load: its `credentials` (each resolved by
//! [`super::credentials::resolve`]) and the digest of its `auth` token. Errors go to the
//! sink and name the file, never the secret.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::binding::BindingCtx;
use super::error::Sink;
use super::raw::{RawAuth, RawBinding};

/// Load a binding's `credentials` (secrets read now); errors go to `sink`, never a secret.
pub(super) fn resolve_credentials(
    raw: &RawBinding,
    ctx: &BindingCtx<'_>,
    sb: Option<&str>,
    sink: &mut Sink<'_>,
    line: usize,
    files: &mut Vec<PathBuf>,
    warnings: &mut Vec<String>,
) -> Vec<super::credentials::Credential> {
    if raw.credentials.is_empty() {
        return Vec::new();
    }
    let Some(key) = ctx.placeholder_key else {
        sink.push(
            sb,
            "credentials",
            "credentials need `tls_intercept` (the CA that terminates their hosts)",
            Some("credentials:"),
            line,
        );
        return Vec::new();
    };
    let mut out = Vec::new();
    let read = |f: &str| super::files::read_in(ctx.base_dir, f);
    for (i, c) in raw.credentials.iter().enumerate() {
        for f in c.source.files() {
            let p = if Path::new(f).is_absolute() {
                PathBuf::from(f)
            } else {
                ctx.base_dir.join(f)
            };
            files.push(p);
        }
        if out
            .iter()
            .any(|o: &super::credentials::Credential| o.name == c.name)
        {
            sink.push(
                sb,
                format!("credentials[{i}]"),
                format!("duplicate name `{}`", c.name),
                Some(&c.name),
                line,
            );
            continue;
        }
        match super::credentials::resolve(c, &raw.id, &read, key, ctx.secrets, warnings) {
            Ok(cred) => out.push(cred),
            Err(errs) => {
                for e in errs {
                    sink.push(sb, format!("credentials[{i}]"), e, Some(&c.name), line);
                }
            }
        }
    }
    out
}

/// Where a sandbox's token comes from, and what review tools may do without it.
pub(super) struct TokenCtx<'a> {
    pub base_dir: &'a Path,
    pub secrets: super::Secrets,
}

/// A sandbox's token digest. Under [`super::Secrets::MayBeAbsent`] (review tools) a token file
/// that cannot be read or a variable that is not set is a warning, and the sandbox keeps a
/// digest no token has (it is never served from such a load).
pub(super) fn token_digest(
    auth: &RawAuth,
    tcx: &TokenCtx<'_>,
    (sb, line): (Option<&str>, usize),
    sink: &mut Sink<'_>,
    warnings: &mut Vec<String>,
    files: &mut Vec<PathBuf>,
) -> Option<[u8; 32]> {
    let mut absent = |field: &str, why: String, hint: &str| match tcx.secrets {
        super::Secrets::MayBeAbsent => {
            let who = sb.unwrap_or("-");
            warnings.push(format!(
                "sandbox {who}: {field}: {why}; {}",
                super::ABSENT_SECRET_NOTE
            ));
            Some([0u8; 32])
        }
        super::Secrets::Required => {
            sink.push(sb, field, why, Some(hint), line);
            None
        }
    };
    let forms = [
        auth.token_sha256.is_some(),
        auth.token_file.is_some(),
        auth.token_env.is_some(),
    ];
    if forms.iter().filter(|f| **f).count() != 1 {
        sink.push(
            sb,
            "auth",
            "give exactly one of token_sha256, token_file, token_env",
            Some("auth:"),
            line,
        );
        return None;
    }
    let secret = if let Some(hex_digest) = &auth.token_sha256 {
        let mut out = [0u8; 32];
        return match hex::decode_to_slice(hex_digest.trim(), &mut out) {
            Ok(()) => Some(out),
            Err(_) => {
                sink.push(
                    sb,
                    "auth.token_sha256",
                    "must be 64 hexadecimal characters (a SHA-256 digest)",
                    Some("token_sha256:"),
                    line,
                );
                None
            }
        };
    } else if let Some(f) = &auth.token_file {
        let path = super::files::path_in(tcx.base_dir, f);
        files.push(path.clone());
        match std::fs::read_to_string(&path) {
            Ok(t) => t.trim().to_string(),
            Err(e) => {
                let why = format!("cannot read {}: {e}", path.display());
                return absent("auth.token_file", why, "token_file:");
            }
        }
    } else {
        let var = auth.token_env.as_deref().unwrap_or_default();
        match std::env::var(var) {
            Ok(t) => t.trim().to_string(),
            Err(_) => {
                let why = format!("environment variable {var} is not set");
                return absent("auth.token_env", why, "token_env:");
            }
        }
    };
    if secret.is_empty() {
        sink.push(sb, "auth", "the token is empty", Some("auth:"), line);
        return None;
    }
    Some(Sha256::digest(secret.as_bytes()).into())
}
