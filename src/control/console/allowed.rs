//! Which access requests a signed-in approver may answer (and whose grants revoke): a layer
//! may name its approvers (`layers[].approvers`); a member of a chain where any layer names
//! some is answered only by a person one of those layers names — an org's approver for every
//! team below it, a team's for its own. A sandbox in no such layer is any approver's. The
//! admin token (the principal `admin`) answers everything, as it does through the API.

use std::sync::Arc;

use super::session::Principal;
use crate::config::console::{Role, ADMIN_PRINCIPAL};
use crate::control::error::{forbidden, ControlError};
use crate::policy::layer::Layer;

/// `Ok` when `who` may answer for a sandbox in `chain`; else why not.
pub fn may_answer(who: &Principal, chain: &[Arc<Layer>]) -> Result<(), ControlError> {
    if who.role != Role::Approver {
        return Err(forbidden(
            "a viewer cannot answer requests or revoke grants",
        ));
    }
    let naming: Vec<&Arc<Layer>> = chain.iter().filter(|l| !l.approvers.is_empty()).collect();
    if who.name == ADMIN_PRINCIPAL || naming.is_empty() {
        return Ok(());
    }
    if naming
        .iter()
        .any(|l| l.approvers.iter().any(|a| **a == *who.name))
    {
        return Ok(());
    }
    let layers: Vec<&str> = naming.iter().map(|l| &*l.id).collect();
    Err(forbidden(format!(
        "layer {} names who may answer for its members, and {} is not among them",
        layers.join(", layer "),
        who.name
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ports::PortSet;

    fn layer(id: &str, approvers: &[&str]) -> Arc<Layer> {
        let mut l = Layer::compile(id, "proxy.yaml", None, Vec::new(), &PortSet::any()).unwrap();
        l.approvers = approvers.iter().map(|a| Arc::from(*a)).collect();
        Arc::new(l)
    }

    fn who(name: &str, role: Role) -> Principal {
        Principal {
            name: name.into(),
            role,
            how: "token",
        }
    }

    #[test]
    fn the_layers_name_who_answers_for_their_members() {
        let chain = [layer("org", &["olga"]), layer("team-a", &["alice"])];
        let ok = |n: &str| may_answer(&who(n, Role::Approver), &chain).is_ok();
        assert!(ok("alice"), "the team's approver");
        assert!(ok("olga"), "the org's approver answers below it");
        assert!(ok("admin"), "the admin token");
        let bob = may_answer(&who("bob", Role::Approver), &chain)
            .unwrap_err()
            .to_string();
        assert!(
            bob.contains("layer org, layer team-a") && bob.contains("bob"),
            "{bob}"
        );
        assert!(may_answer(&who("alice", Role::Viewer), &chain).is_err());
        // No layer names any: every approver.
        assert!(may_answer(&who("bob", Role::Approver), &[layer("org", &[])]).is_ok());
        assert!(may_answer(&who("bob", Role::Approver), &[]).is_ok());
    }
}
