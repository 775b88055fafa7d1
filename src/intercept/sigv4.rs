//! `kind: aws_sigv4`: the sandbox's SDK signs with AWS-shaped placeholder keys; the proxy
//! checks the request was signed with *this* sandbox's placeholder key id, strips the
//! signature and signs the request again with the real keys (and session token), through the
//! official `aws-sigv4` crate. Region, service and date scope come from the request's own
//! credential scope; the signed headers are the ones the client signed, with their values as
//! sent upstream (after the proxy wrote the authority).
//!
//! - Header signatures (`Authorization: AWS4-HMAC-SHA256 …`): the payload hash is the one the
//!   client declared in `x-amz-content-sha256` (a hash, `UNSIGNED-PAYLOAD`,
//!   `STREAMING-UNSIGNED-PAYLOAD-TRAILER`, `STREAMING-AWS4-HMAC-SHA256-PAYLOAD`) — the service
//!   checks the body against it — or, without that header, the hash of the body, read whole
//!   (within `tls_intercept.judge_body_bytes`).
//! - `STREAMING-AWS4-HMAC-SHA256-PAYLOAD`: every chunk signature of the `aws-chunked` body is
//!   computed again from the new seed signature ([`Chunks`]); the body keeps its length.
//! - Presigned URLs (`X-Amz-Credential` … in the query): signed again in the query, for what
//!   is left of the client's `X-Amz-Expires` (an expired one is refused).
//!
//! Anything else carrying the placeholder — another algorithm, signed trailers, the
//! placeholder secret key itself — is refused (`credential_misuse`): what is not understood
//! is not signed.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use aws_sigv4::http_request::{
    sign, PercentEncodingMode, SignableBody, SignableRequest, SignatureLocation, SigningSettings,
    UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use http::{HeaderMap, Request, Uri};
use sha2::{Digest, Sha256};

use crate::config::credential_kinds::AwsKeys;
use crate::intercept::credential_error::{sign as unsigned, CredentialError};
use crate::policy::cause::caused;

mod chunks;

pub use chunks::Chunks;

const ALGORITHM: &str = "AWS4-HMAC-SHA256";
/// The query parameters of a presigned URL.
const QUERY_AUTH: [&str; 7] = [
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Signature",
    "X-Amz-Security-Token",
];
/// The payload modes that can be signed again.
const STREAMING_SIGNED: &str = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD";

/// A request's SigV4 authentication as the client wrote it.
#[derive(Debug, PartialEq)]
pub struct Signed {
    pub key_id: String,
    /// `YYYYMMDD`, region, service.
    pub date: String,
    pub region: String,
    pub service: String,
    pub signed_headers: Vec<String>,
    /// In the query (presigned): `X-Amz-Date` and `X-Amz-Expires`.
    pub presigned: Option<(String, u64)>,
}

/// How a request is authenticated toward AWS, as far as the proxy can tell.
#[derive(Debug, PartialEq)]
pub enum Auth {
    /// Not signed at all (anonymous requests pass as they are).
    None,
    SigV4(Signed),
    /// Signed some other way (SigV2, SigV4a, an unreadable header): never re-signed.
    Other(&'static str),
}

/// `Credential=AKID/DATE/REGION/SERVICE/aws4_request` → its parts.
fn scope(credential: &str) -> Option<(String, String, String, String)> {
    let mut p = credential.split('/');
    let (k, d, r, s, t) = (p.next()?, p.next()?, p.next()?, p.next()?, p.next()?);
    (t == "aws4_request" && p.next().is_none() && d.len() == 8)
        .then(|| (k.into(), d.into(), r.into(), s.into()))
}

/// Read the request's authentication.
pub fn auth(uri: &Uri, headers: &HeaderMap) -> Auth {
    let query: Vec<(String, String)> = uri
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let q = |n: &str| query.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
    let in_query = query.iter().any(|(k, _)| QUERY_AUTH.contains(&k.as_str()));
    let header = headers.get(http::header::AUTHORIZATION);
    match (header, in_query) {
        (None, false) => Auth::None,
        (Some(_), true) => Auth::Other("signed both in a header and in the query"),
        (None, true) => {
            if q("X-Amz-Algorithm") != Some(ALGORITHM) {
                return Auth::Other("a presigned URL of another algorithm than AWS4-HMAC-SHA256");
            }
            let parts = q("X-Amz-Credential").and_then(scope);
            let expires = q("X-Amz-Expires").and_then(|e| e.parse::<u64>().ok());
            match (parts, q("X-Amz-Date"), expires, q("X-Amz-SignedHeaders")) {
                (Some((key_id, date, region, service)), Some(at), Some(exp), Some(sh)) => {
                    Auth::SigV4(Signed {
                        key_id,
                        date,
                        region,
                        service,
                        signed_headers: sh.split(';').map(str::to_string).collect(),
                        presigned: Some((at.to_string(), exp)),
                    })
                }
                _ => Auth::Other("a presigned URL that cannot be read"),
            }
        }
        (Some(v), false) => {
            let Ok(v) = v.to_str() else {
                return Auth::Other("an Authorization header that is not text");
            };
            let Some(rest) = v.strip_prefix(ALGORITHM).and_then(|r| r.strip_prefix(' ')) else {
                return Auth::Other("an Authorization of another scheme than AWS4-HMAC-SHA256");
            };
            let mut credential = None;
            let mut signed = None;
            for part in rest.split(',') {
                let part = part.trim();
                if let Some(c) = part.strip_prefix("Credential=") {
                    credential = scope(c);
                } else if let Some(s) = part.strip_prefix("SignedHeaders=") {
                    signed = Some(s.split(';').map(str::to_string).collect());
                }
            }
            match (credential, signed) {
                (Some((key_id, date, region, service)), Some(signed_headers)) => {
                    Auth::SigV4(Signed {
                        key_id,
                        date,
                        region,
                        service,
                        signed_headers,
                        presigned: None,
                    })
                }
                _ => Auth::Other("an AWS4-HMAC-SHA256 Authorization that cannot be read"),
            }
        }
    }
}

/// `20260101T000000Z` as a time.
fn amz_date(s: &str) -> Option<SystemTime> {
    let f = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    let t = time::PrimitiveDateTime::parse(s, f).ok()?.assume_utc();
    let secs = u64::try_from(t.unix_timestamp()).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

/// The longest life SigV4 gives a presigned URL (AWS refuses more): 7 days.
const MAX_PRESIGNED: Duration = Duration::from_secs(604_800);
/// How far ahead of the proxy's clock a presigned `X-Amz-Date` may be (clock skew).
const PRESIGNED_SKEW: Duration = Duration::from_secs(60);

/// What is left of a presigned URL's life; `None` when it has expired, when its `X-Amz-Date`
/// is more than a minute ahead of now (a date in the future would stretch the life re-signed
/// with the real key), or when `X-Amz-Expires` is more than 7 days.
fn remaining(at: &str, expires: u64) -> Option<Duration> {
    remaining_at(at, expires, SystemTime::now())
}

fn remaining_at(at: &str, expires: u64, now: SystemTime) -> Option<Duration> {
    let start = amz_date(at)?;
    let life = Duration::from_secs(expires);
    if life > MAX_PRESIGNED || start > now + PRESIGNED_SKEW {
        return None;
    }
    (start + life)
        .duration_since(now)
        .ok()
        .filter(|d| !d.is_zero())
        .map(|d| d.min(MAX_PRESIGNED))
}

/// The AWS re-signing kind.
pub struct AwsSigV4 {
    keys: AwsKeys,
}

impl AwsSigV4 {
    pub fn new(keys: AwsKeys) -> Self {
        AwsSigV4 { keys }
    }

    /// Why the request cannot be re-signed for the sandbox whose placeholder key id is
    /// `key_id`; `None` when it can (or is not signed at all).
    pub fn misuse(&self, uri: &Uri, headers: &HeaderMap, key_id: &str) -> Option<String> {
        let secret = &self.keys.placeholder_secret;
        if !secret.is_empty() && super::credential::carries_outside(uri, headers, secret, &[]) {
            return Some("not to be sent: the placeholder secret key is in the request".into());
        }
        match auth(uri, headers) {
            // The key id elsewhere is a signature of another scheme (SigV2's
            // `AWSAccessKeyId=`): never passed on, never re-signed.
            Auth::None => {
                super::credential::carries_outside(uri, headers, key_id, &[]).then(|| {
                    "in a request not signed with SigV4 (SigV2 and other schemes are not re-signed)"
                        .into()
                })
            }
            Auth::Other(what) => Some(format!("not re-signed: the request is {what}")),
            Auth::SigV4(s) if s.key_id != key_id => {
                Some("not what the request was signed with (another access key id)".into())
            }
            Auth::SigV4(s) => {
                if let Some((at, exp)) = &s.presigned {
                    if remaining(at, *exp).is_none() {
                        return Some("on a presigned URL that has expired, is dated more than a minute ahead, or asks for more than 7 days".into());
                    }
                }
                let payload = headers
                    .get("x-amz-content-sha256")
                    .and_then(|v| v.to_str().ok());
                match payload {
                    None => None,
                    Some(p) if known_payload(p) => None,
                    Some(p) => Some(format!(
                        "on a request whose payload mode {p:?} the proxy cannot sign again"
                    )),
                }
            }
        }
    }

    /// Whether the body must be read whole to sign its hash (no `x-amz-content-sha256`).
    pub fn reads_body(&self, uri: &Uri, headers: &HeaderMap) -> bool {
        matches!(
            auth(uri, headers),
            Auth::SigV4(Signed {
                presigned: None,
                ..
            })
        ) && !headers.contains_key("x-amz-content-sha256")
    }

    /// The real keys, as the signer takes them.
    fn identity(&self) -> aws_smithy_runtime_api::client::identity::Identity {
        let keys = &self.keys;
        let session = keys.session_token.as_ref().map(|t| t.expose().to_string());
        aws_credential_types::Credentials::new(
            keys.access_key_id.expose(),
            keys.secret_access_key.expose(),
            session,
            None,
            "egress-proxy",
        )
        .into()
    }

    /// Sign `req` (authority written) again with the real keys. `body` is the whole body when
    /// it was read. `Ok(None)`: not signed by the client, left alone; `Ok(Some(chunks))`:
    /// signed, with the chunk re-signer when the body is signed chunk by chunk.
    pub fn resign<B>(
        &self,
        req: &mut Request<B>,
        body: Option<&[u8]>,
    ) -> Result<Option<Option<Chunks>>, CredentialError> {
        let Auth::SigV4(s) = auth(req.uri(), req.headers()) else {
            return Ok(None);
        };
        let declared = req
            .headers()
            .get("x-amz-content-sha256")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let mut settings = SigningSettings::default();
        if s.service == "s3" {
            settings.percent_encoding_mode = PercentEncodingMode::Single;
            settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        }
        let signable_body = match (&s.presigned, &declared, body) {
            (Some((at, exp)), _, _) => {
                settings.signature_location = SignatureLocation::QueryParams;
                settings.expires_in = Some(remaining(at, *exp).ok_or_else(|| {
                    unsigned("the presigned URL has expired, is dated ahead, or asks for more than 7 days")
                })?);
                strip_query_auth(req)?;
                match s.service.as_str() {
                    "s3" => SignableBody::UnsignedPayload,
                    _ => SignableBody::Bytes(&[]),
                }
            }
            (None, Some(d), _) => SignableBody::Precomputed(d.clone()),
            (None, None, Some(b)) => SignableBody::Precomputed(hex::encode(Sha256::digest(b))),
            (None, None, None) => return Err(unsigned("the body was not read to be signed")),
        };
        for h in ["authorization", "x-amz-date", "x-amz-security-token"] {
            req.headers_mut().remove(h);
        }
        let time = SystemTime::now();
        let identity = self.identity();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&s.region)
            .name(&s.service)
            .time(time)
            .settings(settings)
            .build()
            .map_err(|e| unsigned(caused("signing", e)))?;
        let uri = absolute(req)?;
        let signed: Vec<&str> = s.signed_headers.iter().map(String::as_str).collect();
        let headers: Vec<(&str, &str)> = req
            .headers()
            .iter()
            .filter(|(n, _)| signed.contains(&n.as_str()))
            .filter_map(|(n, v)| Some((n.as_str(), v.to_str().ok()?)))
            .collect();
        let signable = SignableRequest::new(
            req.method().as_str(),
            uri,
            headers.into_iter(),
            signable_body,
        )
        .map_err(|e| unsigned(caused("signing", e)))?;
        let (instructions, seed) = sign(signable, &params.into())
            .map_err(|e| unsigned(caused("signing", e)))?
            .into_parts();
        instructions.apply_to_request_http1x(req);
        let chunks = match declared.as_deref() {
            Some(STREAMING_SIGNED) => Some(self.chunks(req, time, &s, seed)?),
            _ => None,
        };
        Ok(Some(chunks))
    }

    /// The re-signer of a signed `aws-chunked` body whose request was signed at `time` with
    /// seed signature `seed`.
    fn chunks<B>(
        &self,
        req: &Request<B>,
        time: SystemTime,
        s: &Signed,
        seed: String,
    ) -> Result<Chunks, CredentialError> {
        let date = req
            .headers()
            .get("x-amz-date")
            .and_then(|v| v.to_str().ok())
            .filter(|d| d.len() >= 8)
            .ok_or_else(|| unsigned("signing: no x-amz-date"))?
            .to_string();
        let key = v4::generate_signing_key(
            self.keys.secret_access_key.expose(),
            time,
            &s.region,
            &s.service,
        );
        let scope = format!("{}/{}/{}/aws4_request", &date[..8], s.region, s.service);
        Ok(Chunks::new(key.as_ref().to_vec(), date, scope, seed))
    }

    /// The real key id, secret key and session token (the scrubber looks for them).
    pub fn secrets(&self) -> Vec<Vec<u8>> {
        self.keys
            .secrets()
            .into_iter()
            .map(|s| s.expose().as_bytes().to_vec())
            .collect()
    }
}

/// Whether `x-amz-content-sha256` is a payload mode the proxy signs again.
fn known_payload(p: &str) -> bool {
    matches!(
        p,
        "UNSIGNED-PAYLOAD" | "STREAMING-UNSIGNED-PAYLOAD-TRAILER" | STREAMING_SIGNED
    ) || (p.len() == 64 && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The request's URI as `https://authority/path?query`, as the upstream will see it.
fn absolute<B>(req: &Request<B>) -> Result<String, CredentialError> {
    let authority = match req.uri().authority() {
        Some(a) => a.as_str().to_string(),
        None => req
            .headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .ok_or_else(|| unsigned("signing: no authority"))?
            .to_string(),
    };
    let pq = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    Ok(format!("https://{authority}{pq}"))
}

/// Remove a presigned URL's authentication parameters, keeping the rest of the query as
/// written.
fn strip_query_auth<B>(req: &mut Request<B>) -> Result<(), CredentialError> {
    let uri = req.uri().clone();
    let kept: Vec<&str> = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| {
            let name = p.split('=').next().unwrap_or_default();
            let name: Cow<'_, str> = form_urlencoded::parse(name.as_bytes())
                .next()
                .map(|(k, _)| k)
                .unwrap_or_default();
            !p.is_empty() && !QUERY_AUTH.contains(&name.as_ref())
        })
        .collect();
    let mut pq = uri.path().to_string();
    if !kept.is_empty() {
        pq.push('?');
        pq.push_str(&kept.join("&"));
    }
    let mut parts = uri.into_parts();
    parts.path_and_query = Some(
        pq.parse()
            .map_err(|_| unsigned("the URI cannot be rebuilt"))?,
    );
    *req.uri_mut() = Uri::from_parts(parts).map_err(|_| unsigned("the URI cannot be rebuilt"))?;
    Ok(())
}

#[cfg(test)]
mod tests;
