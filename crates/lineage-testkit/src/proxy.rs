//! A TCP proxy on 127.0.0.1 that a test controls: it forwards every connection to a server's port
//! and, when told, cuts the connection that sends a chosen message, either before the server sees
//! it or right after the server answered it (the answer is lost). So a test can make a database
//! client meet a request whose outcome it cannot know, over real sockets.
//!
//! It also plays the network's other failures, for every connection at once: [`Proxy::reset`]
//! closes them all now (a server restart or a reset, as the client sees it); [`Proxy::stall`]
//! holds every byte until [`Proxy::heal`] (a slow or congested path: nothing is lost, only late);
//! [`Proxy::black_hole`] drops every byte and keeps the sockets open, so each connection open
//! then is half-open for good (a partition, or a database machine that died: only the client's
//! own timeouts can tell), and new connections are accepted and never answered until
//! [`Proxy::heal`].
//!
//! A marker is looked for within each chunk the client writes: clients write a short message in
//! one piece, which is what the markers here are for (a statement's text).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

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

/// What the proxy does with the bytes of its connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Path {
    /// Forwarded.
    #[default]
    Open,
    /// Held until healed, then forwarded.
    Stalled,
    /// Dropped; every connection it touches stays silent for good.
    BlackHole,
}

/// One relayed connection's two sockets.
struct Connection {
    client: TcpStream,
    server: TcpStream,
}

#[derive(Default)]
struct Control {
    armed: Mutex<Option<Cut>>,
    cuts: AtomicU64,
    path: Mutex<Path>,
    /// Signalled when the path changes (a stalled pump waits on it).
    changed: Condvar,
    connections: Mutex<HashMap<u64, Connection>>,
    next: AtomicU64,
}

impl Control {
    fn path(&self) -> MutexGuard<'_, Path> {
        self.path.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn connections(&self) -> MutexGuard<'_, HashMap<u64, Connection>> {
        self.connections.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_path(&self, path: Path) {
        *self.path() = path;
        self.changed.notify_all();
    }

    /// Whether a chunk of a connection may be written on now: waits while the path is stalled;
    /// `false` once a black hole swallowed the connection (now or before).
    fn may_pass(&self, swallowed: &AtomicBool) -> bool {
        let mut path = self.path();
        loop {
            if swallowed.load(Ordering::SeqCst) {
                return false;
            }
            match *path {
                Path::Open => return true,
                Path::BlackHole => {
                    swallowed.store(true, Ordering::SeqCst);
                    return false;
                }
                Path::Stalled => path = self.changed.wait(path).unwrap_or_else(|p| p.into_inner()),
            }
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
                    if *shared.path() == Path::BlackHole {
                        swallow(client);
                    } else if let Ok(server) = TcpStream::connect(("127.0.0.1", target)) {
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

    /// How many connections were cut.
    pub fn cuts(&self) -> u64 {
        self.control.cuts.load(Ordering::SeqCst)
    }

    /// Closes every connection open now, both ways; new ones are relayed as before.
    pub fn reset(&self) {
        for connection in self.control.connections().values() {
            let _ = connection.client.shutdown(Shutdown::Both);
            let _ = connection.server.shutdown(Shutdown::Both);
        }
    }

    /// Holds every byte, both ways, until [`Proxy::heal`]; nothing is lost.
    pub fn stall(&self) {
        self.control.set_path(Path::Stalled);
    }

    /// Drops every byte, both ways, with every socket left open: each connection that carries
    /// a byte from now on (or was stalled) stays silent for good, until its client closes it. New
    /// connections are accepted and never answered until [`Proxy::heal`].
    pub fn black_hole(&self) {
        self.control.set_path(Path::BlackHole);
    }

    /// Ends a stall (the held bytes go on) or a black hole (new connections are relayed again;
    /// the ones it swallowed stay silent).
    pub fn heal(&self) {
        self.control.set_path(Path::Open);
    }

    /// How many connections are open through the proxy now (swallowed ones included).
    pub fn open_connections(&self) -> usize {
        self.control.connections().len()
    }
}

/// A connection accepted during a black hole: read and dropped until its client closes it.
fn swallow(mut client: TcpStream) {
    let _ = std::thread::Builder::new()
        .name("lineage-testkit-proxy-hole".into())
        .spawn(move || {
            let mut buf = [0u8; 16 * 1024];
            while matches!(client.read(&mut buf), Ok(n) if n > 0) {}
        });
}

/// Copies what `from` sends to `to`, each chunk read only if `pass` lets it through, until either
/// side closes or fails, or `pass` stops it. A chunk the path holds waits; one it drops is read
/// and forgotten (the sockets stay open).
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    control: &Control,
    swallowed: &AtomicBool,
    mut pass: impl FnMut(&[u8]) -> bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !control.may_pass(swallowed) {
            continue;
        }
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
    let id = control.next.fetch_add(1, Ordering::SeqCst);
    let swallowed = Arc::new(AtomicBool::new(false));
    if let (Ok(client), Ok(server)) = (client.try_clone(), server.try_clone()) {
        control
            .connections()
            .insert(id, Connection { client, server });
    }
    // Set when the server's next answer is to be dropped and the connection closed.
    let lose_answer = Arc::new(AtomicBool::new(false));
    let ends = Arc::new((client_end, server_end));
    let close = {
        let control = control.clone();
        move |ends: &(TcpStream, TcpStream)| {
            let _ = ends.0.shutdown(Shutdown::Both);
            let _ = ends.1.shutdown(Shutdown::Both);
            control.connections().remove(&id);
        }
    };
    let upstream = {
        let (lose_answer, ends, close) = (lose_answer.clone(), ends.clone(), close.clone());
        let (control, swallowed) = (control.clone(), swallowed.clone());
        move || {
            pump(client_in, server, &control, &swallowed, |chunk| {
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
        pump(server_in, client, &control, &swallowed, |_| {
            !lose_answer.load(Ordering::SeqCst)
        });
        // A swallowed connection is half-open: the server's end closing never reaches the
        // client, whose end closes only when the client closes it (the upstream pump ends).
        if !swallowed.load(Ordering::SeqCst) {
            close(&ends);
        }
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
    }

    /// A stall delays and loses nothing; a black hole leaves a connection open and silent for
    /// good and new ones unanswered until healed; a reset closes what is open.
    #[test]
    fn the_proxy_stalls_swallows_and_resets_as_told() {
        use std::time::Duration;
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
        let connect = || {
            let stream = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_millis(300)))
                .unwrap();
            stream
        };
        let echoed = |stream: &mut TcpStream, message: &[u8]| -> Option<Vec<u8>> {
            stream.write_all(message).unwrap();
            let mut answer = vec![0u8; message.len()];
            stream.read_exact(&mut answer).ok().map(|()| answer)
        };
        let mut kept = connect();
        assert_eq!(echoed(&mut kept, b"one").as_deref(), Some(&b"one"[..]));

        proxy.stall();
        assert_eq!(echoed(&mut kept, b"two"), None, "held while stalled");
        proxy.heal();
        let mut late = [0u8; 3];
        kept.read_exact(&mut late).unwrap();
        assert_eq!(&late, b"two", "delivered once healed");

        proxy.black_hole();
        assert_eq!(echoed(&mut kept, b"three"), None, "swallowed");
        let mut during = connect();
        assert_eq!(
            echoed(&mut during, b"four"),
            None,
            "a new connection is not answered"
        );
        proxy.heal();
        assert_eq!(
            echoed(&mut kept, b"five"),
            None,
            "a swallowed connection stays silent"
        );
        let mut after = connect();
        assert_eq!(echoed(&mut after, b"six").as_deref(), Some(&b"six"[..]));

        proxy.reset();
        let mut rest = Vec::new();
        after
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(
            after.read_to_end(&mut rest).ok(),
            Some(0),
            "closed by the reset"
        );
    }
}
