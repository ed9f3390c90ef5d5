//! Traffic for the end-to-end test in the VM (tests/vm/e2e): backends that answer with their pod
//! name, and a client that keeps sending requests through a Service while the test rolls its
//! backends, restarts the proxier, flips gates and stops the apiserver.
//!
//! - `serve --name NAME --port P`: TCP and UDP on port P of both families (`[::]`, IPv4 as mapped
//!   addresses; `0.0.0.0` where the host has no IPv6). Over TCP every line received is answered
//!   with `NAME\n` on the same connection (one line for a short request, many for a long-lived
//!   connection); every UDP datagram is answered with `NAME\n`.
//! - `probe tcp|udp IP:PORT`: one request; prints the answer, exit status 1 without one.
//! - `load --tcp IP:PORT... [--udp IP:PORT...] --rate R --udp-rate U --long N --stats FILE --stop FILE`:
//!   opens R new TCP connections per second (one request each), sends U UDP datagrams per second
//!   (one query each, a fresh source port each time), and holds N long-lived TCP connections that
//!   send a line every 200 ms, until the stop file exists. With several targets of a protocol
//!   (`--tcp` and `--udp` repeat: an IPv4 and an IPv6 address of a dual-stack Service), requests
//!   and long-lived connections take them in turn, so each gets an equal share of the load; the
//!   IPv6 share is also counted apart (`tcp6_*`, `udp6_*`). FILE is rewritten every 200 ms with the
//!   counters (one `key=value` line, see [`Counters::line`]); every failure is logged on stderr
//!   with its time and cause. A long-lived connection that fails is counted as broken and opened
//!   again (a failed attempt to open one counts as `long_connect_failed`).
//!
//! A request fails when it gets no answer line within [`TIMEOUT`] (connect refused or timed out,
//! reset, closed, silent). The test's figure is the number of failures; the target is zero.
//! To tell the product's failures from the machine's, the load also logs requests slower than
//! [`SLOW`] (a TCP SYN sent again takes at least 1 s: a dropped packet) and its own pauses: a
//! thread that sleeps [`PAUSE_TICK`] logs every wake-up later than [`PAUSE`] (the VM or the
//! process did not run then), counted in `pauses` and `pause_max_ms`.
use clap::{Parser, Subcommand, ValueEnum};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a request may take, from connect to answer.
const TIMEOUT: Duration = Duration::from_secs(3);
/// Interval between two lines on a long-lived connection, and between two writes of the stats file.
const TICK: Duration = Duration::from_millis(200);
/// A request that takes longer than this is logged as slow.
const SLOW: Duration = Duration::from_secs(1);
/// The pause detector's sleep.
const PAUSE_TICK: Duration = Duration::from_millis(50);
/// A wake-up of the pause detector later than this is a pause.
const PAUSE: Duration = Duration::from_millis(500);

#[derive(Parser)]
#[command(about = "Backends and load for the kipvs end-to-end test")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Answer every TCP line and UDP datagram on PORT with NAME.
    Serve {
        #[arg(long)]
        name: String,
        #[arg(long)]
        port: u16,
    },
    /// One request; prints the answer.
    Probe { protocol: Proto, target: SocketAddr },
    /// Continuous requests until the stop file exists.
    Load {
        /// TCP targets, taken in turn (repeat the flag).
        #[arg(long, required = true)]
        tcp: Vec<SocketAddr>,
        /// UDP targets, taken in turn (repeat the flag).
        #[arg(long)]
        udp: Vec<SocketAddr>,
        /// New TCP connections per second.
        #[arg(long, default_value_t = 25)]
        rate: u32,
        /// UDP queries per second (with --udp).
        #[arg(long, default_value_t = 5)]
        udp_rate: u32,
        /// Long-lived TCP connections held open.
        #[arg(long, default_value_t = 4)]
        long: usize,
        #[arg(long)]
        stats: PathBuf,
        #[arg(long)]
        stop: PathBuf,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Proto {
    Tcp,
    Udp,
}

fn main() {
    match Cli::parse().command {
        Command::Serve { name, port } => serve(&name, port),
        Command::Probe { protocol, target } => {
            let answer = match protocol {
                Proto::Tcp => tcp_request(target),
                Proto::Udp => udp_request(target),
            };
            match answer {
                Ok(name) => println!("{name}"),
                Err(e) => {
                    eprintln!("probe {target}: {e}");
                    std::process::exit(1);
                }
            }
        }
        Command::Load {
            tcp,
            udp,
            rate,
            udp_rate,
            long,
            stats,
            stop,
        } => load(&tcp, &udp, rate, udp_rate, long, &stats, &stop),
    }
}

fn serve(name: &str, port: u16) {
    // `[::]` takes both families (Linux's default `bindv6only=0`); a host without IPv6 refuses it.
    let udp = UdpSocket::bind(("::", port))
        .or_else(|_| UdpSocket::bind(("0.0.0.0", port)))
        .expect("bind UDP");
    let reply = format!("{name}\n");
    let udp_reply = reply.clone();
    thread::spawn(move || {
        let mut buf = [0u8; 1500];
        loop {
            if let Ok((_, peer)) = udp.recv_from(&mut buf) {
                let _ = udp.send_to(udp_reply.as_bytes(), peer);
            }
        }
    });
    let listener = TcpListener::bind(("::", port))
        .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
        .expect("bind TCP");
    for stream in listener.incoming().flatten() {
        let reply = reply.clone();
        thread::spawn(move || {
            let Ok(read) = stream.try_clone() else { return };
            let mut write = stream;
            for line in BufReader::new(read).lines() {
                if line.is_err() || write.write_all(reply.as_bytes()).is_err() {
                    break;
                }
            }
        });
    }
}

/// Reads one answer line (the backend's name) from `reader`.
fn answer(reader: &mut impl BufRead) -> Result<String, String> {
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(0) => Err("closed without an answer".into()),
        Ok(_) => Ok(line.trim().to_string()),
        Err(e) => Err(e.to_string()),
    }
}

fn connect(target: SocketAddr) -> Result<TcpStream, String> {
    let stream =
        TcpStream::connect_timeout(&target, TIMEOUT).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    Ok(stream)
}

/// One short TCP request: connect, send a line, read the answer, close.
fn tcp_request(target: SocketAddr) -> Result<String, String> {
    let mut stream = connect(target)?;
    stream
        .write_all(b"GET\n")
        .map_err(|e| format!("write: {e}"))?;
    answer(&mut BufReader::new(stream))
}

/// One UDP query from a fresh socket (so a fresh source port and IPVS connection).
fn udp_request(target: SocketAddr) -> Result<String, String> {
    let bind: SocketAddr = if target.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let socket = UdpSocket::bind(bind).map_err(|e| e.to_string())?;
    socket
        .set_read_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    socket
        .send_to(b"q\n", target)
        .map_err(|e| format!("send: {e}"))?;
    let mut buf = [0u8; 512];
    let (n, _) = socket
        .recv_from(&mut buf)
        .map_err(|e| format!("recv: {e}"))?;
    Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string())
}

/// What the load has seen so far.
#[derive(Default)]
struct Counters {
    tcp_sent: AtomicU64,
    tcp_failed: AtomicU64,
    udp_sent: AtomicU64,
    udp_failed: AtomicU64,
    /// The IPv6 share of the four above (included in them).
    tcp6_sent: AtomicU64,
    tcp6_failed: AtomicU64,
    udp6_sent: AtomicU64,
    udp6_failed: AtomicU64,
    /// Long-lived connections opened (reopened ones included).
    long_opened: AtomicU64,
    /// Lines answered on long-lived connections.
    long_lines: AtomicU64,
    /// Established long-lived connections that failed.
    long_broken: AtomicU64,
    /// Failed attempts to open a long-lived connection.
    long_connect_failed: AtomicU64,
    /// Requests (TCP and UDP) answered, but slower than [`SLOW`].
    slow: AtomicU64,
    /// Pauses of the load process longer than [`PAUSE`], and the longest (ms).
    pauses: AtomicU64,
    pause_max_ms: AtomicU64,
    /// Answers by backend name (short TCP requests).
    backends: Mutex<BTreeMap<String, u64>>,
    /// The backend each long-lived connection talks to.
    long_backends: Mutex<BTreeMap<usize, String>>,
}

impl Counters {
    /// `tcp_sent=.. tcp_failed=.. udp_sent=.. udp_failed=.. tcp6_sent=.. tcp6_failed=..
    /// udp6_sent=.. udp6_failed=.. long_opened=.. long_lines=.. long_broken=..
    /// long_connect_failed=.. slow=.. pauses=.. pause_max_ms=.. backends=name:count,..
    /// long=name,..`
    fn line(&self) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let backends = self.backends.lock().expect("not poisoned");
        let long = self.long_backends.lock().expect("not poisoned");
        format!(
            "tcp_sent={} tcp_failed={} udp_sent={} udp_failed={} tcp6_sent={} tcp6_failed={} udp6_sent={} udp6_failed={} long_opened={} long_lines={} long_broken={} long_connect_failed={} slow={} pauses={} pause_max_ms={} backends={} long={}",
            get(&self.tcp_sent),
            get(&self.tcp_failed),
            get(&self.udp_sent),
            get(&self.udp_failed),
            get(&self.tcp6_sent),
            get(&self.tcp6_failed),
            get(&self.udp6_sent),
            get(&self.udp6_failed),
            get(&self.long_opened),
            get(&self.long_lines),
            get(&self.long_broken),
            get(&self.long_connect_failed),
            get(&self.slow),
            get(&self.pauses),
            get(&self.pause_max_ms),
            backends
                .iter()
                .map(|(k, v)| format!("{k}:{v}"))
                .collect::<Vec<_>>()
                .join(","),
            long.values().cloned().collect::<Vec<_>>().join(","),
        )
    }

    /// The counters of `protocol`'s requests sent and failed, and those of their IPv6 share.
    fn of(&self, protocol: Proto) -> [&AtomicU64; 4] {
        match protocol {
            Proto::Tcp => [
                &self.tcp_sent,
                &self.tcp_failed,
                &self.tcp6_sent,
                &self.tcp6_failed,
            ],
            Proto::Udp => [
                &self.udp_sent,
                &self.udp_failed,
                &self.udp6_sent,
                &self.udp6_failed,
            ],
        }
    }

    /// Send one request (`request`) of `protocol` to `target` and count its outcome.
    fn record(
        &self,
        protocol: Proto,
        target: SocketAddr,
        request: impl FnOnce() -> Result<String, String>,
    ) {
        let [sent, failed, sent6, failed6] = self.of(protocol);
        let counted = |c: &AtomicU64, c6: &AtomicU64| {
            c.fetch_add(1, Ordering::Relaxed);
            if target.is_ipv6() {
                c6.fetch_add(1, Ordering::Relaxed);
            }
        };
        let what = match protocol {
            Proto::Tcp => format!("tcp {target}"),
            Proto::Udp => format!("udp {target}"),
        };
        counted(sent, sent6);
        let start = Instant::now();
        let result =
            request().map_err(|e| format!("{e} (after {} ms)", start.elapsed().as_millis()));
        let took = start.elapsed();
        if result.is_ok() && took > SLOW {
            self.slow.fetch_add(1, Ordering::Relaxed);
            log(&format!("{what}: slow: {} ms", took.as_millis()));
        }
        match result {
            Ok(name) if !name.is_empty() => {
                *self
                    .backends
                    .lock()
                    .expect("not poisoned")
                    .entry(name)
                    .or_default() += 1;
            }
            Ok(_) => {
                counted(failed, failed6);
                log(&format!("{what}: empty answer"));
            }
            Err(e) => {
                counted(failed, failed6);
                log(&format!("{what}: {e}"));
            }
        }
    }
}

fn log(message: &str) {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    eprintln!("{}.{:03} {message}", t.as_secs(), t.subsec_millis());
}

/// Calls `f` `per_second` times a second, each in its own thread, until `stop` exists.
fn paced(per_second: u32, stop: &std::path::Path, f: impl Fn() + Send + Sync + 'static) {
    let f = Arc::new(f);
    let interval = Duration::from_secs(1) / per_second.max(1);
    let start = Instant::now();
    let mut n = 0u32;
    while !stop.exists() {
        let f = f.clone();
        thread::spawn(move || f());
        n += 1;
        let next = start + interval * n;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
    }
}

/// The pause detector: sleeps [`PAUSE_TICK`] at a time and logs each wake-up later than
/// [`PAUSE`], until `stop` exists.
fn pauses(counters: &Counters, stop: &std::path::Path) {
    while !stop.exists() {
        let start = Instant::now();
        thread::sleep(PAUSE_TICK);
        let late = start.elapsed().saturating_sub(PAUSE_TICK);
        if late > PAUSE {
            let ms = late.as_millis() as u64;
            counters.pauses.fetch_add(1, Ordering::Relaxed);
            counters.pause_max_ms.fetch_max(ms, Ordering::Relaxed);
            log(&format!("pause: the load did not run for {ms} ms"));
        }
    }
}

/// One long-lived connection: a line every [`TICK`], reopened when it breaks, until `stop` exists.
fn long_lived(id: usize, target: SocketAddr, counters: &Counters, stop: &std::path::Path) {
    while !stop.exists() {
        let stream = match connect(target) {
            Ok(s) => s,
            Err(e) => {
                counters.long_connect_failed.fetch_add(1, Ordering::Relaxed);
                log(&format!("long-lived {id}: {e}"));
                thread::sleep(TICK);
                continue;
            }
        };
        counters.long_opened.fetch_add(1, Ordering::Relaxed);
        let Ok(mut write) = stream.try_clone() else {
            continue;
        };
        let mut read = BufReader::new(stream);
        while !stop.exists() {
            let result = write
                .write_all(b"ping\n")
                .map_err(|e| format!("write: {e}"))
                .and_then(|()| answer(&mut read));
            match result {
                Ok(name) => {
                    counters.long_lines.fetch_add(1, Ordering::Relaxed);
                    let mut long = counters.long_backends.lock().expect("not poisoned");
                    if long.get(&id) != Some(&name) {
                        log(&format!("long-lived {id}: talking to {name}"));
                        long.insert(id, name);
                    }
                }
                Err(e) => {
                    counters.long_broken.fetch_add(1, Ordering::Relaxed);
                    log(&format!("long-lived {id}: broken: {e}"));
                    break;
                }
            }
            thread::sleep(TICK);
        }
    }
}

/// The load: `tcp` and `udp` are each protocol's targets, taken in turn (`tcp` is not empty).
fn load(
    tcp: &[SocketAddr],
    udp: &[SocketAddr],
    rate: u32,
    udp_rate: u32,
    long: usize,
    stats: &std::path::Path,
    stop: &std::path::Path,
) {
    let counters = Arc::new(Counters::default());
    let stop = stop.to_path_buf();
    let mut threads = Vec::new();
    for id in 0..long {
        let (counters, stop, target) = (counters.clone(), stop.clone(), tcp[id % tcp.len()]);
        threads.push(thread::spawn(move || {
            long_lived(id, target, &counters, &stop)
        }));
    }
    // New TCP connections and UDP queries, each protocol at its own pace over its targets.
    type Request = fn(SocketAddr) -> Result<String, String>;
    let paces: [(Proto, &[SocketAddr], u32, Request); 2] = [
        (Proto::Tcp, tcp, rate, tcp_request),
        (Proto::Udp, udp, udp_rate, udp_request),
    ];
    for (protocol, targets, per_second, request) in paces {
        if targets.is_empty() {
            continue;
        }
        let (counters, stop, targets) = (counters.clone(), stop.clone(), targets.to_vec());
        let turn = Arc::new(AtomicUsize::new(0));
        threads.push(thread::spawn(move || {
            paced(per_second, &stop.clone(), move || {
                let target = targets[turn.fetch_add(1, Ordering::Relaxed) % targets.len()];
                counters.record(protocol, target, || request(target));
            })
        }));
    }
    {
        let (counters, stop) = (counters.clone(), stop.clone());
        threads.push(thread::spawn(move || pauses(&counters, &stop)));
    }
    let write_stats = || {
        let tmp = stats.with_extension("tmp");
        if std::fs::write(&tmp, counters.line() + "\n").is_ok() {
            let _ = std::fs::rename(&tmp, stats);
        }
    };
    while !stop.exists() {
        write_stats();
        thread::sleep(TICK);
    }
    for t in threads {
        let _ = t.join();
    }
    // Requests still in flight finish within TIMEOUT; the final figures include them.
    thread::sleep(TIMEOUT + TICK);
    write_stats();
}
