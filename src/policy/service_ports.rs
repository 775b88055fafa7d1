//! Ports where a service that is neither TLS nor HTTP usually listens: what `validate` names
//! when an entry allows one without declaring opaque TCP (`tcp://host:port`), and what
//! `suggest` reads a refused connection by. A hint for the operator, never a policy input.

/// (port, service) for the usual non-HTTP services; sorted by port.
const SERVICES: &[(u16, &str)] = &[
    (21, "FTP"),
    (22, "SSH"),
    (23, "telnet"),
    (25, "SMTP"),
    (110, "POP3"),
    (143, "IMAP"),
    (389, "LDAP"),
    (445, "SMB"),
    (465, "SMTP submission over TLS"),
    (587, "SMTP submission"),
    (636, "LDAPS"),
    (873, "rsync"),
    (993, "IMAPS"),
    (995, "POP3S"),
    (1433, "SQL Server"),
    (1521, "Oracle"),
    (2049, "NFS"),
    (3306, "MySQL"),
    (3389, "RDP"),
    (4222, "NATS"),
    (5432, "PostgreSQL"),
    (5672, "AMQP"),
    (5900, "VNC"),
    (6379, "Redis"),
    (6432, "PgBouncer"),
    (7687, "Neo4j Bolt"),
    (9042, "Cassandra"),
    (9092, "Kafka"),
    (9418, "git"),
    (11211, "memcached"),
    (27017, "MongoDB"),
];

/// The service usually on `port`, if it is one of [`SERVICES`].
pub fn usual_service(port: u16) -> Option<&'static str> {
    SERVICES
        .binary_search_by_key(&port, |(p, _)| *p)
        .ok()
        .map(|i| SERVICES[i].1)
}

/// The usual non-HTTP services among `ports` (at most `limit`, by port).
pub fn services_in(ports: &super::ports::PortSet, limit: usize) -> Vec<(u16, &'static str)> {
    SERVICES
        .iter()
        .filter(|(p, _)| ports.contains(*p))
        .take(limit)
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ports::PortSet;

    #[test]
    fn the_table_is_sorted_and_read_by_port() {
        assert!(SERVICES.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(usual_service(5432), Some("PostgreSQL"));
        assert_eq!(usual_service(443), None);
        let ports = PortSet::from_ports(&[22, 443, 6379]).unwrap();
        assert_eq!(services_in(&ports, 5), [(22, "SSH"), (6379, "Redis")]);
        assert_eq!(services_in(&PortSet::any(), 2).len(), 2);
    }
}
