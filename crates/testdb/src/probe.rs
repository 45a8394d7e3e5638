//! Asking a server whether it accepts connections, without a client library or a process:
//! the first message of the protocol, answered by an authentication request or an error.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// How long a server that took the connection may take to answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Protocol version 3.0, as the startup message spells it.
const PROTOCOL_3_0: u32 = 196_608;

/// Whether the server listening on unix socket `socket` accepts a connection as user
/// `postgres` to database `postgres`. A server that is starting up, shutting down, or out of
/// connection slots answers with an error and counts as not accepting.
pub(crate) fn accepts_connections(socket: &Path) -> bool {
    let Ok(mut stream) = UnixStream::connect(socket) else {
        return false;
    };
    if stream.set_read_timeout(Some(ANSWER_TIMEOUT)).is_err()
        || stream.set_write_timeout(Some(ANSWER_TIMEOUT)).is_err()
    {
        return false;
    }

    let mut body = PROTOCOL_3_0.to_be_bytes().to_vec();
    for text in ["user", "postgres", "database", "postgres", ""] {
        body.extend_from_slice(text.as_bytes());
        body.push(0);
    }
    let Ok(length) = u32::try_from(body.len() + 4) else {
        return false;
    };
    let mut startup = length.to_be_bytes().to_vec();
    startup.extend_from_slice(&body);
    if stream.write_all(&startup).is_err() {
        return false;
    }

    // 'R': an authentication request (with trust: AuthenticationOk); 'E': an error.
    let mut first = [0_u8; 1];
    let accepted = stream.read_exact(&mut first).is_ok() && first[0] == b'R';
    if accepted {
        // Terminate, so that the server logs no "unexpected EOF".
        let _ = stream.write_all(&[b'X', 0, 0, 0, 4]);
    }
    accepted
}
