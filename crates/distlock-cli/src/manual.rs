//! `distlock completions SHELL` and `distlock man`: generated from the clap definitions, so
//! that they cannot drift from the options the program takes.

use std::io::{self, Write};

use clap_mangen::Man;

use crate::util::say;

/// Prints the completion script of `shell`; exit 0.
pub fn completions(mut cli: clap::Command, shell: clap_complete::Shell) -> i32 {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cli, "distlock", &mut script);
    write_stdout(&script)
}

/// Prints the manual page (roff); exit 0, or 1 when it cannot be written.
pub fn man(cli: clap::Command) -> i32 {
    match page(cli) {
        Ok(page) => write_stdout(&page),
        Err(e) => {
            say(&format!("cannot render the manual page: {e}"));
            1
        }
    }
}

/// One page for the whole program: the top-level sections, then a COMMANDS section with each
/// subcommand's synopsis, description and options (clap_mangen's own page would only point
/// to a page per subcommand), then the text that `--help` shows after the options.
fn page(mut cli: clap::Command) -> io::Result<Vec<u8>> {
    cli.build();
    let top = Man::new(cli.clone());
    let mut parts = Vec::new();
    top.render_title(&mut parts)?;
    top.render_name_section(&mut parts)?;
    top.render_synopsis_section(&mut parts)?;
    top.render_description_section(&mut parts)?;
    top.render_options_section(&mut parts)?;
    parts.extend_from_slice(b".SH COMMANDS\n");
    // The global options are described once, above; each subcommand shows its own.
    let globals: Vec<String> = cli
        .get_arguments()
        .filter(|a| a.is_global_set())
        .map(|a| a.get_id().to_string())
        .collect();
    for sub in cli.get_subcommands().filter(|s| s.get_name() != "help") {
        let mut own = sub.clone();
        for id in globals.iter().map(String::as_str).chain(["help"]) {
            if own.get_arguments().any(|a| a.get_id() == id) {
                own = own.mut_arg(id, |a| a.hide(true));
            }
        }
        let man = Man::new(own.clone());
        let mut part = Vec::new();
        man.render_synopsis_section(&mut part)?;
        man.render_description_section(&mut part)?;
        if own.get_arguments().any(|a| !a.is_hide_set()) {
            man.render_options_section(&mut part)?;
        }
        writeln!(parts, ".SS \"distlock {}\"", sub.get_name())?;
        // The sections of a subcommand become paragraphs of its subsection.
        for line in String::from_utf8_lossy(&part).lines() {
            match line.strip_prefix(".SH ") {
                Some(_) => parts.extend_from_slice(b".PP\n"),
                None => writeln!(parts, "{line}")?,
            }
        }
    }
    top.render_extra_section(&mut parts)?;
    top.render_version_section(&mut parts)?;
    // Each rendered part repeats the preamble that defines the apostrophe string: keep the
    // first, and name the after-help section for what it is.
    let mut page = Vec::new();
    let mut preamble_lines = 0;
    for line in String::from_utf8_lossy(&parts).lines() {
        if line.starts_with(".ie \\n(.g .ds Aq") || line.starts_with(".el .ds Aq") {
            preamble_lines += 1;
            if preamble_lines > 2 {
                continue;
            }
        }
        let line = if line == ".SH EXTRA" {
            ".SH DETAILS"
        } else {
            line
        };
        writeln!(page, "{line}")?;
    }
    Ok(page)
}

/// Writes generated text to stdout; a closed pipe (`| head`) is not an error.
fn write_stdout(bytes: &[u8]) -> i32 {
    let mut stdout = io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => 0,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            say(&format!("cannot write to stdout: {e}"));
            1
        }
    }
}
