//! An MCP server's response as the rule lets the client see it: a JSON body (one message or
//! a batch) is read whole, within a byte limit; an event stream (`text/event-stream`) is read
//! event by event. Each message goes through [`McpRule::filter`]: lists the client asked for
//! lose what the rule does not allow, requests the server sends that the rule does not allow
//! are dropped (the event becomes an SSE comment). When the stream answers the client's own
//! requests, a dropped request ends it: the requests still unanswered get JSON-RPC errors
//! saying why (the server, waiting for an answer the client will never send, is left to its
//! own timeout). A message that cannot be read ends the body with an error: nothing passes
//! unjudged. Other bodies (a 202's empty one, an error page) carry no MCP message and pass.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use hyper::body::{Body, Frame};
use serde_json::Value;

use crate::intercept::InterceptError;
use crate::pipeline::whole::Unread;
use crate::policy::protocols::json_tree::Json;
use crate::policy::protocols::mcp::{Filtered, List, Lists, McpRule};
use crate::policy::protocols::ProtocolError;
use crate::policy::protocols::{json_skim, strict_json};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the filter did, for the record.
#[derive(Debug, Default)]
pub struct Notes {
    pub hidden: usize,
    pub dropped: Vec<String>,
    /// Report mode: nothing was changed; these are what enforcing would have done.
    pub report: bool,
}

/// How the body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Json,
    EventStream,
}

/// The framing of a response by its `Content-Type`, if it is one the filter reads.
pub fn framing(headers: &HeaderMap) -> Option<Framing> {
    let ct = headers.get(http::header::CONTENT_TYPE)?;
    match ct.as_bytes() {
        // As nearly every server writes them: the rest is not read.
        b"application/json" => return Some(Framing::Json),
        b"text/event-stream" => return Some(Framing::EventStream),
        _ => {}
    }
    let media = ct.to_str().ok()?.split(';').next()?.trim();
    match media {
        m if m.eq_ignore_ascii_case("application/json") => Some(Framing::Json),
        m if m.eq_ignore_ascii_case("text/event-stream") => Some(Framing::EventStream),
        _ => None,
    }
}

/// What filtering left of a document.
enum Doc<'a> {
    Unchanged,
    Changed(Json<'a>),
    Gone,
}

/// A response body filtered by an MCP rule: as a [`Body`], an event stream filtered event by
/// event; a JSON answer is read whole by [`McpFiltered::read_whole`] (no body of its own).
pub struct McpFiltered<B> {
    inner: B,
    rule: Arc<McpRule>,
    lists: Lists,
    limit: usize,
    buf: Vec<u8>,
    /// The lines of the event being read (event streams).
    lines: Vec<Vec<u8>>,
    /// Set when a server request was dropped from a stream that answers the client's.
    cut: Option<String>,
    /// Report mode: note what would be filtered, pass everything as it came.
    dry: bool,
    done: bool,
    notes: Arc<Mutex<Notes>>,
}

impl<B> McpFiltered<B> {
    pub fn new(
        inner: B,
        rule: Arc<McpRule>,
        lists: Lists,
        limit: usize,
        notes: Arc<Mutex<Notes>>,
    ) -> Self {
        McpFiltered {
            inner,
            rule,
            lists,
            limit,
            buf: Vec::new(),
            lines: Vec::new(),
            cut: None,
            dry: false,
            done: false,
            notes,
        }
    }

    /// Report mode: every message passes as it came; the notes say what enforcing would
    /// have hidden or dropped.
    pub fn dry(mut self, dry: bool) -> Self {
        self.dry = dry;
        if let Ok(mut n) = self.notes.lock() {
            n.report = dry;
        }
        self
    }

    /// Filter a JSON document of messages: `Unchanged` (its bytes pass as they came),
    /// `Changed`, or `Gone` when nothing is left of it.
    fn filter_doc<'a>(&mut self, mut doc: Json<'a>) -> Doc<'a> {
        let mut changed = false;
        let mut notes = self.notes.lock().ok();
        let (rule, lists, cut) = (&self.rule, &mut self.lists, &mut self.cut);
        let mut keep = |m: &mut Json<'a>| {
            let f = rule.filter(m, lists);
            changed |= f != Filtered::Kept;
            Self::note(f, m, (&mut *lists, &mut *cut), notes.as_deref_mut())
        };
        let kept = match &mut doc {
            Json::Arr(items) => {
                items.retain_mut(&mut keep);
                !items.is_empty()
            }
            one => keep(one),
        };
        if self.dry {
            self.cut = None;
            return Doc::Unchanged;
        }
        match (kept, changed) {
            (false, _) => Doc::Gone,
            (true, false) => Doc::Unchanged,
            (true, true) => Doc::Changed(doc),
        }
    }

    /// Whether a document passes as it came, read without building its tree: one message
    /// without a `method` (a server request is judged whole), whose `result` asks for no
    /// input, answering no list (or nothing the client asked). It counts as answered, as
    /// [`Self::note`] counts it. `false`: read it whole and filter it.
    fn passes(&mut self, text: &[u8]) -> Result<bool, ProtocolError> {
        let Some(skim) = json_skim::skim(text)? else {
            return Ok(false);
        };
        if skim.method || skim.input_requests {
            return Ok(false);
        }
        let Some(id) = skim.id else {
            return Ok(true);
        };
        match self.lists.get_mut(&id) {
            None => Ok(true),
            Some(asked) if asked.list == List::Other => {
                asked.answered = true;
                Ok(true)
            }
            Some(_) => Ok(false),
        }
    }

    /// What one message's filtering means: kept or not, noted for the record.
    fn note(
        f: Filtered,
        m: &Json<'_>,
        (lists, cut): (&mut Lists, &mut Option<String>),
        notes: Option<&mut Notes>,
    ) -> bool {
        match f {
            Filtered::Kept => {
                if m.get("method").is_none() {
                    if let Some(asked) = m.get("id").and_then(|id| lists.get_mut(id)) {
                        asked.answered = true;
                    }
                }
                true
            }
            Filtered::Hid(n) => {
                if let Some(n_) = notes {
                    n_.hidden += n;
                }
                true
            }
            Filtered::Dropped(method) => {
                if !lists.is_empty() {
                    cut.get_or_insert(method.clone());
                }
                if let Some(n_) = notes {
                    n_.dropped.push(method);
                }
                false
            }
            Filtered::Answered(method) => {
                if let Some(n_) = notes {
                    n_.dropped.push(method);
                }
                true
            }
        }
    }

    /// One complete event: its lines, filtered.
    fn event(&mut self, out: &mut Vec<u8>) -> Result<(), InterceptError> {
        let lines = std::mem::take(&mut self.lines);
        let mut data: Vec<&[u8]> = Vec::new();
        let mut other: Vec<&[u8]> = Vec::new();
        for l in &lines {
            match l.strip_prefix(b"data:") {
                Some(d) => data.push(d.strip_prefix(b" ").unwrap_or(d)),
                None if l == b"data" => data.push(b""),
                None => other.push(l),
            }
        }
        let text = data.join(&b'\n');
        if text.iter().all(u8::is_ascii_whitespace) {
            for l in &lines {
                out.extend_from_slice(l);
                out.push(b'\n');
            }
            out.push(b'\n');
            return Ok(());
        }
        let not_json = |e| InterceptError::body_caused("an event of the MCP stream is not JSON", e);
        let doc = match self.passes(&text).map_err(not_json)? {
            true => Doc::Unchanged,
            false => self.filter_doc(strict_json::parse_borrowed(&text).map_err(not_json)?),
        };
        match doc {
            Doc::Unchanged => {
                for l in &lines {
                    out.extend_from_slice(l);
                    out.push(b'\n');
                }
                out.push(b'\n');
            }
            Doc::Changed(doc) => {
                for l in other {
                    out.extend_from_slice(l);
                    out.push(b'\n');
                }
                out.extend_from_slice(b"data: ");
                serde_json::to_writer(&mut *out, &doc)
                    .map_err(|e| InterceptError::body_caused("an event of the MCP stream", e))?;
                out.extend_from_slice(b"\n\n");
            }
            Doc::Gone => out.extend_from_slice(b": egress-proxy dropped a server request\n\n"),
        }
        Ok(())
    }

    /// JSON-RPC errors, as one event, for the client's requests still unanswered when the
    /// server asked for `method`.
    fn unanswered(&self, method: &str, out: &mut Vec<u8>) {
        let text = format!("egress-proxy: the server asked the client for {method}, which the rule does not allow (server_requests); the stream was ended");
        let errors: Vec<Value> = self
            .lists
            .unanswered()
            .map(|id| serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32001, "message": text}}))
            .collect();
        for e in errors {
            out.extend_from_slice(b"event: message\ndata: ");
            out.extend_from_slice(e.to_string().as_bytes());
            out.extend_from_slice(b"\n\n");
        }
    }

    /// Read the complete lines held; filter each complete event into `out`.
    fn drain(&mut self, at_end: bool, out: &mut Vec<u8>) -> Result<(), InterceptError> {
        let mut start = 0;
        while let Some(i) = self.buf[start..]
            .iter()
            .position(|b| *b == b'\n' || *b == b'\r')
        {
            let end = start + i;
            let next = match self.buf[end] {
                b'\r' if end + 1 == self.buf.len() && !at_end => break,
                b'\r' if self.buf.get(end + 1) == Some(&b'\n') => end + 2,
                _ => end + 1,
            };
            let line = self.buf[start..end].to_vec();
            start = next;
            if line.is_empty() {
                if !self.lines.is_empty() {
                    self.event(out)?;
                }
                if let Some(method) = self.cut.clone() {
                    self.unanswered(&method, out);
                    self.done = true;
                    self.buf.clear();
                    return Ok(());
                }
            } else {
                self.lines.push(line);
            }
        }
        self.buf.drain(..start);
        let held = self.buf.len() + self.lines.iter().map(Vec::len).sum::<usize>();
        if held > self.limit {
            return Err(InterceptError::body(format!(
                "an event of the MCP stream is larger than {} bytes (tls_intercept.judge_body_bytes)",
                self.limit
            )));
        }
        Ok(())
    }

    /// The whole JSON body `bytes`, filtered: the same bytes, not a copy, when it passes as
    /// it came.
    fn whole(&mut self, bytes: Bytes) -> Result<Bytes, InterceptError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            // No message (a 202's body): nothing to filter.
            return Ok(bytes);
        }
        let not_json = |e| InterceptError::body_caused("the MCP response is not JSON", e);
        if self.passes(&bytes).map_err(not_json)? {
            return Ok(bytes);
        }
        let doc = strict_json::parse_borrowed(&bytes).map_err(not_json)?;
        Ok(match self.filter_doc(doc) {
            Doc::Unchanged => bytes,
            Doc::Changed(doc) => serde_json::to_vec(&doc)
                .map_err(|e| InterceptError::body_caused("the MCP response", e))?
                .into(),
            Doc::Gone => Bytes::new(),
        })
    }
}

impl McpFiltered<()> {
    /// A JSON response body read whole (at most the filter's limit) and filtered: a body that
    /// came in one frame and passes as it came is neither copied nor written again.
    pub async fn read_whole<B>(mut self, body: B) -> Result<Bytes, InterceptError>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let bytes = match crate::pipeline::whole::read(body, self.limit).await {
            Ok(b) => b,
            Err(Unread::TooLarge(limit)) => {
                return Err(InterceptError::body(format!(
                    "the MCP response is larger than {limit} bytes (tls_intercept.judge_body_bytes)"
                )))
            }
            Err(e) => {
                return Err(InterceptError::body_caused(
                    "the MCP response could not be read",
                    e,
                ))
            }
        };
        self.whole(bytes)
    }
}

impl<B> Body for McpFiltered<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(Some(Ok(f))) => f,
                Poll::Ready(None) => {
                    this.done = true;
                    let mut out = Vec::new();
                    return match this.drain(true, &mut out) {
                        Ok(()) if out.is_empty() => Poll::Ready(None),
                        Ok(()) => Poll::Ready(Some(Ok(Frame::data(out.into())))),
                        Err(e) => Poll::Ready(Some(Err(e.into()))),
                    };
                }
            };
            let Ok(data) = frame.into_data() else {
                // Trailers carry no MCP message; they are not passed.
                continue;
            };
            this.buf.extend_from_slice(&data);
            let mut out = Vec::new();
            if let Err(e) = this.drain(false, &mut out) {
                this.done = true;
                return Poll::Ready(Some(Err(e.into())));
            }
            if this.done && out.is_empty() {
                return Poll::Ready(None);
            }
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(out.into()))));
            }
        }
    }
}

#[cfg(test)]
mod tests;
