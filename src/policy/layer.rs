//! Policy layers (DESIGN §4.5): an organisation's and a team's floor and ceiling over their
//! member sandboxes. A layer has an optional `ceiling` — the most a member may reach, in the
//! `network.egress` grammar — and `deny` entries; a member's effective policy is its own
//! entries intersected with every ancestor's ceiling, every ancestor's `deny` above its own
//! rules, and the address guard above all. Layers only narrow: a layer's ceiling must lie
//! within its parent's, and a member's entry outside a ceiling is refused where it is written
//! ([`Layer::admits_entry`]). Reloads, grants and report mode never widen a layer: a grant is
//! judged against the ceilings like an entry, and report mode does not relax a layer's refusal.

use std::net::IpAddr;
use std::sync::Arc;

use super::entry::{Entry, HostPattern};
use super::ports::PortSet;
use super::target::{Host, Target};
use super::{Decision, ListKind, Reason, Rule, RuleSet, RuleSource};

/// One layer, compiled (shared by every member's policy).
#[derive(Debug)]
pub struct Layer {
    /// Its id (`org`, `team-a`).
    pub id: Arc<str>,
    /// Where it was written (the config file, or `runtime layer`).
    pub file: Arc<str>,
    /// `ceiling`: `None` when the layer sets none (it then bounds nothing).
    pub ceiling: Option<Vec<(String, Entry)>>,
    /// `deny`: refused to every member, whatever else allows it.
    pub deny: Vec<(String, Entry)>,
    /// `approvers`: the console users who may answer its members' access requests (empty:
    /// the layer names none; see `docs/console.md`).
    pub approvers: Vec<Arc<str>>,
    /// `network.http`: rules every member's requests to their hosts must pass, before the
    /// member's own (methods, paths and git services only).
    pub http: Vec<super::http_rules::HttpRule>,
    /// `limits`: the most any member may have (a member's own above one is capped to it).
    pub limits: LayerLimits,
    /// The ports an entry without one allows (`defaults.ports`).
    default_ports: PortSet,
    compiled_ceiling: Option<RuleSet>,
    compiled_deny: RuleSet,
    /// The rule a refusal for want of the ceiling names: its entries, the layer as source.
    ceiling_rule: Arc<Rule>,
}

impl PartialEq for Layer {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
            && self.file == other.file
            && self.ceiling == other.ceiling
            && self.deny == other.deny
            && self.default_ports == other.default_ports
            && self.http == other.http
            && self.limits == other.limits
    }
}

/// A layer's `limits`: for each that is set, the most any member may have (`None`: the layer
/// does not bound it).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerLimits {
    /// `bytes_per_day`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_day: Option<u64>,
    /// `requests_per_day`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_day: Option<u64>,
    /// `tokens_per_day`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<u64>,
    /// `cost_per_day`, in dollars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_per_day: Option<f64>,
    /// `max_connections`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// `connections_per_second`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections_per_second: Option<f64>,
    /// `bandwidth_up_bps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_up_bps: Option<u64>,
    /// `bandwidth_down_bps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_down_bps: Option<u64>,
}

impl LayerLimits {
    /// Whether it bounds nothing.
    pub fn is_empty(&self) -> bool {
        *self == LayerLimits::default()
    }

    /// Each limit as a number, by key (`None`: not bounded).
    pub fn values(&self) -> [(&'static str, Option<f64>); 8] {
        let n = |v: Option<u64>| v.map(|v| v as f64);
        [
            ("bytes_per_day", n(self.bytes_per_day)),
            ("requests_per_day", n(self.requests_per_day)),
            ("tokens_per_day", n(self.tokens_per_day)),
            ("cost_per_day", self.cost_per_day),
            ("max_connections", n(self.max_connections.map(u64::from))),
            ("connections_per_second", self.connections_per_second),
            ("bandwidth_up_bps", n(self.bandwidth_up_bps)),
            ("bandwidth_down_bps", n(self.bandwidth_down_bps)),
        ]
    }
}

impl Layer {
    /// Compile a layer's lists with `defaults.ports`.
    pub fn compile(
        id: &str,
        file: &str,
        ceiling: Option<Vec<(String, Entry)>>,
        deny: Vec<(String, Entry)>,
        default_ports: &PortSet,
    ) -> Result<Layer, globset::Error> {
        let (id, file): (Arc<str>, Arc<str>) = (id.into(), file.into());
        let compiled_ceiling = match &ceiling {
            Some(c) => Some(RuleSet::compile(
                c,
                ListKind::Ceiling,
                &file,
                &id,
                default_ports,
            )?),
            None => None,
        };
        let compiled_deny =
            RuleSet::compile(&deny, ListKind::LayerDeny, &file, &id, default_ports)?;
        let text = ceiling
            .as_ref()
            .map(|c| {
                c.iter()
                    .map(|(t, _)| t.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let ceiling_rule = Arc::new(Rule {
            text,
            ports: PortSet::any(),
            source: RuleSource {
                file: file.clone(),
                sandbox: id.clone(),
                list: ListKind::Ceiling,
                index: 0,
            },
            allows_opaque: false,
        });
        Ok(Layer {
            id,
            file,
            ceiling,
            deny,
            approvers: Vec::new(),
            http: Vec::new(),
            limits: LayerLimits::default(),
            default_ports: default_ports.clone(),
            compiled_ceiling,
            compiled_deny,
            ceiling_rule,
        })
    }

    /// A `deny` entry of this layer that refuses `target` (by name, or any of `addrs`).
    pub fn refuses(&self, target: &Target, addrs: Option<&[IpAddr]>) -> Option<Decision> {
        if let Host::Name(name) = &target.host {
            if let Some(r) = self.compiled_deny.names.lookup(name, target.port).with_port {
                return Some(Decision::deny(Reason::DeniedByRule, Some(r.clone())));
            }
        }
        addrs.unwrap_or(&[]).iter().find_map(|ip| {
            let (r, _) = self.compiled_deny.addr_lookup(*ip, target.port);
            r.map(|r| Decision::deny(Reason::DeniedByRule, Some(r.clone())))
        })
    }

    /// `outside_ceiling` when `target` is outside this layer's ceiling. A name no ceiling name
    /// entry covers may still be within its address entries: before resolution (`addrs`
    /// `None`) that is left for the decision with addresses, which must find every address
    /// within them.
    pub fn outside(&self, target: &Target, addrs: Option<&[IpAddr]>) -> Option<Decision> {
        let ceiling = self.compiled_ceiling.as_ref()?;
        let port = target.port;
        if let Host::Name(name) = &target.host {
            if ceiling.names.lookup(name, port).with_port.is_some() {
                return None;
            }
        }
        let within = match addrs {
            None => ceiling.addr_ports.iter().any(|p| p.contains(port)),
            Some(a) => {
                !a.is_empty()
                    && a.iter()
                        .all(|ip| ceiling.addr_lookup(*ip, port).0.is_some())
            }
        };
        match within {
            true => None,
            false => Some(Decision::deny(
                Reason::OutsideCeiling,
                Some(self.ceiling_rule.clone()),
            )),
        }
    }

    /// Whether an entry written for a member (or in a child layer's ceiling) lies within this
    /// layer's ceiling: its names and its ports. A name entry is never within address entries
    /// (where a name resolves is known only when it does), and a glob is within a wildcard
    /// only by its fixed suffix: when in doubt, the entry is refused and the operator writes
    /// the ceiling to cover it plainly.
    pub fn admits_entry(&self, entry: &Entry) -> bool {
        let (Some(ceiling), Some(compiled)) = (&self.ceiling, &self.compiled_ceiling) else {
            return true;
        };
        let ports = entry.ports.as_ref().unwrap_or(&self.default_ports);
        if let HostPattern::Exact(name) = &entry.host {
            return compiled
                .names
                .first(name, |r| ports.within(&r.ports))
                .is_some();
        }
        ceiling.iter().any(|(_, c)| {
            let c_ports = c.ports.as_ref().unwrap_or(&self.default_ports);
            ports.within(c_ports) && host_within(&entry.host, &c.host)
        })
    }
}

/// Whether every name or address `inner` matches is matched by `outer` (names other than an
/// exact one; exact names go through the compiled matcher).
fn host_within(inner: &HostPattern, outer: &HostPattern) -> bool {
    use HostPattern::*;
    let below = |s: &str, c: &str| {
        s.len() > c.len() + 1 && s.ends_with(c) && s[..s.len() - c.len()].ends_with('.')
    };
    match (inner, outer) {
        (Subdomains(s), Subdomains(c) | ApexAndSubdomains(c)) => s == c || below(s, c),
        (ApexAndSubdomains(s), ApexAndSubdomains(c)) => s == c || below(s, c),
        (ApexAndSubdomains(s), Subdomains(c)) => below(s, c),
        (Glob { fixed_suffix, .. }, Subdomains(c) | ApexAndSubdomains(c)) => {
            fixed_suffix == c || below(fixed_suffix, c)
        }
        (Glob { pattern: a, .. }, Glob { pattern: b, .. }) => a == b,
        (Net(n), Net(c)) => c.contains(n),
        (Localhost, Localhost) => true,
        _ => false,
    }
}

/// Every layer of a chain (root first): the first `deny` that refuses, else — for a decision
/// that allows — the first ceiling `target` is outside of; else `decision` as it was.
pub fn narrow(
    layers: &[Arc<Layer>],
    decision: Decision,
    target: &Target,
    addrs: Option<&[IpAddr]>,
) -> Decision {
    if let Some(d) = layers.iter().find_map(|l| l.refuses(target, addrs)) {
        return d;
    }
    if decision.verdict != super::Verdict::Allow {
        return decision;
    }
    layers
        .iter()
        .find_map(|l| l.outside(target, addrs))
        .unwrap_or(decision)
}

/// Whether a chain refuses `name` on every port, for the DNS listener: a `deny` entry that
/// covers every port, or a ceiling with neither a name entry for it nor address entries that
/// could admit what it resolves to.
pub fn name_refusal(layers: &[Arc<Layer>], name: &str) -> Option<Decision> {
    for l in layers {
        if let Some(r) = l.compiled_deny.names.first(name, |r| r.ports.is_any()) {
            return Some(Decision::deny(Reason::DeniedByRule, Some(r.clone())));
        }
    }
    layers.iter().find_map(|l| {
        let c = l.compiled_ceiling.as_ref()?;
        let outside = c.names.first(name, |_| true).is_none() && c.addrs.is_empty();
        outside.then(|| Decision::deny(Reason::OutsideCeiling, Some(l.ceiling_rule.clone())))
    })
}

/// The entries of a member's policy that lie outside a ceiling of its chain, each as the
/// sentence that refuses it (`network.egress[2] `evil.example` is outside the ceiling of layer
/// org (proxy.yaml)`); `network.mode: allow-all` under a ceiling is one of them.
pub fn outside_entries(layers: &[Arc<Layer>], spec: &super::NetworkSpec) -> Vec<String> {
    let mut out = Vec::new();
    let ceilings = || layers.iter().filter(|l| l.ceiling.is_some());
    if spec.mode == super::Mode::AllowAll {
        if let Some(l) = ceilings().next() {
            out.push(format!(
                "network.mode allow-all reaches outside the ceiling of layer {} ({}): list the entries instead",
                l.id, l.file
            ));
        }
    }
    let lists = std::iter::once(("network.egress".to_string(), &spec.egress)).chain(
        spec.scoped
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("network.scoped[{i}].egress"), &s.egress)),
    );
    for (list, entries) in lists {
        for (i, (text, entry)) in entries.iter().enumerate() {
            if let Some(l) = ceilings().find(|l| !l.admits_entry(entry)) {
                out.push(format!(
                    "{list}[{i}] `{text}` is outside the ceiling of layer {} ({}: {}); a member may narrow its layers, never widen them",
                    l.id,
                    l.file,
                    l.ceiling_rule.text
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::entry::parse_entry;

    fn layer(ceiling: &[&str], deny: &[&str]) -> Layer {
        let list = |xs: &[&str]| {
            xs.iter()
                .map(|t| (t.to_string(), parse_entry(t).unwrap()))
                .collect::<Vec<_>>()
        };
        let ports = PortSet::from_ports(&[80, 443]).unwrap();
        Layer::compile("org", "proxy.yaml", Some(list(ceiling)), list(deny), &ports).unwrap()
    }

    #[test]
    fn entries_within_and_outside_a_ceiling() {
        let l = layer(
            &[
                "*.corp.example",
                "pypi.org",
                "10.0.0.0/8:5432",
                "api-*.x.example",
            ],
            &[],
        );
        let ok = |t: &str| l.admits_entry(&parse_entry(t).unwrap());
        assert!(ok("api.corp.example"));
        assert!(ok("a.b.corp.example:443"));
        assert!(ok("*.eu.corp.example"));
        assert!(ok("**.eu.corp.example"));
        assert!(ok("pypi.org"));
        assert!(ok("10.1.0.0/16:5432"));
        assert!(ok("api-1.x.example"));
        assert!(!ok("corp.example"), "the apex is not below *.corp.example");
        assert!(!ok("**.corp.example"));
        assert!(
            !ok("api.corp.example:8443"),
            "a port the ceiling does not allow"
        );
        assert!(!ok("files.pypi.org"));
        assert!(!ok("10.0.0.0/8:5433"));
        assert!(!ok("evilcorp.example"));
        assert!(!ok("*.other.example"));
        assert!(!ok("ec2.*.corp2.example"));
        assert!(ok("ec2.*.corp.example"));
    }

    #[test]
    fn the_dns_view_of_a_member_refuses_what_its_layers_refuse() {
        let chain: Arc<[Arc<Layer>]> =
            vec![Arc::new(layer(&["*.corp.example"], &["*.evil.example"]))].into();
        let egress = ["**.evil.example", "api.corp.example", "github.com"]
            .iter()
            .map(|t| (t.to_string(), parse_entry(t).unwrap()))
            .collect();
        let spec = super::super::NetworkSpec {
            mode: super::super::Mode::Restricted,
            egress,
            deny: Vec::new(),
            resolve_for_address_rules: false,
            http: Default::default(),
            scoped: Vec::new(),
            layers: chain,
            flows: None,
        };
        let ports = PortSet::from_ports(&[443]).unwrap();
        let p = super::super::CompiledPolicy::compile(
            "m",
            "m.yaml",
            &spec,
            super::super::Enforcement::Enforce,
            &ports,
        )
        .unwrap();
        use super::super::dns_view::NameView;
        assert!(matches!(
            p.name_view("api.corp.example"),
            NameView::Named(_)
        ));
        match p.name_view("x.evil.example") {
            NameView::Refused(d) => assert_eq!(d.rule.unwrap().source.list, ListKind::LayerDeny),
            _ => panic!("a name the layer denies is answered"),
        }
        match p.name_view("github.com") {
            NameView::Refused(d) => assert_eq!(d.reason, Reason::OutsideCeiling),
            _ => panic!("a name outside the ceiling is answered"),
        }
    }

    #[test]
    fn deny_refuses_and_the_ceiling_bounds_an_allowing_decision() {
        let l = Arc::new(layer(&["*.corp.example", "pypi.org"], &["*.evil.example"]));
        let t = |s: &str| Target::parse(s, None).unwrap();
        let allow = || Decision::allow(Reason::RuleMatched, None);
        let chain = [l];
        let d = narrow(&chain, allow(), &t("x.evil.example:443"), None);
        assert_eq!(d.reason, Reason::DeniedByRule);
        assert_eq!(d.rule.unwrap().source.list, ListKind::LayerDeny);
        let d = narrow(&chain, allow(), &t("github.com:443"), None);
        assert_eq!(d.reason, Reason::OutsideCeiling);
        let d = narrow(&chain, allow(), &t("pypi.org:443"), None);
        assert_eq!(d.reason, Reason::RuleMatched);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let d = narrow(&chain, allow(), &t("10.0.0.1:443"), Some(&[ip]));
        assert_eq!(d.reason, Reason::OutsideCeiling);
    }
}
