//! `distlock`: run a command under a distributed lock, inspect a lock, or replay the demo.
//!
//! ```text
//! distlock [--backend URL] [--prefix P] [-v] COMMAND
//!   run --key K [--key K2 ...] [--shared | --write | --permits N] [--lease DUR] [--wait DUR | --no-wait] -- CMD [ARGS...]
//!   status K [--json]
//!   list [--json]
//!   unlock K --force
//!   demo [--workers N] [--hold DUR] [--key K]
//!   serve [--listen ADDR] [--token-file FILE] [--tls-cert PEM --tls-key PEM] [--allow-host NAME ...] [--open]
//!   completions bash|zsh|fish|elvish|powershell
//!   man
//! ```
//!
//! `run` starts CMD in a process group of its own and stops that group before the lease can
//! end if renewals fail (see `run::KillPlan`); a watcher process kills it if `distlock` dies.
//!
//! Exit statuses: CMD's own for `run`; 75 lock not acquired; 76 lock lost while CMD ran;
//! 2 usage error; 1 backend error; `status` exits 0 when held and 3 when free.

mod config;
mod demo;
mod duration;
mod elect;
mod group;
mod list;
mod manual;
mod run;
mod serve;
mod signals;
mod status;
mod util;
mod watcher;

use std::ffi::OsString;
use std::time::Duration;

use clap::{ArgAction, Args, CommandFactory, Parser, Subcommand};

use config::{Failure, Global, EXIT_USAGE};
use duration::{parse_at_least, parse_duration, parse_lease};
use run::{HoldKind, WaitMode};

const AFTER_HELP: &str = "\
Backends (--backend or DISTLOCK_BACKEND): memory://, sqlite:///abs/path.db,
redis://[user:pass@]host:port[/db], rediss://..., redis+sentinel://host:port[,...]/MASTER,
rediss+sentinel://..., redis+cluster://host:port[,host:port], rediss+cluster://...,
redlock://host:port,host:port,host:port, redlocks://...,
postgres://user:pass@host:port/db,
mysql://user:pass@host:port/db, zk://host:port[,host:port][/root],
etcd://host:port[,host:port], etcds://...[?ca_file=/path/ca.pem]. Without one, locks live in a SQLite file
distlock.db in $DISTLOCK_HOME, else $XDG_DATA_HOME/distlock, else ~/.local/share/distlock.

run: options come before CMD; CMD starts after -- or at the first word that is not an
option, and an unknown option is a usage error. Without --shared, --write or --permits, run
holds K exclusively (K's mutex); --shared holds it shared with other --shared holders (the
read side of K's read-write lock: flock -s beside flock -x); --write holds the write side of
that lock, alone (on ZooKeeper, Curator's readers wait for it, not for the mutex); --permits
N takes one of N permits of the semaphore K. Several --key are held together, all or nothing, taken in key order so that
two such runs cannot deadlock. CMD runs in a process group of its own (given the terminal
when distlock has it), gets DISTLOCK_KEY and DISTLOCK_FENCE (of the first key given; with
several keys also DISTLOCK_FENCES, a JSON object of key to fence) but not DISTLOCK_BACKEND; SIGINT, SIGTERM and SIGHUP to distlock are passed on to CMD's group, and
the lock is released once the whole group is gone. If distlock dies, even by SIGKILL, a
watcher process kills CMD's group.

Stopping CMD (grace: DISTLOCK_KILL_GRACE, a duration; default 5s): if renewals fail,
CMD's group gets SIGTERM when the lease left is grace + margin, and SIGKILL when it is margin
(margin: a tenth of the lease, 50ms to 1s), so it is gone before the lease can end. The
grace must fit in a third of the lease minus the margin; a longer one is cut to that for
this purpose (-v says so). If the lock is lost before that (deleted, expired on the server),
the group gets SIGTERM at once and SIGKILL after the full grace (at once if it already had
SIGTERM). Processes CMD leaves in its group when it ends are stopped the same way before the
lock is released. Ctrl-Z stops CMD and distlock; a stop longer than the lease loses the lock.

Exit status of run: CMD's own (128+N if signal N ended it); 75 lock not acquired;
76 lock lost while CMD ran, or CMD stopped because it was about to be lost; 127 CMD not
found; 2 usage error; 1 backend error.
status: 0 held, 3 free, 1 backend unreachable. list: 0, 1 backend unreachable.
unlock --force: 0 removed, 3 nothing held, 1 backend unreachable.
status, list and unlock create nothing: without a database they find every lock free.

Durations: 500ms, 30s, 2m, 1h, 1d, 1.5s, 1m30s, or a number of seconds (10); the same in
URL parameters such as ?connect_timeout=10s.";

/// Distributed locks from the command line.
#[derive(Debug, Parser)]
#[command(name = "distlock", version, after_help = AFTER_HELP)]
struct Cli {
    /// Backend URL (default: a SQLite file in the user's data directory)
    #[arg(
        long,
        global = true,
        env = "DISTLOCK_BACKEND",
        value_name = "URL",
        hide_env_values = true
    )]
    backend: Option<String>,

    /// Namespace of every key (Redis keys are <prefix>:<key>)
    #[arg(long, global = true, default_value = "lock", value_name = "P")]
    prefix: String,

    /// Log what happens to stderr (-vv for more)
    #[arg(short, long, global = true, action = ArgAction::Count)]
    verbose: u8,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run CMD while holding the lock K (renewed while CMD runs)
    Run(RunArgs),
    /// Show whether the lock K is held, by what kind of holds, its fence and remaining lease
    Status(StatusArgs),
    /// List the locks held under the prefix (key, kind, holders, fence, lease left)
    List(ListArgs),
    /// Remove the lock K whoever holds it (the holders find it lost)
    Unlock(UnlockArgs),
    /// Wait until leading the election N, then run CMD while leading (DISTLOCK_TERM)
    Elect(ElectArgs),
    /// Show who leads the election N, and its term
    Leader(LeaderArgs),
    /// N workers contend for one key and hold it in turn
    Demo(DemoArgs),
    /// Serve the backend over HTTP, with a live page (see docs/SERVE.md)
    Serve(ServeArgs),
    /// Print the shell completion script for SHELL (bash: `source <(distlock completions bash)`)
    Completions(CompletionsArgs),
    /// Print the manual page (roff: `distlock man | man -l -`)
    Man,
}

#[derive(Debug, Args)]
struct CompletionsArgs {
    /// The shell
    #[arg(value_name = "SHELL")]
    shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Address to listen on (port 0: any free port, printed on stdout)
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7070")]
    listen: std::net::SocketAddr,

    /// Require `Authorization: Bearer <the file's content>` on every request
    #[arg(long, value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,

    /// Serve HTTPS with this PEM certificate chain (with --tls-key)
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,

    /// The PEM private key of --tls-cert
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,

    /// Accept requests that name NAME as their Host (any port), besides the addresses listened
    /// on (repeatable; e.g. the name of a proxy in front)
    #[arg(long = "allow-host", value_name = "NAME", action = ArgAction::Append)]
    allow_hosts: Vec<String>,

    /// Listen beyond loopback without --token-file: the service is meant to be open to
    /// everyone who can reach it
    #[arg(long)]
    open: bool,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The lock's key; several --key are held together (all or nothing)
    #[arg(long = "key", value_name = "K", value_parser = config::parse_key, required = true, action = ArgAction::Append)]
    keys: Vec<String>,

    /// Hold K shared with other --shared holders (the read side of K's read-write lock)
    #[arg(long, conflicts_with_all = ["permits", "write"])]
    shared: bool,

    /// Hold K alone as the write side of K's read-write lock (excludes --shared holders)
    #[arg(long, conflicts_with = "permits")]
    write: bool,

    /// Take one of N permits of the semaphore K
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(distlock::MAX_PERMITS)))]
    permits: Option<u32>,

    /// Lease of the lock, renewed while CMD runs [default: 30s, or the longest the backend
    /// grants when that is shorter]
    #[arg(long, value_name = "DUR", value_parser = parse_lease)]
    lease: Option<Duration>,

    /// Wait at most DUR for the lock (default: wait without limit)
    #[arg(long, value_name = "DUR", value_parser = parse_duration, conflicts_with = "no_wait")]
    wait: Option<Duration>,

    /// Fail at once (exit 75) when the lock is busy
    #[arg(long)]
    no_wait: bool,

    /// Who holds the lock, as `status` and `list` show it [default: <hostname>:<pid>]; at most
    /// 128 printable bytes, never a secret
    #[arg(long, value_name = "DESC", env = "DISTLOCK_OWNER", value_parser = config::parse_owner)]
    owner: Option<distlock::Owner>,

    /// Keep the lock until DUR after CMD started, even when CMD ends sooner (a scheduled job
    /// that another instance must not run again at once: ShedLock's lockAtLeastFor)
    #[arg(long, value_name = "DUR", value_parser = parse_at_least)]
    at_least: Option<Duration>,

    /// The command and its arguments: after `--`, or from the first word that is not an
    /// option (an unknown option is a usage error, never the command)
    #[arg(value_name = "CMD", required = true, num_args = 1.., trailing_var_arg = true)]
    command: Vec<OsString>,
}

#[derive(Debug, Args)]
struct ElectArgs {
    /// The election's name (the key of its lock)
    #[arg(long, value_name = "N", value_parser = config::parse_key)]
    name: String,

    /// This candidate's description, as `leader` shows it [default: <hostname>:<pid>]
    #[arg(long, value_name = "DESC", env = "DISTLOCK_OWNER", value_parser = config::parse_owner)]
    id: Option<distlock::Owner>,

    /// Lease of the leadership, renewed while CMD runs: how long a dead leader stays leader
    /// [default: 30s, or the longest the backend grants when that is shorter]
    #[arg(long, value_name = "DUR", value_parser = parse_lease)]
    lease: Option<Duration>,

    /// The command and its arguments, after `--`
    #[arg(value_name = "CMD", required = true, num_args = 1.., trailing_var_arg = true)]
    command: Vec<OsString>,
}

#[derive(Debug, Args)]
struct LeaderArgs {
    /// The election's name
    #[arg(value_name = "N", value_parser = config::parse_key)]
    name: String,

    /// Print one JSON object a line: {"name", "leader", "term"}
    #[arg(long)]
    json: bool,

    /// Print a line at every change of leader, until interrupted
    #[arg(long)]
    watch: bool,
}

#[derive(Debug, Args)]
struct StatusArgs {
    /// The lock's key
    #[arg(value_name = "K", value_parser = config::parse_key)]
    key: String,

    /// Print one JSON object
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Print one JSON object per lock and line
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct UnlockArgs {
    /// The lock's key
    #[arg(value_name = "K", value_parser = config::parse_key)]
    key: String,

    /// Required: remove the lock whoever holds it
    #[arg(long)]
    force: bool,
}

#[derive(Debug, Args)]
struct DemoArgs {
    /// How many workers contend
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    workers: u32,

    /// How long each worker holds the lock
    #[arg(long, value_name = "DUR", default_value = "3s", value_parser = parse_duration)]
    hold: Duration,

    /// The key they contend for
    #[arg(long, value_name = "K", default_value = "demo", value_parser = config::parse_key)]
    key: String,
}

fn main() {
    if std::env::args_os().nth(1).as_deref() == Some(std::ffi::OsStr::new(watcher::WATCH_ARG)) {
        std::process::exit(watcher::main());
    }
    let code = real_main();
    std::process::exit(code);
}

fn real_main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_error(e),
    };
    match &cli.command {
        Command::Completions(args) => return manual::completions(Cli::command(), args.shell),
        Command::Man => return manual::man(Cli::command()),
        _ => {}
    }
    init_tracing(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            util::say(&format!("cannot start the runtime: {e}"));
            return 1;
        }
    };
    let global = Global {
        backend: cli.backend,
        prefix: cli.prefix,
    };
    let result = runtime.block_on(dispatch(&global, cli.command));
    runtime.shutdown_timeout(Duration::from_millis(500));
    match result {
        Ok(code) => code,
        Err(failure) => {
            util::say(&failure.message);
            failure.code
        }
    }
}

async fn dispatch(global: &Global, command: Command) -> Result<i32, Failure> {
    match command {
        Command::Run(args) => {
            let wait = match (args.wait, args.no_wait) {
                (_, true) => WaitMode::No,
                (Some(d), false) => WaitMode::For(d),
                (None, false) => WaitMode::Forever,
            };
            let kind = match (args.shared, args.write, args.permits) {
                (true, _, _) => HoldKind::Shared,
                (_, true, _) => HoldKind::Write,
                (_, _, Some(n)) => HoldKind::Permit(n),
                (false, false, None) => HoldKind::Exclusive,
            };
            let request = run::RunRequest {
                keys: args.keys,
                kind,
                lease: args.lease,
                wait,
                command: args.command,
                owner: args.owner,
                at_least: args.at_least,
                election: false,
            };
            run::run(global, request).await
        }
        Command::Elect(args) => {
            let request = run::RunRequest {
                keys: vec![args.name],
                kind: HoldKind::Exclusive,
                lease: args.lease,
                wait: WaitMode::Forever,
                command: args.command,
                owner: Some(args.id.unwrap_or_default()),
                at_least: None,
                election: true,
            };
            run::run(global, request).await
        }
        Command::Leader(args) => elect::leader(global, &args.name, args.json, args.watch).await,
        Command::Status(args) => status::status(global, &args.key, args.json).await,
        Command::List(args) => list::list(global, args.json).await,
        Command::Unlock(args) => {
            if !args.force {
                return Err(Failure::usage(
                    "unlock removes a lock whoever holds it: say so with --force",
                ));
            }
            list::unlock(global, &args.key).await
        }
        Command::Demo(args) => {
            let request = demo::DemoRequest {
                workers: args.workers,
                hold: args.hold,
                key: args.key,
            };
            demo::demo(global, request).await
        }
        Command::Serve(args) => {
            let request = serve::ServeRequest {
                listen: args.listen,
                token_file: args.token_file,
                tls_cert: args.tls_cert,
                tls_key: args.tls_key,
                allow_hosts: args.allow_hosts,
                open: args.open,
            };
            serve::serve(global, request).await
        }
        Command::Completions(_) | Command::Man => Ok(0),
    }
}

/// Help and version go to stdout with exit 0; usage errors become one line and exit 2.
fn clap_error(e: clap::Error) -> i32 {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            0
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            EXIT_USAGE
        }
        _ => {
            let mut message = clap_message(&e.render().to_string());
            // clap quotes the refused value whole: a 100 kB key would make a 100 kB line.
            if let Some(clap::error::ContextValue::String(value)) =
                e.get(clap::error::ContextKind::InvalidValue)
            {
                let short = distlock::ShortKey(value).to_string();
                if short.len() < value.len() {
                    message = message.replace(&format!("'{value}'"), &short);
                }
            }
            util::say(&format!("{message} (see --help)"));
            EXIT_USAGE
        }
    }
}

/// The message part of a rendered clap error: up to the first blank line, on one line,
/// without the `error: ` prefix.
fn clap_message(rendered: &str) -> String {
    let head = rendered.split("\n\n").next().unwrap_or(rendered);
    let line = util::one_line(head);
    line.strip_prefix("error: ")
        .map(str::to_owned)
        .unwrap_or(line)
}

/// Tracing to stderr only when asked: `-v` (debug for distlock), `-vv` (trace) or `RUST_LOG`.
fn init_tracing(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let rust_log = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty());
    if verbose == 0 && rust_log.is_none() {
        return;
    }
    let mut filter = match &rust_log {
        Some(spec) => EnvFilter::try_new(spec).unwrap_or_else(|_| EnvFilter::new("warn")),
        None => EnvFilter::new("warn"),
    };
    if verbose > 0 {
        let level = if verbose > 1 { "trace" } else { "debug" };
        if let Ok(directive) = format!("distlock={level}").parse() {
            filter = filter.add_directive(directive);
        }
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("distlock").chain(args.iter().copied()))
    }

    #[test]
    fn run_arguments() {
        let cli = parse(&[
            "run", "--key", "k", "--wait", "2s", "--", "echo", "--flag", "x",
        ])
        .unwrap();
        let Command::Run(run) = cli.command else {
            panic!("run expected")
        };
        assert_eq!(run.keys, ["k"]);
        assert!(!run.shared && run.permits.is_none());
        assert_eq!(run.wait, Some(Duration::from_secs(2)));
        assert_eq!(run.lease, None);
        assert_eq!(run.command, ["echo", "--flag", "x"].map(OsString::from));
        assert_eq!(cli.prefix, "lock");
    }

    #[test]
    fn cmd_begins_after_dash_dash_or_at_the_first_word_that_is_not_an_option() {
        let command = |args: &[&str]| match parse(args).map(|cli| cli.command) {
            Ok(Command::Run(run)) => Ok(run.command),
            Ok(_) => panic!("run expected"),
            Err(e) => Err(e.exit_code()),
        };
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            command(&["run", "--key", "k", "--bogus", "--", "true"]),
            Err(2)
        );
        assert_eq!(
            command(&["run", "--key", "k", "--wiat", "5s", "--", "x"]),
            Err(2)
        );
        assert_eq!(command(&["run", "--key", "k", "-x", "true"]), Err(2));
        assert_eq!(
            command(&["run", "--key", "k", "echo", "hi"]),
            Ok(os(&["echo", "hi"]))
        );
        assert_eq!(
            command(&["run", "--key", "k", "--", "--weird"]),
            Ok(os(&["--weird"]))
        );
        assert_eq!(
            command(&["run", "--key", "k", "--", "true", "--bogus"]),
            Ok(os(&["true", "--bogus"]))
        );
        assert_eq!(
            command(&["run", "--key", "k", "sh", "-c", "exit 3", "--key", "--"]),
            Ok(os(&["sh", "-c", "exit 3", "--key", "--"]))
        );
    }

    #[test]
    fn several_keys_and_the_kinds() {
        let cli = parse(&["run", "--key", "a", "--key", "b", "--shared", "--", "true"]).unwrap();
        let Command::Run(run) = cli.command else {
            panic!("run expected")
        };
        assert_eq!(run.keys, ["a", "b"]);
        assert!(run.shared);
        let cli = parse(&["run", "--key", "s", "--permits", "4", "true"]).unwrap();
        let Command::Run(run) = cli.command else {
            panic!("run expected")
        };
        assert_eq!(run.permits, Some(4));
        let cli = parse(&["run", "--key", "w", "--write", "true"]).unwrap();
        let Command::Run(run) = cli.command else {
            panic!("run expected")
        };
        assert!(run.write && !run.shared && run.permits.is_none());
    }

    #[test]
    fn clap_messages_are_one_line() {
        let e = parse(&["run", "--key", "k"]).unwrap_err();
        let line = clap_message(&e.render().to_string());
        assert!(!line.contains('\n'));
        assert!(line.contains("CMD"), "{line}");
        assert!(!line.starts_with("error:"), "{line}");
    }
}
