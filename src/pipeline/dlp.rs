//! The request DLP phase of the pipeline (`dlp:` of a sandbox), wherever secrets travel: the
//! request target (path and query, userinfo), header values ([`head`]) and trailer values
//! ([`Scanner::trailers`]), and the body as it
//! streams ([`Scanner`]) — no whole-body buffering: each chunk is scanned with the last
//! [`OVERLAP`] bytes of the one before, so a match split across chunks is found — within
//! `max_bytes`. Every place is scanned as it is and as the origin may decode it: percent and
//! JSON escapes undone (the scrubber's decoder; [`super::decoded`]) and base64 runs
//! decoded; a body under a `Content-Encoding` is decompressed first ([`Coding`]), and one the
//! proxy cannot undo is refused. A `deny` match refuses the request (in the body: cuts it; the
//! upstream gets an incomplete body, never a complete one), a `report` match is recorded.
//! Matches are recorded by rule name, never by the text matched.

use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};

use super::aws_chunked::AwsChunks;
pub use super::coding::Coding;
use crate::config::decider::{DlpAction, DlpConfig};
use crate::policy::cause::{of, Why};

/// Bytes of the previous chunk scanned again with the next.
pub const OVERLAP: usize = 1024;
/// The name the entropy detector's finds are recorded under.
pub const HIGH_ENTROPY: &str = "high_entropy";

/// What the scanner found, shared with the exchange.
#[derive(Default, Debug)]
pub struct Found {
    /// Rule names, in the order first found.
    pub names: Vec<String>,
    /// A `deny` rule matched (the body was cut).
    pub blocked: Option<String>,
    /// A flow rule cut the body as it streamed (a label armed meanwhile refuses the rest):
    /// why ([`super::flow::Gated`]).
    pub flow: Option<String>,
}

/// The scanner of one body.
pub struct Scanner {
    cfg: Arc<DlpConfig>,
    /// `deny` acts as `report` (the sandbox is in report mode).
    report_only: bool,
    tail: BytesMut,
    scanned: u64,
    /// What it found (rule names, the blocking one).
    pub found: Arc<Mutex<Found>>,
}

/// Shannon entropy of `s`, in bits per byte.
fn entropy(s: &[u8]) -> f64 {
    let mut counts = [0u32; 256];
    for b in s {
        counts[usize::from(*b)] += 1;
    }
    let n = s.len() as f64;
    counts
        .iter()
        .filter(|c| **c > 0)
        .map(|c| {
            let p = f64::from(*c) / n;
            -p * p.log2()
        })
        .sum()
}

impl Scanner {
    /// A scanner with the rules of `cfg`; `report_only` records and never blocks.
    pub fn new(cfg: Arc<DlpConfig>, report_only: bool) -> Self {
        Scanner {
            cfg,
            report_only,
            tail: BytesMut::new(),
            scanned: 0,
            found: Default::default(),
        }
    }

    /// Scan the next chunk; `Err` with the rule when a `deny` rule matched.
    pub fn scan(&mut self, chunk: &Bytes) -> Result<(), DlpError> {
        let left = self.cfg.max_bytes.saturating_sub(self.scanned);
        if left == 0 {
            return Ok(());
        }
        let take = chunk.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        self.scanned += take as u64;
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(&chunk[..take]);
        let mut hits = rule_hits(&self.cfg, &window);
        if let Some((min, bits, action)) = self.cfg.entropy {
            let token = |b: &u8| b.is_ascii_alphanumeric() || b"+/=_-".contains(b);
            let high = window[..]
                .split(|b| !token(b))
                .any(|t| t.len() >= min && entropy(t) >= bits);
            if high {
                hits.push((HIGH_ENTROPY.to_string(), action));
            }
        }
        let keep = window.len().min(OVERLAP);
        self.tail = window.split_off(window.len() - keep);
        self.note(hits, "the request body")
    }

    /// Scan the request's target and header values with the named rules (not the entropy
    /// detector: tokens and placeholders in headers are random by design), before anything is
    /// sent; `Err` with the refusal's words when a `deny` rule matched.
    pub fn head(&mut self, uri: &http::Uri, headers: &http::HeaderMap) -> Result<(), DlpError> {
        let mut hits = Vec::new();
        if let Some(pq) = uri.path_and_query() {
            hits.extend(rule_hits(&self.cfg, pq.as_str().as_bytes()));
        }
        if let Some(a) = uri.authority() {
            hits.extend(rule_hits(&self.cfg, a.as_str().as_bytes()));
        }
        for (name, value) in headers {
            if name == http::header::PROXY_AUTHORIZATION {
                continue;
            }
            hits.extend(rule_hits(&self.cfg, value.as_bytes()));
        }
        self.note(hits, "the request's target or headers")
    }

    /// Scan a body's trailer fields (HTTP/1.1 chunked trailers, HTTP/2 trailing HEADERS) like
    /// headers: an origin reads them as headers (review 7a B8).
    pub fn trailers(&mut self, trailers: &http::HeaderMap) -> Result<(), DlpError> {
        let hits = trailers
            .values()
            .flat_map(|v| rule_hits(&self.cfg, v.as_bytes()))
            .collect();
        self.note(hits, "the request's trailers")
    }

    /// Record what was found; `Err` at the first `deny` rule (unless only reporting).
    fn note(&self, hits: Vec<(String, DlpAction)>, place: &'static str) -> Result<(), DlpError> {
        let Ok(mut f) = self.found.lock() else {
            return Err(DlpError::Failed);
        };
        for (name, action) in hits {
            if !f.names.contains(&name) {
                f.names.push(name.clone());
            }
            if action == DlpAction::Deny && !self.report_only && f.blocked.is_none() {
                f.blocked = Some(name.clone());
                return Err(DlpError::Matched {
                    rule: name.clone(),
                    place,
                });
            }
        }
        Ok(())
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the DLP phase made of a request that may go on: its body scanned as it streams, or
/// (compressed) read whole, decoded, scanned, and sent as it came.
pub enum Phase<B> {
    /// Scanned as it streams.
    Stream(Scanned<B>),
    /// Read whole, decoded and scanned; sent as it came.
    Whole(Bytes),
}

/// A request body type the DLP phase wraps: scanned as it streams, or the bytes read whole.
pub trait Rebody:
    http_body::Body<Data = Bytes, Error: From<Cut> + Into<BoxError>> + Unpin + Sized
{
    /// The body scanned as it streams.
    fn scanned(s: Scanned<Self>) -> Self;
    /// The body read whole (and scanned decoded), sent as it came.
    fn whole(b: Bytes) -> Self;
    /// The body watched by the sandbox's flow rules as it streams.
    fn gated(g: super::flow::Gated<Self>) -> Self;
}

/// The DLP phase of a request of `binding`, the one call site on every path (forwarded,
/// plain in a tunnel, terminated): nothing without `dlp:`; else the target and headers the
/// sandbox sent now, and the body wrapped ([`phase`]). `Ok` with the request to send and what
/// the body scanner will have found (read after the request was sent: [`recorded`]); `Err`
/// with the refusal, recorded (`dlp_blocked`, the rules that matched).
pub async fn request<B: Rebody>(
    binding: &crate::config::Binding,
    req: http::Request<B>,
    audit: &mut crate::audit::AuditGuard,
) -> Result<(http::Request<B>, Option<Arc<Mutex<Found>>>), super::Refusal> {
    use crate::policy::reason::Reason;
    let Some(cfg) = binding.dlp.clone() else {
        return Ok((req, None));
    };
    let report = binding.enforcement == crate::policy::Enforcement::Report;
    let scanner = Scanner::new(cfg, report);
    let found = scanner.found.clone();
    let (parts, body) = req.into_parts();
    let body = match phase(scanner, &parts.uri, &parts.headers, body).await {
        Ok(Phase::Stream(s)) => B::scanned(s),
        Ok(Phase::Whole(b)) => B::whole(b),
        Err(why) => {
            // The rules that matched the target or headers, named on the record.
            let _ = recorded(&found, audit);
            audit.verdict(crate::policy::Verdict::Deny, Reason::DlpBlocked);
            audit.detail(why.to_string());
            return Err(super::Refusal::new(Reason::DlpBlocked, why.to_string()));
        }
    };
    Ok((http::Request::from_parts(parts, body), Some(found)))
}

/// The DLP phase: the request's target and headers, then its body — wrapped to be scanned as
/// it streams, or read whole (within `max_bytes`) and decoded first when it has a
/// `Content-Encoding`. `Err` with the refusal's words (the scanner's finds say which rule).
pub async fn phase<B>(
    scanner: Scanner,
    uri: &http::Uri,
    headers: &http::HeaderMap,
    body: B,
) -> Result<Phase<B>, DlpError>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: From<Cut> + Into<BoxError>,
{
    let mut scanner = scanner;
    scanner.head(uri, headers)?;
    let coding = Coding::of(headers);
    if matches!(coding, Coding::Identity | Coding::AwsChunked) {
        let chunks = (coding == Coding::AwsChunked).then(AwsChunks::default);
        return Ok(Phase::Stream(Scanned {
            inner: body,
            scanner,
            chunks,
        }));
    }
    let max = scanner.cfg.max_bytes;
    let limit = usize::try_from(max).unwrap_or(usize::MAX);
    let whole = super::whole::read(body, limit)
        .await
        .map_err(|e| DlpError::Unread { max, cause: of(e) })?;
    let plain = coding.decode(&whole, max)?;
    scanner.scan(&Bytes::from(plain))?;
    Ok(Phase::Whole(whole))
}

/// A body scanned as it streams: a `deny` match ends it with an error (the upstream gets an
/// incomplete body, never a complete one).
pub struct Scanned<B> {
    inner: B,
    scanner: Scanner,
    /// An `aws-chunked` body's de-framer: its payload is what is scanned.
    chunks: Option<AwsChunks>,
}

/// The error a scanned body ends with when a `deny` rule matched.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct Cut(pub DlpError);

/// Why the DLP phase refused a request (the refusal's words: `dlp_blocked`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum DlpError {
    /// A `deny` rule matched: its name, and where (`the request body`, `the request's target
    /// or headers`).
    #[error("dlp rule {rule} matched {place}")]
    Matched {
        /// The rule's name.
        rule: String,
        /// Where it matched.
        place: &'static str,
    },
    /// A body under a Content-Encoding, scanned whole, was larger than `max` bytes or could
    /// not be read.
    #[error("a body under a Content-Encoding is scanned whole, and this one is larger than {max} bytes (dlp.max_bytes) or could not be read")]
    Unread {
        /// `dlp.max_bytes`.
        max: u64,
        /// The read's error (the limit's, when it was too large).
        #[source]
        cause: Why,
    },
    /// A body's Content-Encoding is not one the scanner can undo.
    #[error("the body's Content-Encoding {0} cannot be undone to scan it")]
    UnknownCoding(String),
    /// A body's Content-Encoding does not decode.
    #[error("the body's Content-Encoding does not decode: {0}")]
    Undecodable(#[source] Why),
    /// An `aws-chunked` body's framing does not read: what is wrong with it.
    #[error("{0}")]
    Framing(&'static str),
    /// The scanner's state is unavailable.
    #[error("the scanner failed")]
    Failed,
    /// A flow rule refused the rest of a streaming body ([`super::flow::Gated`]).
    #[error("a flow rule refused the rest of the body")]
    Flow,
}

impl<B> http_body::Body for Scanned<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: From<Cut>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let frame = std::task::ready!(std::pin::Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(Ok(f)) = &frame {
            let scanned = match (f.data_ref(), f.trailers_ref()) {
                (Some(d), _) => match &mut this.chunks {
                    None => this.scanner.scan(d),
                    Some(chunks) => {
                        let scanner = &mut this.scanner;
                        let mut scan = |p: &[u8]| scanner.scan(&Bytes::copy_from_slice(p));
                        chunks
                            .push(d, &mut scan)
                            .unwrap_or_else(|why| Err(DlpError::Framing(why)))
                    }
                },
                (_, Some(t)) => this.scanner.trailers(t),
                _ => Ok(()),
            };
            if let Err(why) = scanned {
                return std::task::Poll::Ready(Some(Err(Cut(why).into())));
            }
        }
        std::task::Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Record what the body's watchers found on `audit` (rule names only); the refusal's reason
/// and words when a `deny` rule (or a flow rule) cut the body.
pub fn recorded(
    found: &Mutex<Found>,
    audit: &mut crate::audit::AuditGuard,
) -> Option<(crate::policy::reason::Reason, String)> {
    use crate::policy::reason::Reason;
    let f = found.lock().ok()?;
    if !f.names.is_empty() {
        audit.dlp(f.names.join(","));
    }
    if let Some(why) = &f.flow {
        return Some((Reason::FlowRefused, format!("{why}; the upload was cut")));
    }
    let rule = f.blocked.as_ref()?;
    let why = format!("dlp rule {rule} matched the request body; the upload was cut");
    Some((Reason::DlpBlocked, why))
}

/// The named rules that match `bytes` as they are or in any of their decoded views.
fn rule_hits(cfg: &DlpConfig, bytes: &[u8]) -> Vec<(String, DlpAction)> {
    let views = super::decoded::views(bytes);
    cfg.rules
        .iter()
        .filter(|r| views.iter().any(|v| r.pattern.is_match(v)))
        .map(|r| (r.name.clone(), r.action))
        .collect()
}

#[cfg(test)]
mod tests;
