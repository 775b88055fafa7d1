//! Compiled name rules: exact names in a hash map, `*.`/`**.` suffixes looked up label by
//! label, globs bucketed by their fixed suffix (one `GlobSet` per bucket), so a lookup costs a
//! few hash probes plus the globs that share the name's suffix — never a scan of all entries.

use std::collections::HashMap;
use std::sync::Arc;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use super::compact_map::CompactMap;
use super::Rule;

/// The rules under one wildcard suffix: (rule, matches the apex too).
type SuffixRules = Box<[(Arc<Rule>, bool)]>;

/// Name rules of one list (egress or deny) of one sandbox, compiled (read-only).
#[derive(Debug, Default)]
pub struct NameMatcher {
    /// Exact names.
    exact: CompactMap<Box<[Arc<Rule>]>>,
    /// Wildcard suffixes: (rule, matches the apex too) — `*.x` is `false`, `**.x` is `true`.
    suffix: CompactMap<SuffixRules>,
    /// Globs keyed by the labels after their last wildcard.
    globs: CompactMap<GlobBucket>,
}

#[derive(Debug)]
struct GlobBucket {
    set: GlobSet,
    rules: Vec<Arc<Rule>>,
}

/// Collects one list's name rules, then compiles them into a [`NameMatcher`].
#[derive(Debug, Default)]
pub struct NameMatcherBuilder {
    exact: HashMap<Box<str>, Vec<Arc<Rule>>>,
    suffix: HashMap<Box<str>, Vec<(Arc<Rule>, bool)>>,
    /// Globs (pattern in path form, rule), keyed by their fixed suffix.
    globs: HashMap<Box<str>, Vec<(String, Arc<Rule>)>>,
}

/// The best matches for a name: the first rule that also allows the port, and the first
/// rule that matched the name at all (to tell `port_not_allowed` from `no_rule_matched`).
#[derive(Debug, Default)]
pub struct NameHit<'a> {
    /// The rule that matched the name with the asked port, if one did.
    pub with_port: Option<&'a Arc<Rule>>,
    /// The rule that matched the name on another port, if one did (for the reason given).
    pub name_only: Option<&'a Arc<Rule>>,
}

impl<'a> NameHit<'a> {
    fn offer(&mut self, rule: &'a Arc<Rule>, port: u16) -> bool {
        if self.name_only.is_none() {
            self.name_only = Some(rule);
        }
        if rule.ports.contains(port) {
            self.with_port = Some(rule);
            return true;
        }
        false
    }
}

impl NameMatcherBuilder {
    /// A rule for exactly `name`.
    pub fn add_exact(&mut self, name: &str, rule: Arc<Rule>) {
        self.exact.entry(name.into()).or_default().push(rule);
    }

    /// A rule for names below `suffix` (and `suffix` itself when `apex`).
    pub fn add_suffix(&mut self, suffix: &str, apex: bool, rule: Arc<Rule>) {
        self.suffix
            .entry(suffix.into())
            .or_default()
            .push((rule, apex));
    }

    /// A rule for names matching the label glob `pattern`, indexed by its `fixed_suffix`.
    pub fn add_glob(&mut self, pattern: &str, fixed_suffix: &str, rule: Arc<Rule>) {
        self.globs
            .entry(fixed_suffix.into())
            .or_default()
            .push((pattern.replace('.', "/"), rule));
    }

    /// Build the glob sets and freeze everything, sized to fit.
    pub fn build(self) -> Result<NameMatcher, globset::Error> {
        let mut globs = HashMap::with_capacity(self.globs.len());
        for (suffix, patterns) in self.globs {
            let mut builder = GlobSetBuilder::new();
            let mut rules = Vec::with_capacity(patterns.len());
            for (pattern, rule) in patterns {
                builder.add(GlobBuilder::new(&pattern).literal_separator(true).build()?);
                rules.push(rule);
            }
            let set = builder.build()?;
            globs.insert(suffix, GlobBucket { set, rules });
        }
        Ok(NameMatcher {
            exact: frozen(self.exact),
            suffix: frozen(self.suffix),
            globs: CompactMap::from(globs),
        })
    }
}

/// A builder's lists, frozen: each boxed to fit.
fn frozen<T>(m: HashMap<Box<str>, Vec<T>>) -> CompactMap<Box<[T]>> {
    CompactMap::from(
        m.into_iter()
            .map(|(k, v)| (k, v.into_boxed_slice()))
            .collect::<HashMap<_, _>>(),
    )
}

impl NameMatcher {
    /// Match a normalised name. Order of preference: exact, then the longest wildcard
    /// suffix, then globs.
    pub fn lookup(&self, name: &str, port: u16) -> NameHit<'_> {
        let mut hit = NameHit::default();
        self.walk(name, |r| hit.offer(r, port));
        hit
    }

    /// The first rule (in [`NameMatcher::lookup`]'s order) that matches `name` and `pred`.
    pub fn first(&self, name: &str, pred: impl Fn(&Rule) -> bool) -> Option<&Arc<Rule>> {
        let mut found = None;
        self.walk(name, |r| {
            if pred(r) {
                found = Some(r);
            }
            found.is_some()
        });
        found
    }

    /// Offer every rule matching `name` to `visit`, in order, until it returns true.
    fn walk<'a>(&'a self, name: &str, mut visit: impl FnMut(&'a Arc<Rule>) -> bool) {
        if let Some(rules) = self.exact.get(name) {
            for r in rules {
                if visit(r) {
                    return;
                }
            }
        }
        if !self.suffix.is_empty() {
            // The name itself (apex rules only), then every proper suffix, longest first.
            if let Some(rules) = self.suffix.get(name) {
                for (r, apex) in rules {
                    if *apex && visit(r) {
                        return;
                    }
                }
            }
            for suffix in proper_suffixes(name) {
                if let Some(rules) = self.suffix.get(suffix) {
                    for (r, _) in rules {
                        if visit(r) {
                            return;
                        }
                    }
                }
            }
        }
        if !self.globs.is_empty() {
            let mut path: Option<String> = None;
            for suffix in proper_suffixes(name) {
                if let Some(bucket) = self.globs.get(suffix) {
                    let p = path.get_or_insert_with(|| name.replace('.', "/"));
                    for i in bucket.set.matches(p.as_str()) {
                        if let Some(r) = bucket.rules.get(i) {
                            if visit(r) {
                                return;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `a.b.c` → `b.c`, `c`.
fn proper_suffixes(name: &str) -> impl Iterator<Item = &str> {
    name.match_indices('.').map(move |(i, _)| &name[i + 1..])
}

#[cfg(test)]
mod tests {
    use super::super::ports::PortSet;
    use super::super::{ListKind, RuleSource};
    use super::*;

    fn rule(text: &str, ports: PortSet) -> Arc<Rule> {
        Arc::new(Rule {
            text: text.into(),
            allows_opaque: false,
            ports,
            source: RuleSource {
                file: "t.yaml".into(),
                sandbox: "t".into(),
                list: ListKind::Egress,
                index: 0,
            },
        })
    }

    #[test]
    fn exact_suffix_and_glob() {
        let p443 = PortSet::parse("443").unwrap();
        let mut m = NameMatcherBuilder::default();
        m.add_exact("api.example.com", rule("api.example.com", p443.clone()));
        m.add_suffix("example.org", false, rule("*.example.org", p443.clone()));
        m.add_suffix("example.net", true, rule("**.example.net", p443.clone()));
        m.add_glob(
            "ec2.*.amazonaws.com",
            "amazonaws.com",
            rule("ec2.*.amazonaws.com", p443.clone()),
        );
        m.add_glob(
            "a.**.example.io",
            "example.io",
            rule("a.**.example.io", p443.clone()),
        );
        let m = m.build().unwrap();
        let yes = |n: &str| m.lookup(n, 443).with_port.map(|r| r.text.clone());
        assert_eq!(yes("api.example.com").as_deref(), Some("api.example.com"));
        assert_eq!(yes("x.api.example.com"), None);
        assert_eq!(yes("a.example.org").as_deref(), Some("*.example.org"));
        assert_eq!(yes("a.b.example.org").as_deref(), Some("*.example.org"));
        assert_eq!(yes("example.org"), None);
        assert_eq!(yes("example.net").as_deref(), Some("**.example.net"));
        assert_eq!(yes("x.y.example.net").as_deref(), Some("**.example.net"));
        assert_eq!(
            yes("ec2.us-east-1.amazonaws.com").as_deref(),
            Some("ec2.*.amazonaws.com")
        );
        assert_eq!(yes("ec2.a.b.amazonaws.com"), None);
        assert_eq!(yes("ec2.amazonaws.com"), None);
        assert_eq!(yes("a.example.io").as_deref(), Some("a.**.example.io"));
        assert_eq!(yes("a.x.y.example.io").as_deref(), Some("a.**.example.io"));
        assert_eq!(yes("b.x.example.io"), None);
        let hit = m.lookup("api.example.com", 80);
        assert!(hit.with_port.is_none());
        assert!(hit.name_only.is_some());
    }
}
