//! Inference governance (issue 63) with the providers' official Python SDKs (`openai`,
//! `anthropic`, `google-genai`; `tests/data/llm_client.py`) through the proxy, against
//! `tests/data/llm_origin.py`, a local origin that speaks the documented wire formats behind
//! the test CA, with brokered keys: token records for JSON and streamed calls, the model
//! allowlist, token and cost budgets (20 calls at once against a budget for 3), provider-run
//! web tools bounded by the sandbox's egress, and two replicas on etcd sharing one budget.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const SECRET: &str = "sk-test-brokered-0123456789";

struct Env {
    dir: tempfile::TempDir,
    origin: ScriptOrigin,
    proxy: Proxy,
}

/// The config: three provider hosts on the origin's port with keys brokered, the rules and
/// limits given, and prices for `gpt-4o-mini*` only; `extra` (YAML) at the top level.
fn config(dir: &Path, port: u16, limits: &str, extra: &str) -> ProxyConfig {
    around(dir, extra).sandbox(dev(port, limits))
}

const HOSTS: [&str; 5] = [
    "api.openai.test",
    "api.anthropic.test",
    "gemini.test",
    "plain-llm.test",
    "paths-llm.test",
];

/// Sandbox `dev` of [`config`].
fn dev(port: u16, limits: &str) -> SandboxSpec {
    let key = |name: &str, host: &str, header: &str, format: &str| {
        format!("{{ name: {name}, hosts: [{host}], inject: {{ header: {header}, format: \"{format}\" }}, source: {{ env: LLM_SECRET }} }}")
    };
    let dev = SandboxSpec::new("dev")
        .token("dev-secret")
        .limits(limits)
        .credential(&key("openai", "api.openai.test", "Authorization", "Bearer {secret}"))
        .credential(&key("anthropic", "api.anthropic.test", "x-api-key", "{secret}"))
        .credential(&key("gemini", "gemini.test", "x-goog-api-key", "{secret}"))
        .allow("docs.allowed.test")
        .allow("*.docs.allowed.test")
        .network(
            "http",
            r#"[{ host: api.openai.test, protocol: openai, models: ["gpt-4o-mini*"] }, { host: api.anthropic.test, protocol: anthropic }, { host: gemini.test, protocol: gemini }, { host: plain-llm.test, protocol: openai }, { host: paths-llm.test, protocol: openai, paths: [/v1/chat/completions] }]"#,
        );
    HOSTS
        .iter()
        .fold(dev, |dev, h| dev.allow(&format!("{h}:{port}")))
}

/// [`config`] without its sandbox.
fn around(dir: &Path, extra: &str) -> ProxyConfig {
    HOSTS
        .iter()
        .fold(ProxyConfig::new(), |c, h| c.host(h, "127.0.0.1"))
        .admin_token_file(&dir.join("admin.token"))
        .dns_server("127.0.0.1:9")
        .guard_allow("127.0.0.1/32")
        .defaults(
            "prices",
            r#"[{ models: "gpt-4o-mini*", input: 0.15, output: 0.6, cached_input: 0.075 }]"#,
        )
        .intercept(&dir.join("ica"), &dir.join("ca/ca.pem"))
        .raw(extra)
}

fn env(limits: &str) -> Env {
    env_with(limits, "")
}

fn env_with(limits: &str, extra: &str) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("ca")).unwrap();
    let ca = TestCa::generate(&d.join("ca"));
    ca_init(&d.join("ica"));
    std::fs::write(d.join("admin.token"), "admin-token\n").unwrap();
    let log = d.join("origin.jsonl");
    std::fs::write(&log, "").unwrap();
    let origin = ScriptOrigin::start(
        "llm_origin.py",
        &[
            ca.cert_pem.as_os_str(),
            ca.key_pem.as_os_str(),
            log.as_os_str(),
            SECRET.as_ref(),
        ],
    );
    let proxy = config(d, origin.port, limits, extra).start_env(d, &[("LLM_SECRET", SECRET)]);
    Env { dir, origin, proxy }
}

impl Env {
    /// Run the SDK client: `kind` against the provider's host with `spec`; one report per call.
    fn call(&self, kind: &str, spec: serde_json::Value) -> Vec<serde_json::Value> {
        call_through(&self.proxy, self.dir.path(), self.origin.port, kind, spec)
    }

    /// What the origin received: (path, model, keyed, stream) per call.
    fn received(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("origin.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The `end` records of calls carrying a `tokens` block.
    fn token_records(&self, n: usize) -> Vec<serde_json::Value> {
        eventually(Duration::from_secs(10), "token records", || {
            let r: Vec<_> = self
                .proxy
                .audit_records()
                .into_iter()
                .filter(|r| r["event"] == "end" && r.get("tokens").is_some())
                .collect();
            (r.len() >= n).then_some(r)
        })
    }
}

fn call_through(
    proxy: &Proxy,
    dir: &Path,
    port: u16,
    kind: &str,
    spec: serde_json::Value,
) -> Vec<serde_json::Value> {
    let base = match kind {
        "messages" | "messages_stream" => format!("https://api.anthropic.test:{port}"),
        "gemini" | "gemini_stream" => format!("https://gemini.test:{port}"),
        "models" => format!("https://paths-llm.test:{port}/v1"),
        "chat_plain" => format!("http://plain-llm.test:{port}/v1"),
        _ => format!("https://api.openai.test:{port}/v1"),
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/llm_client.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(kind)
        .arg(base)
        .arg(format!("http://dev:dev-secret@{}", proxy.proxy))
        .arg(dir.join("ica/ca.crt"))
        .arg(spec.to_string())
        .output()
        .expect("python3");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|_| {
        panic!(
            "llm_client.py printed no report (are openai, anthropic and google-genai installed? tests/run installs them): {text} {}\nthe proxy recorded: {:#?}",
            String::from_utf8_lossy(&out.stderr),
            proxy.audit_records()
        )
    })
}

/// `GET /v1/usage?sandbox=dev`.
fn usage(p: &Proxy) -> serde_json::Value {
    let (status, body) = admin_req(
        p.admin,
        "GET",
        "/v1/usage?sandbox=dev",
        "",
        Some("admin-token"),
    );
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn ok(reports: &[serde_json::Value]) -> usize {
    reports.iter().filter(|r| r["ok"] == true).count()
}

#[test]
fn json_and_streamed_calls_of_each_provider_are_recorded_with_their_tokens() {
    let e = env("{}");
    let runs: [(&str, &str, [u64; 6]); 7] = [
        // kind, model, [input, cached_input, cache_write, output, reasoning, total]
        ("chat", "gpt-4o-mini", [10, 2, 0, 5, 1, 17]),
        ("chat_stream", "gpt-4o-mini", [10, 2, 0, 5, 1, 17]),
        ("responses_stream", "gpt-4o-mini", [9, 0, 0, 3, 0, 12]),
        ("messages", "claude-test", [25, 4, 6, 15, 0, 50]),
        ("messages_stream", "claude-test", [25, 4, 6, 15, 0, 50]),
        ("gemini", "gemini-test", [7, 1, 0, 5, 2, 13]),
        ("gemini_stream", "gemini-test", [7, 1, 0, 5, 2, 13]),
    ];
    for (i, (kind, model, want)) in runs.iter().enumerate() {
        let r = e.call(kind, serde_json::json!({ "model": model }));
        assert_eq!(ok(&r), 1, "{kind}: {r:?}");
        let records = e.token_records(i + 1);
        let t = &records[i]["tokens"];
        let got: Vec<u64> = [
            "input",
            "cached_input",
            "cache_write",
            "output",
            "reasoning",
            "total",
        ]
        .iter()
        .map(|k| t[*k].as_u64().unwrap())
        .collect();
        assert_eq!(got, want, "{kind}: {t}");
        assert_eq!(t["model"], *model, "{kind}");
        assert_eq!(t["counted"], "reported");
        assert_eq!(records[i]["mode"], "https");
    }
    // Every call reached the origin with the brokered key, never the sandbox's placeholder.
    let got = e.received();
    assert_eq!(got.len(), runs.len(), "{got:?}");
    assert!(got.iter().all(|r| r["keyed"] == true), "{got:?}");
    // Priced: gpt-4o-mini's chat cost 10×0.15 + 2×0.075 + 5×0.6 per million = $0.00000465.
    let chat = &e.token_records(1)[0]["tokens"];
    assert!(
        (chat["cost_usd"].as_f64().unwrap() - 4.65e-6).abs() < 1e-12,
        "{chat}"
    );
    // The ledger sums them per model.
    let u = usage(&e.proxy);
    let claude = u["usage"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["model"] == "claude-test")
        .unwrap_or_else(|| panic!("no claude row in {u}"));
    assert_eq!(claude["destination"], "api.anthropic.test");
    assert_eq!(claude["tokens_output"], 30);
    assert_eq!(claude["requests"], 2);
}

#[test]
fn tokens_and_cost_reach_an_otlp_receiver_per_model() {
    let recv_dir = tempfile::tempdir().unwrap();
    let out = recv_dir.path().join("received.jsonl");
    let receiver = ScriptOrigin::start("otlp_receiver.py", &["grpc".as_ref(), out.as_os_str()]);
    let otel = format!(
        "otel: {{ endpoint: \"http://127.0.0.1:{}\", protocol: grpc, interval_ms: 300, timeout_ms: 1000 }}\n",
        receiver.port
    );
    let e = env_with("{}", &otel);
    assert_eq!(ok(&e.call("chat", serde_json::json!({}))), 1);
    let points = |name: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["signal"] == "metrics")
            .flat_map(|e| e["points"].as_array().cloned().unwrap_or_default())
            .filter(|p| {
                p["name"] == name && p["attributes"]["gen_ai.request.model"] == "gpt-4o-mini"
            })
            .collect()
    };
    let output = eventually(Duration::from_secs(15), "egress.tokens output", || {
        points("egress.tokens")
            .into_iter()
            .find(|p| p["attributes"]["egress.token.kind"] == "output" && p["value"] == 5)
    });
    assert_eq!(output["attributes"]["sandbox.id"], "dev");
    // 10×0.15 + 2×0.075 + 5×0.6 per million tokens = 4,650 nano-dollars.
    assert!(points("egress.cost").iter().any(|p| p["value"] == 4650));
}

#[test]
fn a_model_outside_the_rule_and_a_fallback_outside_it_are_refused_in_the_providers_shape() {
    let e = env("{}");
    let r = e.call("chat", serde_json::json!({ "model": "gpt-4o" }));
    assert_eq!(r[0]["status"], 403, "{r:?}");
    assert_eq!(r[0]["type"], "inference_not_allowed", "{r:?}");
    let msg = r[0]["message"].as_str().unwrap();
    assert!(
        msg.contains("model `gpt-4o` is not one this rule allows"),
        "{msg}"
    );
    // A fallback a router would try is judged too.
    let r = e.call(
        "chat",
        serde_json::json!({ "model": "gpt-4o-mini", "headers": {}, "extra_body": { "models": ["gpt-4o-mini", "o1"] } }),
    );
    assert_eq!(r[0]["status"], 403, "{r:?}");
    assert!(r[0]["message"].as_str().unwrap().contains("`o1`"), "{r:?}");
    assert!(e.received().is_empty(), "{:?}", e.received());
    let rec = e
        .proxy
        .wait_record(|r| r["reason"] == "inference_not_allowed");
    assert_eq!(rec["decision"], "deny");
    // A path the provider's rule does not list (`models.list()` against a rule for chat
    // completions): the same shape, so the SDK shows why (clients review B1.9).
    let r = e.call("models", serde_json::json!({}));
    assert_eq!(r[0]["status"], 403, "{r:?}");
    assert_eq!(r[0]["type"], "http_not_allowed", "{r:?}");
    let msg = r[0]["message"].as_str().unwrap();
    assert!(msg.contains("GET /v1/models"), "{msg}");
}

#[test]
fn a_sandbox_over_its_tokens_per_day_gets_an_error_the_sdk_raises_with_the_reason() {
    let e = env("{ tokens_per_day: 40 }");
    // A stream that would not report its usage cannot be counted: refused under a budget.
    let r = e.call("chat_stream", serde_json::json!({ "no_usage": true }));
    assert_eq!(r[0]["status"], 403, "{r:?}");
    assert!(
        r[0]["message"].as_str().unwrap().contains("include_usage"),
        "{r:?}"
    );
    // 17 tokens a call (settled from the usage reported): the third call finds 34 + … of 40
    // reserved; each reserves its estimate first, so the one that would pass 40 is refused.
    let mut served = 0;
    let mut refused = None;
    for _ in 0..5 {
        let r = e.call("chat", serde_json::json!({ "max_tokens": 5 }));
        match r[0]["ok"] == true {
            true => served += 1,
            false => {
                refused = Some(r[0].clone());
                break;
            }
        }
    }
    let refused = refused.expect("a refusal");
    assert_eq!(refused["status"], 429, "{refused}");
    assert_eq!(refused["type"], "budget_exceeded", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("tokens_per_day quota (40)"),
        "{refused}"
    );
    assert!((1..=3).contains(&served), "{served}");
    assert_eq!(e.received().len(), served);
    // A background response is fetched later by an unmetered GET: refused under a budget
    // (security review B03).
    let e2 = env("{ tokens_per_day: 100000 }");
    let r = e2.call(
        "responses",
        serde_json::json!({ "extra_body": { "background": true } }),
    );
    assert_eq!(r[0]["status"], 403, "{r:?}");
    assert!(
        r[0]["message"].as_str().unwrap().contains("background"),
        "{r:?}"
    );
    // Anthropic's SDK raises it too, in Anthropic's shape.
    let r = e.call("messages", serde_json::json!({ "model": "claude-test" }));
    assert_eq!(r[0]["status"], 429, "{r:?}");
    assert_eq!(r[0]["type"], "budget_exceeded", "{r:?}");
}

#[test]
fn twenty_parallel_calls_against_a_budget_for_three_serve_three() {
    // Each call reserves 1,000 output tokens plus its body's estimate; the origin holds every
    // answer 6 s, so all twenty are in flight together and only reservations decide. (At
    // 1.5 s a loaded CI machine started some of the twenty after the first answers had
    // settled and given their reservations back: 5 served, each rightly.)
    let e = env("{ tokens_per_day: 3000 }");
    let r = e.call(
        "chat",
        serde_json::json!({ "max_tokens": 1000, "parallel": 20, "headers": { "x-test-delay-ms": "6000" } }),
    );
    assert_eq!(r.len(), 20);
    assert_eq!(ok(&r), 3, "{r:?}");
    assert!(
        r.iter()
            .filter(|x| x["ok"] != true)
            .all(|x| x["status"] == 429 && x["type"] == "budget_exceeded"),
        "{r:?}"
    );
    assert_eq!(e.received().len(), 3);
    // Settled at what they used: 3 × 17 tokens, so a call fits again.
    let u = usage(&e.proxy);
    assert_eq!(u["quotas"][0]["tokens"], 51, "{u}");
    assert_eq!(ok(&e.call("chat", serde_json::json!({}))), 1);
}

#[test]
fn a_cost_budget_needs_a_price_for_the_model() {
    let e = env("{ cost_per_day: 0.001 }");
    assert_eq!(ok(&e.call("chat", serde_json::json!({}))), 1);
    let r = e.call("messages", serde_json::json!({ "model": "claude-test" }));
    assert_eq!(r[0]["status"], 429, "{r:?}");
    assert!(
        r[0]["message"].as_str().unwrap().contains("no price"),
        "{r:?}"
    );
    assert_eq!(e.received().len(), 1);
}

#[test]
fn provider_run_web_tools_are_bounded_by_the_sandboxs_egress() {
    let e = env("{}");
    let fetch = |domains: serde_json::Value| {
        let mut tool = serde_json::json!({ "type": "web_fetch_20250910", "name": "web_fetch" });
        if !domains.is_null() {
            tool["allowed_domains"] = domains;
        }
        e.call(
            "messages",
            serde_json::json!({ "model": "claude-test", "tools": [tool] }),
        )
    };
    assert_eq!(ok(&fetch(serde_json::json!(["docs.allowed.test"]))), 1);
    for wide in [
        serde_json::json!(["docs.allowed.test", "evil.test"]),
        serde_json::Value::Null,
    ] {
        let r = fetch(wide.clone());
        assert_eq!(r[0]["status"], 403, "{wide}: {r:?}");
        assert_eq!(r[0]["type"], "inference_not_allowed", "{r:?}");
    }
    // OpenAI's web_search names its domains under `filters`.
    let search = |d: &str| {
        e.call(
            "responses",
            serde_json::json!({ "tools": [{ "type": "web_search", "filters": { "allowed_domains": [d] } }] }),
        )
    };
    assert_eq!(ok(&search("docs.allowed.test")), 1);
    assert_eq!(search("metadata.google.internal")[0]["status"], 403);
    assert_eq!(e.received().len(), 2);
    // Provider-run MCP connectors reach whatever server the call names (L02c, L02d): bounded
    // like web tools, by the server's host. A tool type the proxy does not know is refused.
    let mcp = |url: &str| {
        e.call(
            "responses",
            serde_json::json!({ "tools": [{ "type": "mcp", "server_label": "x", "server_url": url }] }),
        )
    };
    assert_eq!(ok(&mcp("https://docs.allowed.test/mcp")), 1);
    let r = mcp("https://evil.test/mcp");
    assert_eq!(r[0]["status"], 403, "{r:?}");
    assert!(
        r[0]["message"].as_str().unwrap().contains("evil.test"),
        "{r:?}"
    );
    let r = e.call(
        "messages",
        serde_json::json!({ "model": "claude-test", "extra_body": { "mcp_servers": [{ "type": "url", "url": "https://evil.test/sse", "name": "x" }] } }),
    );
    assert_eq!(r[0]["status"], 403, "{r:?}");
    let r = e.call(
        "responses",
        serde_json::json!({ "tools": [{ "type": "browser_use_2099" }] }),
    );
    assert_eq!(r[0]["status"], 403, "{r:?}");
    assert!(
        r[0]["message"].as_str().unwrap().contains("does not know"),
        "{r:?}"
    );
    // A client's own function tool is not the provider's to run.
    let r = e.call(
        "responses",
        serde_json::json!({ "tools": [{ "type": "function", "name": "f", "parameters": {} }] }),
    );
    assert_eq!(ok(&r), 1, "{r:?}");
    assert_eq!(e.received().len(), 4);
}

#[test]
fn a_forwarded_inference_call_in_clear_is_refused() {
    let e = env("{}");
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-x"])
        .arg(format!("http://dev:dev-secret@{}", e.proxy.proxy))
        .arg(format!(
            "http://plain-llm.test:{}/v1/chat/completions",
            e.origin.port
        ))
        .args([
            "-H",
            "Content-Type: application/json",
            "-d",
            r#"{"model":"gpt-4o-mini"}"#,
        ])
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "403");
    let rec = e
        .proxy
        .wait_record(|r| r["reason"] == "inference_not_allowed");
    assert!(
        rec["detail"]
            .as_str()
            .unwrap()
            .contains("only inside a tunnel"),
        "{rec}"
    );
    // The SDK sent in clear (base_url http://…) reads why, in its own error shape.
    let r = e.call("chat_plain", serde_json::json!({}));
    assert_eq!(r[0]["status"], 403, "{r:?}");
    assert_eq!(r[0]["type"], "inference_not_allowed", "{r:?}");
    assert!(
        r[0]["message"]
            .as_str()
            .unwrap()
            .contains("only inside a tunnel"),
        "{r:?}"
    );
}

/// A replica of `e`'s proxy in `e.dir/name`, on the etcd of `plane`, under `limits`.
fn replica(e: &Env, name: &str, plane: &str, limits: &str) -> Proxy {
    let d = e.dir.path().join(name);
    std::fs::create_dir_all(&d).unwrap();
    for f in ["ica", "ca"] {
        let _ = std::process::Command::new("cp")
            .args(["-r"])
            .arg(e.dir.path().join(f))
            .arg(&d)
            .status();
    }
    std::fs::write(d.join("admin.token"), "admin-token\n").unwrap();
    let p = config(&d, e.origin.port, limits, plane).start_env(&d, &[("LLM_SECRET", SECRET)]);
    eventually(Duration::from_secs(20), "ready", || {
        (p.admin_get("/readyz").0 == 200).then_some(())
    });
    p
}

/// The `control_plane` block for `etcd` under `prefix`.
fn plane(etcd: &Etcd, prefix: &str) -> String {
    format!(
        "control_plane: {{ etcd: {{ endpoints: [\"127.0.0.1:{}\"], prefix: {prefix} }} }}\n",
        etcd.client_port
    )
}

#[test]
#[ignore = "needs etcd (etcd-server, etcd-client); .ci/run runs it"]
fn two_replicas_on_etcd_share_one_budget() {
    let e = env("{ tokens_per_day: 40 }");
    let etcd = Etcd::start(e.dir.path());
    let plane = plane(&etcd, "/budget-test/");
    let a = replica(&e, "a", &plane, "{ tokens_per_day: 40 }");
    let b = replica(&e, "b", &plane, "{ tokens_per_day: 40 }");
    let on = |p: &Proxy, dir: &str| {
        call_through(
            p,
            &e.dir.path().join(dir),
            e.origin.port,
            "chat",
            serde_json::json!({ "max_tokens": 5 }),
        )
    };
    // A spends the budget (17 tokens a call) until it refuses.
    let mut served = 0;
    while ok(&on(&a, "a")) == 1 {
        served += 1;
        assert!(served < 5, "A never refused");
    }
    assert!(served >= 2, "{served}");
    // B refuses the same sandbox: the fleet's budget is spent.
    eventually(Duration::from_secs(10), "B to refuse", || {
        let r = on(&b, "b");
        (r[0]["status"] == 429).then_some(())
    });
    let u = usage(&b);
    assert!(u["quotas"][0]["tokens"].as_u64().unwrap() >= 34, "{u}");
}

/// Three replicas on one etcd share `tokens_per_day: 2000` exactly (issue 94): 60 calls at
/// once, 20 on each replica, each using its whole output bound and held 2 s so all are in
/// flight together. Every call is served from its replica's leased share of the fleet's
/// counter, so what the three replicas counted together is at most the budget (this origin
/// reports fewer input tokens than the proxy's estimate: the documented overshoot, what
/// providers report beyond a reservation, is zero here), and the fleet's counter in etcd
/// never passes it. On the old code each replica judged on its own count and the others' as
/// of their last report: the three spent about three budgets.
#[test]
#[ignore = "needs etcd (etcd-server, etcd-client); .ci/run runs it"]
fn three_replicas_spend_a_token_budget_exactly() {
    const BUDGET: u64 = 2000;
    let limits = format!("{{ tokens_per_day: {BUDGET} }}");
    let e = env(&limits);
    let etcd = Etcd::start(e.dir.path());
    let plane = plane(&etcd, "/budget3/");
    let replicas: Vec<Proxy> = ["a", "b", "c"]
        .iter()
        .map(|n| replica(&e, n, &plane, &limits))
        .collect();
    let reports: Vec<Vec<serde_json::Value>> = std::thread::scope(|s| {
        let runs: Vec<_> = replicas
            .iter()
            .zip(["a", "b", "c"])
            .map(|(p, n)| {
                let dir = e.dir.path().join(n);
                let port = e.origin.port;
                s.spawn(move || {
                    let spec = serde_json::json!({
                        "max_tokens": 100,
                        "parallel": 20,
                        "headers": { "x-test-use-all": "1", "x-test-delay-ms": "2000" },
                    });
                    call_through(p, &dir, port, "chat", spec)
                })
            })
            .collect();
        runs.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let all: Vec<&serde_json::Value> = reports.iter().flatten().collect();
    let served = all.iter().filter(|r| r["ok"] == true).count();
    assert!(
        all.iter()
            .filter(|r| r["ok"] != true)
            .all(|r| r["status"] == 429 && r["type"] == "budget_exceeded"),
        "{all:?}"
    );
    // Counted by the three replicas together: what the provider reported for each call,
    // once every served call's record is written.
    let spent: u64 = replicas
        .iter()
        .zip(&reports)
        .map(|(p, r)| {
            let records = eventually(Duration::from_secs(10), "every call settled", || {
                let records: Vec<serde_json::Value> = p
                    .audit_records()
                    .into_iter()
                    .filter(|r| r["event"] == "end" && r.get("tokens").is_some())
                    .collect();
                (records.len() >= ok(r)).then_some(records)
            });
            records
                .iter()
                .filter_map(|r| r["tokens"]["total"].as_u64())
                .sum::<u64>()
        })
        .sum();
    eprintln!("{served} calls served, {spent} tokens spent of {BUDGET}");
    assert!(
        spent <= BUDGET,
        "{served} calls spent {spent} tokens of {BUDGET} over three replicas"
    );
    // Most of the budget is served (a call takes up to 125 of it: 100 out, the rest in).
    assert!(spent >= BUDGET / 2, "{served} calls spent only {spent}");
    let out = etcd.ctl(&["get", "--prefix", "/budget3/quota/", "--print-value-only"]);
    let counter: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(
        counter["tokens"].as_u64().unwrap() <= BUDGET,
        "the fleet's counter: {counter}"
    );
}

/// `simulate` on a trail of LLM calls: the running configuration changes nothing (exit 0); a
/// candidate that denies the provider's host refuses the calls for that reason — what the
/// body held no longer matters, so they are not "cannot tell" (clients review B6.3).
#[test]
fn simulate_refuses_llm_calls_to_a_denied_host_whatever_their_bodies() {
    let e = env("{}");
    let r = e.call("chat", serde_json::json!({}));
    assert_eq!(r[0]["ok"], true, "{r:?}");
    e.token_records(1);
    let d = e.dir.path();
    let simulate = |candidate: &Path| simulate(candidate, &d.join("audit.jsonl"));
    let (code, same) = simulate(&d.join("proxy.yaml"));
    assert_eq!(code, Some(0), "{same:#}");
    let denied = around(d, "").sandbox(dev(e.origin.port, "{}").deny("api.openai.test"));
    std::fs::write(d.join("denied.yaml"), denied.yaml(&d.join("audit.jsonl"))).unwrap();
    let (code, report) = simulate(&d.join("denied.yaml"));
    assert_eq!(code, Some(1), "{report:#}");
    let refused = report["newly_refused"].to_string();
    assert!(
        refused.contains("denied_by_rule") && refused.contains("POST /v1/chat/completions"),
        "{report:#}"
    );
    assert!(
        !report["cannot_tell"].to_string().contains("openai"),
        "{report:#}"
    );
}

/// A stream the client cuts before the usage the provider sends last is charged the larger
/// of its reservation and what was reported so far — never only what the sandbox saw
/// (security review B02: Anthropic's `message_start` reports 1 output token, and the 3,000
/// the call could spend were given back).
#[test]
fn a_stream_cut_before_its_usage_is_charged_its_reservation() {
    let e = env("{ tokens_per_day: 100000 }");
    let r = e.call(
        "messages_stream",
        serde_json::json!({
            "model": "claude-test",
            "max_tokens": 3000,
            "hang_up_after": 2,
            "headers": { "x-test-chunks": "40", "x-test-chunk-ms": "25" },
        }),
    );
    assert_eq!(r[0]["hung_up"], true, "{r:?}");
    let rec = e.token_records(1).remove(0);
    assert_eq!(rec["tokens"]["counted"], "estimated", "{rec}");
    assert!(
        rec["tokens"]["total"].as_u64().unwrap() >= 3000,
        "charged at least the reservation: {rec}"
    );
    assert!(
        rec["detail"].as_str().unwrap().contains("cut before"),
        "{rec}"
    );
}

/// Under a token budget every call is bounded: a call that names no output bound gets one
/// (what is left after its input), and 50 calls at once that each use their whole bound
/// never spend more than the budget (security review B05b: 20 calls in flight spent 2,000,200
/// tokens against 1,000).
#[test]
fn under_a_budget_every_call_is_bounded_to_what_is_left() {
    let e = env("{ tokens_per_day: 1000 }");
    let r = e.call("chat", serde_json::json!({ "max_tokens": null }));
    assert_eq!(r[0]["ok"], true, "{r:?}");
    let sent = e.received().remove(0);
    let bound = sent["max_output"].as_u64().expect("a bound was set");
    assert!(bound > 0 && bound < 1000, "{sent}");
    let rec = e.token_records(1).remove(0);
    assert!(
        rec["detail"]
            .as_str()
            .unwrap()
            .contains("output bound was set"),
        "{rec}"
    );
    // Streamed and not: the same bound.
    for kind in ["chat", "chat_stream"] {
        let e = env("{ tokens_per_day: 1000 }");
        let r = e.call(
            kind,
            serde_json::json!({ "max_tokens": 300, "parallel": 50, "headers": { "x-test-use-all": "1" } }),
        );
        let served = ok(&r);
        assert!(served >= 1, "{kind}: {r:?}");
        e.token_records(served);
        let u = usage(&e.proxy);
        let used = u["quotas"][0]["tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("{u}"));
        assert!(
            used <= 1000,
            "{kind}: {served} calls spent {used} tokens of 1000: {r:?}"
        );
    }
}

/// Flow rules (issue 93) with the providers' own SDKs: once the sandbox has read from the
/// private host (an Anthropic call here), an OpenAI chat call — a write to a host outside
/// `private` — is refused in the provider's error shape the `openai` SDK raises, with the
/// reason `flow_refused` and the rule named; before that read it went through.
#[test]
fn after_a_private_read_the_openai_sdk_gets_flow_refused() {
    let e = env("{}");
    let flows = "{ labels: { private: [api.anthropic.test] }, rules: [{ name: no-exfil, after: [private], refuse: writes, except: [private] }] }";
    let d = e.dir.path();
    let flowing = around(d, "").sandbox(dev(e.origin.port, "{}").network("flows", flows));
    std::fs::write(d.join("proxy.yaml"), flowing.yaml(&d.join("audit.jsonl"))).unwrap();
    let (status, body) = admin_req(e.proxy.admin, "POST", "/v1/reload", "", Some("admin-token"));
    assert_eq!(status, 200, "{body}");
    let before = e.call("chat", serde_json::json!({}));
    assert_eq!(ok(&before), 1, "before the read: {before:?}");
    let read = e.call("messages", serde_json::json!({}));
    assert_eq!(ok(&read), 1, "the private read: {read:?}");
    let after = e.call("chat", serde_json::json!({}));
    assert_eq!(after[0]["status"], 403, "{after:?}");
    assert_eq!(after[0]["type"], "flow_refused", "{after:?}");
    let msg = after[0]["message"].as_str().unwrap();
    assert!(
        msg.contains("no-exfil") && msg.contains("api.anthropic.test"),
        "{msg}"
    );
    let calls = e.received().len();
    assert_eq!(
        calls,
        2,
        "the refused call never reached the origin: {:?}",
        e.received()
    );
}
