//! Port sets: the `:443`, `:8000-8100` and `:*` suffixes of policy entries, and
//! `defaults.ports`. Parsing rejects 0 and anything above 65535.

use std::fmt;
use std::sync::Arc;

use super::ParseError;

/// A set of TCP ports, kept as a few inclusive ranges.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PortSet {
    /// Inclusive ranges; small (one for an entry, a handful for `defaults.ports`).
    ranges: Arc<[(u16, u16)]>,
}

impl PortSet {
    /// Every port, 1–65535.
    pub fn any() -> Self {
        PortSet {
            ranges: Arc::from([(1, u16::MAX)]),
        }
    }

    /// A list of single ports (as in `defaults.ports`).
    pub fn from_ports(ports: &[u16]) -> Result<Self, ParseError> {
        if let Some(p) = ports.iter().find(|p| **p == 0) {
            return Err(ParseError(format!("port {p} is outside 1-65535").into()));
        }
        Ok(PortSet {
            ranges: ports.iter().map(|p| (*p, *p)).collect(),
        })
    }

    /// Parse the text after the colon of an entry: `443`, `8000-8100` or `*`.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        if text == "*" {
            return Ok(Self::any());
        }
        let (lo, hi) = match text.split_once('-') {
            Some((a, b)) => (parse_port(a)?, parse_port(b)?),
            None => {
                let p = parse_port(text)?;
                (p, p)
            }
        };
        if lo > hi {
            return Err(ParseError(
                format!("port range `{text}` is empty (low end above high end)").into(),
            ));
        }
        Ok(PortSet {
            ranges: Arc::from([(lo, hi)]),
        })
    }

    /// Whether `port` is in the set.
    #[inline]
    pub fn contains(&self, port: u16) -> bool {
        self.ranges
            .iter()
            .any(|(lo, hi)| *lo <= port && port <= *hi)
    }

    /// Whether every port of this set is in `other` (a layer's ceiling admits an entry only
    /// on ports the ceiling allows).
    pub fn within(&self, other: &PortSet) -> bool {
        self.ranges.iter().all(|&(lo, hi)| {
            let mut next = u32::from(lo);
            while next <= u32::from(hi) {
                let Some(&(_, end)) = other
                    .ranges
                    .iter()
                    .find(|(a, b)| u32::from(*a) <= next && next <= u32::from(*b))
                else {
                    return false;
                };
                next = u32::from(end) + 1;
            }
            true
        })
    }

    /// Whether this is the set of every port.
    pub fn is_any(&self) -> bool {
        self.ranges.contains(&(1, u16::MAX))
    }
}

fn parse_port(text: &str) -> Result<u16, ParseError> {
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseError(
            format!("`{text}` is not a port (1-65535, a range lo-hi, or *)").into(),
        ));
    }
    match text.parse::<u32>() {
        Ok(p) if (1..=65535).contains(&p) => Ok(p as u16),
        _ => Err(ParseError(format!("port {text} is outside 1-65535").into())),
    }
}

impl fmt::Display for PortSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_any() {
            return f.write_str("*");
        }
        for (i, (lo, hi)) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_follows_adjacent_ranges_and_stops_at_a_gap() {
        let p = |t: &str| PortSet::parse(t).unwrap();
        let two = PortSet::from_ports(&[80, 443]).unwrap();
        assert!(p("443").within(&two));
        assert!(!p("8443").within(&two));
        assert!(p("8000-8100").within(&p("*")));
        assert!(!p("*").within(&p("1-65534")));
        let joined = PortSet {
            ranges: Arc::from([(1, 100), (101, 200)]),
        };
        assert!(p("50-150").within(&joined));
        assert!(!p("50-201").within(&joined));
    }

    #[test]
    fn parses_single_range_and_any() {
        assert!(PortSet::parse("443").unwrap().contains(443));
        assert!(!PortSet::parse("443").unwrap().contains(444));
        let r = PortSet::parse("8000-8100").unwrap();
        assert!(r.contains(8000) && r.contains(8100) && !r.contains(8101) && !r.contains(7999));
        assert!(PortSet::parse("*").unwrap().contains(1));
        assert!(PortSet::parse("*").unwrap().contains(65535));
        assert_eq!(
            PortSet::parse("8000-8100").unwrap().to_string(),
            "8000-8100"
        );
    }

    #[test]
    fn rejects_out_of_range_and_garbage() {
        for bad in [
            "0",
            "65536",
            "99999999999",
            "",
            "-1",
            "1-",
            "a",
            "443 ",
            "+443",
            "200-100",
            "0-10",
        ] {
            assert!(PortSet::parse(bad).is_err(), "{bad:?}");
        }
        assert!(PortSet::from_ports(&[0]).is_err());
        let d = PortSet::from_ports(&[80, 443]).unwrap();
        assert!(d.contains(80) && d.contains(443) && !d.contains(8080));
    }
}
