//! A member's limits under its layers: each limit a layer of its chain sets is the most the
//! member may have, so its own value above it — or none, where none means unlimited — is
//! capped to the least of them. Applied where limits are put in force (the sandbox's
//! limiter), so a layer changed at run time bounds its members at their next connection.

use std::borrow::Cow;
use std::sync::Arc;

use crate::config::Limits;
use crate::policy::layer::Layer;

/// `limits` capped by every layer of `layers` that bounds one.
pub fn bounded<'a>(limits: &'a Limits, layers: &[Arc<Layer>]) -> Cow<'a, Limits> {
    if layers.iter().all(|l| l.limits.is_empty()) {
        return Cow::Borrowed(limits);
    }
    let mut out = limits.clone();
    for l in layers.iter().map(|l| &l.limits) {
        cap(&mut out.bytes_per_day, l.bytes_per_day);
        cap(&mut out.requests_per_day, l.requests_per_day);
        cap(&mut out.tokens_per_day, l.tokens_per_day);
        cap(&mut out.bandwidth_up_bps, l.bandwidth_up_bps);
        cap(&mut out.bandwidth_down_bps, l.bandwidth_down_bps);
        if let Some(c) = l.cost_per_day {
            out.cost_per_day = Some(out.cost_per_day.map_or(c, |own| own.min(c)));
        }
        if let Some(m) = l.max_connections {
            out.max_connections = out.max_connections.min(m);
        }
        if let Some(r) = l.connections_per_second {
            out.connections_per_second = out.connections_per_second.min(r);
        }
    }
    Cow::Owned(out)
}

/// `own` capped at `most` (an unset `own` is unlimited: it becomes `most`).
fn cap(own: &mut Option<u64>, most: Option<u64>) {
    if let Some(m) = most {
        *own = Some(own.map_or(m, |o| o.min(m)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::layer::LayerLimits;
    use crate::policy::ports::PortSet;

    fn layer(limits: LayerLimits) -> Arc<Layer> {
        let ports = PortSet::from_ports(&[443]).unwrap();
        let mut l = Layer::compile("org", "proxy.yaml", None, Vec::new(), &ports).unwrap();
        l.limits = limits;
        Arc::new(l)
    }

    #[test]
    fn a_layer_caps_what_a_member_asks_and_fills_what_it_leaves_unlimited() {
        let own = Limits {
            tokens_per_day: Some(5_000_000),
            requests_per_day: Some(10),
            ..crate::config::defaults::LIMITS
        };
        let org = layer(LayerLimits {
            tokens_per_day: Some(2_000_000),
            requests_per_day: Some(100),
            bytes_per_day: Some(1 << 30),
            connections_per_second: Some(5.0),
            ..LayerLimits::default()
        });
        let team = layer(LayerLimits {
            tokens_per_day: Some(1_000_000),
            ..LayerLimits::default()
        });
        let b = bounded(&own, &[org, team]);
        assert_eq!(b.tokens_per_day, Some(1_000_000), "the least of the chain");
        assert_eq!(b.requests_per_day, Some(10), "the member's own is lower");
        assert_eq!(
            b.bytes_per_day,
            Some(1 << 30),
            "unlimited becomes the layer's"
        );
        assert_eq!(b.connections_per_second, 5.0);
        assert!(matches!(bounded(&own, &[]), Cow::Borrowed(_)));
    }
}
