//! What an LLM provider says a call used, read from its answer as it passes: a JSON body
//! (kept up to [`MAX_JSON`] bytes), or a server-sent event stream read event by event (never
//! held back: the reader sees a copy of each chunk after it is passed on). Each provider's
//! usage object is read where that provider puts it, and a later report replaces an earlier
//! one field by field (Anthropic's `message_delta` and Gemini's chunks repeat running totals):
//!
//! - OpenAI: `usage` (Chat Completions: `prompt_tokens`, `completion_tokens`, with
//!   `prompt_tokens_details.cached_tokens`, `completion_tokens_details.reasoning_tokens`;
//!   Responses: `input_tokens`, `output_tokens` and their details), top level or under
//!   `response` (the Responses stream's `response.completed`);
//! - Anthropic: `usage` or `message.usage` (`input_tokens`, `output_tokens`,
//!   `cache_read_input_tokens`, `cache_creation_input_tokens`);
//! - Gemini: `usageMetadata` (`promptTokenCount`, `candidatesTokenCount`,
//!   `cachedContentTokenCount`, `thoughtsTokenCount`, `toolUsePromptTokenCount`), in a JSON
//!   object, a JSON array of chunks, or events.
//!
//! Normalised as billed: input not cached, cached input, cache writes, output (reasoning
//! included; `reasoning` is the part of it that was).

use serde_json::Value;

use super::inference::Provider;

/// The most of a JSON answer kept to read its usage (a longer one is counted at its
/// reservation).
pub const MAX_JSON: usize = 8 << 20;
/// The longest event read from a stream.
const MAX_EVENT: usize = 1 << 20;

/// What the provider reported a call used.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// Tokens by billed kind.
    pub kinds: TokenKinds,
    /// Of the output, reasoning ("thinking") tokens.
    pub reasoning: u64,
    /// The model the provider says answered.
    pub model: Option<String>,
    /// The provider's final count was read (the whole JSON answer, the stream's last usage:
    /// OpenAI's usage chunk or `response.completed`, Anthropic's `message_delta`, Gemini's
    /// chunk with a `finishReason`); `false`: only a count from before the end (Anthropic's
    /// `message_start`, Gemini's running totals) — the answer was cut.
    pub complete: bool,
}

/// The usage fields seen so far (`None`: not reported).
#[derive(Debug, Default, Clone)]
struct Raw {
    input: Option<u64>,
    output: Option<u64>,
    cached: Option<u64>,
    cache_write: Option<u64>,
    reasoning: Option<u64>,
    tool_prompt: Option<u64>,
    model: Option<String>,
    /// The final count was seen ([`Usage::complete`]).
    last: bool,
}

/// The number at `path` in `u`.
fn num(u: &Value, path: &[&str]) -> Option<u64> {
    let mut at = u;
    for k in path {
        at = at.get(*k)?;
    }
    at.as_u64()
}

/// `x` into `slot`, when there is one (a later report without a count keeps the earlier).
fn set(slot: &mut Option<u64>, x: Option<u64>) {
    if x.is_some() {
        *slot = x;
    }
}

impl Raw {
    fn model_from(&mut self, v: &Value, key: &str) {
        if let Some(m) = v.get(key).and_then(Value::as_str) {
            self.model = Some(m.to_string());
        }
    }

    /// OpenAI: Chat Completions' `usage` (its last chunk's), or the Responses API's
    /// `response.usage`.
    fn openai(&mut self, v: &Value) {
        let at = v.get("response").filter(|r| r.is_object()).unwrap_or(v);
        self.model_from(at, "model");
        let Some(u) = at.get("usage").filter(|u| u.is_object()) else {
            return;
        };
        self.last = true;
        let n = |a: &[&str], b: &[&str]| num(u, a).or(num(u, b));
        set(&mut self.input, n(&["prompt_tokens"], &["input_tokens"]));
        set(
            &mut self.output,
            n(&["completion_tokens"], &["output_tokens"]),
        );
        set(
            &mut self.cached,
            n(
                &["prompt_tokens_details", "cached_tokens"],
                &["input_tokens_details", "cached_tokens"],
            ),
        );
        set(
            &mut self.reasoning,
            n(
                &["completion_tokens_details", "reasoning_tokens"],
                &["output_tokens_details", "reasoning_tokens"],
            ),
        );
    }

    /// Anthropic: `message_start` counts the input and one output token; the final output
    /// count comes in `message_delta` (or the whole message, not streamed).
    fn anthropic(&mut self, v: &Value) {
        let at = v.get("message").filter(|m| m.is_object()).unwrap_or(v);
        self.model_from(at, "model");
        let Some(u) = at.get("usage").or(v.get("usage")).filter(|u| u.is_object()) else {
            return;
        };
        self.last |= v.get("type").and_then(Value::as_str) != Some("message_start");
        set(&mut self.input, num(u, &["input_tokens"]));
        set(&mut self.output, num(u, &["output_tokens"]));
        set(&mut self.cached, num(u, &["cache_read_input_tokens"]));
        set(
            &mut self.cache_write,
            num(u, &["cache_creation_input_tokens"]),
        );
    }

    /// Gemini: `usageMetadata` on every chunk, final once a candidate has a `finishReason`.
    fn gemini(&mut self, v: &Value) {
        self.model_from(v, "modelVersion");
        let Some(u) = v.get("usageMetadata").filter(|u| u.is_object()) else {
            return;
        };
        let finished = v
            .get("candidates")
            .and_then(Value::as_array)
            .is_some_and(|c| c.iter().any(|c| c.get("finishReason").is_some()));
        self.last |= finished;
        set(&mut self.input, num(u, &["promptTokenCount"]));
        set(&mut self.output, num(u, &["candidatesTokenCount"]));
        set(&mut self.cached, num(u, &["cachedContentTokenCount"]));
        set(&mut self.reasoning, num(u, &["thoughtsTokenCount"]));
        set(&mut self.tool_prompt, num(u, &["toolUsePromptTokenCount"]));
    }
}

/// Reads one answer's usage as its bytes pass.
#[derive(Debug)]
pub struct UsageReader {
    provider: Provider,
    events: bool,
    /// The JSON body so far, or the current line of the stream.
    buf: Vec<u8>,
    /// The current event's data lines.
    data: Vec<u8>,
    /// More arrived than is kept.
    overflow: bool,
    raw: Raw,
}

impl UsageReader {
    /// A reader for `provider`'s answer; `events`: a `text/event-stream`.
    pub fn new(provider: Provider, events: bool) -> Self {
        UsageReader {
            provider,
            events,
            buf: Vec::new(),
            data: Vec::new(),
            overflow: false,
            raw: Raw::default(),
        }
    }

    /// Whether `content_type` is an event stream.
    pub fn is_event_stream(content_type: Option<&str>) -> bool {
        content_type.is_some_and(|c| {
            c.split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
        })
    }

    /// The next bytes of the answer.
    pub fn feed(&mut self, chunk: &[u8]) {
        if !self.events {
            match self.buf.len() + chunk.len() > MAX_JSON {
                true => self.overflow = true,
                false => self.buf.extend_from_slice(chunk),
            }
            return;
        }
        for &b in chunk {
            if b != b'\n' {
                match self.buf.len() < MAX_EVENT {
                    true => self.buf.push(b),
                    false => self.overflow = true,
                }
                continue;
            }
            let line = std::mem::take(&mut self.buf);
            self.line(&line);
        }
    }

    /// One line of the event stream.
    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            let data = std::mem::take(&mut self.data);
            if let Ok(v) = serde_json::from_slice::<Value>(&data) {
                self.read(&v);
            }
            return;
        }
        if let Some(d) = line.strip_prefix(b"data:") {
            let d = d.strip_prefix(b" ").unwrap_or(d);
            if !self.data.is_empty() {
                self.data.push(b'\n');
            }
            match self.data.len() + d.len() <= MAX_EVENT {
                true => self.data.extend_from_slice(d),
                false => self.overflow = true,
            }
        }
    }

    /// The usage the answer reported, if it reported any.
    pub fn finish(mut self) -> Option<Usage> {
        if self.events {
            let rest = std::mem::take(&mut self.buf);
            self.line(&rest);
            self.line(b"");
        } else if !self.overflow {
            if let Ok(v) = serde_json::from_slice::<Value>(&self.buf) {
                match &v {
                    Value::Array(chunks) => chunks.iter().for_each(|c| self.read(c)),
                    _ => self.read(&v),
                }
            }
        }
        self.usage()
    }

    /// Whether part of the answer was past what is kept.
    pub fn overflowed(&self) -> bool {
        self.overflow
    }

    /// Take what `v` (a body, a chunk or an event) reports.
    fn read(&mut self, v: &Value) {
        match self.provider {
            Provider::OpenAi => self.raw.openai(v),
            Provider::Anthropic => self.raw.anthropic(v),
            Provider::Gemini => self.raw.gemini(v),
        }
    }

    /// The usage as billed, when any count was reported.
    fn usage(&self) -> Option<Usage> {
        let r = &self.raw;
        if r.input.is_none() && r.output.is_none() {
            return None;
        }
        let (input, output, cached) = (
            r.input.unwrap_or(0),
            r.output.unwrap_or(0),
            r.cached.unwrap_or(0),
        );
        let reasoning = r.reasoning.unwrap_or(0);
        let kinds = match self.provider {
            // The prompt count includes the cached part; reasoning is in the output count.
            Provider::OpenAi => TokenKinds {
                input: input.saturating_sub(cached),
                cached_input: cached,
                cache_write: 0,
                output,
            },
            // Input excludes the cache's reads and writes, which are reported apart.
            Provider::Anthropic => TokenKinds {
                input,
                cached_input: cached,
                cache_write: r.cache_write.unwrap_or(0),
                output,
            },
            // Thoughts are billed as output but counted apart from the candidates.
            Provider::Gemini => TokenKinds {
                input: input
                    .saturating_sub(cached)
                    .saturating_add(r.tool_prompt.unwrap_or(0)),
                cached_input: cached,
                cache_write: 0,
                output: output.saturating_add(reasoning),
            },
        };
        Some(Usage {
            kinds,
            reasoning,
            model: r.model.clone(),
            complete: r.last,
        })
    }
}

/// Token counts of one call, by kind (what a price multiplies).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TokenKinds {
    /// Input tokens not read from or written to a cache.
    pub input: u64,
    /// Input tokens read from the cache.
    pub cached_input: u64,
    /// Input tokens written to the cache.
    pub cache_write: u64,
    /// Output tokens (reasoning included).
    pub output: u64,
}

impl TokenKinds {
    /// Every token counted.
    pub fn total(&self) -> u64 {
        self.input
            .saturating_add(self.cached_input)
            .saturating_add(self.cache_write)
            .saturating_add(self.output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(p: Provider, events: bool, chunks: &[&[u8]]) -> Option<Usage> {
        let mut r = UsageReader::new(p, events);
        for c in chunks {
            r.feed(c);
        }
        r.finish()
    }

    #[test]
    fn openai_json_and_streams() {
        let u = read(Provider::OpenAi, false, &[br#"{"model":"gpt-4o-mini-2024","usage":{"prompt_tokens":12,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":2},"completion_tokens_details":{"reasoning_tokens":3}}}"#]).unwrap();
        assert_eq!(
            u.kinds,
            TokenKinds {
                input: 10,
                cached_input: 2,
                cache_write: 0,
                output: 5
            }
        );
        assert_eq!(
            (u.reasoning, u.model.as_deref()),
            (3, Some("gpt-4o-mini-2024"))
        );
        // A chat stream, split mid-line; the usage chunk comes last, then [DONE].
        let s = read(Provider::OpenAi, true, &[b"data: {\"model\":\"m\",\"choices\":[]}\n\nda", b"ta: {\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":4}}\r\n\r\ndata: [DONE]\n\n"]).unwrap();
        assert_eq!(s.kinds.total(), 11);
        // The Responses stream's completed event.
        let s = read(Provider::OpenAi, true, &[b"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"o4\",\"usage\":{\"input_tokens\":9,\"output_tokens\":1,\"input_tokens_details\":{\"cached_tokens\":0}}}}\n\n"]).unwrap();
        assert_eq!(
            (s.kinds.input, s.kinds.output, s.model.as_deref()),
            (9, 1, Some("o4"))
        );
        assert!(read(Provider::OpenAi, true, &[b"data: {\"choices\":[]}\n\n"]).is_none());
    }

    #[test]
    fn anthropic_stream_takes_the_last_running_total() {
        let s = read(Provider::Anthropic, true, &[
            b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-x\",\"usage\":{\"input_tokens\":25,\"output_tokens\":1,\"cache_read_input_tokens\":4,\"cache_creation_input_tokens\":6}}}\n\n",
            b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n",
        ]).unwrap();
        assert_eq!(
            s.kinds,
            TokenKinds {
                input: 25,
                cached_input: 4,
                cache_write: 6,
                output: 15
            }
        );
        assert_eq!(s.model.as_deref(), Some("claude-x"));
    }

    #[test]
    fn gemini_arrays_and_thoughts() {
        let s = read(Provider::Gemini, false, &[br#"[{"modelVersion":"gemini-2.0-flash","usageMetadata":{"promptTokenCount":8}},{"usageMetadata":{"promptTokenCount":8,"candidatesTokenCount":3,"thoughtsTokenCount":2,"cachedContentTokenCount":1}}]"#]).unwrap();
        assert_eq!(
            s.kinds,
            TokenKinds {
                input: 7,
                cached_input: 1,
                cache_write: 0,
                output: 5
            }
        );
        assert_eq!(s.reasoning, 2);
    }

    #[test]
    fn hostile_answers_are_bounded_and_never_panic() {
        let mut r = UsageReader::new(Provider::OpenAi, true);
        r.feed(&vec![b'x'; MAX_EVENT + 10]);
        r.feed(b"\n\ndata: {\"usage\":{\"prompt_tokens\":1e99}}\n\n");
        assert!(r.overflowed());
        assert!(r.finish().is_none());
        assert!(read(
            Provider::Anthropic,
            false,
            &[b"{\"usage\":{\"input_tokens\":-1}}"]
        )
        .is_none());
        let big = read(Provider::OpenAi, false, &[&vec![b' '; MAX_JSON], b"{}"]);
        assert!(big.is_none());
    }
}
