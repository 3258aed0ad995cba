//! HTTP/1.x heads: read within a bound, parsed with `httparse`, re-written without hop-by-hop
//! headers.

use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest request or response head (request line or status line and headers), in bytes.
pub const HEAD_BYTES_MAX: usize = 16 * 1024;
/// Most header fields in one head.
pub const HEADERS_MAX: usize = 64;

/// Why a head could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    #[error("the head exceeds {HEAD_BYTES_MAX} bytes or {HEADERS_MAX} header fields")]
    TooLarge,
    #[error("the peer closed the connection before the head ended")]
    Closed,
    #[error("not HTTP/1.x: {0}")]
    Malformed(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// One header field.
#[derive(Debug, Clone)]
pub struct Field {
    pub name: String,
    pub value: Vec<u8>,
}

/// A request head.
#[derive(Debug, Clone)]
pub struct RequestHead {
    pub method: String,
    pub target: String,
    pub fields: Vec<Field>,
}

/// A response head.
#[derive(Debug, Clone)]
pub struct ResponseHead {
    pub code: u16,
    pub reason: String,
    pub fields: Vec<Field>,
}

/// Reads from `stream` into `buf` until a whole head is there; returns the head's length
/// (`buf` may hold bytes past it: the start of a body).
pub async fn read_head<R: AsyncRead + Unpin>(
    stream: &mut R,
    buf: &mut Vec<u8>,
) -> Result<usize, HeadError> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = find_head_end(buf) {
            return Ok(end);
        }
        if buf.len() >= HEAD_BYTES_MAX {
            return Err(HeadError::TooLarge);
        }
        let room = (HEAD_BYTES_MAX + 4 - buf.len()).min(chunk.len());
        let n = stream.read(&mut chunk[..room]).await?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    (end <= HEAD_BYTES_MAX).then_some(end)
}

fn fields_of(headers: &[httparse::Header<'_>]) -> Vec<Field> {
    headers
        .iter()
        .map(|h| Field {
            name: h.name.to_string(),
            value: h.value.to_vec(),
        })
        .collect()
}

fn parse_error(e: httparse::Error) -> HeadError {
    match e {
        httparse::Error::TooManyHeaders => HeadError::TooLarge,
        other => HeadError::Malformed(other.to_string()),
    }
}

/// Parses a request head.
pub fn parse_request(head: &[u8]) -> Result<RequestHead, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head).map_err(parse_error)? {
        httparse::Status::Complete(_) => {}
        httparse::Status::Partial => return Err(HeadError::Malformed("incomplete head".into())),
    }
    Ok(RequestHead {
        method: req.method.unwrap_or_default().to_string(),
        target: req.path.unwrap_or_default().to_string(),
        fields: fields_of(req.headers),
    })
}

/// Parses a response head.
pub fn parse_response(head: &[u8]) -> Result<ResponseHead, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut res = httparse::Response::new(&mut headers);
    match res.parse(head).map_err(parse_error)? {
        httparse::Status::Complete(_) => {}
        httparse::Status::Partial => return Err(HeadError::Malformed("incomplete head".into())),
    }
    Ok(ResponseHead {
        code: res.code.unwrap_or_default(),
        reason: res.reason.unwrap_or_default().to_string(),
        fields: fields_of(res.headers),
    })
}

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1), plus those the
/// `Connection` header names. The proxy drops them in both directions.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The fields without hop-by-hop ones.
pub fn end_to_end(fields: &[Field]) -> Vec<&Field> {
    end_to_end_keeping(fields, &[])
}

/// The fields without hop-by-hop ones, except those named in `keep` (lowercase).
pub fn end_to_end_keeping<'a>(fields: &'a [Field], keep: &[&str]) -> Vec<&'a Field> {
    let named: Vec<String> = fields
        .iter()
        .filter(|f| f.name.eq_ignore_ascii_case("connection"))
        .flat_map(|f| {
            String::from_utf8_lossy(&f.value)
                .split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .collect();
    fields
        .iter()
        .filter(|f| {
            let name = f.name.to_ascii_lowercase();
            keep.contains(&name.as_str())
                || (!HOP_BY_HOP.contains(&name.as_str()) && !named.contains(&name))
        })
        .collect()
}

/// The first value of a field.
pub fn field<'a>(fields: &'a [Field], name: &str) -> Option<&'a [u8]> {
    fields
        .iter()
        .find(|f| f.name.eq_ignore_ascii_case(name))
        .map(|f| f.value.as_slice())
}

/// Appends `name: value\r\n` for each field.
pub fn write_fields(out: &mut Vec<u8>, fields: &[&Field]) {
    for f in fields {
        out.extend_from_slice(f.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(&f.value);
        out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_fields_and_those_connection_names_are_dropped() {
        let head = parse_request(
            b"GET http://a/ HTTP/1.1\r\nHost: a\r\nConnection: close, X-Secret\r\nX-Secret: 1\r\nProxy-Authorization: b\r\nAccept: */*\r\n\r\n",
        )
        .unwrap();
        let kept: Vec<&str> = end_to_end(&head.fields)
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(kept, ["Host", "Accept"]);
    }

    #[test]
    fn too_many_fields_is_too_large() {
        let mut head = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..=HEADERS_MAX {
            head.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
        }
        head.extend_from_slice(b"\r\n");
        assert!(matches!(parse_request(&head), Err(HeadError::TooLarge)));
    }
}
