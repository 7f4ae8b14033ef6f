//! `bench-tunnel`: both ends of a bulk transfer through an opaque relay, for
//! `e2e/bench/tunnel.sh`.
//!
//! - `bench-tunnel serve ADDR...`: an endpoint. Each connection starts with
//!   `0x16` (a TLS handshake's first byte, so a sidecar's CONNECT tunnel stays
//!   opaque) and `U` or `D`. `U`: it reads to EOF and answers the byte count
//!   (8 bytes, little-endian). `D`: it reads a count the same way, sends that
//!   many bytes and closes.
//! - `bench-tunnel up|down ADDR BYTES [--connect HOST:PORT]`: the client. It
//!   sends or receives BYTES through ADDR (after a CONNECT to HOST:PORT when
//!   given) and prints MiB/s, timed from its first byte to the last.
//! - `bench-tunnel requests ADDR N [--connect HOST:PORT]`: N keep-alive
//!   `GET /` requests with `Host: bench`, one at a time on one connection
//!   (inside the tunnel when `--connect` is given); each answer must be a
//!   `200` with a `content-length` body. Prints requests per second.
//!
//! Plain blocking sockets, 64 KiB writes and 256 KiB reads: the ends cost
//! the CPU they share little, so the relay between them shows.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::Instant;

use anyhow::{bail, ensure, Context};

/// Bytes per client write.
const WRITE: usize = 64 * 1024;

/// Bytes per read, either end.
const READ: usize = 256 * 1024;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("serve") if args.len() > 1 => serve(&args[1..]),
        Some(dir @ ("up" | "down")) if args.len() == 3 || args.len() == 5 => {
            let bytes: u64 = args[2].parse().context("BYTES")?;
            let mibs = transfer(&args[1], dir == "up", bytes, connect_option(&args[3..])?)?;
            println!("{mibs:.0}");
            Ok(())
        }
        Some("requests") if args.len() == 3 || args.len() == 5 => {
            let n: u64 = args[2].parse().context("N")?;
            println!("{:.0}", requests(&args[1], n, connect_option(&args[3..])?)?);
            Ok(())
        }
        _ => bail!(
            "usage: bench-tunnel serve ADDR... | bench-tunnel up|down ADDR BYTES [--connect HOST:PORT] \
             | bench-tunnel requests ADDR N [--connect HOST:PORT]"
        ),
    }
}

/// `[--connect HOST:PORT]`, what follows a client's positional arguments.
fn connect_option(rest: &[String]) -> anyhow::Result<Option<&str>> {
    match rest {
        [] => Ok(None),
        [flag, target] if flag == "--connect" => Ok(Some(target.as_str())),
        other => bail!("unknown options {other:?}"),
    }
}

fn serve(addrs: &[String]) -> anyhow::Result<()> {
    let listeners = addrs
        .iter()
        .map(|a| TcpListener::bind(a).with_context(|| format!("bind {a}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    std::thread::scope(|s| {
        for listener in &listeners {
            s.spawn(move || {
                for conn in listener.incoming().flatten() {
                    std::thread::spawn(move || {
                        if let Err(e) = answer(conn) {
                            eprintln!("bench-tunnel: {e:#}");
                        }
                    });
                }
            });
        }
    });
    Ok(())
}

/// One connection at the endpoint.
fn answer(mut conn: TcpStream) -> anyhow::Result<()> {
    let mut kind = [0u8; 2];
    conn.read_exact(&mut kind)?;
    let mut buf = vec![0u8; READ];
    match kind {
        [0x16, b'U'] => {
            let n = drain(&mut conn, &mut buf)?;
            conn.write_all(&n.to_le_bytes())?;
        }
        [0x16, b'D'] => {
            let mut count = [0u8; 8];
            conn.read_exact(&mut count)?;
            send(&mut conn, u64::from_le_bytes(count), &buf)?;
        }
        other => bail!("unknown transfer {other:?}"),
    }
    conn.shutdown(Shutdown::Both)?;
    Ok(())
}

/// The client's side: MiB/s from its first byte to the last.
fn transfer(addr: &str, up: bool, bytes: u64, connect: Option<&str>) -> anyhow::Result<f64> {
    let mut conn = open(addr, connect)?;
    let started = Instant::now();
    if up {
        conn.write_all(&[0x16, b'U'])?;
        send(&mut conn, bytes, &vec![0u8; WRITE])?;
        conn.shutdown(Shutdown::Write)?;
        let mut count = [0u8; 8];
        conn.read_exact(&mut count)
            .context("the endpoint's count")?;
        let got = u64::from_le_bytes(count);
        ensure!(got == bytes, "the endpoint received {got} bytes of {bytes}");
    } else {
        conn.write_all(&[0x16, b'D'])?;
        conn.write_all(&bytes.to_le_bytes())?;
        let got = drain(&mut conn, &mut vec![0u8; READ])?;
        ensure!(got == bytes, "received {got} bytes of {bytes}");
    }
    Ok(bytes as f64 / f64::from(1 << 20) / started.elapsed().as_secs_f64())
}

/// `n` requests one after another on one connection: requests per second.
fn requests(addr: &str, n: u64, connect: Option<&str>) -> anyhow::Result<f64> {
    let mut conn = open(addr, connect)?;
    let mut buf = vec![0u8; 64 * 1024];
    let started = Instant::now();
    for _ in 0..n {
        conn.write_all(b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n")?;
        read_response(&mut conn, &mut buf)?;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Reads one `200` response whose body has a `content-length`.
fn read_response(conn: &mut TcpStream, buf: &mut [u8]) -> anyhow::Result<()> {
    let mut have = 0;
    loop {
        ensure!(have < buf.len(), "response head over {} bytes", buf.len());
        let k = conn.read(&mut buf[have..])?;
        ensure!(k > 0, "the connection closed mid-response");
        have += k;
        let Some(end) = buf[..have].windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = std::str::from_utf8(&buf[..end]).context("response head")?;
        ensure!(head.starts_with("HTTP/1.1 200"), "not a 200: {head}");
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .context("no content-length")?;
        let mut body = have - (end + 4);
        ensure!(body <= length, "more bytes than one response");
        while body < length {
            let want = (length - body).min(buf.len());
            let k = conn.read(&mut buf[..want])?;
            ensure!(k > 0, "the connection closed mid-body");
            body += k;
        }
        return Ok(());
    }
}

/// A connection to `addr`, through a CONNECT tunnel to `connect` if given.
fn open(addr: &str, connect: Option<&str>) -> anyhow::Result<TcpStream> {
    let mut conn = TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
    conn.set_nodelay(true)?;
    if let Some(target) = connect {
        tunnel(&mut conn, target)?;
    }
    Ok(conn)
}

/// Sends CONNECT and reads the answer's head, which must be a 2xx.
fn tunnel(conn: &mut TcpStream, target: &str) -> anyhow::Result<()> {
    write!(conn, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n")?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        ensure!(head.len() < 16 * 1024, "CONNECT answer head too long");
        conn.read_exact(&mut byte).context("CONNECT answer")?;
        head.push(byte[0]);
    }
    ensure!(
        head.starts_with(b"HTTP/1.1 2"),
        "CONNECT refused: {}",
        String::from_utf8_lossy(&head)
    );
    Ok(())
}

fn send(conn: &mut TcpStream, mut left: u64, chunk: &[u8]) -> anyhow::Result<()> {
    while left > 0 {
        let n = usize::try_from(left).unwrap_or(usize::MAX).min(chunk.len());
        conn.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// Reads to EOF; the bytes read.
fn drain(conn: &mut TcpStream, buf: &mut [u8]) -> anyhow::Result<u64> {
    let mut n = 0u64;
    loop {
        match conn.read(buf)? {
            0 => return Ok(n),
            k => n += k as u64,
        }
    }
}
