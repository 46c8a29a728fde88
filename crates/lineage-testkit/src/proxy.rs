//! A TCP proxy on 127.0.0.1 that a test controls: it forwards every connection to a server's port
//! and, when told, cuts the connection that sends a chosen message, either before the server sees
//! it or right after the server answered it (the answer is lost). So a test can make a database
//! client meet a request whose outcome it cannot know, over real sockets.
//!
//! A marker is looked for within each chunk the client writes: clients write a short message in
//! one piece, which is what the markers here are for (a statement's text).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// How the proxy cuts the connection that sends a message holding the marker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cut {
    /// The message is dropped and the connection closed: the server never sees it.
    Before(Vec<u8>),
    /// The message reaches the server; its answer is dropped and the connection closed.
    AnswerTo(Vec<u8>),
}

impl Cut {
    fn marker(&self) -> &[u8] {
        match self {
            Cut::Before(marker) | Cut::AnswerTo(marker) => marker,
        }
    }
}

#[derive(Default)]
struct Control {
    armed: Mutex<Option<Cut>>,
    cuts: AtomicU64,
    /// While set, nothing passes either way (see [`Proxy::stall`]).
    stalled: (Mutex<bool>, Condvar),
}

impl Control {
    /// Returns once the proxy is not stalled.
    fn wait_while_stalled(&self) {
        let (stalled, resumed) = &self.stalled;
        let mut now = stalled.lock().unwrap_or_else(|p| p.into_inner());
        while *now {
            now = resumed.wait(now).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// A running proxy. Its listener lives as long as the test process.
pub struct Proxy {
    port: u16,
    control: Arc<Control>,
}

impl Proxy {
    /// Starts a proxy to `target`, a port on 127.0.0.1.
    ///
    /// # Panics
    ///
    /// When no port can be bound.
    pub fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("the proxy binds a port");
        let port = listener.local_addr().expect("a bound address").port();
        let control = Arc::new(Control::default());
        let shared = control.clone();
        std::thread::Builder::new()
            .name("lineage-testkit-proxy".into())
            .spawn(move || {
                for client in listener.incoming().flatten() {
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", target)) {
                        relay(client, server, shared.clone());
                    }
                }
            })
            .expect("the proxy's thread starts");
        Proxy { port, control }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Cuts the next connection that sends a message holding the cut's marker; later ones pass.
    pub fn cut_next(&self, cut: Cut) {
        *self.control.armed.lock().unwrap_or_else(|p| p.into_inner()) = Some(cut);
    }

    /// Stalls every connection (`true`) or lets them go on (`false`): while stalled, what either
    /// side sends is held, and the connections stay open, as over a network that went silent
    /// (a partition, a dead machine: the half-open connection a client cannot tell from a slow
    /// server). Once the stall ends, what was held passes in order.
    pub fn stall(&self, on: bool) {
        let (stalled, resumed) = &self.control.stalled;
        *stalled.lock().unwrap_or_else(|p| p.into_inner()) = on;
        resumed.notify_all();
    }

    /// How many connections were cut.
    pub fn cuts(&self) -> u64 {
        self.control.cuts.load(Ordering::SeqCst)
    }
}

/// Copies what `from` sends to `to`, each chunk read only if `pass` lets it through, until either
/// side closes or fails, or `pass` stops it.
fn pump(mut from: TcpStream, mut to: TcpStream, mut pass: impl FnMut(&[u8]) -> bool) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !pass(&buf[..n]) || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
}

/// Pumps one connection both ways on two threads.
fn relay(client: TcpStream, server: TcpStream, control: Arc<Control>) {
    let (Ok(client_in), Ok(server_in), Ok(client_end), Ok(server_end)) = (
        client.try_clone(),
        server.try_clone(),
        client.try_clone(),
        server.try_clone(),
    ) else {
        return;
    };
    // Set when the server's next answer is to be dropped and the connection closed.
    let lose_answer = Arc::new(AtomicBool::new(false));
    let down_control = control.clone();
    let ends = Arc::new((client_end, server_end));
    let close = move |ends: &(TcpStream, TcpStream)| {
        let _ = ends.0.shutdown(Shutdown::Both);
        let _ = ends.1.shutdown(Shutdown::Both);
    };
    let upstream = {
        let (lose_answer, ends) = (lose_answer.clone(), ends.clone());
        move || {
            pump(client_in, server, |chunk| {
                control.wait_while_stalled();
                let cut = {
                    let mut armed = control.armed.lock().unwrap_or_else(|p| p.into_inner());
                    let hit = armed
                        .as_ref()
                        .is_some_and(|cut| contains(chunk, cut.marker()));
                    if hit { armed.take() } else { None }
                };
                match cut {
                    Some(Cut::Before(_)) => {
                        control.cuts.fetch_add(1, Ordering::SeqCst);
                        return false;
                    }
                    Some(Cut::AnswerTo(_)) => {
                        control.cuts.fetch_add(1, Ordering::SeqCst);
                        lose_answer.store(true, Ordering::SeqCst);
                    }
                    None => {}
                }
                true
            });
            close(&ends);
        }
    };
    let downstream = move || {
        // Once the server has answered the message, the client never hears it.
        pump(server_in, client, |_| {
            down_control.wait_while_stalled();
            !lose_answer.load(Ordering::SeqCst)
        });
        close(&ends);
    };
    let _ = std::thread::Builder::new()
        .name("lineage-testkit-proxy-up".into())
        .spawn(upstream);
    let _ = std::thread::Builder::new()
        .name("lineage-testkit-proxy-down".into())
        .spawn(downstream);
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server: the proxy forwards, drops a marked message, or drops the answer to one.
    #[test]
    fn the_proxy_forwards_and_cuts_as_told() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = echo.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in echo.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut stream = stream;
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = stream.read(&mut buf) {
                        if n == 0 || stream.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let proxy = Proxy::start(target);
        let exchange = |message: &[u8]| -> Option<Vec<u8>> {
            let mut stream = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
            stream.write_all(message).unwrap();
            let mut answer = vec![0u8; message.len()];
            stream.read_exact(&mut answer).ok().map(|()| answer)
        };
        assert_eq!(exchange(b"hello").as_deref(), Some(&b"hello"[..]));
        proxy.cut_next(Cut::AnswerTo(b"COMMIT".to_vec()));
        assert_eq!(exchange(b"SELECT 1"), Some(b"SELECT 1".to_vec()));
        assert_eq!(exchange(b"COMMIT"), None, "the answer is lost");
        proxy.cut_next(Cut::Before(b"COMMIT".to_vec()));
        assert_eq!(exchange(b"COMMIT"), None, "the message is dropped");
        assert_eq!(exchange(b"COMMIT").as_deref(), Some(&b"COMMIT"[..]));
        assert_eq!(proxy.cuts(), 2);

        // Stalled, a message is held with its connection open; it passes once the stall ends.
        let mut stream = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_millis(200)))
            .unwrap();
        proxy.stall(true);
        stream.write_all(b"held").unwrap();
        let mut answer = [0u8; 4];
        assert!(stream.read_exact(&mut answer).is_err(), "nothing passes");
        proxy.stall(false);
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        stream.read_exact(&mut answer).unwrap();
        assert_eq!(&answer, b"held");
    }
}
