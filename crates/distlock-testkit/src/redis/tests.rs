//! Unit tests of the throwaway `redis-server`: start, `cli`, kill, restart, pause, credentials
//! and the errors of a server that cannot start.

use super::*;
use std::io::Read;

/// One reply line without its `\r\n`; an error at the end of the stream.
fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(line.trim_end_matches("\r\n").to_owned())
}

fn options(password: Option<&str>, acl_user: Option<(&str, &str)>) -> RedisServerOptions {
    RedisServerOptions {
        password: password.map(str::to_owned),
        acl_user: acl_user.map(|(u, p)| (u.to_owned(), p.to_owned())),
        ..Default::default()
    }
}

fn raw_ping(addr: SocketAddr) -> io::Result<String> {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    (&stream).write_all(b"PING\r\n")?;
    read_line(&mut BufReader::new(stream))
}

#[test]
fn server_starts_on_a_free_port_and_answers_ping() {
    let server = RedisServer::start().unwrap();
    assert_ne!(server.port(), 6379);
    assert_eq!(
        server.addr(),
        SocketAddr::from(([127, 0, 0, 1], server.port()))
    );
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert_eq!(raw_ping(server.addr()).unwrap(), "+PONG");
    assert_eq!(server.cli(&["PING"]).unwrap(), "PONG");
}

#[test]
fn cli_renders_replies_as_text() {
    let server = RedisServer::start().unwrap();
    assert_eq!(server.cli(&["SET", "k", "v a l"]).unwrap(), "OK");
    assert_eq!(server.cli(&["GET", "k"]).unwrap(), "v a l");
    assert_eq!(server.cli(&["GET", "missing"]).unwrap(), "(nil)");
    assert_eq!(server.cli(&["RPUSH", "list", "a", "b"]).unwrap(), "2");
    assert_eq!(server.cli(&["LRANGE", "list", "0", "-1"]).unwrap(), "a\nb");
    assert_eq!(server.cli(&["LRANGE", "nothing", "0", "-1"]).unwrap(), "");
    assert_eq!(server.cli(&["DEL", "k", "list"]).unwrap(), "2");
    assert_eq!(server.cli(&["CONFIG", "GET", "save"]).unwrap(), "save\n");
    assert_eq!(
        server.cli(&["CONFIG", "GET", "appendonly"]).unwrap(),
        "appendonly\nno"
    );
    let error = server.cli(&["NOSUCHCOMMAND"]).unwrap_err();
    assert!(error.to_string().starts_with("ERR"), "{error}");
    assert!(server.cli(&[]).is_err());
    assert_eq!(server.cli(&["FLUSHALL"]).unwrap(), "OK");
}

#[test]
fn debug_sleep_and_client_kill_are_allowed() {
    let server = RedisServer::start().unwrap();
    let started = Instant::now();
    assert_eq!(server.cli(&["DEBUG", "SLEEP", "0.2"]).unwrap(), "OK");
    assert!(started.elapsed() >= Duration::from_millis(200));

    let victim = TcpStream::connect(server.addr()).unwrap();
    victim
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    (&victim).write_all(b"PING\r\n").unwrap();
    let mut reader = BufReader::new(victim);
    assert_eq!(read_line(&mut reader).unwrap(), "+PONG");
    assert_eq!(
        server.cli(&["CLIENT", "KILL", "TYPE", "normal"]).unwrap(),
        "1"
    );
    let mut rest = Vec::new();
    assert_eq!(
        reader.read_to_end(&mut rest).unwrap_or(0),
        0,
        "killed client sees EOF"
    );
}

#[test]
fn kill_refuses_connections_and_restart_comes_back_empty_on_the_same_port() {
    let mut server = RedisServer::start().unwrap();
    let port = server.port();
    let first_pid = server.pid().unwrap();
    server.cli(&["SET", "k", "v"]).unwrap();

    server.kill();
    assert!(!server.is_running());
    assert_eq!(server.pid(), None);
    assert!(raw_ping(server.addr()).is_err());
    assert!(server.cli(&["PING"]).is_err());
    server.kill(); // idempotent

    server.restart().unwrap();
    assert!(server.is_running());
    assert_eq!(server.port(), port);
    assert_ne!(server.pid().unwrap(), first_pid);
    assert_eq!(server.cli(&["GET", "k"]).unwrap(), "(nil)");

    // Restarting a running server replaces it too.
    server.cli(&["SET", "k", "v"]).unwrap();
    server.restart().unwrap();
    assert_eq!(server.port(), port);
    assert_eq!(server.cli(&["DBSIZE"]).unwrap(), "0");
}

#[test]
fn drop_kills_the_process_and_removes_its_directory() {
    let server = RedisServer::start().unwrap();
    let addr = server.addr();
    let pid = libc::pid_t::try_from(server.pid().unwrap()).unwrap();
    let dir = server.dir.path().to_owned();
    assert!(dir.is_dir());
    drop(server);
    // SAFETY: signal 0 only checks whether the pid exists.
    assert_eq!(unsafe { libc::kill(pid, 0) }, -1, "process is gone");
    assert!(!dir.exists());
    assert!(raw_ping(addr).is_err());
}

const HELPER_ENV: &str = "DISTLOCK_TESTKIT_DEATH_HELPER";

/// Run by `servers_die_with_the_test_process` in a child process; does nothing otherwise.
#[test]
#[ignore = "helper of servers_die_with_the_test_process"]
fn helper_starts_a_server_and_waits_to_be_killed() {
    if std::env::var_os(HELPER_ENV).is_none() {
        return;
    }
    let server = RedisServer::start().unwrap();
    println!("port={}", server.port());
    io::stdout().flush().unwrap();
    thread::sleep(Duration::from_secs(60));
}

#[test]
fn servers_die_with_the_test_process() {
    let mut helper = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "redis::tests::helper_starts_a_server_and_waits_to_be_killed",
            "--ignored",
            "--nocapture",
        ])
        .env(HELPER_ENV, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(helper.stdout.take().unwrap());
    let port = stdout.lines().find_map(|line| {
        line.ok()?
            .strip_prefix("port=")
            .and_then(|port| port.parse::<u16>().ok())
    });
    helper.kill().unwrap();
    helper.wait().unwrap();
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port.expect("helper printed a port")));

    let deadline = Instant::now() + Duration::from_secs(5);
    while answers_ping(addr) {
        assert!(
            Instant::now() < deadline,
            "redis-server outlived the killed test process"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn pause_stops_answers_until_resume() {
    let server = RedisServer::start().unwrap();
    let stream = TcpStream::connect(server.addr()).unwrap();
    server.pause().unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    (&stream).write_all(b"PING\r\n").unwrap();
    let mut reader = BufReader::new(stream);
    assert!(
        read_line(&mut reader).is_err(),
        "a paused server does not answer"
    );
    server.resume().unwrap();
    reader
        .get_ref()
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(read_line(&mut reader).unwrap(), "+PONG");
}

#[test]
fn password_is_required_and_used_by_cli_and_url() {
    let server = RedisServer::start_with(options(Some("s3cret/pw"), None)).unwrap();
    assert!(raw_ping(server.addr()).unwrap().starts_with("-NOAUTH"));
    assert_eq!(server.cli(&["PING"]).unwrap(), "PONG");
    assert_eq!(server.cli(&["ACL", "WHOAMI"]).unwrap(), "default");
    assert_eq!(
        server.url(),
        format!(
            "redis://:s3cret%2Fpw@127.0.0.1:{}?allow_insecure_auth=true",
            server.port()
        )
    );
}

#[test]
fn acl_user_can_log_in_and_is_used_by_cli_and_url() {
    let mut server = RedisServer::start_with(options(None, Some(("alice", "pw")))).unwrap();
    assert_eq!(server.cli(&["ACL", "WHOAMI"]).unwrap(), "alice");
    assert_eq!(server.cli(&["SET", "k", "v"]).unwrap(), "OK");
    assert_eq!(
        server.url(),
        format!(
            "redis://alice:pw@127.0.0.1:{}?allow_insecure_auth=true",
            server.port()
        )
    );
    assert_eq!(
        server.url_with(None, None),
        format!("redis://127.0.0.1:{}", server.port())
    );
    server.restart().unwrap();
    assert_eq!(server.cli(&["ACL", "WHOAMI"]).unwrap(), "alice");
}

#[test]
fn wrong_credentials_fail_cli_with_permission_denied() {
    let mut server = RedisServer::start_with(options(Some("right"), None)).unwrap();
    server.options.password = Some("wrong".to_owned());
    let error = server.cli(&["PING"]).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::PermissionDenied, "{error}");
}

#[test]
fn missing_binary_error_says_what_to_install() {
    let error = RedisServer::start_binary(
        "distlock-no-such-redis-server",
        RedisServerOptions::default(),
    )
    .unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::NotFound);
    assert!(
        error.to_string().contains("apt-get install redis-server"),
        "{error}"
    );
}

#[test]
fn start_up_failure_is_an_error_not_a_hang() {
    // `false` accepts any arguments and exits at once, like a server that rejects its config.
    let error = RedisServer::start_binary("false", RedisServerOptions::default()).unwrap_err();
    assert!(
        error.to_string().contains("exited during start-up"),
        "{error}"
    );
}

#[test]
fn replies_of_every_type_are_rendered() {
    let reply = Value::Array(vec![
        Value::Okay,
        Value::SimpleString("QUEUED".to_owned()),
        Value::Int(-3),
        Value::Nil,
        Value::BulkString(b"hi".to_vec()),
        Value::Array(Vec::new()),
        Value::Map(vec![(Value::BulkString(b"k".to_vec()), Value::Int(1))]),
        Value::Boolean(true),
        Value::Double(1.5),
        Value::VerbatimString {
            format: ::redis::VerbatimFormat::Text,
            text: "abc".to_owned(),
        },
    ]);
    assert_eq!(
        render(&reply),
        "OK\nQUEUED\n-3\n(nil)\nhi\n\nk\n1\ntrue\n1.5\nabc"
    );
    // An error inside an array is text; a whole reply that is an error fails `cli`.
    let server = RedisServer::start().unwrap();
    assert_eq!(
        server
            .cli(&["EVAL", "return {1, redis.error_reply('ERR x')}", "0"])
            .unwrap(),
        "1\n(error) ERR x"
    );
}

#[test]
fn url_user_info_is_percent_encoded() {
    assert_eq!(percent_encode("a-b_c.d~e"), "a-b_c.d~e");
    assert_eq!(percent_encode("p@ss:w/rd é"), "p%40ss%3Aw%2Frd%20%C3%A9");
}
