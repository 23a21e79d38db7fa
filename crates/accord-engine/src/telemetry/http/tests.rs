//! The endpoint's bounds, over loopback: answers parse as HTTP, bad requests get error codes,
//! and neither a silent client nor one that never reads keeps the next client or the stop out.

use super::*;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Bound on any client wait in these tests (a liveness bound, not a timing assertion).
const CLIENT_WAIT: Duration = Duration::from_secs(20);

struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(limits: Limits, body: String) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            serve(
                listener,
                limits,
                || Some((body.clone(), "text/plain; version=0.0.4")),
                || flag.load(Ordering::Relaxed),
            )
        });
        Server { addr, stop, thread: Some(thread) }
    }

    /// Stops the server and waits for its thread, which must end.
    fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Sends `request` and reads the whole answer; returns (status code, body).
fn ask(addr: SocketAddr, request: &[u8]) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(CLIENT_WAIT)).unwrap();
    s.write_all(request).unwrap();
    let mut answer = vec![];
    s.read_to_end(&mut answer).expect("the server answers and closes within the bound");
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut parsed = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head) = parsed.parse(&answer).expect("an HTTP response") else {
        panic!("incomplete response: {:?}", String::from_utf8_lossy(&answer));
    };
    let length: usize = parsed
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .map(|h| std::str::from_utf8(h.value).unwrap().parse().unwrap())
        .expect("Content-Length");
    let code = parsed.code.unwrap();
    let body = answer[head..].to_vec();
    assert!(body.is_empty() || body.len() == length, "body of {} bytes, Content-Length {length}", body.len());
    (code, body)
}

#[test]
fn get_metrics_is_answered_with_the_body() {
    let server = Server::start(Limits::DEFAULT, "accord_up 1\n".into());
    let (code, body) = ask(server.addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!((code, body.as_slice()), (200, &b"accord_up 1\n"[..]));
    let (code, body) = ask(server.addr, b"HEAD / HTTP/1.0\r\n\r\n");
    assert_eq!((code, body.len()), (200, 0));
    server.stop();
}

#[test]
fn bad_requests_get_error_codes() {
    let server = Server::start(Limits { request_bytes: 256, ..Limits::DEFAULT }, "x\n".into());
    assert_eq!(ask(server.addr, b"GET /other HTTP/1.1\r\n\r\n").0, 404);
    assert_eq!(ask(server.addr, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").0, 405);
    assert_eq!(ask(server.addr, b"\x00\x01 garbage\r\n\r\n").0, 400);
    let long = format!("GET /metrics HTTP/1.1\r\nX-Pad: {}\r\n\r\n", "a".repeat(1000));
    assert_eq!(ask(server.addr, long.as_bytes()).0, 431);
    let many: String = (0..HEADERS_MAX + 1).map(|i| format!("H{i}: v\r\n")).collect();
    let server_wide = Server::start(Limits::DEFAULT, "x\n".into());
    assert_eq!(ask(server_wide.addr, format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes()).0, 431);
    server.stop();
    server_wide.stop();
}

#[test]
fn a_silent_client_delays_the_next_one_only_until_its_time_is_up() {
    let limits = Limits { connection_time: Duration::from_millis(300), ..Limits::DEFAULT };
    let server = Server::start(limits, "ok\n".into());
    // Connects and says nothing; then a half request that never ends.
    let silent = TcpStream::connect(server.addr).unwrap();
    let mut half = TcpStream::connect(server.addr).unwrap();
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost:").unwrap();
    let (code, body) = ask(server.addr, b"GET /metrics HTTP/1.1\r\n\r\n");
    assert_eq!((code, body.as_slice()), (200, &b"ok\n"[..]));
    drop((silent, half));
    server.stop();
}

#[test]
fn a_client_that_never_reads_does_not_hold_the_server() {
    // An answer far larger than the socket buffers, to a client that never reads it.
    let limits = Limits { connection_time: Duration::from_millis(300), ..Limits::DEFAULT };
    let server = Server::start(limits, "y".repeat(64 << 20));
    let mut stuck = TcpStream::connect(server.addr).unwrap();
    stuck.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut next = TcpStream::connect(server.addr).unwrap();
    next.set_read_timeout(Some(CLIENT_WAIT)).unwrap();
    next.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut head = [0u8; 12];
    next.read_exact(&mut head).expect("the next client is answered after the stuck one's time");
    assert_eq!(&head, b"HTTP/1.1 200");
    drop((stuck, next));
    server.stop();
}

#[test]
fn stop_ends_the_thread_while_a_client_holds_a_connection() {
    let server = Server::start(Limits { connection_time: Duration::from_secs(3600), ..Limits::DEFAULT }, "x".into());
    let _silent = TcpStream::connect(server.addr).unwrap();
    std::thread::sleep(POLL_SLICE);
    // Joins: the read is sliced, so the stop is seen within a slice, not after an hour.
    server.stop();
}

#[test]
fn the_server_ends_when_the_body_is_gone() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let thread = std::thread::spawn(move || serve(listener, Limits::DEFAULT, || None, || false));
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(CLIENT_WAIT)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut rest = vec![];
    let _ = s.read_to_end(&mut rest);
    thread.join().unwrap();
}

#[test]
fn routes() {
    assert_eq!(route("GET", "/metrics?x=1"), Route::Metrics { head_only: false });
    assert_eq!(route("HEAD", "/"), Route::Metrics { head_only: true });
    assert_eq!(route("GET", "/favicon.ico"), Route::NotFound);
    assert_eq!(route("DELETE", "/metrics"), Route::MethodNotAllowed);
}
