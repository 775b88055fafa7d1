//! SOCKS5 as a server reads and writes it (RFC 1928, with the username/password
//! sub-negotiation of RFC 1929), without I/O: each reader looks at the bytes received so far
//! and says *more*, *done* (with how many bytes it used) or *malformed*. Every length is one
//! byte, so nothing here can be asked to hold more than 513 bytes; whatever follows a message
//! (a client that sends before it is answered) is left to the caller.
//!
//! Written here rather than taken from a crate: the protocol is four small messages, and the
//! server crates looked at log the password (a sandbox's token here) at debug level.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The protocol version byte of every RFC 1928 message.
pub const VERSION: u8 = 5;
/// The sub-negotiation version of RFC 1929.
const LOGIN_VERSION: u8 = 1;

/// An authentication method (RFC 1928 §3).
pub mod method {
    /// No authentication: the sandbox is known by the client's address.
    pub const NONE: u8 = 0x00;
    /// Username and password (RFC 1929): sandbox id and token.
    pub const LOGIN: u8 = 0x02;
    /// None of the methods offered is acceptable.
    pub const UNACCEPTABLE: u8 = 0xFF;
}

/// What a reader made of the bytes so far.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<T> {
    /// Not all of the message has arrived.
    More,
    /// The message, and how many bytes of the buffer it took.
    Done(T, usize),
}

/// Bytes that are not the SOCKS5 message expected at this point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    /// The first byte is not 5 (SOCKS4, or not SOCKS at all).
    Version(u8),
    /// A login sub-negotiation whose version is not 1.
    LoginVersion(u8),
    /// A request's reserved byte is not 0.
    Reserved(u8),
    /// A request's address type is none of IPv4, name, IPv6 (answered
    /// [`Reply::AddressTypeNotSupported`]).
    AddressType(u8),
    /// A greeting that offers no method at all.
    NoMethods,
    /// A name of zero bytes, or one that is not UTF-8.
    Name,
}

impl Malformed {
    /// One phrase for the audit record.
    pub fn explain(self) -> &'static str {
        match self {
            Malformed::Version(4) => "SOCKS4 is not served: use SOCKS5",
            Malformed::Version(_) => "not a SOCKS5 greeting",
            Malformed::LoginVersion(_) => "not an RFC 1929 username/password message",
            Malformed::Reserved(_) => "a SOCKS5 request with a non-zero reserved byte",
            Malformed::AddressType(_) => "a SOCKS5 request with an unknown address type",
            Malformed::NoMethods => "a SOCKS5 greeting that offers no method",
            Malformed::Name => "a SOCKS5 request whose name is empty or not UTF-8",
        }
    }
}

/// Which of the two methods served here a client offers (it may offer others too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Methods {
    /// The client offers no authentication.
    pub none: bool,
    /// The client offers a username and password.
    pub login: bool,
}

/// `VER NMETHODS METHODS...`
pub fn greeting(buf: &[u8]) -> Result<Step<Methods>, Malformed> {
    let Some(&version) = buf.first() else {
        return Ok(Step::More);
    };
    if version != VERSION {
        return Err(Malformed::Version(version));
    }
    let Some(&n) = buf.get(1) else {
        return Ok(Step::More);
    };
    if n == 0 {
        return Err(Malformed::NoMethods);
    }
    let end = 2 + n as usize;
    let Some(offered) = buf.get(2..end) else {
        return Ok(Step::More);
    };
    let methods = Methods {
        none: offered.contains(&method::NONE),
        login: offered.contains(&method::LOGIN),
    };
    Ok(Step::Done(methods, end))
}

/// The username and password of RFC 1929, as sent (the password is a token: never shown).
#[derive(PartialEq, Eq)]
pub struct Login<'a> {
    /// The user name.
    pub user: &'a [u8],
    /// The password.
    pub password: &'a [u8],
}

impl std::fmt::Debug for Login<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("user", &String::from_utf8_lossy(self.user))
            .field("password", &"<hidden>")
            .finish()
    }
}

/// `VER ULEN UNAME PLEN PASSWD` (RFC 1929 §2). Either may be empty here: the identity step
/// judges them.
pub fn login(buf: &[u8]) -> Result<Step<Login<'_>>, Malformed> {
    let Some(&version) = buf.first() else {
        return Ok(Step::More);
    };
    if version != LOGIN_VERSION {
        return Err(Malformed::LoginVersion(version));
    }
    let Some(&ulen) = buf.get(1) else {
        return Ok(Step::More);
    };
    let user_end = 2 + ulen as usize;
    let Some(&plen) = buf.get(user_end) else {
        return Ok(Step::More);
    };
    let end = user_end + 1 + plen as usize;
    if buf.len() < end {
        return Ok(Step::More);
    }
    let login = Login {
        user: &buf[2..user_end],
        password: &buf[user_end + 1..end],
    };
    Ok(Step::Done(login, end))
}

/// A request's command (RFC 1928 §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// CONNECT: a TCP tunnel.
    Connect,
    /// BIND (not served).
    Bind,
    /// UDP ASSOCIATE (not served).
    UdpAssociate,
    /// Any other command.
    Other(u8),
}

impl Command {
    fn from_byte(b: u8) -> Self {
        match b {
            1 => Command::Connect,
            2 => Command::Bind,
            3 => Command::UdpAssociate,
            other => Command::Other(other),
        }
    }

    /// The command's name, for the record.
    pub fn name(self) -> &'static str {
        match self {
            Command::Connect => "CONNECT",
            Command::Bind => "BIND",
            Command::UdpAssociate => "UDP ASSOCIATE",
            Command::Other(_) => "an unknown command",
        }
    }
}

/// Where a request goes: an address, or a name the proxy resolves (`socks5h`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// An IPv4 or IPv6 address and port.
    Address(SocketAddr),
    /// A name and port.
    Name(String, u16),
}

impl Destination {
    /// `host:port`, IPv6 in brackets, for a target parser.
    pub fn authority(&self) -> String {
        match self {
            Destination::Address(a) => a.to_string(),
            Destination::Name(n, p) => format!("{n}:{p}"),
        }
    }
}

/// A request: `VER CMD RSV ATYP DST.ADDR DST.PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// What is asked.
    pub command: Command,
    /// Where.
    pub destination: Destination,
}

/// Read a request. An unknown command is returned as such (it is answered, not dropped).
pub fn request(buf: &[u8]) -> Result<Step<Request>, Malformed> {
    if buf.len() < 4 {
        if let Some(&v) = buf.first() {
            if v != VERSION {
                return Err(Malformed::Version(v));
            }
        }
        return Ok(Step::More);
    }
    let (version, command, reserved, atyp) = (buf[0], buf[1], buf[2], buf[3]);
    if version != VERSION {
        return Err(Malformed::Version(version));
    }
    if reserved != 0 {
        return Err(Malformed::Reserved(reserved));
    }
    let (addr_len, start) = match atyp {
        1 => (4, 4),
        4 => (16, 4),
        3 => match buf.get(4) {
            Some(&n) => (n as usize, 5),
            None => return Ok(Step::More),
        },
        other => return Err(Malformed::AddressType(other)),
    };
    let end = start + addr_len + 2;
    if buf.len() < end {
        return Ok(Step::More);
    }
    let raw = &buf[start..start + addr_len];
    let port = u16::from_be_bytes([buf[end - 2], buf[end - 1]]);
    let destination = match atyp {
        1 => {
            let octets: [u8; 4] = raw.try_into().map_err(|_| Malformed::AddressType(1))?;
            Destination::Address(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(octets)), port))
        }
        4 => {
            let octets: [u8; 16] = raw.try_into().map_err(|_| Malformed::AddressType(4))?;
            Destination::Address(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(octets)), port))
        }
        _ => {
            let name = std::str::from_utf8(raw).map_err(|_| Malformed::Name)?;
            if name.is_empty() {
                return Err(Malformed::Name);
            }
            Destination::Name(name.to_string(), port)
        }
    };
    let command = Command::from_byte(command);
    Ok(Step::Done(
        Request {
            command,
            destination,
        },
        end,
    ))
}

/// A reply's code (RFC 1928 §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Reply {
    /// Succeeded.
    Succeeded = 0,
    /// General failure.
    GeneralFailure = 1,
    /// Not allowed by the ruleset.
    NotAllowed = 2,
    /// Network unreachable.
    NetworkUnreachable = 3,
    /// Host unreachable.
    HostUnreachable = 4,
    /// Connection refused.
    ConnectionRefused = 5,
    /// TTL expired.
    TtlExpired = 6,
    /// Command not supported.
    CommandNotSupported = 7,
    /// Address type not supported.
    AddressTypeNotSupported = 8,
}

/// A reply, bound address `0.0.0.0:0`: the proxy's own addresses are not the client's
/// business, and no client here uses them (BIND is not served).
pub fn reply(code: Reply) -> [u8; 10] {
    [VERSION, code as u8, 0, 1, 0, 0, 0, 0, 0, 0]
}

/// The method the server chose: `VER METHOD`.
pub fn chosen(m: u8) -> [u8; 2] {
    [VERSION, m]
}

/// The login's outcome (RFC 1929): 0 succeeded, anything else failed (and the server
/// closes).
pub fn login_status(ok: bool) -> [u8; 2] {
    [LOGIN_VERSION, if ok { 0 } else { 1 }]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every message arrives in pieces as small as one byte: each prefix is `More`, the whole
    /// is `Done` with its length, and a trailing byte is left over.
    fn in_pieces<T: std::fmt::Debug>(
        whole: &[u8],
        read: impl Fn(&[u8]) -> Result<Step<T>, Malformed>,
    ) -> T {
        for cut in 0..whole.len() {
            assert!(
                matches!(read(&whole[..cut]), Ok(Step::More)),
                "{cut} of {whole:?}"
            );
        }
        let mut longer = whole.to_vec();
        longer.push(0x16);
        match read(&longer) {
            Ok(Step::Done(v, n)) => {
                assert_eq!(n, whole.len());
                v
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn greetings_offer_methods() {
        let m = in_pieces(&[5, 2, 0, 2], greeting);
        assert!(m.none && m.login);
        let m = in_pieces(&[5, 1, 1], greeting);
        assert!(!m.none && !m.login);
        assert_eq!(greeting(&[4, 1, 0]), Err(Malformed::Version(4)));
        assert_eq!(greeting(&[5, 0]), Err(Malformed::NoMethods));
        assert_eq!(greeting(b"GET / HTTP/1.1"), Err(Malformed::Version(b'G')));
    }

    #[test]
    fn logins_are_read_whole_and_never_shown() {
        let whole = [1, 2, b'a', b'b', 3, b'x', b'y', b'z'];
        for cut in 0..whole.len() {
            assert!(matches!(login(&whole[..cut]), Ok(Step::More)), "{cut}");
        }
        let longer = [&whole[..], &[5, 1]].concat();
        let Ok(Step::Done(l, n)) = login(&longer) else {
            panic!("not read");
        };
        assert_eq!(
            (l.user, l.password, n),
            (&b"ab"[..], &b"xyz"[..], whole.len())
        );
        assert!(!format!("{l:?}").contains("xyz"));
        let Ok(Step::Done(empty, 3)) = login(&[1, 0, 0]) else {
            panic!("empty login not read");
        };
        assert!(empty.user.is_empty() && empty.password.is_empty());
        assert_eq!(login(&[5, 1]), Err(Malformed::LoginVersion(5)));
    }

    #[test]
    fn requests_name_an_address_or_a_name() {
        let r = in_pieces(&[5, 1, 0, 1, 127, 0, 0, 1, 0x1F, 0x90], request);
        assert_eq!(r.command, Command::Connect);
        assert_eq!(r.destination.authority(), "127.0.0.1:8080");
        let mut v6 = vec![5, 1, 0, 4];
        v6.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
        v6.extend_from_slice(&443u16.to_be_bytes());
        assert_eq!(in_pieces(&v6, request).destination.authority(), "[::1]:443");
        let mut named = vec![5, 2, 0, 3, 9];
        named.extend_from_slice(b"a.example");
        named.extend_from_slice(&80u16.to_be_bytes());
        let r = in_pieces(&named, request);
        assert_eq!(r.command, Command::Bind);
        assert_eq!(r.destination, Destination::Name("a.example".into(), 80));
        assert_eq!(
            in_pieces(&[5, 9, 0, 1, 1, 2, 3, 4, 0, 1], request).command,
            Command::Other(9)
        );
    }

    #[test]
    fn malformed_requests_are_named() {
        assert_eq!(request(&[4, 1, 0, 1]), Err(Malformed::Version(4)));
        assert_eq!(request(&[4]), Err(Malformed::Version(4)));
        assert_eq!(request(&[5, 1, 7, 1]), Err(Malformed::Reserved(7)));
        assert_eq!(request(&[5, 1, 0, 9]), Err(Malformed::AddressType(9)));
        assert_eq!(request(&[5, 1, 0, 3, 0, 0, 80]), Err(Malformed::Name));
        assert_eq!(request(&[5, 1, 0, 3, 1, 0xFF, 0, 80]), Err(Malformed::Name));
    }

    #[test]
    fn replies_are_ten_bytes() {
        assert_eq!(reply(Reply::NotAllowed), [5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(chosen(method::UNACCEPTABLE), [5, 0xFF]);
        assert_eq!(login_status(false), [1, 1]);
    }

    proptest::proptest! {
        /// No input makes a reader panic, and `Done` never claims more than it was given.
        #[test]
        fn any_bytes_are_safe(buf in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            if let Ok(Step::Done(_, n)) = greeting(&buf) { proptest::prop_assert!(n <= buf.len()); }
            if let Ok(Step::Done(_, n)) = login(&buf) { proptest::prop_assert!(n <= buf.len()); }
            if let Ok(Step::Done(_, n)) = request(&buf) { proptest::prop_assert!(n <= buf.len()); }
        }
    }
}
