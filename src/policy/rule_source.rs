//! Where a rule was written ([`RuleSource`]: file, sandbox, list, index) and how that is
//! spelt: piece by piece ([`Spell`]), so that `Display` and the audit record's JSON write
//! the same text, the record with no formatter in between.

use std::fmt;
use std::sync::Arc;

/// Which list a rule came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    /// `network.egress`: what is allowed.
    Egress,
    /// `network.deny`: what is refused whatever else allows it.
    Deny,
    /// A grant approved at run time ([`granted`]): `file` names it.
    Grant,
    /// `network.scoped[i].egress`: allowed to the processes of that entry's scope only.
    Scoped(usize),
    /// A layer's `deny` ([`layer`]): `sandbox` names the layer.
    LayerDeny,
    /// A layer's `ceiling` ([`layer`]): `sandbox` names the layer.
    Ceiling,
}

impl ListKind {
    /// Whether the rule is a layer's (its refusals are not the member's to relax).
    pub fn is_layer(self) -> bool {
        matches!(self, ListKind::LayerDeny | ListKind::Ceiling)
    }
}

/// Where a rule was written: file, sandbox, list and index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSource {
    /// The file the sandbox was read from.
    pub file: Arc<str>,
    /// The sandbox it belongs to.
    pub sandbox: Arc<str>,
    /// Which list the entry is in.
    pub list: ListKind,
    /// Its position in that list (from 0).
    pub index: usize,
}

/// Where [`RuleSource::spell`] writes: its text and numbers, in order.
pub trait Spell {
    /// Append text.
    fn text(&mut self, s: &str);
    /// Append a number's digits.
    fn number(&mut self, n: u64);
}

impl RuleSource {
    /// Its spelling (`file: sandbox sb: network.egress[2]`), piece by piece: through `Display`
    /// and, with no formatter, into the audit record's JSON (where `Display` cost about
    /// 1,400 instructions a record).
    pub fn spell(&self, out: &mut impl Spell) {
        let (file, name) = (&*self.file, &*self.sandbox);
        out.text(file);
        let list = match self.list {
            ListKind::Egress => "egress",
            ListKind::Deny => "deny",
            ListKind::Grant => return [": sandbox ", name].iter().for_each(|t| out.text(t)),
            ListKind::Scoped(i) => {
                [": sandbox ", name, ": network.scoped["]
                    .iter()
                    .for_each(|t| out.text(t));
                out.number(i as u64);
                out.text("].egress[");
                out.number(self.index as u64);
                return out.text("]");
            }
            ListKind::LayerDeny => {
                [": layer ", name, ": deny["]
                    .iter()
                    .for_each(|t| out.text(t));
                out.number(self.index as u64);
                return out.text("]");
            }
            ListKind::Ceiling => {
                return [": layer ", name, ": ceiling"]
                    .iter()
                    .for_each(|t| out.text(t))
            }
        };
        [": sandbox ", name, ": network.", list, "["]
            .iter()
            .for_each(|t| out.text(t));
        out.number(self.index as u64);
        out.text("]");
    }
}

/// [`Spell`] into a formatter, keeping its first error.
struct Formatted<'a, 'b> {
    f: &'a mut fmt::Formatter<'b>,
    result: fmt::Result,
}

impl Spell for Formatted<'_, '_> {
    fn text(&mut self, s: &str) {
        if self.result.is_ok() {
            self.result = self.f.write_str(s);
        }
    }

    fn number(&mut self, n: u64) {
        if self.result.is_ok() {
            self.result = write!(self.f, "{n}");
        }
    }
}

impl fmt::Display for RuleSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = Formatted { f, result: Ok(()) };
        self.spell(&mut out);
        out.result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each list is spelt as the record has always spelt it (the audit record's JSON says the
    /// same text: `crate::audit::record_golden`).
    #[test]
    fn every_list_is_spelt_as_before() {
        for (list, want) in [
            (ListKind::Egress, "p.yaml: sandbox sb-1: network.egress[12]"),
            (ListKind::Deny, "p.yaml: sandbox sb-1: network.deny[12]"),
            (ListKind::Grant, "p.yaml: sandbox sb-1"),
            (
                ListKind::Scoped(3),
                "p.yaml: sandbox sb-1: network.scoped[3].egress[12]",
            ),
            (ListKind::LayerDeny, "p.yaml: layer sb-1: deny[12]"),
            (ListKind::Ceiling, "p.yaml: layer sb-1: ceiling"),
        ] {
            let source = RuleSource {
                file: "p.yaml".into(),
                sandbox: "sb-1".into(),
                list,
                index: 12,
            };
            assert_eq!(source.to_string(), want);
        }
    }
}
