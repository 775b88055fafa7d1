//! What an exchange was allowed to do, and whether a newer policy still allows it: the
//! decision's result that every live exchange keeps ([`crate::relay::watch`] re-checks it on
//! every publication).

use std::net::IpAddr;

use crate::egress::identity::Proof;
use crate::policy::granted::GrantKind;
use crate::policy::sandbox_id::SandboxId;
use crate::policy::target::Target;
use crate::sandboxes::set::PolicySet;

/// What an exchange was allowed to do: the sandbox (and how the client proved it was that
/// sandbox), the target it asked for and the address actually dialled, decided under policy
/// `generation`.
#[derive(Debug, Clone)]
pub struct Clearance {
    pub sandbox: SandboxId,
    pub proof: Proof,
    pub target: Target,
    pub dialed: IpAddr,
    pub generation: u64,
    /// The approved grant (`crate::policy::granted`) that allowed it, if one did.
    pub granted_by: Option<std::sync::Arc<str>>,
    /// The process it was attributed to (`network.scoped` entries are checked again for it).
    pub process: Option<std::sync::Arc<crate::policy::process::Process>>,
}

impl Clearance {
    /// Whether `set` still allows this exchange: it still identifies the client as the same
    /// sandbox (a rotated token ends the tunnels opened with the old one), and it makes
    /// exactly the decision a new connection with the same target and address would get.
    pub fn allowed_by(&self, set: &PolicySet) -> bool {
        if !self.proof.still_identifies(set, &self.sandbox) {
            return false;
        }
        let Some(sb) = set.get(self.sandbox.as_str()) else {
            return false;
        };
        let process = self.process.as_deref();
        let decided = set
            .decide_for(sb, process, &self.target, Some(&[self.dialed]))
            .decision;
        if !decided.verdict.proceeds() {
            return false;
        }
        // A spent `once` grant still allows the one exchange it was spent on, and no other
        // (an exchange whose own grant was revoked or ended is not kept by it).
        match set.grant_of(sb, &decided) {
            Some(g) if g.kind == GrantKind::Once && g.used() => {
                self.granted_by.as_deref() == Some(&*g.id)
            }
            _ => true,
        }
    }
}
