//! A tiny blocking RESP client over `std::net`, used for readiness probes
//! (it works without an async runtime and with hard timeouts).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

/// Sends one command to 127.0.0.1:`port` and returns a simple-string,
/// integer or bulk-string reply as text. Error replies, nil replies and
/// arrays are returned as errors.
pub(crate) fn command(port: u16, args: &[&str], timeout: Duration) -> io::Result<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;

    let mut request = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        request.extend_from_slice(arg.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    stream.write_all(&request)?;

    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line)?;
    let header = String::from_utf8_lossy(&line);
    let header = header.trim_end_matches(['\r', '\n']);
    let (kind, rest) = header.split_at(header.len().min(1));
    match kind {
        "+" | ":" => Ok(rest.to_owned()),
        "-" => Err(io::Error::other(format!("redis error reply: {rest}"))),
        "$" => {
            let len: i64 = rest
                .parse()
                .map_err(|_| io::Error::other(format!("bad bulk length: {rest:?}")))?;
            let len = usize::try_from(len).map_err(|_| io::Error::other("nil reply".to_owned()))?;
            let mut body = vec![0; len + 2];
            reader.read_exact(&mut body)?;
            body.truncate(len);
            Ok(String::from_utf8_lossy(&body).into_owned())
        }
        "" => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed without a reply",
        )),
        _ => Err(io::Error::other(format!("unexpected reply: {header:?}"))),
    }
}

/// Value of `field` in an `INFO`-style `field:value` text.
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_field_parses() {
        let info = "# Server\r\nprocess_id:42\r\ncluster_state:ok\r\ncluster_state_x:no\r\n";
        assert_eq!(info_field(info, "process_id"), Some("42"));
        assert_eq!(info_field(info, "cluster_state"), Some("ok"));
        assert_eq!(info_field(info, "missing"), None);
    }

    #[test]
    fn refused_connection_is_an_error() {
        // Port 1 on loopback is essentially never listening.
        assert!(command(1, &["PING"], Duration::from_millis(200)).is_err());
    }
}
