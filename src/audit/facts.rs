//! What a request's record says beyond its connection's: the request (method, path, status,
//! credentials), what read it (the decider, DLP, flow labels), what it used (tokens) and what
//! its answer was (the body's digest) — set by the phases that know, on the request's guard.

use super::{record, AuditGuard};

impl AuditGuard {
    /// What an inference call used.
    pub fn tokens(&mut self, facts: record::TokenFacts) {
        self.record.tokens = Some(Box::new(facts));
    }

    /// What the request inside a terminated tunnel was, and how it was answered.
    pub fn http(&mut self, facts: record::HttpFacts) {
        self.record.http = Some(Box::new(facts));
    }

    /// What became of a request whose facts its driver recorded
    /// ([`crate::pipeline::driver::request`]): the status it was answered with (0: none) and
    /// the credentials put on it, by name.
    pub fn answered(&mut self, status: u16, credential: Option<&str>) {
        if let Some(h) = self.record.http.as_mut() {
            h.status = status;
            h.credential = credential.map(Into::into);
        }
    }

    /// The response's status, on a request whose method and path are recorded.
    pub fn status(&mut self, status: http::StatusCode) {
        if let Some(h) = self.record.http.as_mut() {
            h.status = status.as_u16();
        }
    }

    /// What the decider said of this exchange.
    pub fn decider(&mut self, note: impl Into<Box<str>>) {
        self.record.decider = Some(note.into());
    }

    /// The flow labels the sandbox carried when this was judged.
    pub fn labels(&mut self, labels: Option<String>) {
        if let Some(l) = labels {
            self.record.flow.get_or_insert_with(Default::default).labels = Some(l.into());
        }
    }

    /// The flow labels this armed.
    pub fn armed(&mut self, armed: Option<String>) {
        if let Some(a) = armed {
            self.record.flow.get_or_insert_with(Default::default).armed = Some(a.into());
        }
    }

    /// SHA-256 of the response body the client was given.
    pub fn body_sha256(&mut self, digest: Option<[u8; 32]>) {
        // Written into a buffer of its own size, then one allocation (`hex::encode` pushes
        // char by char; a `format!` a byte was 32 allocations), on every terminated response.
        let mut hexed = [0u8; 64];
        let written = digest.and_then(|d| hex::encode_to_slice(d, &mut hexed).ok());
        if let Some(text) = written.and_then(|()| std::str::from_utf8(&hexed).ok()) {
            self.record.body_sha256 = Some(text.into());
        }
    }

    /// The record's `conn_id`.
    pub fn conn_id(&self) -> u64 {
        self.record.conn_id
    }

    /// What the body scanner found (rule names, never the text).
    pub fn dlp(&mut self, note: impl Into<Box<str>>) {
        self.record.dlp = Some(note.into());
    }
}
