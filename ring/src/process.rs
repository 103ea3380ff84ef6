//! The processes of this machine as `/proc` lists them: their ids and command lines. `ringd`
//! looks for guards a previous run left (the etcd driver's adoption), the demo and the tests
//! for what a member left behind.

/// Every process's id and command line (its arguments, program first), skipping the ones
/// that end or cannot be read meanwhile. Empty where there is no `/proc`.
pub fn command_lines() -> Vec<(i32, Vec<String>)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            Some((pid, split(&cmdline)))
        })
        .collect()
}

/// A NUL-separated command line's arguments.
pub fn split(cmdline: &[u8]) -> Vec<String> {
    cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// The file name of a command line's program (`etcd` for `/usr/bin/etcd`).
pub fn program(args: &[String]) -> Option<&str> {
    std::path::Path::new(args.first()?).file_name()?.to_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_listed_with_its_program() {
        let me = i32::try_from(std::process::id()).unwrap();
        let lines = command_lines();
        let (_, args) = lines.iter().find(|(pid, _)| *pid == me).expect("listed");
        assert!(program(args).is_some(), "{args:?}");
        assert_eq!(split(b"a\0b\0\0"), ["a", "b"]);
        assert_eq!(program(&["/usr/bin/etcd".to_string()]), Some("etcd"));
        assert_eq!(program(&[]), None);
    }
}
