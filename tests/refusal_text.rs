//! What an agent reads when it is refused, through the clients it runs (issue 61, F2, F3, F5
//! of the client review): the text each client prints names the reason and where to ask —
//! `https://egress-proxy.local/v1/requests` when the proxy has an interception CA the sandbox
//! trusts, reached with `HTTPS_PROXY` alone — and a SOCKS5-only sandbox reaches
//! `egress-proxy.local` to ask and to read its denials.
//!
//! The clients: curl, Python's requests and httpx, and Node's `fetch` with undici's
//! `ProxyAgent` (from `EGRESS_TEST_NODE_MODULES`, installed by `tests/run`; the test fails
//! when it is missing).

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

const ASK_HTTPS: &str = "https://egress-proxy.local/v1/requests";

struct Env {
    _dir: tempfile::TempDir,
    ica: PathBuf,
    proxy: Proxy,
}

/// A proxy with the SOCKS5 listener and sandbox `agent` (allowed `allowed.test` only), with an
/// interception CA when `tls` is given (these `tls_intercept` keys with it).
fn env(tls: Option<&[(&str, &str)]>) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let ica = dir.path().join("ica");
    let mut config = ProxyConfig::new()
        .socks5()
        .dns_server("127.0.0.1:9")
        .host("refused.test", "127.0.0.1")
        .sandbox(
            SandboxSpec::new("agent")
                .token("tok-agent")
                .allow("allowed.test"),
        );
    if let Some(keys) = tls {
        ca_init(&ica);
        config = config.intercept_only(&ica);
        for (k, v) in keys {
            config = config.intercept_option(k, v);
        }
    }
    let proxy = config.start(dir.path());
    Env {
        _dir: dir,
        ica,
        proxy,
    }
}

impl Env {
    fn https_proxy(&self) -> String {
        format!("http://agent:tok-agent@{}", self.proxy.proxy)
    }

    fn ca(&self) -> String {
        self.ica.join("ca.crt").display().to_string()
    }

    /// Run `program args` with only `HTTPS_PROXY` set (the README's setup): stdout + stderr.
    fn run(&self, program: &str, args: &[&str], extra: &[(&str, &str)]) -> String {
        let url = self.https_proxy();
        let out = Command::new(program)
            .args(args)
            .env("HTTPS_PROXY", &url)
            .env("https_proxy", &url)
            .env_remove("HTTP_PROXY")
            .env_remove("http_proxy")
            .env_remove("ALL_PROXY")
            .env_remove("all_proxy")
            .env_remove("NO_PROXY")
            .env_remove("no_proxy")
            .envs(extra.iter().copied())
            .output()
            .unwrap_or_else(|e| panic!("{program} runs: {e}"));
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }

    fn socks(&self) -> SocketAddr {
        self.proxy.socks5.expect("the SOCKS5 listener")
    }
}

/// Node's module directory holding undici (`tests/run` installs it there).
fn node_modules() -> String {
    let dir = std::env::var("EGRESS_TEST_NODE_MODULES")
        .unwrap_or_else(|_| "/opt/egress-proxy-test/node_modules".into());
    assert!(
        Path::new(&dir).join("undici").is_dir(),
        "undici is not installed in {dir}: run tests/run, or set EGRESS_TEST_NODE_MODULES"
    );
    dir
}

/// The reason phrase of a refused CONNECT ends with the https ask URL, and the clients that
/// print it (requests, httpx, `curl -v`) show it; the ask itself then works with
/// `HTTPS_PROXY` alone.
#[test]
fn a_refused_connect_tells_every_python_client_and_curl_where_to_ask() {
    let e = env(Some(&[]));
    let code = "import requests\ntry:\n    requests.get('https://refused.test/')\nexcept Exception as x:\n    print(x)";
    let text = e.run("python3", &["-c", code], &[]);
    assert!(text.contains("[no_rule_matched]"), "{text}");
    assert!(text.contains(&format!("(ask: POST {ASK_HTTPS})")), "{text}");

    let code = "import httpx\ntry:\n    httpx.get('https://refused.test/')\nexcept Exception as x:\n    print(type(x).__name__, x)";
    let text = e.run("python3", &["-c", code], &[]);
    assert!(text.contains("[no_rule_matched]"), "{text}");
    assert!(text.contains(ASK_HTTPS), "{text}");

    let text = e.run("curl", &["-sSv", "https://refused.test/"], &[]);
    assert!(
        text.contains("< HTTP/1.1 403 egress-proxy [no_rule_matched]"),
        "{text}"
    );
    assert!(text.contains(ASK_HTTPS), "{text}");

    // The advertised URL is reached with HTTPS_PROXY alone (F3).
    let code = format!(
        "import requests\nr = requests.post('{ASK_HTTPS}', json={{'host': 'refused.test', 'port': 443, 'reason': 'docs'}}, verify='{}')\nprint(r.status_code, r.json()['state'])",
        e.ca()
    );
    let text = e.run("python3", &["-c", &code], &[]);
    assert!(text.trim_end().ends_with("202 pending"), "{text}");
}

/// Node's fetch through undici's `ProxyAgent` prints only `Request was cancelled` for a
/// refused CONNECT (undici tunnels `http://` URLs too, and drops the reason phrase); it reads
/// its denials at the https ask URL with `HTTPS_PROXY` alone.
#[test]
fn node_fetch_reaches_the_endpoint_with_https_proxy_alone() {
    let e = env(Some(&[]));
    let text = node(
        &e,
        &[
            "https://refused.test/",
            "https://egress-proxy.local/v1/denials",
        ],
    );
    assert!(
        text.contains("error fetch failed Request was cancelled."),
        "{text}"
    );
    let denials = text
        .lines()
        .find_map(|l| l.strip_prefix("200 "))
        .unwrap_or_else(|| panic!("{text}"));
    let v: Value = serde_json::from_str(denials).unwrap();
    assert!(
        v["denials"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["host"] == "refused.test" && d["reason"] == "no_rule_matched"),
        "{v}"
    );
}

/// Fetch each URL with Node's fetch through undici's `ProxyAgent` (`HTTPS_PROXY`, the
/// interception CA trusted): `STATUS BODY` or `error MESSAGE CAUSE` per URL.
fn node(e: &Env, urls: &[&str]) -> String {
    let script = r#"
const { fetch, ProxyAgent } = require('undici');
const dispatcher = new ProxyAgent({ uri: process.env.HTTPS_PROXY,
  requestTls: { ca: require('fs').readFileSync(process.env.CA) } });
(async () => {
  for (const url of process.argv.slice(1)) {
    try {
      const r = await fetch(url, { dispatcher });
      console.log(r.status, (await r.text()).replace(/\n/g, ' '));
    } catch (x) {
      console.log('error', x.message, x.cause && x.cause.message);
    }
  }
})();
"#;
    let mut args = vec!["-e", script];
    args.extend_from_slice(urls);
    e.run(
        "node",
        &args,
        &[("NODE_PATH", &node_modules()), ("CA", &e.ca())],
    )
}

/// With `tls_intercept.refusals_inside`, a refused CONNECT is answered `200` and refused
/// inside the tunnel, so curl without `-v` and Node's fetch print the whole refusal — over
/// TLS with the CA, and in the clear for an `http://` URL undici tunnels; nothing is dialled,
/// the record is the CONNECT's refusal. A client that does not trust the CA gets a
/// certificate error (why it is off by default).
#[test]
fn refusals_inside_the_tunnel_reach_curl_and_node() {
    let e = env(Some(&[("refusals_inside", "true")]));
    let out = curl(&[
        "-sS",
        "-x",
        &e.https_proxy(),
        "--cacert",
        &e.ca(),
        "https://refused.test/",
    ]);
    let text = out.text();
    assert!(
        text.starts_with("egress-proxy refused CONNECT refused.test:443 for sandbox agent."),
        "{text} {}",
        out.stderr
    );
    assert!(text.contains("reason: no_rule_matched"), "{text}");
    assert!(text.contains(ASK_HTTPS), "{text}");
    let rec = e
        .proxy
        .wait_record(|r| r["mode"] == "connect" && r["target_port"] == 443);
    assert_eq!(
        (rec["decision"].as_str(), rec["reason"].as_str()),
        (Some("deny"), Some("no_rule_matched")),
        "{rec}"
    );
    assert_eq!(rec["dialed"], Value::Null, "{rec}");
    assert!(
        rec["detail"]
            .as_str()
            .unwrap_or("")
            .contains("refused inside the tunnel"),
        "{rec}"
    );

    let text = node(&e, &["http://refused.test/", "https://refused.test/x"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    for line in lines {
        assert!(
            line.starts_with("403 egress-proxy refused CONNECT refused.test:"),
            "{text}"
        );
        assert!(line.contains("no_rule_matched"), "{text}");
        assert!(line.contains(ASK_HTTPS), "{text}");
    }

    let untrusting = curl(&["-sS", "-x", &e.https_proxy(), "https://refused.test/"]);
    assert_eq!(
        untrusting.code, 60,
        "a certificate error: {}",
        untrusting.stderr
    );
}

/// Without an interception CA, `https://egress-proxy.local` cannot be served, so the hint gives
/// the `http://` form and says it must be sent through the proxy (HTTP_PROXY or `curl -x`).
#[test]
fn without_an_interception_ca_the_hint_says_how_the_http_form_is_reached() {
    let e = env(None);
    let code = "import requests\ntry:\n    requests.get('https://refused.test/')\nexcept Exception as x:\n    print(x)";
    let text = e.run("python3", &["-c", code], &[]);
    assert!(
        text.contains("(ask: POST http://egress-proxy.local/v1/requests via HTTP_PROXY)"),
        "{text}"
    );
    let out = curl(&["-sS", "-x", &e.https_proxy(), "http://refused.test/"]);
    assert!(out.text().contains("set HTTP_PROXY too"), "{}", out.text());
}

/// A SOCKS5-only sandbox (`ALL_PROXY=socks5h://…`) reaches `egress-proxy.local` on port 80 —
/// and on 443 with the interception CA — to read its denials and to ask (F5); the endpoint's
/// records are the sandbox's, and any other port is still refused.
#[test]
fn a_socks5_sandbox_reads_its_denials_and_asks() {
    let e = env(Some(&[]));
    let socks = format!("socks5h://agent:tok-agent@{}", e.socks());
    let refused = curl(&["-sS", "-x", &socks, "http://refused.test/"]);
    assert!(refused.stderr.contains("(2)"), "{}", refused.stderr);
    let denials = curl(&["-sS", "-x", &socks, "http://egress-proxy.local/v1/denials"]);
    let rec = e.proxy.wait_record(|r| {
        r["reason"] == "proxy_endpoint" && r["sandbox"] == "agent" && r["mode"] == "http"
    });
    assert!(
        rec["detail"]
            .as_str()
            .unwrap_or("")
            .contains("GET /v1/denials"),
        "{rec}"
    );
    let v: Value = serde_json::from_str(&denials.text())
        .unwrap_or_else(|_| panic!("{} {}", denials.text(), denials.stderr));
    assert!(
        v["denials"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["host"] == "refused.test" && d["mode"] == "socks5"),
        "{v}"
    );
    let body = r#"{"host": "refused.test", "port": 80, "reason": "over socks5"}"#;
    let asked = curl(&[
        "-sS",
        "-x",
        &socks,
        "--cacert",
        &e.ca(),
        "--data-binary",
        body,
        ASK_HTTPS,
    ]);
    let r: Value = serde_json::from_str(&asked.text())
        .unwrap_or_else(|_| panic!("{} {}", asked.text(), asked.stderr));
    assert_eq!(
        (r["state"].as_str(), r["sandbox"].as_str()),
        (Some("pending"), Some("agent"))
    );
    let rec = e.proxy.wait_record(|r| {
        r["reason"] == "proxy_endpoint" && r["sandbox"] == "agent" && r["mode"] == "https"
    });
    assert!(
        rec["detail"]
            .as_str()
            .unwrap_or("")
            .contains("POST /v1/requests"),
        "{rec}"
    );
    let other = curl(&[
        "-sS",
        "-x",
        &socks,
        "http://egress-proxy.local:8080/v1/denials",
    ]);
    assert!(other.stderr.contains("(2)"), "{}", other.stderr);
    let rec = e.proxy.wait_record(|r| {
        r["target_host"] == "egress-proxy.local"
            && r["target_port"] == 8080
            && r["reason"] == "invalid_target"
    });
    assert_eq!(rec["mode"], "socks5", "{rec}");
}
