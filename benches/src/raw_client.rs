//! A minimal keep-alive HTTP client, to measure what the receiver and the loopback can take
//! without the library's HTTP client: baseline (i) of the drain.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use outbox_testkit::http::find;

use crate::{failed, Res, WithContext};

/// Sends `total` POSTs over `threads` keep-alive connections with a minimal client, each
/// shaped like a signed delivery of `body`; returns requests per second. This is the
/// receiver's own capacity (and the loopback's), not the library's HTTP client's.
pub fn raw_capacity(addr: SocketAddr, threads: usize, total: u64, body: &[u8]) -> Res<f64> {
    let threads = threads.max(1);
    let per_thread = total / threads as u64;
    let started = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let body = body.to_vec();
            std::thread::spawn(move || raw_client(addr, t as u64, per_thread, &body))
        })
        .collect();
    for worker in workers {
        worker
            .join()
            .map_err(|_| failed("a capacity client panicked"))??;
    }
    Ok((per_thread * threads as u64) as f64 / started.elapsed().as_secs_f64())
}

fn raw_client(addr: SocketAddr, thread: u64, count: u64, body: &[u8]) -> Res<()> {
    let mut stream = TcpStream::connect(addr).ctx("connecting to the receiver")?;
    stream.set_nodelay(true).ctx("setting TCP_NODELAY")?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ctx("setting a read timeout")?;
    let mut answer = [0u8; 1024];
    for n in 0..count {
        // A distinct, UUID-shaped id per request, so the receiver's bookkeeping runs as usual.
        let id = (u128::from(thread) << 96) | u128::from(n) | (1u128 << 127);
        let hex = format!("{id:032x}");
        let head = format!(
            "POST /hook HTTP/1.1\r\nhost: {addr}\r\nuser-agent: outbox-webhook/0.1.0\r\n\
             content-type: application/json\r\nwebhook-id: {}-{}-{}-{}-{}\r\n\
             webhook-timestamp: 1767225600\r\n\
             webhook-signature: v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=\r\n\
             accept: */*\r\ncontent-length: {}\r\n\r\n",
            &hex[..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..],
            body.len()
        );
        let mut request = head.into_bytes();
        request.extend_from_slice(body);
        stream.write_all(&request).ctx("sending a request")?;
        let mut got = 0;
        loop {
            let n = stream.read(&mut answer[got..]).ctx("reading an answer")?;
            if n == 0 {
                return Err(failed("the receiver closed the connection"));
            }
            got += n;
            if find(&answer[..got], b"\r\n\r\n").is_some() {
                break;
            }
            if got == answer.len() {
                return Err(failed("an answer head longer than 1 KiB"));
            }
        }
    }
    Ok(())
}
