//! The CPU time of a server process, and how to find the server behind a loopback URL: what the
//! scale and waiters benchmarks read to charge a server its share of the work.

/// User + system CPU seconds of `pid` and of its children (a PostgreSQL server does its work in
/// one child per connection), from `/proc/*/stat`.
pub fn process_tree_cpu_s(pid: u32) -> Option<f64> {
    // `/proc` counts in USER_HZ, which Linux fixes at 100 for user space.
    let tick = 100.0;
    // Fields after the command name, which may itself hold spaces and parentheses.
    let fields = |p: &str| -> Option<Vec<String>> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        let after = &stat[stat.rfind(')')? + 1..];
        Some(after.split_whitespace().map(str::to_owned).collect())
    };
    // After the name: state(0) ppid(1) … utime(11) stime(12).
    let cpu = |f: &[String]| -> f64 {
        let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        (t(11) + t(12)) / tick
    };
    let own = fields(&pid.to_string())?;
    let mut total = cpu(&own);
    let parent = pid.to_string();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(p) = name
            .to_str()
            .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if let Some(f) = fields(p) {
            if f.get(1) == Some(&parent) {
                total += cpu(&f);
            }
        }
    }
    Some(total)
}

/// The loopback port a network URL names (its first host), with the scheme's default port.
pub fn url_port(url: &str) -> Option<u16> {
    let (scheme, rest) = url.split_once("://")?;
    let default = match scheme {
        "redis" | "rediss" => 6379,
        "postgres" | "postgresql" => 5432,
        "mysql" => 3306,
        "zk" | "zks" => 2181,
        "etcd" | "etcds" => 2379,
        _ => return None,
    };
    let authority = rest.split(['/', '?']).next()?;
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let first = hosts.split(',').next()?;
    match first.rsplit_once(':') {
        Some((_, port)) if !first.ends_with(']') => port.parse().ok(),
        _ => Some(default),
    }
}

/// The pid of the process of this user that listens on TCP `port`.
pub fn listening_pid(port: u16) -> Option<u32> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address is HEXIP:HEXPORT, st 0A is LISTEN, inode is the tenth field.
            let Some(local_port) = f.get(1).and_then(|a| a.rsplit_once(':')) else {
                continue;
            };
            if u16::from_str_radix(local_port.1, 16).ok() == Some(port) && f.get(3) == Some(&"0A") {
                if let Some(inode) = f.get(9) {
                    inodes.push(format!("socket:[{inode}]"));
                }
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if inodes.iter().any(|i| target.as_os_str() == i.as_str()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_of_urls() {
        assert_eq!(url_port("redis://127.0.0.1:6390"), Some(6390));
        assert_eq!(url_port("redis://u:p@localhost/2"), Some(6379));
        assert_eq!(
            url_port("zk://127.0.0.1:2182,127.0.0.1:2183/root"),
            Some(2182)
        );
        assert_eq!(url_port("mysql://u:p@127.0.0.1:3307/db?x=1"), Some(3307));
        assert_eq!(url_port("memory://"), None);
        assert_eq!(url_port("sqlite:///tmp/x.db"), None);
    }

    #[test]
    fn this_process_has_cpu_time() {
        assert!(process_tree_cpu_s(std::process::id()).is_some());
    }
}
