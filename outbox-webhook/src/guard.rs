//! The SSRF guard: which addresses a webhook may be delivered to.

use std::fmt;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// IPv4 blocks of the IANA special-purpose address registry, plus multicast and the reserved
/// 240.0.0.0/4 (which holds the broadcast address).
const SPECIAL_V4: &[(Ipv4Addr, u8)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8),       // "this network"
    (Ipv4Addr::new(10, 0, 0, 0), 8),      // private
    (Ipv4Addr::new(100, 64, 0, 0), 10),   // shared address space (CGNAT)
    (Ipv4Addr::new(127, 0, 0, 0), 8),     // loopback
    (Ipv4Addr::new(169, 254, 0, 0), 16),  // link-local, cloud metadata services
    (Ipv4Addr::new(172, 16, 0, 0), 12),   // private
    (Ipv4Addr::new(192, 0, 0, 0), 24),    // IETF protocol assignments
    (Ipv4Addr::new(192, 0, 2, 0), 24),    // documentation (TEST-NET-1)
    (Ipv4Addr::new(192, 31, 196, 0), 24), // AS112
    (Ipv4Addr::new(192, 52, 193, 0), 24), // AMT
    (Ipv4Addr::new(192, 88, 99, 0), 24),  // deprecated 6to4 relay anycast
    (Ipv4Addr::new(192, 168, 0, 0), 16),  // private
    (Ipv4Addr::new(192, 175, 48, 0), 24), // AS112 direct delegation
    (Ipv4Addr::new(198, 18, 0, 0), 15),   // benchmarking
    (Ipv4Addr::new(198, 51, 100, 0), 24), // documentation (TEST-NET-2)
    (Ipv4Addr::new(203, 0, 113, 0), 24),  // documentation (TEST-NET-3)
    (Ipv4Addr::new(224, 0, 0, 0), 4),     // multicast
    (Ipv4Addr::new(240, 0, 0, 0), 4),     // reserved, and 255.255.255.255 broadcast
];

/// Special-purpose blocks inside 2000::/3, the only IPv6 range allocated for global unicast;
/// everything outside it is refused wholesale (after judging IPv4-mapped and NAT64 addresses by
/// the IPv4 address they carry).
const SPECIAL_V6_GLOBAL: &[(Ipv6Addr, u8)] = &[
    (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 23), // IETF protocol assignments, Teredo
    (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32), // documentation
    (Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16), // 6to4
    (Ipv6Addr::new(0x2620, 0x4f, 0x8000, 0, 0, 0, 0, 0), 48), // AS112 direct delegation
    (Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20), // documentation
];

const GLOBAL_UNICAST_V6: (Ipv6Addr, u8) = (Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0), 3);
const NAT64_V6: (Ipv6Addr, u8) = (Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96);

/// Whether `ip` is a special-purpose address that webhooks are not delivered to by default.
///
/// True for private, loopback, link-local, unspecified, multicast, broadcast, shared (CGNAT,
/// 100.64.0.0/10), benchmarking (198.18.0.0/15), documentation and the other blocks of the IANA
/// special-purpose registries, in IPv4 and IPv6 (`::1`, `fc00::/7`, `fe80::/10`, `ff00::/8`,
/// `2001:db8::/32`, `100::/64`, `::`, ...). IPv6 outside the global unicast range 2000::/3 is
/// refused as a whole. IPv4-mapped (`::ffff:a.b.c.d`) and NAT64 (`64:ff9b::/96`) addresses are
/// judged by the IPv4 address they embed.
///
/// ```
/// use outbox_webhook::is_special_purpose;
///
/// assert!(is_special_purpose("169.254.169.254".parse().unwrap()));
/// assert!(is_special_purpose("::ffff:10.0.0.1".parse().unwrap()));
/// assert!(!is_special_purpose("8.8.8.8".parse().unwrap()));
/// assert!(!is_special_purpose("2606:4700::1".parse().unwrap()));
/// ```
pub fn is_special_purpose(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_special_v4(v4),
        IpAddr::V6(v6) => is_special_v6(v6),
    }
}

fn is_special_v4(ip: Ipv4Addr) -> bool {
    let bits = ip.to_bits();
    SPECIAL_V4
        .iter()
        .any(|&(net, prefix)| in_block(u128::from(bits), u128::from(net.to_bits()), prefix + 96))
}

fn is_special_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_special_v4(v4);
    }
    let bits = ip.to_bits();
    if in_v6_block(bits, NAT64_V6) {
        return is_special_v4(Ipv4Addr::from_bits((bits & 0xffff_ffff) as u32));
    }
    !in_v6_block(bits, GLOBAL_UNICAST_V6)
        || SPECIAL_V6_GLOBAL
            .iter()
            .any(|&block| in_v6_block(bits, block))
}

fn in_v6_block(bits: u128, (net, prefix): (Ipv6Addr, u8)) -> bool {
    in_block(bits, net.to_bits(), prefix)
}

/// Whether `bits` lies in `net/prefix`, all as 128-bit numbers (IPv4 shifted into the low bits,
/// its prefix lengths plus 96).
fn in_block(bits: u128, net: u128, prefix: u8) -> bool {
    let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
    bits & mask == net & mask
}

/// Which addresses one endpoint may dial: everything that is not special-purpose, plus its
/// explicit allow-list.
#[derive(Debug, Clone, Default)]
pub(crate) struct AddressGuard {
    allowed: Vec<IpAddr>,
}

impl AddressGuard {
    pub(crate) fn new(allowed: &[IpAddr]) -> Self {
        AddressGuard {
            allowed: allowed.iter().map(IpAddr::to_canonical).collect(),
        }
    }

    pub(crate) fn permits(&self, ip: IpAddr) -> bool {
        // IPv4-mapped IPv6 addresses reach the same host as the IPv4 address they carry.
        let ip = ip.to_canonical();
        self.allowed.contains(&ip) || !is_special_purpose(ip)
    }
}

/// The host resolved only to addresses the guard refuses. Travels through reqwest's error chain
/// as the source of its DNS error, where delivery finds it again to report a permanent failure.
#[derive(Debug, Clone)]
pub(crate) struct BlockedHost {
    pub(crate) host: String,
    pub(crate) addresses: Vec<IpAddr>,
}

impl fmt::Display for BlockedHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` resolves only to special-purpose addresses",
            self.host
        )
    }
}

impl std::error::Error for BlockedHost {}

/// The resolver installed in every endpoint's client: the system resolver
/// (`std::net::ToSocketAddrs`), keeping only the addresses the guard permits, so the check
/// applies to the address actually dialled and a name cannot be re-pointed between a check and
/// the connection.
#[derive(Debug)]
pub(crate) struct GuardedResolver {
    guard: Arc<AddressGuard>,
}

impl GuardedResolver {
    pub(crate) fn new(guard: Arc<AddressGuard>) -> Self {
        GuardedResolver { guard }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        let guard = Arc::clone(&self.guard);
        Box::pin(Lookup::spawn(move || lookup(&host, &guard)))
    }
}

type LookupResult = Result<Addrs, Box<dyn std::error::Error + Send + Sync>>;

fn lookup(host: &str, guard: &AddressGuard) -> LookupResult {
    let resolved: Vec<SocketAddr> = (host, 0).to_socket_addrs()?.collect();
    let (permitted, refused): (Vec<SocketAddr>, Vec<SocketAddr>) = resolved
        .into_iter()
        .partition(|addr| guard.permits(addr.ip()));
    if permitted.is_empty() && !refused.is_empty() {
        return Err(Box::new(BlockedHost {
            host: host.to_owned(),
            addresses: refused.iter().map(SocketAddr::ip).collect(),
        }));
    }
    if !refused.is_empty() {
        log::debug!("webhook host `{host}`: skipping special-purpose addresses {refused:?}");
    }
    Ok(Box::new(permitted.into_iter()))
}

/// A blocking lookup run on its own thread, so a slow resolver does not stall the sending
/// thread's runtime, and the connect timeout can still end the wait.
struct Lookup {
    slot: Arc<Mutex<Slot>>,
}

#[derive(Default)]
struct Slot {
    result: Option<LookupResult>,
    waker: Option<Waker>,
}

impl Lookup {
    fn spawn(work: impl FnOnce() -> LookupResult + Send + 'static) -> Self {
        let slot = Arc::new(Mutex::new(Slot::default()));
        let filled = Arc::clone(&slot);
        let spawned = std::thread::Builder::new()
            .name("outbox-webhook-dns".into())
            .spawn(move || {
                let result = work();
                let mut slot = filled.lock().unwrap_or_else(PoisonError::into_inner);
                slot.result = Some(result);
                if let Some(waker) = slot.waker.take() {
                    waker.wake();
                }
            });
        if let Err(error) = spawned {
            slot.lock().unwrap_or_else(PoisonError::into_inner).result = Some(Err(Box::new(error)));
        }
        Lookup { slot }
    }
}

impl Future for Lookup {
    type Output = LookupResult;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        match slot.result.take() {
            Some(result) => Poll::Ready(result),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_purpose_addresses_are_recognised() {
        let special = [
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "10.255.255.255",
            "100.64.0.1",
            "100.127.255.255",
            "127.0.0.1",
            "127.255.255.254",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "192.88.99.1",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::2",
            "::ffff:127.0.0.1",
            "::ffff:10.1.2.3",
            "::ffff:169.254.169.254",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::1",
            "100::1",
            "2001::1",
            "2001:db8::1",
            "2001:db8:ffff::1",
            "2002:7f00:1::1",
            "3fff::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "ff0e::1",
        ];
        for ip in special {
            let parsed: IpAddr = ip.parse().unwrap();
            assert!(is_special_purpose(parsed), "{ip} should be special-purpose");
        }
        let public = [
            "8.8.8.8",
            "1.1.1.1",
            "9.255.255.255",
            "11.0.0.1",
            "93.184.216.34",
            "100.63.255.255",
            "100.128.0.1",
            "126.255.255.255",
            "128.0.0.1",
            "169.253.0.1",
            "172.15.255.255",
            "172.32.0.1",
            "192.0.1.1",
            "192.167.255.255",
            "192.169.0.1",
            "198.17.255.255",
            "198.20.0.1",
            "223.255.255.255",
            "2606:4700::1",
            "2a00:1450:4001:81b::200e",
            "2001:4860:4860::8888",
            "2400:cb00::1",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ];
        for ip in public {
            let parsed: IpAddr = ip.parse().unwrap();
            assert!(!is_special_purpose(parsed), "{ip} should be allowed");
        }
    }

    #[test]
    fn the_allow_list_opens_exactly_its_addresses_including_mapped_forms() {
        let guard = AddressGuard::new(&["127.0.0.1".parse().unwrap()]);
        assert!(guard.permits("127.0.0.1".parse().unwrap()));
        assert!(guard.permits("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!guard.permits("127.0.0.2".parse().unwrap()));
        assert!(!guard.permits("::1".parse().unwrap()));
        assert!(guard.permits("8.8.8.8".parse().unwrap()));

        let mapped = AddressGuard::new(&["::ffff:10.0.0.5".parse().unwrap()]);
        assert!(mapped.permits("10.0.0.5".parse().unwrap()));
        assert!(!mapped.permits("10.0.0.6".parse().unwrap()));
    }

    #[test]
    fn the_resolver_drops_refused_addresses_and_names_the_host() {
        let guard = AddressGuard::default();
        let err = match lookup("localhost", &guard) {
            Ok(addrs) => panic!("localhost resolved to {:?}", addrs.collect::<Vec<_>>()),
            Err(err) => err,
        };
        let blocked = err.downcast_ref::<BlockedHost>().unwrap();
        assert_eq!(blocked.host, "localhost");
        assert!(blocked.addresses.iter().all(|ip| ip.is_loopback()));
        assert!(err.to_string().contains("`localhost`"));

        let open = AddressGuard::new(&["127.0.0.1".parse().unwrap()]);
        let addrs: Vec<SocketAddr> = lookup("localhost", &open).unwrap().collect();
        assert!(!addrs.is_empty());
        assert!(addrs
            .iter()
            .all(|addr| addr.ip() == IpAddr::from([127, 0, 0, 1])));
    }
}
