//! `protocol: openai | anthropic | gemini`: what a call to an LLM provider's API asks for, read
//! from its JSON body (and, for Gemini, its path) as the provider reads it — the model (and
//! every fallback model a router would try), whether it streams, the most output it may
//! produce, and the provider-run web tools it asks for (Anthropic `web_search`/`web_fetch`,
//! OpenAI `web_search`, Gemini `google_search`/`url_context`) with their domain lists.
//!
//! The rule judges the model against `models:` here; the web tools are judged by the exchange
//! against the sandbox's own egress policy (`web_tools: policy`, the default), because that
//! policy is not the rule's. Pure: no I/O.

use serde_json::Value;

use super::{json_media, media_refusal, names, ProtocolError};

/// The provider whose wire format a rule reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// OpenAI: Chat Completions, Responses, Completions, Embeddings.
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
    /// Google Gemini `generateContent` / `streamGenerateContent`.
    Gemini,
}

impl Provider {
    /// The name written in rules and records.
    pub fn name(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
            Provider::Gemini => "gemini",
        }
    }

    /// The provider named `name`, if it is one.
    pub fn parse(name: &str) -> Option<Provider> {
        match name {
            "openai" => Some(Provider::OpenAi),
            "anthropic" => Some(Provider::Anthropic),
            "gemini" => Some(Provider::Gemini),
            _ => None,
        }
    }
}

/// What a rule does with provider-run web tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebTools {
    /// Allowed when the tool names `allowed_domains` and the sandbox's own egress policy
    /// allows every one of them (the default).
    Policy,
    /// Never.
    Refuse,
    /// Whatever they name.
    Allow,
}

impl WebTools {
    /// The mode written as `web_tools: NAME`.
    pub fn parse(name: &str) -> Option<WebTools> {
        match name {
            "policy" => Some(WebTools::Policy),
            "refuse" => Some(WebTools::Refuse),
            "allow" => Some(WebTools::Allow),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            WebTools::Policy => "policy",
            WebTools::Refuse => "refuse",
            WebTools::Allow => "allow",
        }
    }
}

/// A compiled `protocol: openai | anthropic | gemini` rule.
#[derive(Debug, Clone)]
pub struct InferenceRule {
    /// Whose wire format.
    pub provider: Provider,
    /// `models:` as written (none: any model).
    pub models: Vec<String>,
    matcher: Option<globset::GlobSet>,
    /// What provider-run web tools may do.
    pub web_tools: WebTools,
    /// Tool `type`s the operator names as run without network access by the provider (or by
    /// the client), beyond those the reader knows: any other unknown type is refused while
    /// `web_tools` is not `allow` (fail closed).
    pub tool_types: Vec<String>,
}

/// A provider-run tool that reaches the network, as a call asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebTool {
    /// `web_search`, `web_fetch`, `google_search`, `mcp`, …
    pub name: String,
    /// Its `allowed_domains` (none written: `None`, the whole web), or the one host of a
    /// remote MCP server's URL.
    pub allowed: Option<Vec<String>>,
    /// `allowed` names exact hosts (an MCP server), not domains with their subdomains.
    pub exact: bool,
}

/// What an allowed call asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// Whose API.
    pub provider: Provider,
    /// The model asked for (`None`: the body names none).
    pub model: Option<String>,
    /// Whether the answer streams (server-sent events).
    pub stream: bool,
    /// The most output tokens it may produce, when the body bounds it.
    pub max_output: Option<u64>,
    /// The body's length (the input estimate reads it).
    pub body_bytes: u64,
    /// The provider-run web tools asked for.
    pub web: Vec<WebTool>,
    /// Whether the answer will report its usage: always, but for an OpenAI Chat Completions
    /// stream that does not ask for it (`stream_options.include_usage`).
    pub reports_usage: bool,
    /// OpenAI's `background: true`: the answer (and its usage) is fetched later.
    pub background: bool,
}

impl Call {
    /// What the record's `call` says: `openai gpt-4o-mini`, `anthropic claude-… stream`.
    pub fn describe(&self) -> String {
        let model = self.model.as_deref().unwrap_or("(no model)");
        match self.stream {
            true => format!("{model} stream"),
            false => model.to_string(),
        }
    }

    /// The tokens reserved before the call leaves: the input estimated at one token per four
    /// bytes of body (rounded up), plus the output bound the body gives (none: nothing).
    pub fn estimate(&self) -> u64 {
        self.body_bytes
            .div_ceil(4)
            .saturating_add(self.max_output.unwrap_or(0))
    }
}

impl InferenceRule {
    /// A rule for `provider` allowing `models` (globs; none: any) with `web_tools`.
    pub fn new(
        provider: Provider,
        models: &[String],
        (web_tools, tool_types): (WebTools, &[String]),
    ) -> Result<Self, ProtocolError> {
        let matcher = match models.is_empty() {
            true => None,
            false => Some(names(models, "model")?),
        };
        Ok(InferenceRule {
            provider,
            models: models.to_vec(),
            matcher,
            web_tools,
            tool_types: tool_types.to_vec(),
        })
    }

    /// The rule as text, for the policy version and `validate`.
    pub fn describe(&self) -> String {
        let mut out = format!("protocol:{}", self.provider.name());
        if !self.models.is_empty() {
            out.push_str(&format!(" models:{}", self.models.join(",")));
        }
        if self.web_tools != WebTools::Policy {
            out.push_str(&format!(" web_tools:{}", self.web_tools.name()));
        }
        if !self.tool_types.is_empty() {
            out.push_str(&format!(" tool_types:{}", self.tool_types.join(",")));
        }
        out
    }

    /// Judge one call: `Ok` with what it asks for, or why it is refused. A request without a
    /// body (a GET of `/v1/models`, a DELETE of a stored response) asks for nothing to judge.
    pub fn judge(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Result<Call, ProtocolError> {
        let mut call = Call {
            provider: self.provider,
            model: gemini_model(self.provider, path),
            stream: self.provider == Provider::Gemini && path.ends_with(":streamGenerateContent"),
            max_output: None,
            body_bytes: body.len() as u64,
            web: Vec::new(),
            reports_usage: true,
            background: false,
        };
        if !method.eq_ignore_ascii_case("POST") {
            if body.is_empty() {
                return Ok(call);
            }
            return Err(ProtocolError::malformed(format!(
                "a {method} with a body is not a call this rule reads"
            )));
        }
        if !json_media(content_type) {
            return Err(ProtocolError::malformed(media_refusal(
                content_type,
                "an inference",
            )));
        }
        let v = super::strict_json::parse(body)?;
        let Value::Object(o) = &v else {
            return Err(ProtocolError::malformed("the body is not a JSON object"));
        };
        let mut models: Vec<String> = Vec::new();
        match (self.provider, o.get("model")) {
            (Provider::Gemini, None) => {}
            (_, None) => {}
            (_, Some(Value::String(m))) => models.push(m.clone()),
            (_, Some(_)) => return Err(ProtocolError::malformed("`model` is not a string")),
        }
        if self.provider != Provider::Gemini {
            call.model = models.first().cloned();
        } else if let Some(m) = &call.model {
            models.insert(0, m.clone());
        }
        models.extend(fallbacks(o)?);
        self.judge_models(&models)?;
        call.stream |= o.get("stream") == Some(&Value::Bool(true));
        let include_usage = o.get("stream_options").and_then(|x| x.get("include_usage"))
            == Some(&Value::Bool(true));
        call.reports_usage = self.provider != Provider::OpenAi
            || !call.stream
            || path.ends_with("/responses")
            || include_usage;
        call.max_output = max_output(self.provider, o)?;
        call.background = o.get("background") == Some(&Value::Bool(true));
        call.web = self.web_tools_of(o)?;
        Ok(call)
    }

    /// The provider-run web tools a call asks for, as the rule's `web_tools` takes them: a
    /// tool type the proxy does not know is refused unless the rule names it; every web tool
    /// is refused under `refuse`; none is kept (nothing to check) under `allow`.
    fn web_tools_of(
        &self,
        o: &serde_json::Map<String, Value>,
    ) -> Result<Vec<WebTool>, ProtocolError> {
        let (web, unknown) = super::inference_tools::web_tools(o)?;
        let unnamed = unknown.iter().find(|t| !self.tool_types.contains(t));
        if let (Some(t), false) = (unnamed, self.web_tools == WebTools::Allow) {
            return Err(ProtocolError::not_allowed(format!(
                "the call asks for a tool of type `{}`, which the proxy does not know: the provider may reach the network with it (name it in the rule's tool_types if it does not, or web_tools: allow)",
                shown(t)
            )));
        }
        match (self.web_tools, web.first()) {
            (WebTools::Refuse, Some(t)) => Err(ProtocolError::not_allowed(format!(
                "the call asks the provider to run `{}`; this rule refuses provider-run web tools (web_tools: refuse)",
                t.name
            ))),
            (WebTools::Allow, _) => Ok(Vec::new()),
            _ => Ok(web),
        }
    }

    /// Every model named (the one asked for and each fallback) must be one `models:` allows.
    fn judge_models(&self, models: &[String]) -> Result<(), ProtocolError> {
        let Some(m) = &self.matcher else {
            return Ok(());
        };
        if models.is_empty() {
            return Err(ProtocolError::not_allowed(format!(
                "the call names no model; this rule allows only {}",
                self.models.join(", ")
            )));
        }
        match models.iter().find(|x| !m.is_match(x.as_str())) {
            Some(bad) => Err(ProtocolError::not_allowed(format!(
                "model `{}` is not one this rule allows ({})",
                shown(bad),
                self.models.join(", ")
            ))),
            None => Ok(()),
        }
    }
}

/// A name from the body as a refusal may show it: printable, at most 100 characters.
fn shown(s: &str) -> String {
    s.chars()
        .take(100)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// Gemini names its model in the path: `/v1beta/models/MODEL:generateContent`.
fn gemini_model(provider: Provider, path: &str) -> Option<String> {
    if provider != Provider::Gemini {
        return None;
    }
    let after = path.split("/models/").nth(1)?;
    let model = after.split(':').next()?;
    (!model.is_empty() && !model.contains('/')).then(|| model.to_string())
}

/// The fallback models a router would try: `models: [..]` (OpenRouter) and `fallbacks: [..]`
/// (LiteLLM: names or `{ model }` objects). A fallback that is not a name is refused.
fn fallbacks(o: &serde_json::Map<String, Value>) -> Result<Vec<String>, ProtocolError> {
    let mut out = Vec::new();
    for key in ["models", "fallbacks", "fallback_models"] {
        let Some(v) = o.get(key) else { continue };
        let Value::Array(items) = v else {
            return Err(ProtocolError::malformed(format!(
                "`{key}` is not a list of models"
            )));
        };
        for item in items {
            match item {
                Value::String(m) => out.push(m.clone()),
                Value::Object(x) => match x.get("model") {
                    Some(Value::String(m)) => out.push(m.clone()),
                    _ => {
                        return Err(ProtocolError::malformed(format!(
                            "an entry of `{key}` names no model"
                        )))
                    }
                },
                _ => {
                    return Err(ProtocolError::malformed(format!(
                        "an entry of `{key}` is not a model"
                    )))
                }
            }
        }
    }
    Ok(out)
}

/// The output bound the body gives.
fn max_output(
    provider: Provider,
    o: &serde_json::Map<String, Value>,
) -> Result<Option<u64>, ProtocolError> {
    let number = |v: &Value, k: &str| {
        v.as_u64()
            .ok_or_else(|| ProtocolError::malformed(format!("`{k}` is not a non-negative integer")))
    };
    let keys: &[&str] = match provider {
        Provider::OpenAi => &["max_output_tokens", "max_completion_tokens", "max_tokens"],
        Provider::Anthropic => &["max_tokens"],
        Provider::Gemini => &[],
    };
    for k in keys {
        if let Some(v) = o.get(*k) {
            return number(v, k).map(Some);
        }
    }
    if provider == Provider::Gemini {
        let config = o
            .get("generationConfig")
            .or_else(|| o.get("generation_config"));
        if let Some(v) = config.and_then(|c| {
            c.get("maxOutputTokens")
                .or_else(|| c.get("max_output_tokens"))
        }) {
            return number(v, "maxOutputTokens").map(Some);
        }
    }
    Ok(None)
}

/// `body` (a call to `path` the rule allowed) with its output bound set to `bound`: the field
/// the body already bounds it with, else the one the API reads (OpenAI's Responses
/// `max_output_tokens`, Chat Completions `max_completion_tokens`; Anthropic's `max_tokens`;
/// Gemini's `generationConfig.maxOutputTokens`). `None` when the body is not a JSON object.
/// The body is written again (its keys in order, its values as they were).
pub fn with_output_bound(
    provider: Provider,
    path: &str,
    body: &[u8],
    bound: u64,
) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(body).ok()?;
    let o = v.as_object_mut()?;
    match provider {
        Provider::OpenAi => {
            let key = ["max_output_tokens", "max_completion_tokens", "max_tokens"]
                .into_iter()
                .find(|k| o.contains_key(*k))
                .unwrap_or(match path.ends_with("/responses") {
                    true => "max_output_tokens",
                    false => "max_completion_tokens",
                });
            o.insert(key.into(), bound.into());
        }
        Provider::Anthropic => {
            o.insert("max_tokens".into(), bound.into());
        }
        Provider::Gemini => {
            let (section, key) = match o.contains_key("generation_config") {
                true => ("generation_config", "max_output_tokens"),
                false => ("generationConfig", "maxOutputTokens"),
            };
            let config = o
                .entry(section)
                .or_insert_with(|| Value::Object(Default::default()));
            config.as_object_mut()?.insert(key.into(), bound.into());
        }
    }
    serde_json::to_vec(&v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(p: Provider, models: &[&str], web: WebTools) -> InferenceRule {
        let models: Vec<String> = models.iter().map(|m| m.to_string()).collect();
        InferenceRule::new(p, &models, (web, &[])).unwrap()
    }

    const JSON: Option<&str> = Some("application/json");

    #[test]
    fn models_and_fallbacks_are_judged() {
        let r = rule(Provider::OpenAi, &["gpt-4o-mini*"], WebTools::Policy);
        let body = br#"{"model":"gpt-4o-mini","max_tokens":50,"stream":true}"#;
        let ok = r.judge("POST", "/v1/chat/completions", JSON, body).unwrap();
        assert_eq!(ok.model.as_deref(), Some("gpt-4o-mini"));
        assert!(ok.stream);
        assert_eq!(ok.max_output, Some(50));
        assert_eq!(ok.estimate(), 50 + (body.len() as u64).div_ceil(4));
        assert!(
            !ok.reports_usage,
            "a chat stream without include_usage reports none"
        );
        let asks =
            br#"{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true}}"#;
        let c = r.judge("POST", "/v1/chat/completions", JSON, asks).unwrap();
        assert!(c.reports_usage);
        let c = r.judge(
            "POST",
            "/v1/responses",
            JSON,
            br#"{"model":"gpt-4o-mini","stream":true}"#,
        );
        assert!(c.unwrap().reports_usage);
        for (body, says) in [
            (&br#"{"model":"gpt-4o"}"#[..], "`gpt-4o` is not one"),
            (br#"{"model":"gpt-4o-mini","models":["o1"]}"#, "`o1`"),
            (
                br#"{"model":"gpt-4o-mini","fallbacks":[{"model":"o3"}]}"#,
                "`o3`",
            ),
            (br#"{"messages":[]}"#, "names no model"),
            (br#"{"model":"gpt-4o-mini","model":"o1"}"#, "JSON"),
            (br#"{"model":5}"#, "not a string"),
            (
                br#"{"model":"gpt-4o-mini","max_tokens":-1}"#,
                "non-negative",
            ),
        ] {
            let e = r
                .judge("POST", "/v1/chat/completions", JSON, body)
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{e}");
        }
        assert!(r.judge("POST", "/v1/x", Some("text/plain"), b"{}").is_err());
        assert!(r.judge("GET", "/v1/models", None, b"").is_ok());
    }

    #[test]
    fn an_output_bound_is_set_where_each_api_reads_it() {
        let set = |p, path, body: &str| {
            let out = with_output_bound(p, path, body.as_bytes(), 7).unwrap();
            serde_json::from_slice::<Value>(&out).unwrap()
        };
        let v = set(
            Provider::OpenAi,
            "/v1/chat/completions",
            r#"{"model":"m","max_tokens":900}"#,
        );
        assert_eq!(v["max_tokens"], 7);
        let v = set(Provider::OpenAi, "/v1/chat/completions", r#"{"model":"m"}"#);
        assert_eq!(v["max_completion_tokens"], 7);
        let v = set(
            Provider::OpenAi,
            "/v1/responses",
            r#"{"model":"m","input":"hi"}"#,
        );
        assert_eq!(v["max_output_tokens"], 7);
        let v = set(
            Provider::Anthropic,
            "/v1/messages",
            r#"{"model":"c","max_tokens":4096}"#,
        );
        assert_eq!(v["max_tokens"], 7);
        let v = set(
            Provider::Gemini,
            "/v1beta/models/g:generateContent",
            r#"{"contents":[]}"#,
        );
        assert_eq!(v["generationConfig"]["maxOutputTokens"], 7);
        assert!(with_output_bound(Provider::OpenAi, "/", b"[1]", 7).is_none());
    }

    #[test]
    fn gemini_reads_the_model_from_the_path() {
        let r = rule(Provider::Gemini, &["gemini-2.0-flash"], WebTools::Policy);
        let c = r
            .judge(
                "POST",
                "/v1beta/models/gemini-2.0-flash:streamGenerateContent",
                JSON,
                br#"{"generationConfig":{"maxOutputTokens":9}}"#,
            )
            .unwrap();
        assert!(c.stream && c.max_output == Some(9));
        assert!(r
            .judge(
                "POST",
                "/v1beta/models/gemini-pro:generateContent",
                JSON,
                b"{}"
            )
            .is_err());
    }

    #[test]
    fn web_tools_are_read_with_their_domains() {
        let r = rule(Provider::Anthropic, &[], WebTools::Policy);
        let c = r
            .judge("POST", "/v1/messages", JSON, br#"{"model":"c","max_tokens":5,"tools":[{"type":"web_fetch_20250910","name":"web_fetch","allowed_domains":["a.test"]},{"type":"web_search_20250305","name":"web_search"},{"name":"mine","input_schema":{}}]}"#)
            .unwrap();
        assert_eq!(c.web.len(), 2);
        assert_eq!(c.web[0].allowed, Some(vec!["a.test".to_string()]));
        assert_eq!(c.web[1].allowed, None);
        let refuse = rule(Provider::OpenAi, &[], WebTools::Refuse);
        assert!(refuse
            .judge("POST", "/v1/responses", JSON, br#"{"model":"m","tools":[{"type":"web_search","filters":{"allowed_domains":["a.test"]}}]}"#)
            .unwrap_err()
            .to_string()
            .contains("web_tools: refuse"));
    }
}
