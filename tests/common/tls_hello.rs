//! Hand-built TLS ClientHellos, for what `openssl s_client` cannot send (Encrypted Client
//! Hello: Debian 12's OpenSSL has no ECH).

/// Extension type of Encrypted Client Hello (draft-ietf-tls-esni).
pub const EXT_ECH: u16 = 0xfe0d;

fn u16be(v: usize) -> [u8; 2] {
    (v as u16).to_be_bytes()
}

/// One TLS record holding a ClientHello with `sni` (as the outer, cleartext name) and the
/// extra extensions `(type, body)`.
pub fn client_hello(sni: &str, extra: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut exts = Vec::new();
    // server_name: list of one host_name.
    let name = sni.as_bytes();
    let mut list = vec![0u8];
    list.extend_from_slice(&u16be(name.len()));
    list.extend_from_slice(name);
    let mut sni_body = u16be(list.len()).to_vec();
    sni_body.extend_from_slice(&list);
    for (ty, body) in std::iter::once((0u16, sni_body)).chain(extra.iter().cloned()) {
        exts.extend_from_slice(&ty.to_be_bytes());
        exts.extend_from_slice(&u16be(body.len()));
        exts.extend_from_slice(&body);
    }
    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[0x42; 32]); // random
    body.push(0); // session id
    body.extend_from_slice(&[0, 2, 0x13, 0x01]); // TLS_AES_128_GCM_SHA256
    body.extend_from_slice(&[1, 0]); // null compression
    body.extend_from_slice(&u16be(exts.len()));
    body.extend_from_slice(&exts);
    let mut hs = vec![0x01];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend_from_slice(&u16be(hs.len()));
    record.extend_from_slice(&hs);
    record
}

/// A ClientHello whose outer SNI is `sni` and that carries an ECH extension (an outer
/// `ClientHelloOuter` with a made-up config id and payload, as a client with an ECH config
/// sends it).
pub fn ech_hello(sni: &str) -> Vec<u8> {
    let mut ech = vec![0x00]; // type: outer
    ech.extend_from_slice(&[0x00, 0x01, 0x00, 0x01]); // HPKE KDF and AEAD
    ech.push(0x07); // config id
    ech.extend_from_slice(&u16be(32));
    ech.extend_from_slice(&[0x11; 32]); // enc
    ech.extend_from_slice(&u16be(64));
    ech.extend_from_slice(&[0x22; 64]); // payload
    client_hello(sni, &[(EXT_ECH, ech)])
}
