//! The little of HTTP/1.1 that `kheap serve` speaks: one GET or HEAD per
//! connection, answered and closed. Parsing is bounded (the caller hands
//! over at most `HEAD_LIMIT` bytes) and strict: anything else gets the
//! status that says what was wrong, never a guess.

/// The largest request head (request line and headers) read. Prometheus
/// sends a few hundred bytes; 8 KiB is what common servers allow per line.
pub const HEAD_LIMIT: usize = 8 * 1024;
/// The most header lines a request may carry.
const MAX_HEADERS: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
}

/// A parsed request head: what the handlers need and nothing more.
#[derive(Debug)]
pub struct Request {
    pub method: Method,
    /// The path, without the query string.
    pub path: String,
    headers: Vec<(String, String)>,
}

impl Request {
    /// The value of the first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Where the end of the head is in what was read so far: the length of
/// the head including its blank line. Bare LF line ends are accepted too.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    let mut line_start = 0;
    for (i, &b) in buf.iter().enumerate() {
        if b == b'\n' {
            let line = &buf[line_start..i];
            if line.is_empty() || line == b"\r" {
                // A blank line before any request line is tolerated
                // (RFC 9112 2.2), so only a blank line after one ends it.
                if line_start > 0 && buf[..line_start].iter().any(|&c| c > b' ') {
                    return Some(i + 1);
                }
            }
            line_start = i + 1;
        }
    }
    None
}

/// The status for a head that grew past `HEAD_LIMIT` without ending: 414
/// while the request line itself has not ended, 431 once the headers are
/// what is too large.
pub fn oversized_status(buf: &[u8]) -> u16 {
    let first_line_ended = buf
        .split(|&b| b == b'\n')
        .find(|l| !l.is_empty() && *l != b"\r")
        .is_some_and(|l| l.len() < buf.len());
    if first_line_ended && buf.contains(&b'\n') {
        431
    } else {
        414
    }
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Parses a complete head (as delimited by `head_end`). The error is the
/// status to answer with.
pub fn parse_head(head: &[u8]) -> Result<Request, u16> {
    let text = std::str::from_utf8(head).map_err(|_| 400u16)?;
    let mut lines = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .skip_while(|l| l.is_empty());
    let request_line = lines.next().ok_or(400u16)?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(400);
    };
    let Some(numbers) = version.strip_prefix("HTTP/") else {
        return Err(400);
    };
    match numbers {
        "1.0" | "1.1" => {}
        v if v.len() == 3
            && v.as_bytes()[1] == b'.'
            && v.bytes().all(|b| b == b'.' || b.is_ascii_digit()) =>
        {
            return Err(505)
        }
        _ => return Err(400),
    }
    let method = match method {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        m if is_token(m) => return Err(405),
        _ => return Err(400),
    };
    if !target.starts_with('/') {
        return Err(400);
    }
    let path = target.split('?').next().unwrap_or("").to_string();
    let mut headers = Vec::new();
    for line in lines {
        if line.is_empty() {
            break;
        }
        if headers.len() == MAX_HEADERS {
            return Err(431);
        }
        let (name, value) = line.split_once(':').ok_or(400u16)?;
        if !is_token(name) {
            return Err(400);
        }
        headers.push((name.to_string(), value.trim().to_string()));
    }
    Ok(Request {
        method,
        path,
        headers,
    })
}

/// A response: status, extra headers, body. Every response closes the
/// connection.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn new(status: u16, content_type: &str, body: impl Into<Vec<u8>>) -> Response {
        Response {
            status,
            headers: vec![("Content-Type", content_type.to_string())],
            body: body.into(),
        }
    }

    /// A plain-text response.
    pub fn text(status: u16, body: impl Into<Vec<u8>>) -> Response {
        Response::new(status, "text/plain; charset=utf-8", body)
    }

    /// The response for a status this module decided (bad head, limits).
    pub fn error(status: u16) -> Response {
        let mut r = Response::text(status, format!("{}\n", reason(status)));
        if status == 405 {
            r.headers.push(("Allow", "GET, HEAD".to_string()));
        }
        r
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }

    /// The status line and headers on the wire (the body follows as is,
    /// not copied: a HEAD request gets the head alone, with the body's
    /// length).
    pub fn head(&self) -> Vec<u8> {
        let mut out = format!("HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        for (name, value) in &self.headers {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        out.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.body.len()
        ));
        out.into_bytes()
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        414 => "URI Too Long",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Request, u16> {
        let end = head_end(s.as_bytes()).expect("a complete head");
        parse_head(&s.as_bytes()[..end])
    }

    #[test]
    fn a_prometheus_request_parses() {
        let r = parse(
            "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept: application/openmetrics-text\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.method, Method::Get);
        assert_eq!(r.path, "/metrics");
        assert_eq!(r.header("accept"), Some("application/openmetrics-text"));
        assert_eq!(r.header("authorization"), None);
        let r = parse("\r\nHEAD / HTTP/1.0\n\n").unwrap();
        assert_eq!((r.method, r.path.as_str()), (Method::Head, "/"));
    }

    #[test]
    fn wrong_methods_versions_and_shapes_get_their_status() {
        for (req, want) in [
            ("POST /metrics HTTP/1.1\r\n\r\n", 405),
            ("BREW /metrics HTTP/1.1\r\n\r\n", 405),
            ("PRI * HTTP/2.0\r\n\r\n", 505),
            ("GET / HTTP/2.0\r\n\r\n", 505),
            ("GET / HTTP/1.1 x\r\n\r\n", 400),
            ("GET / FTP/1.1\r\n\r\n", 400),
            ("GET metrics HTTP/1.1\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nno colon\r\n\r\n", 400),
            ("G\u{e9}T / HTTP/1.1\r\n\r\n", 400),
        ] {
            assert_eq!(parse(req).unwrap_err(), want, "{req:?}");
        }
        let many: String = (0..65).map(|i| format!("X-{i}: y\r\n")).collect();
        assert_eq!(
            parse(&format!("GET / HTTP/1.1\r\n{many}\r\n")).unwrap_err(),
            431
        );
    }

    #[test]
    fn the_head_ends_at_the_first_blank_line_after_the_request_line() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n"), None);
        assert_eq!(head_end(b"\r\n\r\nGET / HTTP/1.1\r\n"), None);
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
        assert_eq!(oversized_status(&[b'a'; 100]), 414);
        assert_eq!(oversized_status(b"GET / HTTP/1.1\r\nX: aaaa"), 431);
    }

    #[test]
    fn responses_close_and_head_keeps_the_length() {
        let r = Response::text(200, "ok\n");
        let head = String::from_utf8(r.head()).unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(head.ends_with("Content-Length: 3\r\nConnection: close\r\n\r\n"));
        let e = String::from_utf8(Response::error(405).head()).unwrap();
        assert!(e.contains("Allow: GET, HEAD\r\n"), "{e}");
    }
}
