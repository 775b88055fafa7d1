//! Responses of terminated hosts never carry a brokered secret back: wherever a secret bound
//! to the host appears in a response header, trailer or body — as is, in any letter case,
//! percent-encoded (any subset of its bytes, as `quote()` leaves `/`), JSON-escaped (`\/`,
//! `\uXXXX`), in hex, or in base64 (standard or URL-safe, at any alignment inside a longer
//! base64 string) — it is replaced by a string of the same length cut from its placeholder,
//! so lengths (and `Content-Length`) stay right. Escapes are undone before matching
//! ([`crate::pipeline::unescape`]) and the match replaced in the original bytes. Bodies are scanned as
//! they stream, safe across chunk boundaries: only a tail that could still become a secret
//! (or an escape cut in two) is held back, never a whole chunk, so server-sent events are not
//! delayed. Past `tls_intercept.scrub_body_bytes` a body passes unscanned (noted).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use hyper::body::{Body, Frame, SizeHint};

use super::credential::Bound;
use crate::pipeline::unescape;

pub mod compiled;

pub use compiled::Compiled;

/// Every form of the secrets of some credentials, compiled once per binding.
pub struct Scrubber {
    /// Matched without regard to ASCII case, on the unescaped view of the bytes.
    ac: AhoCorasick,
    /// Per pattern: the credential's index in `names`.
    owners: Vec<usize>,
    /// Per credential: its placeholder (replacements are cut from it).
    placeholders: Vec<Vec<u8>>,
    patterns: Vec<Vec<u8>>,
    names: Vec<String>,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrubber")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

/// Base64 fragments of `secret` that do not depend on what surrounds it, at the three
/// alignments it can have inside a longer base64 string, in both alphabets.
fn base64_forms(secret: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for engine in [
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ] {
        for k in 0..3usize {
            let mut data = vec![0u8; k];
            data.extend_from_slice(secret);
            let enc = engine.encode(&data).into_bytes();
            let bits = 8 * data.len();
            // Characters covering prefix bits depend on the prefix; the last ones may depend
            // on what follows.
            let first = (8 * k).div_ceil(6);
            let last = bits / 6; // characters fully inside the data
            if last > first && last - first >= 8 {
                out.push(enc[first..last].to_vec());
            }
        }
    }
    out
}

/// The secret in hex (matched in either case).
fn hex_form(secret: &[u8]) -> Vec<u8> {
    hex::encode(secret).into_bytes()
}

/// What a secret in a header that says where to go next becomes: URL-safe, and not a
/// placeholder (placeholders start `egp_`).
const REDACTED: &[u8] = b"redacted-";

/// `len` bytes cut from `placeholder`, repeated if it is shorter.
fn cut(placeholder: &[u8], len: usize) -> Vec<u8> {
    placeholder.iter().copied().cycle().take(len).collect()
}

impl Scrubber {
    /// The scrubber of the secrets `bound` credentials' kinds name ([`Kind::secrets`]);
    /// `None` when there are none.
    ///
    /// [`Kind::secrets`]: super::credential::Kind::secrets
    pub fn new<'c>(bound: impl Iterator<Item = &'c Bound>) -> Option<Scrubber> {
        Self::with_minted(bound, &[])
    }

    /// [`Scrubber::new`], with values minted for one request (`(credential name, value)`):
    /// the identity token put on a request is never read back by the sandbox in its answer
    /// (security review A18).
    pub fn with_minted<'c>(
        bound: impl Iterator<Item = &'c Bound>,
        minted: &[(&str, &[u8])],
    ) -> Option<Scrubber> {
        let mut patterns: Vec<Vec<u8>> = Vec::new();
        let mut owners = Vec::new();
        let mut placeholders = Vec::new();
        let mut names = Vec::new();
        for c in bound {
            let mut secrets = c.kind.secrets();
            let own = minted.iter().filter(|(name, _)| *name == c.name);
            secrets.extend(own.map(|(_, v)| v.to_vec()));
            for secret in secrets {
                let mut forms = vec![secret.clone(), hex_form(&secret)];
                forms.extend(base64_forms(&secret));
                for f in forms {
                    if !patterns.iter().any(|p| p.eq_ignore_ascii_case(&f)) {
                        owners.push(names.len());
                        patterns.push(f);
                    }
                }
            }
            // A kind the sandbox holds no placeholder of (the identity token) is redacted.
            placeholders.push(match c.placeholder.is_empty() {
                true => REDACTED.to_vec(),
                false => c.placeholder.as_bytes().to_vec(),
            });
            names.push(c.name.clone());
        }
        if patterns.is_empty() {
            return None;
        }
        let ac = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .ascii_case_insensitive(true)
            .build(&patterns)
            .ok()?;
        Some(Scrubber {
            ac,
            owners,
            placeholders,
            patterns,
            names,
        })
    }

    /// Whether `buf` may hold a secret in some form (escapes are judged on the slow path).
    fn may_match(&self, buf: &[u8]) -> bool {
        unescape::has_escapes(buf) || self.ac.is_match(buf)
    }

    /// Replace every secret in `buf` in place by a cut of its placeholder; the credentials
    /// found (indexes into names).
    fn scrub(&self, buf: &mut [u8], found: &mut Vec<usize>) {
        self.scrub_with(buf, found, false);
    }

    /// [`Scrubber::scrub`], by [`REDACTED`] instead of the placeholder when `redact`.
    fn scrub_with(&self, buf: &mut [u8], found: &mut Vec<usize>, redact: bool) {
        let mut spans = Vec::new();
        if unescape::has_escapes(buf) {
            let (view, map) = unescape::decode(buf);
            for m in self.ac.find_iter(&view) {
                spans.push((map[m.start()], map[m.end()], m.pattern().as_usize()));
            }
        } else {
            for m in self.ac.find_iter(&*buf) {
                spans.push((m.start(), m.end(), m.pattern().as_usize()));
            }
        }
        for (start, end, pattern) in spans {
            let who = self.owners[pattern];
            let with = match redact {
                true => cut(REDACTED, end - start),
                false => cut(&self.placeholders[who], end - start),
            };
            buf[start..end].copy_from_slice(&with);
            if !found.contains(&who) {
                found.push(who);
            }
        }
    }

    /// How many bytes at the end of `buf` could be the start of a secret, or of an escape,
    /// (held back until more arrives).
    fn held_tail(&self, buf: &[u8]) -> usize {
        // An escape cut at the end is held whole, with whatever before it could begin a
        // secret that the escape continues.
        let end = unescape::incomplete_escape(buf).unwrap_or(buf.len());
        let head = &buf[..end];
        let start = if unescape::has_escapes(head) {
            let (view, map) = unescape::decode(head);
            map[view.len() - self.prefix_tail(&view)]
        } else {
            end - self.prefix_tail(head)
        };
        buf.len() - start
    }

    /// The longest tail of `buf` that begins some pattern (any case).
    fn prefix_tail(&self, buf: &[u8]) -> usize {
        let mut keep = 0;
        for p in &self.patterns {
            let most = (p.len() - 1).min(buf.len());
            for k in (keep + 1..=most).rev() {
                if buf[buf.len() - k..].eq_ignore_ascii_case(&p[..k]) {
                    keep = k;
                    break;
                }
            }
        }
        keep
    }

    /// Scrub response headers in place; the names of the credentials found.
    pub fn headers(&self, headers: &mut HeaderMap) -> Vec<&str> {
        let mut found = Vec::new();
        self.fields(headers, &mut found);
        found.iter().map(|i| self.names[*i].as_str()).collect()
    }

    /// Scrub a whole message in place (a WebSocket message); the names of the credentials
    /// found.
    pub fn scrub_message(&self, buf: &mut [u8]) -> Vec<&str> {
        let mut found = Vec::new();
        if self.may_match(buf) {
            self.scrub(buf, &mut found);
        }
        found.iter().map(|i| self.names[*i].as_str()).collect()
    }

    /// Scrub the values of a header or trailer section in place. Where a client goes next
    /// (`Location`, `Content-Location`, `Refresh`) the secret becomes [`REDACTED`], never the
    /// placeholder: a client following a redirect to a host the proxy does not terminate would
    /// carry the placeholder there unseen (review 7d C1).
    fn fields(&self, fields: &mut HeaderMap, found: &mut Vec<usize>) {
        for (name, v) in fields.iter_mut() {
            if self.may_match(v.as_bytes()) {
                let mut bytes = v.as_bytes().to_vec();
                let onward = [
                    http::header::LOCATION,
                    http::header::CONTENT_LOCATION,
                    http::header::REFRESH,
                ];
                self.scrub_with(&mut bytes, found, onward.contains(name));
                if let Ok(nv) = HeaderValue::from_bytes(&bytes) {
                    *v = nv;
                }
            }
        }
    }
}

/// Who is told what a body carried: the credential names found, and whether the body went
/// past the scan limit.
#[derive(Debug, Default)]
pub struct Findings {
    pub names: Vec<String>,
    pub unscanned_past: Option<u64>,
}

/// A response body with every secret replaced as it streams.
pub struct Scrubbed<B> {
    inner: B,
    scrubber: Arc<Scrubber>,
    held: Vec<u8>,
    scanned: u64,
    limit: u64,
    /// Trailers that arrived while bytes were still held.
    trailers: Option<HeaderMap>,
    done: bool,
    findings: Arc<Mutex<Findings>>,
}

impl<B> Scrubbed<B> {
    pub fn new(
        inner: B,
        scrubber: Arc<Scrubber>,
        limit: u64,
        findings: Arc<Mutex<Findings>>,
    ) -> Self {
        Scrubbed {
            inner,
            scrubber,
            held: Vec::new(),
            scanned: 0,
            limit,
            trailers: None,
            done: false,
            findings,
        }
    }

    fn note(&self, found: &[usize]) {
        if found.is_empty() {
            return;
        }
        if let Ok(mut f) = self.findings.lock() {
            for i in found {
                let n = &self.scrubber.names[*i];
                if !f.names.contains(n) {
                    f.names.push(n.clone());
                }
            }
        }
    }
}

impl<B> Body for Scrubbed<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        loop {
            if this.done {
                if !this.held.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(
                        std::mem::take(&mut this.held).into(),
                    ))));
                }
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.done = true;
                    continue;
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(f))) => f,
            };
            let data = match frame.into_data() {
                Ok(d) => d,
                Err(frame) => {
                    // Trailers (HTTP/1.1 chunked trailers, HTTP/2 trailing HEADERS) are
                    // scrubbed like headers, whatever the body's scan limit; what is held
                    // is flushed first.
                    let mut trailers = frame.into_trailers().ok();
                    if let Some(t) = trailers.as_mut() {
                        let mut found = Vec::new();
                        this.scrubber.fields(t, &mut found);
                        this.note(&found);
                    }
                    this.trailers = trailers;
                    this.done = true;
                    continue;
                }
            };
            if this.scanned >= this.limit && this.held.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            this.scanned += data.len() as u64;
            if this.held.is_empty() && this.scanned < this.limit && !this.scrubber.may_match(&data)
            {
                // The common case: nothing to replace, nothing held — pass the chunk as it
                // is, holding back only a tail that could begin a secret.
                let keep = this.scrubber.held_tail(&data);
                if keep > 0 {
                    this.held = data[data.len() - keep..].to_vec();
                }
                let out = data.slice(..data.len() - keep);
                if !out.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(out))));
                }
                continue;
            }
            let mut buf = std::mem::take(&mut this.held);
            buf.extend_from_slice(&data);
            let mut found = Vec::new();
            this.scrubber.scrub(&mut buf, &mut found);
            this.note(&found);
            let keep = if this.scanned >= this.limit {
                if let Ok(mut f) = this.findings.lock() {
                    f.unscanned_past = Some(this.limit);
                }
                0
            } else {
                this.scrubber.held_tail(&buf)
            };
            this.held = buf.split_off(buf.len() - keep);
            if !buf.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(buf.into()))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.held.is_empty() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        // Replacements keep lengths: the inner body's hint holds, plus what is held.
        let inner = self.inner.size_hint();
        let held = self.held.len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + held);
        if let Some(u) = inner.upper() {
            hint.set_upper(u + held);
        }
        hint
    }
}

#[cfg(test)]
pub(crate) mod tests;
