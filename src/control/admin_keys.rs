//! What the admin listener publishes about keys and credentials: the identity issuer's
//! keys (`/.well-known/jwks.json`) and OpenID discovery document
//! (`/.well-known/openid-configuration`), public like any issuer's; and each credential's
//! placeholder entry (`GET /v1/sandboxes/{id}/placeholders`, admin token only).

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use serde_json::json;

use super::admin::json_resp;
use crate::runtime::Shared;

/// The `.well-known` documents, when `req` asks for one (GET only); `None`: not one of them.
pub(super) fn well_known<B>(shared: &Shared, req: &Request<B>) -> Option<Response<Full<Bytes>>> {
    let path = req.uri().path();
    let jwks = path == "/.well-known/jwks.json";
    if !jwks && path != "/.well-known/openid-configuration" {
        return None;
    }
    if req.method() != Method::GET {
        return Some(json_resp(
            StatusCode::METHOD_NOT_ALLOWED,
            json!({ "error": "GET only" }),
        ));
    }
    let Some(ix) = shared.settings.interceptor.as_ref() else {
        return Some(json_resp(
            StatusCode::NOT_FOUND,
            json!({ "error": "no identity issuer: configure tls_intercept" }),
        ));
    };
    if jwks {
        return Some(json_resp(StatusCode::OK, ix.issuer.jwks()));
    }
    let host = req
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    Some(json_resp(
        StatusCode::OK,
        ix.issuer.discovery(&format!("http://{host}")),
    ))
}

/// One credential's placeholder: for `aws_sigv4`, the AWS-shaped key pair the sandbox's SDK
/// is configured with.
pub(super) fn placeholder_of(c: &crate::config::credentials::Credential) -> serde_json::Value {
    use crate::config::credentials::CredentialKind;
    let mut v = json!({
        "name": c.name,
        "placeholder": c.placeholder,
        "hosts": c.hosts.len(),
    });
    let kind = match &c.kind {
        CredentialKind::Static { .. } => "static",
        CredentialKind::AwsSigV4(k) => {
            v["access_key_id"] = json!(c.placeholder);
            v["secret_access_key"] = json!(k.placeholder_secret);
            "aws_sigv4"
        }
        CredentialKind::Minted(m) => match m.how {
            crate::config::credential_kinds::Mint::OAuth2 { .. } => "oauth2",
            crate::config::credential_kinds::Mint::GithubApp { .. } => "github_app",
        },
    };
    v["kind"] = json!(kind);
    v
}
