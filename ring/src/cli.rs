//! Small helpers shared by the `ringd` and `ringctl` command lines.

/// Parses the command line of `program`. `--help` and `--version` print as usual; a usage error
/// becomes one line on stderr and exit status 2, like every other error of these tools.
pub fn parse_or_exit<T: clap::Parser>(program: &str) -> T {
    match T::try_parse() {
        Ok(parsed) => parsed,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("{program}: error: {first} (see --help)");
            std::process::exit(2);
        }
    }
}
