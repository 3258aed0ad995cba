//! Inline scripts inside an argv: `["sh", "-c", "…"]` is a command string by another name.
//!
//! A grant without `shell` allows only explicit argv, so that no shell or interpreter parses a
//! string the model wrote. An argv that starts a shell or interpreter with an inline script is
//! refused the same way. The check is deliberately conservative: every element of the argv is
//! examined (so wrappers such as `env`, `nice`, `timeout`, `xargs`, `busybox` or
//! `find -exec` do not hide the interpreter), the program is recognized by its file name
//! whatever its directory (`/bin/sh`, `/usr/bin/env`), versioned names count as the program
//! (`python3.12`, `perl5.36`), and an inline flag is recognized alone or inside a cluster of
//! short options (`-ec`, `-lc`, `-ne`). `env -S "sh -c …"` (a split string) is split and
//! checked too.
//!
//! | programs | inline flags |
//! | --- | --- |
//! | `sh` `bash` `zsh` `dash` `ksh` `mksh` `ash` `yash` `fish` `csh` `tcsh` `busybox` (its `sh`) | `-c` |
//! | `python` `python2` `python3` `pypy` `pypy3` | `-c` |
//! | `node` `nodejs` `bun` `deno` | `-e` `--eval` `-p` `--print` (`deno eval`) |
//! | `perl` | `-e` `-E` |
//! | `ruby` | `-e` |
//! | `php` | `-r` |
//! | `lua` `luajit` | `-e` |
//! | `pwsh` `powershell` | `-c` `-Command` `-EncodedCommand` |
//! | `osascript` | `-e` |
//! | `tclsh` `wish` `expect` | `-c` |
//! | `awk` `gawk` `mawk` `nawk` | (always: the program is an inline script) |

/// Most argv elements examined (the kernel's argument bound keeps real argvs far below).
const ARGV_ELEMENTS_MAX: usize = 4096;

/// Programs that run an inline script, and their inline flags (`None`: every invocation).
const INTERPRETERS: &[(&str, Option<&[&str]>)] = &[
    ("sh", Some(&["-c"])),
    ("bash", Some(&["-c"])),
    ("zsh", Some(&["-c"])),
    ("dash", Some(&["-c"])),
    ("ksh", Some(&["-c"])),
    ("mksh", Some(&["-c"])),
    ("ash", Some(&["-c"])),
    ("yash", Some(&["-c"])),
    ("fish", Some(&["-c", "--command"])),
    ("csh", Some(&["-c"])),
    ("tcsh", Some(&["-c"])),
    ("python", Some(&["-c"])),
    ("python2", Some(&["-c"])),
    ("python3", Some(&["-c"])),
    ("pypy", Some(&["-c"])),
    ("pypy3", Some(&["-c"])),
    ("node", Some(&["-e", "--eval", "-p", "--print"])),
    ("nodejs", Some(&["-e", "--eval", "-p", "--print"])),
    ("bun", Some(&["-e", "--eval", "-p", "--print"])),
    ("deno", Some(&["eval"])),
    ("perl", Some(&["-e", "-E"])),
    ("ruby", Some(&["-e"])),
    ("php", Some(&["-r"])),
    ("lua", Some(&["-e"])),
    ("luajit", Some(&["-e"])),
    (
        "pwsh",
        Some(&["-c", "-command", "-encodedcommand", "-e", "-ec"]),
    ),
    (
        "powershell",
        Some(&["-c", "-command", "-encodedcommand", "-e", "-ec"]),
    ),
    ("osascript", Some(&["-e"])),
    ("tclsh", Some(&["-c"])),
    ("wish", Some(&["-c"])),
    ("expect", Some(&["-c"])),
    ("awk", None),
    ("gawk", None),
    ("mawk", None),
    ("nawk", None),
];

/// The program and flag of the first inline script `argv` starts, as `"sh -c"`, or `None`.
pub(crate) fn inline_script(argv: &[&str]) -> Option<String> {
    let argv = &argv[..argv.len().min(ARGV_ELEMENTS_MAX)];
    for (i, element) in argv.iter().enumerate() {
        let rest = &argv[i + 1..];
        if let Some(split) = split_string_option(element, rest.first().copied()) {
            let words: Vec<&str> = split.split_whitespace().collect();
            if let Some(found) = inline_script(&words) {
                return Some(found);
            }
        }
        let Some((name, flags)) = interpreter(element) else {
            continue;
        };
        let Some(flags) = flags else {
            return Some(name.to_string());
        };
        // busybox runs its applets: `busybox sh -c …` is found when `sh` is examined.
        if let Some(flag) = rest.iter().find(|a| is_inline_flag(a, flags)) {
            return Some(format!("{name} {flag}"));
        }
    }
    None
}

/// The program named by `element`: its file name, without `.exe` or a version suffix.
fn interpreter(element: &str) -> Option<(&'static str, Option<&'static [&'static str]>)> {
    let file = element.rsplit(['/', '\\']).next().unwrap_or(element);
    let file = file
        .strip_suffix(".exe")
        .unwrap_or(file)
        .to_ascii_lowercase();
    let base = file.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.' || c == '-');
    INTERPRETERS
        .iter()
        .find(|(name, _)| *name == file || *name == base)
        .map(|(name, flags)| (*name, *flags))
}

/// Whether `arg` is one of `flags`, alone, in a short-option cluster (`-ec`), or with a value
/// attached (`--eval=…`). Case-insensitive for PowerShell's long flags.
fn is_inline_flag(arg: &str, flags: &[&str]) -> bool {
    let lower = arg.to_ascii_lowercase();
    flags.iter().any(|flag| {
        if lower == *flag || lower.starts_with(&format!("{flag}=")) {
            return true;
        }
        let short = flag.len() == 2 && flag.starts_with('-');
        let cluster = lower.len() > 2 && lower.starts_with('-') && !lower.starts_with("--");
        short && cluster && arg[1..].contains(&flag[1..])
    })
}

/// The string `env -S` / `--split-string` splits into words, when `element` is that option.
fn split_string_option<'a>(element: &'a str, next: Option<&'a str>) -> Option<&'a str> {
    match element {
        "-S" | "--split-string" => next,
        _ => element
            .strip_prefix("--split-string=")
            .or_else(|| element.strip_prefix("-S").filter(|s| !s.is_empty())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(argv: &[&str]) -> Option<String> {
        inline_script(argv)
    }

    #[test]
    fn shells_and_interpreters_with_inline_scripts_are_found() {
        for argv in [
            &["sh", "-c", "id"][..],
            &["/bin/sh", "-c", "id"],
            &["bash", "-lc", "id"],
            &["zsh", "-c", "id"],
            &["dash", "-ec", "id"],
            &["python", "-c", "1"],
            &["python3", "-c", "1"],
            &["/usr/bin/python3.12", "-c", "1"],
            &["node", "-e", "1"],
            &["node", "--eval=1"],
            &["perl", "-ne", "print"],
            &["ruby", "-e", "1"],
            &["php", "-r", "1;"],
            &["env", "sh", "-c", "id"],
            &["/usr/bin/env", "-i", "FOO=1", "bash", "-c", "id"],
            &["env", "-S", "sh -c id"],
            &["timeout", "5", "sh", "-c", "id"],
            &["xargs", "sh", "-c", "id"],
            &["busybox", "sh", "-c", "id"],
            &["awk", "BEGIN{system(\"id\")}"],
            &["pwsh", "-Command", "id"],
        ] {
            assert!(found(argv).is_some(), "{argv:?}");
        }
    }

    #[test]
    fn plain_argvs_pass() {
        for argv in [
            &["ls", "-la"][..],
            &["sh", "script.sh"],
            &["python3", "tool.py", "--count"],
            &["git", "commit", "-m", "fix sh -c quoting"],
            &["grep", "-c", "sh", "file"],
            &["cargo", "test"],
        ] {
            assert_eq!(found(argv), None, "{argv:?}");
        }
    }

    #[test]
    fn the_finding_names_program_and_flag() {
        assert_eq!(found(&["/bin/bash", "-c", "x"]).as_deref(), Some("bash -c"));
    }
}
