//! The metrics endpoint's HTTP server: one thread, one connection at a time, every step
//! bounded, requests parsed by `httparse` (the parser under hyper).
//!
//! Why not a general server crate: the ones with few dependencies (`tiny_http`, which this
//! replaced) start a pool of threads per endpoint (one more per open connection, unbounded),
//! read a request without a time limit, and write the response on the caller's thread with
//! no write timeout, so a client that never reads a large answer could hold this thread,
//! which the engine's `Drop` joins. An endpoint inside a job must cost one thread, never grow, and never wait on a
//! stranger: here a connection gets at most [`Limits::connection_time`] in all (reading its
//! request of at most [`Limits::request_bytes`], then writing the answer), is closed after
//! one answer, and the thread checks whether to stop at least every [`POLL_SLICE`].

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Longest the server blocks in one call (accept, read, write) before it checks whether to stop.
pub(crate) const POLL_SLICE: Duration = Duration::from_millis(100);
/// Most headers a request may have.
const HEADERS_MAX: usize = 32;

/// What one connection may cost the endpoint.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Longest request head read; a longer one is answered 431.
    pub(crate) request_bytes: usize,
    /// Longest a connection is served, reading and writing together; then it is closed.
    pub(crate) connection_time: Duration,
}

impl Limits {
    pub(crate) const DEFAULT: Limits = Limits { request_bytes: 8 * 1024, connection_time: Duration::from_secs(2) };
}

/// What the server does with one well-formed request.
#[derive(Debug, PartialEq)]
enum Route {
    Metrics { head_only: bool },
    NotFound,
    MethodNotAllowed,
}

fn route(method: &str, path: &str) -> Route {
    let path = path.split('?').next().unwrap_or(path);
    match (method, path) {
        ("GET" | "HEAD", "/metrics" | "/") => Route::Metrics { head_only: method == "HEAD" },
        ("GET" | "HEAD", _) => Route::NotFound,
        _ => Route::MethodNotAllowed,
    }
}

/// Serves `listener` until `body` returns `None` (the engine is gone) or `stop` says so.
/// `body` gives the text and its content type for each metrics request.
pub(crate) fn serve(
    listener: TcpListener,
    limits: Limits,
    mut body: impl FnMut() -> Option<(String, &'static str)>,
    stop: impl Fn() -> bool,
) {
    // On Linux a receive timeout bounds `accept` too: it returns `WouldBlock` after a slice.
    if let Err(e) = socket2::SockRef::from(&listener).set_read_timeout(Some(POLL_SLICE)) {
        tracing::warn!(error = %e, "metrics endpoint: no accept timeout; not serving");
        return;
    }
    loop {
        if stop() {
            return;
        }
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                continue
            }
            Err(e) => {
                tracing::debug!(error = %e, "metrics endpoint: accept failed");
                // Out of descriptors, say: do not spin on it.
                std::thread::sleep(POLL_SLICE);
                continue;
            }
        };
        if !serve_one(stream, limits, &mut body, &stop) {
            return;
        }
    }
}

/// Serves one connection within `limits`; `false` when the server should stop.
fn serve_one(
    mut stream: TcpStream,
    limits: Limits,
    body: &mut impl FnMut() -> Option<(String, &'static str)>,
    stop: &impl Fn() -> bool,
) -> bool {
    let deadline = Instant::now() + limits.connection_time;
    let answer = match read_request(&mut stream, limits.request_bytes, deadline, stop) {
        Ok(Route::Metrics { head_only }) => match body() {
            Some((text, content_type)) => response(200, "OK", content_type, &text, head_only),
            None => return false,
        },
        Ok(Route::NotFound) => response(404, "Not Found", "text/plain", "try /metrics\n", false),
        Ok(Route::MethodNotAllowed) => response(405, "Method Not Allowed", "text/plain", "GET /metrics\n", false),
        Err(RequestError::TooLarge) => {
            response(431, "Request Header Fields Too Large", "text/plain", "request too large\n", false)
        }
        Err(RequestError::Malformed) => response(400, "Bad Request", "text/plain", "malformed request\n", false),
        Err(RequestError::Gone) => return !stop(),
    };
    write_all(&mut stream, answer.as_bytes(), deadline, stop);
    let _ = stream.shutdown(std::net::Shutdown::Both);
    !stop()
}

#[derive(Debug)]
enum RequestError {
    TooLarge,
    Malformed,
    /// Closed, timed out, or the server is stopping: nothing to answer.
    Gone,
}

/// Reads one request head (at most `max` bytes, until `deadline`) and routes it.
fn read_request(
    stream: &mut TcpStream,
    max: usize,
    deadline: Instant,
    stop: &impl Fn() -> bool,
) -> Result<Route, RequestError> {
    let mut buf = vec![0u8; max];
    let mut len = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stop() {
            return Err(RequestError::Gone);
        }
        if stream.set_read_timeout(Some(left.min(POLL_SLICE))).is_err() {
            return Err(RequestError::Gone);
        }
        match stream.read(&mut buf[len..]) {
            Ok(0) => return Err(RequestError::Gone),
            Ok(n) => len += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                continue
            }
            Err(_) => return Err(RequestError::Gone),
        }
        let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(&buf[..len]) {
            Ok(httparse::Status::Complete(_)) => {
                return Ok(route(request.method.unwrap_or(""), request.path.unwrap_or("")));
            }
            Ok(httparse::Status::Partial) if len == max => return Err(RequestError::TooLarge),
            Ok(httparse::Status::Partial) => continue,
            Err(httparse::Error::TooManyHeaders) => return Err(RequestError::TooLarge),
            Err(_) => return Err(RequestError::Malformed),
        }
    }
}

fn response(code: u16, reason: &str, content_type: &str, body: &str, head_only: bool) -> String {
    let mut text = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !head_only {
        text.push_str(body);
    }
    text
}

/// Writes `bytes` until done, `deadline`, an error or `stop`; a client that does not read
/// loses its answer rather than holding the thread.
fn write_all(stream: &mut TcpStream, mut bytes: &[u8], deadline: Instant, stop: &impl Fn() -> bool) {
    while !bytes.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stop() || stream.set_write_timeout(Some(left.min(POLL_SLICE))).is_err() {
            return;
        }
        match stream.write(bytes) {
            Ok(0) => return,
            Ok(n) => bytes = &bytes[n..],
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests;
