//! `layers:` as written (DESIGN §4.5): named policy layers — an organisation, its teams —
//! each with an optional `parent`, a `ceiling` (the most a member may reach, in the
//! `network.egress` grammar) and `deny` entries. A sandbox joins one with `layer:` (in
//! `sandboxes:` or its registration) and is bounded by that layer and every ancestor.
//!
//! Checked here: ids are sandbox-id shaped and unique, parents exist, no cycles, at most
//! [`MAX_DEPTH`] deep, entries parse, and a layer's ceiling lies within its parent's (a team
//! may narrow, never widen). Each layer is compiled once; every member shares it.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::error::Sink;
use crate::policy::entry::{parse_entry, Entry};
use crate::policy::http_rules::HttpRule;
use crate::policy::layer::{Layer, LayerLimits};
use crate::policy::ports::PortSet;
use crate::policy::sandbox_id::SandboxId;

/// How deep a chain of layers may be.
pub const MAX_DEPTH: usize = 8;

/// A layer and its ancestors, root first (the layer last): what a member is bounded by.
pub type Chain = Arc<[Arc<Layer>]>;

/// Every layer by id, as its chain.
pub type Layers = Arc<BTreeMap<String, Chain>>;

/// `layers:` of a configuration: as written (what a runtime layer change edits and `policy
/// diff` compares) and compiled.
#[derive(Debug, Clone, Default)]
pub struct LayerSet {
    /// As written in the file, in file order.
    pub raw: Vec<RawLayer>,
    /// Defined at run time (`PUT /v1/layers/{id}`, etcd), by id.
    pub runtime: BTreeMap<String, RawLayer>,
    /// Compiled, by id.
    pub chains: Layers,
}

impl LayerSet {
    /// The chain of layer `id`.
    pub fn get(&self, id: &str) -> Option<&Chain> {
        self.chains.get(id)
    }

    /// Every layer's id.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.chains.keys()
    }
}

/// One `layers:` item (also the body of `PUT /v1/layers/{id}`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawLayer {
    /// The layer's id.
    pub id: String,
    /// The layer above it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The most a member may reach; absent: no ceiling of its own (its parent's still bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<Vec<String>>,
    /// Refused to every member, above the member's own rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
    /// The console users who may answer its members' access requests (`admin.users[].name`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvers: Vec<String>,
    /// `network.http` rules (methods, paths, git) every member's requests must pass first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<super::http_rules::RawHttpRule>,
    /// The most any member may have of each limit set here.
    #[serde(default, skip_serializing_if = "LayerLimits::is_empty")]
    pub limits: LayerLimits,
}

/// A layer's `http` rules compiled: methods, paths and git services only — a protocol, a
/// preset or a process scope is a member's to write (a layer judges heads, never bodies).
fn layer_http(
    id: &str,
    raw: &[super::http_rules::RawHttpRule],
) -> Result<Vec<HttpRule>, Vec<String>> {
    let mut rules = Vec::new();
    let mut errors = Vec::new();
    for (i, r) in raw.iter().enumerate() {
        if r.preset.is_some() {
            errors.push(format!("layer {id}: http[{i}]: a layer's rules cannot be presets (write the methods and paths)"));
            continue;
        }
        match r.compile() {
            Ok(rule) if rule.protocol.is_some() || rule.scope.is_some() => errors.push(format!(
                "layer {id}: http[{i}] `{}`: a layer's rules name methods, paths and git services; protocols and processes are a member's to write",
                rule.text
            )),
            Ok(rule) => rules.push(rule),
            Err(e) => errors.push(format!("layer {id}: http[{i}]: {e}")),
        }
    }
    match errors.is_empty() {
        true => Ok(rules),
        false => Err(errors),
    }
}

/// What is wrong with a layer's `limits` (zero, negative or not a number, or above an
/// ancestor's: a team narrows its organisation).
fn limits_errors(id: &str, l: &LayerLimits, parents: &[Arc<Layer>]) -> Vec<String> {
    let mut errors = Vec::new();
    for (key, v) in l.values() {
        let Some(v) = v else { continue };
        if !(v > 0.0 && v.is_finite()) {
            errors.push(format!("layer {id}: limits.{key} must be positive"));
        }
        for p in parents {
            let above = p.limits.values().into_iter().find(|(k, _)| *k == key);
            if let Some((_, Some(a))) = above.filter(|(_, a)| a.is_some_and(|a| v > a)) {
                errors.push(format!("layer {id}: limits.{key} {v} is above its ancestor layer {}'s {a}: a layer may narrow its parent, never widen it", p.id));
            }
        }
    }
    errors
}

/// A parsed list of entries, or the message for the first entry that does not parse.
fn entries(list: &[String]) -> Result<Vec<(String, Entry)>, String> {
    list.iter()
        .map(|t| {
            parse_entry(t)
                .map(|e| (t.clone(), e))
                .map_err(|e| format!("`{t}`: {e}"))
        })
        .collect()
}

/// Build every layer of `raw` (in any order) written in `file`; each problem is one message
/// naming the layer. Returns the chains of the layers that are sound.
pub fn build(
    raw: &[(RawLayer, Arc<str>)],
    default_ports: &PortSet,
) -> (BTreeMap<String, Chain>, Vec<String>) {
    let mut errors = Vec::new();
    let by_id: BTreeMap<&str, &(RawLayer, Arc<str>)> =
        raw.iter().map(|r| (r.0.id.as_str(), r)).collect();
    if by_id.len() != raw.len() {
        errors.push("two layers have the same id".to_string());
    }
    let mut chains: BTreeMap<String, Chain> = BTreeMap::new();
    // Parents before children: repeat until nothing more can be built.
    let mut pending: Vec<&(RawLayer, Arc<str>)> = by_id.values().copied().collect();
    while !pending.is_empty() {
        let before = pending.len();
        pending.retain(|(r, file)| {
            let parent = match &r.parent {
                None => None,
                Some(p) if !by_id.contains_key(p.as_str()) => {
                    errors.push(format!("layer {}: parent `{p}` is no layer", r.id));
                    return false;
                }
                Some(p) => match chains.get(p) {
                    Some(c) => Some(c.clone()),
                    None => return true,
                },
            };
            match one(r, file, parent.as_deref().unwrap_or(&[]), default_ports) {
                Ok(chain) => {
                    chains.insert(r.id.clone(), chain);
                }
                Err(e) => errors.extend(e),
            }
            false
        });
        if pending.len() == before {
            for (r, _) in pending {
                errors.push(format!(
                    "layer {}: its parents form a cycle (or one of them is wrong)",
                    r.id
                ));
            }
            break;
        }
    }
    (chains, errors)
}

/// One layer under its parent's chain: its chain, or what is wrong with it.
fn one(
    r: &RawLayer,
    file: &Arc<str>,
    parents: &[Arc<Layer>],
    default_ports: &PortSet,
) -> Result<Chain, Vec<String>> {
    let id = &r.id;
    let mut errors = Vec::new();
    if let Err(e) = SandboxId::new(id) {
        errors.push(format!("layer `{id}`: not a valid id: {e}"));
    }
    if parents.len() >= MAX_DEPTH {
        errors.push(format!("layer {id}: more than {MAX_DEPTH} layers deep"));
    }
    let ceiling = r.ceiling.as_deref().map(entries).transpose();
    let deny = entries(&r.deny);
    let (ceiling, deny) = match (ceiling, deny) {
        (Ok(c), Ok(d)) => (c, d),
        (c, d) => {
            errors.extend(c.err().map(|e| format!("layer {id}: ceiling: {e}")));
            errors.extend(d.err().map(|e| format!("layer {id}: deny: {e}")));
            return Err(errors);
        }
    };
    for (text, entry) in ceiling.iter().flatten() {
        if let Some(p) = parents.iter().find(|p| !p.admits_entry(entry)) {
            errors.push(format!(
                "layer {id}: ceiling `{text}` is outside the ceiling of its ancestor layer {} ({}): a layer may narrow its parent, never widen it",
                p.id, p.file
            ));
        }
    }
    for a in r
        .approvers
        .iter()
        .filter(|a| !super::console::valid_name(a))
    {
        errors.push(format!(
            "layer {id}: approvers: `{a}` is not a console user's name"
        ));
    }
    errors.extend(limits_errors(id, &r.limits, parents));
    let http = layer_http(id, &r.http).map_err(|e| errors.extend(e)).ok();
    let Some(http) = http.filter(|_| errors.is_empty()) else {
        return Err(errors);
    };
    let mut layer = Layer::compile(id, file, ceiling, deny, default_ports)
        .map_err(|e| vec![format!("layer {id}: cannot compile: {e}")])?;
    layer.approvers = r.approvers.iter().map(|a| a.as_str().into()).collect();
    layer.http = http;
    layer.limits = r.limits.clone();
    let mut chain: Vec<Arc<Layer>> = parents.to_vec();
    chain.push(Arc::new(layer));
    Ok(chain.into())
}

/// `layers:` of the config file: every problem is an error of the file.
pub(super) fn resolve(
    value: Option<serde_yaml::Value>,
    file: &Arc<str>,
    default_ports: &PortSet,
    sink: &mut Sink<'_>,
) -> LayerSet {
    let Some(value) = value else {
        return LayerSet::default();
    };
    let raw: Vec<RawLayer> = match serde_yaml::from_value(value) {
        Ok(r) => r,
        Err(e) => {
            let message = super::error::redact(&e.to_string());
            sink.top("layers", message, Some("layers:"));
            return LayerSet::default();
        }
    };
    let tagged: Vec<_> = raw.iter().map(|r| (r.clone(), file.clone())).collect();
    let (chains, errors) = build(&tagged, default_ports);
    for e in errors {
        let id = e.split([' ', ':']).nth(1).unwrap_or("layers").to_string();
        sink.top("layers", e, Some(&format!("id: {id}")));
    }
    LayerSet {
        raw,
        runtime: BTreeMap::new(),
        chains: Arc::new(chains),
    }
}

/// Where runtime layers are said to be written (their rules' `file`).
pub const RUNTIME: &str = "runtime layer";

impl super::Config {
    /// This configuration with `runtime` as its runtime layers (replacing any before): every
    /// layer built again, file-defined sandboxes bound to the new chains. Refused — with
    /// every reason — when a runtime layer takes a file-defined id, or any layer is unsound
    /// (a parent missing, a ceiling wider than its parent's).
    pub fn with_runtime_layers(
        &self,
        runtime: BTreeMap<String, RawLayer>,
    ) -> Result<super::Config, Vec<String>> {
        let mut errors: Vec<String> = (runtime.keys())
            .filter(|id| self.layers.raw.iter().any(|r| &&r.id == id))
            .map(|id| format!("layer {id} is defined in {}; change it there", self.origin))
            .collect();
        let file = self.origin.clone();
        let runtime_file: Arc<str> = RUNTIME.into();
        let tagged: Vec<(RawLayer, Arc<str>)> = (self.layers.raw.iter())
            .map(|r| (r.clone(), file.clone()))
            .chain(runtime.values().map(|r| (r.clone(), runtime_file.clone())))
            .collect();
        let (chains, problems) = build(&tagged, &self.defaults.ports);
        errors.extend(problems);
        if !errors.is_empty() {
            return Err(errors);
        }
        let mut config = self.clone();
        for b in &mut config.bindings {
            let id = b.network.layers.last().map(|l| l.id.to_string());
            if let Some(chain) = id.and_then(|id| chains.get(&id)) {
                b.network.layers = chain.clone();
            }
        }
        config.layers = LayerSet {
            raw: self.layers.raw.clone(),
            runtime,
            chains: Arc::new(chains),
        };
        Ok(config)
    }
}

/// Every entry of a file-defined sandbox outside a ceiling of its layers is an error of the
/// file (a runtime registration is refused alike at `PUT`) — or, for `simulate`, listed in
/// `listed` (`sandbox ID: …`).
pub(super) fn check_members(
    bindings: &[super::Binding],
    sink: &mut Sink<'_>,
    mut listed: Option<&mut Vec<String>>,
) {
    for b in bindings {
        for e in crate::policy::layer::outside_entries(&b.network.layers, &b.network) {
            match listed.as_deref_mut() {
                Some(list) => list.push(format!("sandbox {}: {e}", b.id)),
                None => sink.push(Some(&b.id), "layer", e, Some(&format!("id: {}", b.id)), 1),
            }
        }
    }
}

/// `layer: id` of a binding: its network is bounded by that layer's chain (none: unbounded).
pub(super) fn attach(
    id: Option<&str>,
    layers: &Layers,
    network: &mut crate::policy::NetworkSpec,
) -> Result<(), String> {
    if let Some(id) = id {
        network.layers = chain_of(layers, id)?;
    }
    Ok(())
}

/// The chain a member of layer `id` is bounded by, or the message that refuses `layer: id`.
pub fn chain_of(layers: &Layers, id: &str) -> Result<Chain, String> {
    layers.get(id).cloned().ok_or_else(|| {
        let known: Vec<&str> = layers.keys().map(String::as_str).collect();
        match known.is_empty() {
            true => format!("layer `{id}` is not defined (this configuration has no layers)"),
            false => format!("layer `{id}` is not defined (layers: {})", known.join(", ")),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(id: &str, parent: Option<&str>, ceiling: &[&str]) -> (RawLayer, Arc<str>) {
        let layer = RawLayer {
            id: id.into(),
            parent: parent.map(Into::into),
            ceiling: Some(ceiling.iter().map(|s| s.to_string()).collect()),
            deny: Vec::new(),
            approvers: Vec::new(),
            ..RawLayer::default()
        };
        (layer, "proxy.yaml".into())
    }

    #[test]
    fn a_team_narrows_its_org_and_cannot_widen_it() {
        let ports = PortSet::from_ports(&[443]).unwrap();
        let list = [
            raw("team-a", Some("org"), &["api.corp.example"]),
            raw("org", None, &["*.corp.example", "pypi.org"]),
        ];
        let (chains, errors) = build(&list, &ports);
        assert!(errors.is_empty(), "{errors:?}");
        let ids: Vec<&str> = chains["team-a"].iter().map(|l| &*l.id).collect();
        assert_eq!(ids, ["org", "team-a"]);
        let wide = [
            raw("org", None, &["*.corp.example"]),
            raw("team-b", Some("org"), &["github.com"]),
        ];
        let (chains, errors) = build(&wide, &ports);
        assert!(!chains.contains_key("team-b"));
        assert!(
            errors[0].contains("layer team-b: ceiling `github.com`"),
            "{errors:?}"
        );
        assert!(errors[0].contains("ancestor layer org"), "{errors:?}");
        let cycle = [raw("a", Some("b"), &[]), raw("b", Some("a"), &[])];
        let (_, errors) = build(&cycle, &ports);
        assert_eq!(errors.len(), 2, "{errors:?}");
        let (_, errors) = build(&[raw("a", Some("nope"), &[])], &ports);
        assert!(
            errors[0].contains("parent `nope` is no layer"),
            "{errors:?}"
        );
    }
}
