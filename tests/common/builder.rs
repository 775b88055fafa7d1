//! `ProxyConfig`: a proxy configuration built by what a test means — listeners, names the
//! proxy's resolver knows, the guard's exceptions, sandboxes with their tokens, sources and
//! lists — instead of a YAML string per test file (linkerd's integration builders). Unusual
//! keys still go in as YAML (`raw`). `start` writes it beside the audit log and starts the
//! real binary.

#![allow(dead_code)]

use super::*;

/// One sandbox of a [`ProxyConfig`].
#[derive(Clone, Debug)]
pub struct SandboxSpec {
    id: String,
    token: Option<String>,
    sources: Vec<String>,
    egress: Vec<String>,
    deny: Vec<String>,
    report: bool,
    /// More `network` keys, as YAML flow values (`flows`, `{ labels: … }`).
    network: Vec<(String, String)>,
    /// `limits`, as a YAML flow value.
    limits: Option<String>,
    /// `credentials`, each a YAML flow map.
    credentials: Vec<String>,
    /// More keys of the sandbox's entry, as YAML flow values (`identity_token`, …).
    entries: Vec<(String, String)>,
    /// `policy: { ref: … }` instead of a local policy.
    policy_ref: Option<String>,
}

impl SandboxSpec {
    /// A sandbox with this id and nothing allowed yet.
    pub fn new(id: &str) -> Self {
        SandboxSpec {
            id: id.into(),
            token: None,
            sources: Vec::new(),
            egress: Vec::new(),
            deny: Vec::new(),
            report: false,
            network: Vec::new(),
            limits: None,
            credentials: Vec::new(),
            entries: Vec::new(),
            policy_ref: None,
        }
    }

    /// Identified by this token (`Proxy-Authorization`, a SOCKS5 login).
    pub fn token(mut self, token: &str) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Identified by this source range.
    pub fn source(mut self, cidr: &str) -> Self {
        self.sources.push(cidr.into());
        self
    }

    /// An entry of `network.egress`.
    pub fn allow(mut self, entry: &str) -> Self {
        self.egress.push(entry.into());
        self
    }

    /// An entry of `network.deny`.
    pub fn deny(mut self, entry: &str) -> Self {
        self.deny.push(entry.into());
        self
    }

    /// Another `network` key, its value as a YAML flow value (`flows`, `{ labels: … }`).
    pub fn network(mut self, key: &str, yaml: &str) -> Self {
        self.network.push((key.into(), yaml.into()));
        self
    }

    /// `limits`, as a YAML flow value (`{ requests_per_day: 50 }`).
    pub fn limits(mut self, yaml: &str) -> Self {
        self.limits = Some(yaml.into());
        self
    }

    /// A credential, as a YAML flow map (`{ name: api, hosts: [api.test], … }`).
    pub fn credential(mut self, yaml: &str) -> Self {
        self.credentials.push(yaml.into());
        self
    }

    /// Another key of the sandbox's entry, its value as a YAML flow value
    /// (`identity_token`, `{ hosts: [api.test] }`).
    pub fn entry(mut self, key: &str, yaml: &str) -> Self {
        self.entries.push((key.into(), yaml.into()));
        self
    }

    /// Its policy from this file (`policy: { ref: ./x.SANDBOX.md }`), not its lists.
    pub fn policy_ref(mut self, path: &str) -> Self {
        self.policy_ref = Some(path.into());
        self
    }

    /// `enforcement: report`.
    pub fn report(mut self) -> Self {
        self.report = true;
        self
    }

    fn yaml(&self) -> String {
        let list = |v: &[String]| {
            let quoted: Vec<String> = v.iter().map(|e| format!("{e:?}")).collect();
            format!("[{}]", quoted.join(", "))
        };
        let mut s = format!("  - id: {}\n", self.id);
        if let Some(t) = &self.token {
            s += &format!("    auth: {{ token_sha256: {} }}\n", sha(t));
        }
        if !self.sources.is_empty() {
            s += &format!("    sources: {}\n", list(&self.sources));
        }
        if self.report {
            s += "    enforcement: report\n";
        }
        if let Some(l) = &self.limits {
            s += &format!("    limits: {l}\n");
        }
        if !self.credentials.is_empty() {
            s += &format!("    credentials: [{}]\n", self.credentials.join(", "));
        }
        for (k, v) in &self.entries {
            s += &format!("    {k}: {v}\n");
        }
        if let Some(path) = &self.policy_ref {
            return s + &format!("    policy: {{ ref: {path} }}\n");
        }
        let more: String = self
            .network
            .iter()
            .map(|(k, v)| format!(", {k}: {v}"))
            .collect();
        s += &format!(
            "    policy: {{ provider: local, config: {{}}, network: {{ egress: {}, deny: {}{more} }} }}\n",
            list(&self.egress),
            list(&self.deny)
        );
        s
    }
}

/// A proxy configuration; see the module's documentation.
#[derive(Clone, Debug, Default)]
pub struct ProxyConfig {
    /// No explicit proxy listener (`listen.proxy: null`).
    no_proxy: bool,
    /// More `audit` keys, as YAML (`chain: true`).
    audit: Vec<String>,
    listeners: Vec<(String, String)>,
    hosts: Vec<(String, String)>,
    /// `dns.servers`; none: the machine's resolver.
    dns_servers: Vec<String>,
    /// Other `dns` keys, as YAML flow values.
    dns: Vec<(String, String)>,
    guard_allow: Vec<String>,
    /// Other `defaults` keys, as YAML flow values.
    defaults: Vec<(String, String)>,
    admin_token_file: Option<PathBuf>,
    /// `listen.admin` when not `127.0.0.1:0`.
    admin: Option<String>,
    sandboxes: Vec<SandboxSpec>,
    /// `tls_intercept`: the interception CA's directory, more keys.
    intercept: Option<(PathBuf, Vec<(String, String)>)>,
    raw: Vec<String>,
}

impl ProxyConfig {
    /// The explicit proxy and the admin listener on `127.0.0.1:0`, nothing else.
    pub fn new() -> Self {
        Self::default()
    }

    /// A SOCKS5 listener too.
    pub fn socks5(self) -> Self {
        self.listen("socks5")
    }

    /// No explicit proxy listener.
    pub fn no_proxy(mut self) -> Self {
        self.no_proxy = true;
        self
    }

    /// An `audit` key besides the path, as YAML (`chain: true`).
    pub fn audit(mut self, yaml: &str) -> Self {
        self.audit.push(yaml.into());
        self
    }

    /// Another listener (`dns`, `socks5`, `transparent`) on `127.0.0.1:0`.
    pub fn listen(mut self, key: &str) -> Self {
        self.listeners.push((key.into(), "127.0.0.1:0".into()));
        self
    }

    /// Another listener with its value as YAML (`proxy_tls`, `{ addr: …, cert_file: … }`).
    pub fn listen_at(mut self, key: &str, yaml: &str) -> Self {
        self.listeners.push((key.into(), yaml.into()));
        self
    }

    /// The upstream resolver (`dns.servers`): a dead one keeps a test off the machine's.
    pub fn dns_server(mut self, addr: &str) -> Self {
        self.dns_servers.push(addr.into());
        self
    }

    /// A `defaults` key, its value as YAML (`require_tls_ports`, `[]`).
    pub fn defaults(mut self, key: &str, yaml: &str) -> Self {
        self.defaults.push((key.into(), yaml.into()));
        self
    }

    /// The admin listener on this address (a test that must know it before the start).
    pub fn admin_at(mut self, addr: &str) -> Self {
        self.admin = Some(addr.into());
        self
    }

    /// The admin token file (`admin_token_file`).
    pub fn admin_token_file(mut self, path: &Path) -> Self {
        self.admin_token_file = Some(path.to_path_buf());
        self
    }

    /// A `dns` key, its value as YAML (`timeout_ms`, `2000`).
    pub fn dns(mut self, key: &str, yaml: &str) -> Self {
        self.dns.push((key.into(), yaml.into()));
        self
    }

    /// The proxy's resolver answers `name` with `ip` (`dns.hosts`).
    pub fn host(mut self, name: &str, ip: &str) -> Self {
        self.hosts.push((name.into(), ip.into()));
        self
    }

    /// A range the address guard lets through (`defaults.guard_allow_ranges`).
    pub fn guard_allow(mut self, cidr: &str) -> Self {
        self.guard_allow.push(cidr.into());
        self
    }

    /// A sandbox.
    pub fn sandbox(mut self, sb: SandboxSpec) -> Self {
        self.sandboxes.push(sb);
        self
    }

    /// `tls_intercept` with the interception CA `egress-proxy ca init` wrote in `ica_dir`,
    /// trusting origins signed by the PEM file `upstream_ca`.
    pub fn intercept(self, ica_dir: &Path, upstream_ca: &Path) -> Self {
        self.intercept_only(ica_dir)
            .intercept_option("upstream_ca_file", &upstream_ca.display().to_string())
    }

    /// `tls_intercept` with the interception CA in `ica_dir` and the system's roots for
    /// origins.
    pub fn intercept_only(mut self, ica_dir: &Path) -> Self {
        self.intercept = Some((ica_dir.into(), Vec::new()));
        self
    }

    /// Another `tls_intercept` key, its value as YAML (`upstream_keepalive`, `false`); after
    /// [`ProxyConfig::intercept`].
    pub fn intercept_option(mut self, key: &str, yaml: &str) -> Self {
        let (_, more) = self.intercept.as_mut().expect("intercept() comes first");
        more.push((key.into(), yaml.into()));
        self
    }

    /// Top-level YAML for what the builder does not name.
    pub fn raw(mut self, yaml: &str) -> Self {
        self.raw.push(yaml.into());
        self
    }

    /// The configuration as YAML, its audit log at `audit`.
    pub fn yaml(&self, audit: &Path) -> String {
        let more: String = self
            .listeners
            .iter()
            .map(|(k, v)| format!(", {k}: {v}"))
            .collect();
        let proxy = if self.no_proxy { "null" } else { "127.0.0.1:0" };
        let trail: String = self.audit.iter().map(|a| format!(", {a}")).collect();
        let admin = self.admin.as_deref().unwrap_or("127.0.0.1:0");
        let mut s = format!(
            "listen: {{ proxy: {proxy}, admin: {admin}{more} }}\naudit: {{ path: {:?}{trail} }}\n",
            audit.display().to_string()
        );
        if let Some(t) = &self.admin_token_file {
            s += &format!("admin_token_file: {}\n", t.display());
        }
        let mut dns = Vec::new();
        if !self.dns_servers.is_empty() {
            let quoted: Vec<String> = self.dns_servers.iter().map(|a| format!("{a:?}")).collect();
            dns.push(format!("servers: [{}]", quoted.join(", ")));
        }
        if !self.hosts.is_empty() {
            let h: Vec<String> = self
                .hosts
                .iter()
                .map(|(n, ip)| format!("{n}: [{ip}]"))
                .collect();
            dns.push(format!("hosts: {{ {} }}", h.join(", ")));
        }
        dns.extend(self.dns.iter().map(|(k, v)| format!("{k}: {v}")));
        if !dns.is_empty() {
            s += &format!("dns: {{ {} }}\n", dns.join(", "));
        }
        let mut defaults = Vec::new();
        if !self.guard_allow.is_empty() {
            let quoted: Vec<String> = self.guard_allow.iter().map(|r| format!("{r:?}")).collect();
            defaults.push(format!("guard_allow_ranges: [{}]", quoted.join(", ")));
        }
        defaults.extend(self.defaults.iter().map(|(k, v)| format!("{k}: {v}")));
        if !defaults.is_empty() {
            s += &format!("defaults: {{ {} }}\n", defaults.join(", "));
        }
        if let Some((ica, more)) = &self.intercept {
            let more: String = more.iter().map(|(k, v)| format!(", {k}: {v}")).collect();
            s += &format!(
                "tls_intercept: {{ ca_cert_file: {ica}/ca.crt, ca_key_file: {ica}/ca.key{more} }}\n",
                ica = ica.display(),
            );
        }
        for r in &self.raw {
            s += r;
            s += "\n";
        }
        if !self.sandboxes.is_empty() {
            s += "sandboxes:\n";
            for sb in &self.sandboxes {
                s += &sb.yaml();
            }
        }
        s
    }

    /// Write it in `dir` and start the real binary on it.
    pub fn start(&self, dir: &Path) -> Proxy {
        self.start_env(dir, &[])
    }

    /// [`ProxyConfig::start`] with the binary run by `wrapper` (`ip netns exec NAME …`).
    pub fn start_wrapped(&self, dir: &Path, wrapper: &[&str]) -> Proxy {
        let audit = dir.join("audit.jsonl");
        let config = dir.join("proxy.yaml");
        std::fs::write(&config, self.yaml(&audit)).unwrap();
        Proxy::start_wrapped(config, audit, &[], wrapper)
    }

    /// [`ProxyConfig::start`] with these environment variables set for the binary.
    pub fn start_env(&self, dir: &Path, env: &[(&str, &str)]) -> Proxy {
        let audit = dir.join("audit.jsonl");
        let config = dir.join("proxy.yaml");
        std::fs::write(&config, self.yaml(&audit)).unwrap();
        Proxy::start_with(config, audit, env)
    }
}
