//! What of a binding decides, hashed: the digest each compiled sandbox carries, XOR-combined
//! into the policy version. A change to any of it — entries, scopes, layers, HTTP rules,
//! credentials, the decider — is a new version, and wakes the sandbox's live exchanges.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::config::Binding;
use crate::policy::granted::Granted;
use crate::policy::sandbox_id::SandboxId;

/// Feed everything in `b` that decides into `h`.
pub(super) fn hash_binding(h: &mut Sha256, b: &Binding) {
    h.update(b.id.as_bytes());
    h.update([0]);
    h.update(b.token_sha256.unwrap_or_default());
    h.update(format!(
        "{:?}{:?}{:?}",
        b.sources, b.enforcement, b.network.mode
    ));
    for (text, _) in b.network.egress.iter() {
        h.update(b"+");
        h.update(text.as_bytes());
    }
    for (text, _) in b.network.deny.iter() {
        h.update(b"-");
        h.update(text.as_bytes());
    }
    for s in b.network.scoped.iter() {
        h.update(format!("s{}", s.scope));
        s.egress.iter().for_each(|(t, _)| h.update(t.as_bytes()));
    }
    // Its layers decide too: a layer's change is a new version of every member.
    for l in b.network.layers.iter() {
        h.update(format!(
            "L{}{}{:?}",
            l.id,
            l.file,
            l.ceiling.as_ref().map(|c| c.len())
        ));
        let lists = l.ceiling.iter().flatten().chain(l.deny.iter());
        lists.for_each(|(t, _)| h.update(t.as_bytes()));
        h.update(format!("{}", l.deny.len()));
    }
    h.update(format!(
        "{:?}{}{:?}{}{}",
        b.limits,
        b.strict_sni_dst,
        b.require_tls_ports,
        b.refuse_ech,
        b.network.resolve_for_address_rules
    ));
    // What terminated requests are judged by and given: HTTP rules and credentials (the
    // secret by its digest, so a rotation is a new version and wakes the sandbox's exchanges).
    for r in b.network.http.iter() {
        h.update(b"h");
        h.update(format!(
            "{:?}{:?}{:?}{:?}{}",
            r.host, r.methods, r.paths, r.git, r.text
        ));
    }
    if let Some(f) = &b.network.flows {
        h.update(b"f");
        h.update(f.describe());
    }
    for c in b.credentials.iter() {
        h.update(b"c");
        h.update(c.fingerprint());
    }
    // The decider and the body scanner narrow what is allowed: a change is a new version.
    h.update(format!("{:?}{:?}", b.decider, b.identity_token));
    if let Some(d) = &b.dlp {
        h.update(format!("{:?}{:?}", d.entropy, d.max_bytes));
        for r in &d.rules {
            h.update(format!("{}{:?}{}", r.name, r.action, r.pattern.as_str()));
        }
    }
}

/// The digest of every sandbox's grants (zero without any).
pub(super) fn grants(grants: &imbl::HashMap<SandboxId, Arc<Granted>>) -> [u8; 32] {
    if grants.is_empty() {
        return [0u8; 32];
    }
    let mut ids: Vec<&SandboxId> = grants.keys().collect();
    ids.sort_unstable();
    let mut h = Sha256::new();
    for id in ids {
        h.update(id.as_bytes());
        h.update([0]);
        h.update(grants[id].digest_text());
    }
    h.finalize().into()
}
